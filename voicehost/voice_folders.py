"""The voice directory on disk: built-in voices plus one adapter folder per voice,
``<root>/<voice_id>/``. Every adapter is validated before use; a bad one is listed with its error
and never stops the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from voicehost.adapter_validation import (
    MANIFEST,
    STATUS,
    AdapterRules,
    InvalidAdapter,
    read_json_object,
    validate_adapter,
    voice_status,
    write_manifest,
)
from voicehost.ids import is_voice_id
from voicehost.voices import BrokenAdapter, NotHeld, ReadOnlyVoice, Voice, VoiceExists

log = logging.getLogger(__name__)


class FolderVoiceDirectory:
    """The voice directory on disk: built-in voices plus the adapters under the adapter roots.

    Adapters are found at start-up, on a periodic rescan, and at once when a request names a
    folder that appeared since the last scan.
    """

    def __init__(self, roots: Iterable[Path], builtin: Iterable[str], rules: AdapterRules) -> None:
        self.roots = list(roots)
        self.rules = rules
        self.builtin = {v: Voice(voice_id=v, name=v.capitalize()) for v in builtin}
        self.adapters: dict[str, Voice] = {}
        self._broken: dict[str, BrokenAdapter] = {}
        self._lock = threading.Lock()  # scans run on worker threads; readers take copies
        self._seen: dict[Path, tuple[tuple[str, int, int], ...]] = {}

    def scan(self) -> None:
        """Validate new or changed adapter folders; forget removed ones."""
        with self._lock:
            self._scan()

    def _scan(self) -> None:
        present: set[Path] = set()
        for root in self.roots:
            if not root.is_dir():
                continue
            for folder in sorted(p for p in root.iterdir() if p.is_dir()):
                if folder.name.startswith("."):  # staging folders of uploads and exports
                    continue
                present.add(folder)
                self._load(folder)
        for folder in set(self._seen) - present:
            del self._seen[folder]
            self.adapters.pop(folder.name, None)
            self._broken.pop(folder.name, None)

    def _load(self, folder: Path) -> None:
        stamp = _folder_stamp(folder)
        if self._seen.get(folder) == stamp:
            return
        self._seen[folder] = stamp
        voice_id = folder.name
        try:
            voice = validate_adapter(folder, self.rules)
        except Exception as exc:  # whatever is in the folder, the server stays up
            reason = str(exc) if isinstance(exc, InvalidAdapter) else f"{type(exc).__name__}: {exc}"
            self.adapters.pop(voice_id, None)
            self._broken[voice_id] = BrokenAdapter(voice_id, folder, reason)
            log.error("voice adapter %s is unusable: %s", folder, exc)
            return
        self._broken.pop(voice_id, None)
        self.adapters[voice_id] = voice
        log.info("voice adapter %s ready (%s)", voice_id, folder)

    def get(self, voice_id: str) -> Voice | None:
        """The voice named ``voice_id`` among those already found."""
        return self.adapters.get(voice_id) or self.builtin.get(voice_id)

    def discover(self, voice_id: str) -> Voice | None:
        """Like ``get``, but first looks on disk for a folder that appeared since the last scan."""
        voice = self.get(voice_id)
        if voice is None and is_voice_id(voice_id):
            with self._lock:
                for root in self.roots:
                    if (root / voice_id).is_dir():
                        self._load(root / voice_id)
            voice = self.adapters.get(voice_id)
        return voice

    async def find(self, voice_id: str) -> Voice | None:
        """``discover`` without blocking the event loop on disk reads."""
        return self.get(voice_id) or await asyncio.to_thread(self.discover, voice_id)

    def broken(self, voice_id: str) -> str | None:
        with self._lock:
            found = self._broken.get(voice_id)
        return found.error if found else None

    async def list_voices(self) -> tuple[list[Voice], list[BrokenAdapter]]:
        return self.voices(), self.broken_adapters()

    def missing(self) -> int:
        return 0  # the folders are the truth

    def loaded(self) -> int:
        with self._lock:
            return len(self.adapters)

    @property
    def writable_root(self) -> Path:
        """The adapters folder that uploads and clone jobs write into (the first root)."""
        return self.roots[0]

    async def exists(self, voice_id: str) -> bool:
        return (
            await self.find(voice_id) is not None
            or voice_id in self._broken
            or (self.writable_root / voice_id).exists()
        )

    async def add(self, voice_id: str, folder: Path) -> Voice:
        await asyncio.to_thread(validate_adapter, folder, self.rules)
        target = self.writable_root / voice_id
        if await self.exists(voice_id):
            raise VoiceExists(f"voice {voice_id!r} already exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.move, folder, target)
        voice = await self.find(voice_id)
        if voice is None:
            raise InvalidAdapter(self.broken(voice_id) or "the adapter could not be loaded")
        return voice

    async def remove(self, voice_id: str) -> bool:
        voice = await self.find(voice_id)
        folder = self.writable_root / voice_id
        if voice is None and voice_id not in self._broken:
            return False
        if voice is not None and (
            voice.adapter_path is None or voice.adapter_path.resolve() != folder.resolve()
        ):
            raise ReadOnlyVoice(f"voice {voice_id!r} is not a deletable adapter")
        await asyncio.to_thread(shutil.rmtree, folder, True)
        await asyncio.to_thread(self.scan)
        return True

    async def manifest(self, voice_id: str) -> dict | None:
        voice = await self.find(voice_id)
        if voice is None:
            return None
        if voice.adapter_path is None or not (voice.adapter_path / MANIFEST).exists():
            return {}
        return json.loads(await asyncio.to_thread((voice.adapter_path / MANIFEST).read_text))

    async def publish(self, voice_id: str, published: dict[str, object]) -> Voice | None:
        return await asyncio.to_thread(self._publish, voice_id, published)

    def _publish(self, voice_id: str, published: dict[str, object]) -> Voice | None:
        """Under the scan lock, so two publishes of one voice cannot both find it held."""
        if voice_id in self.builtin and voice_id not in self.adapters:
            raise NotHeld(f"voice {voice_id!r} is a built-in voice")
        with self._lock:
            voice = self.adapters.get(voice_id)
            if voice is None or voice.adapter_path is None:
                return None
            folder = voice.adapter_path
            path = folder / MANIFEST
            manifest = read_json_object(path) if path.exists() else {}
            if voice_status(manifest) != "held":
                raise NotHeld(f"voice {voice_id!r} is not held")
            write_manifest(folder, {**manifest, STATUS: "ready", "published": published})
            self._seen.pop(folder, None)  # load it again now, not at the next scan
            self._load(folder)
            return self.adapters.get(voice_id)

    def voices(self) -> list[Voice]:
        """Every usable voice, sorted by id."""
        with self._lock:
            found = list(self.adapters.values())
        return sorted([*self.builtin.values(), *found], key=lambda v: v.voice_id)

    def broken_adapters(self) -> list[BrokenAdapter]:
        """Adapter folders that failed validation, with why."""
        with self._lock:
            return sorted(self._broken.values(), key=lambda b: b.voice_id)

    async def watch(self, interval: float) -> None:
        """Rescan forever (run as a task); a failing scan is logged and retried."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.scan)
            except Exception:
                log.exception("scanning the adapter folders failed; retrying")


def _folder_stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Changes whenever a file in the folder is added, removed or rewritten."""
    try:
        files = sorted(folder.iterdir())
        return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    except OSError:
        return ()
