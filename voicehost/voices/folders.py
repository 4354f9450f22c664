"""The voice directory on disk: built-in voices plus one folder per voice, ``<root>/<voice_id>/``.
Every adapter is validated before use; a bad one is listed with its error and never stops the
server.

A voice folder is either one adapter (its files at the top: version 1, as voices were before
they had versions; nothing to migrate) or, once it has a second version, versioned::

    <voice_id>/live.json          {"live": 2, "newest": 3}: the live version, the newest number
    <voice_id>/versions/1/        an adapter with its voice.json (immutable once added)
    <voice_id>/versions/2/ ...

Promotion rewrites ``live.json`` by one atomic rename; a version's folder never changes but for
its ``voice.json`` (publish, promotion date), so a stream keeps the adapter it started with.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from voicehost.ids import is_version, is_voice_id
from voicehost.voices import versioning
from voicehost.voices.validation import (
    MANIFEST,
    VERSION,
    AdapterRules,
    InvalidAdapter,
    ServedModels,
    read_json_object,
    validate_adapter,
    voice_status,
    voice_tenant,
    write_manifest,
)
from voicehost.voices.voice import (
    BrokenAdapter,
    NotHeld,
    ReadOnlyVoice,
    UnusableVersion,
    Voice,
    VoiceVersion,
)

log = logging.getLogger(__name__)

LIVE = "live.json"
VERSIONS = "versions"


def read_live(folder: Path) -> tuple[int, int] | None:
    """(live, newest) of a versioned voice folder; ``None`` for a one-adapter folder. Raises
    ``InvalidAdapter`` for a ``live.json`` that says nothing usable."""
    path = folder / LIVE
    if not path.is_file():
        return None
    data = read_json_object(path)
    live, newest = data.get("live"), data.get("newest", data.get("live"))
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (live, newest)):
        raise InvalidAdapter(f"{LIVE} must hold the live and newest version numbers")
    return live, versioning.newest_version(live, newest)


def write_live(folder: Path, live: int, newest: int) -> None:
    """Switch the live version: one atomic rename, so a reader sees the old pointer or the new."""
    staging = folder / f".{LIVE}.{uuid.uuid4().hex}"
    try:
        with staging.open("w") as out:
            out.write(json.dumps({"live": live, "newest": newest}))
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, folder / LIVE)
    finally:
        staging.unlink(missing_ok=True)


def version_folders(folder: Path) -> dict[int, Path]:
    """Each version's adapter folder: ``versions/<n>/``, or the folder itself as version 1."""
    if not (folder / LIVE).is_file():
        return {1: folder}
    root = folder / VERSIONS
    found = (
        [p for p in root.iterdir() if p.is_dir() and is_version(p.name)] if root.is_dir() else []
    )
    return {int(p.name): p for p in found}


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)  # the same files, no copy (an adapter is immutable)
    except OSError:
        shutil.copy2(source, target)


def make_versioned(folder: Path) -> None:
    """Turn a one-adapter folder into ``versions/1/`` plus ``live.json``, with no moment in
    which it is not servable: version 1 is linked (or copied) beside it, the pointer switches,
    then the old top-level files go."""
    if (folder / LIVE).is_file():
        return
    top = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != VERSIONS]
    staging = folder / VERSIONS / f".{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    for path in top:
        if path.is_dir():
            shutil.copytree(path, staging / path.name, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(path), str(staging / path.name))
    path = staging / MANIFEST
    manifest = {**(read_json_object(path) if path.exists() else {}), VERSION: 1}
    write_manifest(staging, versioning.first_promotion(manifest) or manifest)  # version 1 is live
    staging.rename(folder / VERSIONS / "1")
    write_live(folder, 1, 1)
    for path in top:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


class FolderVoiceDirectory:
    """The voice directory on disk: built-in voices plus the voices under the adapter roots.

    Voices are found at start-up, on a periodic rescan, and at once when a request names a
    folder that appeared since the last scan.
    """

    def __init__(
        self, roots: Iterable[Path], builtin: Mapping[str, str] | Iterable[str], rules: AdapterRules
    ) -> None:
        self.roots = list(roots)
        self.models = ServedModels(rules)  # one: the served model
        self.builtin = versioning.builtin_voices(builtin, rules.base_model)
        self.adapters: dict[str, Voice] = {}  # each voice's live version
        self._versions: dict[str, dict[int, Voice | str]] = {}  # every version, or its error
        self._live: dict[str, int] = {}
        self._folders: dict[str, Path] = {}
        self._broken: dict[str, BrokenAdapter] = {}
        self._lock = threading.RLock()  # scans run on worker threads; readers take copies
        self._seen: dict[Path, tuple[tuple[str, int, int], ...]] = {}

    def scan(self) -> None:
        """Validate new or changed voice folders; forget removed ones."""
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
            self._forget(folder.name)

    def _forget(self, voice_id: str) -> None:
        for known in (self.adapters, self._versions, self._live, self._folders, self._broken):
            known.pop(voice_id, None)

    def _load(self, folder: Path, force: bool = False) -> None:
        stamp = _voice_stamp(folder)
        if self._seen.get(folder) == stamp and not force:
            return
        self._seen[folder] = stamp
        voice_id = folder.name
        self._folders[voice_id] = folder
        try:
            pointer = read_live(folder)
            folders = version_folders(folder)
        except (InvalidAdapter, OSError) as exc:
            self._unusable(voice_id, folder, str(exc))
            return
        live = pointer[0] if pointer else 1
        versions: dict[int, Voice | str] = {}
        for number, path in sorted(folders.items()):
            try:
                voice = validate_adapter(path, self.models.own, voice_id)
                versions[number] = replace(voice, version=number)
            except Exception as exc:  # whatever is in the folder, the server stays up
                versions[number] = (
                    str(exc) if isinstance(exc, InvalidAdapter) else f"{type(exc).__name__}: {exc}"
                )
        self._versions[voice_id] = versions
        self._live[voice_id] = live
        found = versions.get(live, f"its live version {live} is missing")
        if isinstance(found, str):
            self._unusable(voice_id, folder, found)
            return
        self._broken.pop(voice_id, None)
        self.adapters[voice_id] = found
        log.info("voice adapter %s ready (%s, version %d)", voice_id, folder, live)

    def _unusable(self, voice_id: str, folder: Path, reason: str) -> None:
        self.adapters.pop(voice_id, None)
        self._broken[voice_id] = BrokenAdapter(voice_id, folder, reason)
        log.error("voice adapter %s is unusable: %s", folder, reason)

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

    async def find(self, voice_id: str, version: int | None = None) -> Voice | None:
        """``discover`` without blocking the event loop on disk reads."""
        voice = self.get(voice_id) or await asyncio.to_thread(self.discover, voice_id)
        if version is None:
            return voice
        if voice_id in self.builtin and voice_id not in self._versions:
            return versioning.builtin_version(self.builtin[voice_id], version)
        found = self._versions.get(voice_id, {}).get(version)
        return found if isinstance(found, Voice) else None

    def broken(self, voice_id: str, version: int | None = None) -> str | None:
        with self._lock:
            if version is not None:
                found = self._versions.get(voice_id, {}).get(version)
                return found if isinstance(found, str) else None
            unusable = self._broken.get(voice_id)
        return unusable.error if unusable else None

    async def list_voices(self) -> tuple[list[Voice], list[BrokenAdapter]]:
        """What the folders hold now: a listing rescans first (unchanged folders cost a stat),
        so a host's front end lists the voice another front end added a moment ago."""
        await asyncio.to_thread(self.scan)
        return self.voices(), self.broken_adapters()

    def missing(self) -> int:
        return 0  # the folders are the truth

    async def health(self) -> dict[str, object]:
        return {"registry": "whole"}

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
        await asyncio.to_thread(validate_adapter, folder, self.models.own)
        target = self.writable_root / voice_id
        if await self.exists(voice_id):
            raise versioning.voice_exists(voice_id)
        path = folder / MANIFEST
        manifest = await asyncio.to_thread(read_json_object, path) if path.exists() else {}
        await asyncio.to_thread(write_manifest, folder, {**manifest, VERSION: 1})
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.move, folder, target)
        voice = await self.find(voice_id)
        if voice is None:
            raise InvalidAdapter(self.broken(voice_id) or "the adapter could not be loaded")
        return voice

    def _managed_folder(self, voice_id: str) -> Path:
        """The folder of a voice this directory may change: ``NoSuchVersion`` if there is no
        such voice, ``ReadOnlyVoice`` for one outside the writable root (a dev voice)."""
        self.discover(voice_id)
        folder = self._folders.get(voice_id)
        if folder is None:
            if voice_id in self.builtin:
                raise versioning.builtin_voice(voice_id)
            raise versioning.no_such_voice(voice_id)
        if folder.parent.resolve() != self.writable_root.resolve():
            raise ReadOnlyVoice(f"voice {voice_id!r} is not a deletable adapter")
        return folder

    async def add_version(self, voice_id: str, folder: Path, promote: bool) -> Voice:
        staged = await asyncio.to_thread(validate_adapter, folder, self.models.own, voice_id)
        return await asyncio.to_thread(self._add_version, voice_id, folder, staged, promote)

    def _add_version(self, voice_id: str, folder: Path, staged: Voice, promote: bool) -> Voice:
        with self._lock:
            target = self._managed_folder(voice_id)
            versions = self._versions.get(voice_id, {}).values()
            versioning.refuse_duplicate(
                voice_id, staged.checksum, [v.checksum for v in versions if isinstance(v, Voice)]
            )
            current = self.adapters.get(voice_id)
            make_versioned(target)
            pointer = read_live(target)
            assert pointer is not None
            live, newest = pointer
            number = versioning.next_version(newest)
            path = folder / MANIFEST
            staged_manifest = read_json_object(path) if path.exists() else {}
            # the voice's tenant, as its live version says (the staged one's if that is unusable)
            tenant = current.tenant if current is not None else voice_tenant(staged_manifest)
            manifest, promote = versioning.new_version_manifest(
                staged_manifest, number, tenant, promote
            )
            write_manifest(folder, manifest)
            staging = target / VERSIONS / f".{uuid.uuid4().hex}"
            shutil.move(folder, staging)
            staging.rename(target / VERSIONS / str(number))
            write_live(target, number if promote else live, number)
            self._load(target, force=True)
            added = self._versions[voice_id].get(number)
            if not isinstance(added, Voice):
                raise InvalidAdapter(added or "the adapter could not be loaded")
            return added

    async def promote(self, voice_id: str, version: int) -> Voice:
        return await asyncio.to_thread(self._promote, voice_id, version)

    def _promote(self, voice_id: str, version: int) -> Voice:
        with self._lock:
            target = self._managed_folder(voice_id)
            found = self._versions.get(voice_id, {}).get(version)
            if isinstance(found, str):
                raise UnusableVersion(f"version {version}: {found}")
            versioning.check_promotable(voice_id, version, None if found is None else found.status)
            assert found is not None
            pointer = read_live(target)
            if pointer is None:  # a one-adapter folder: version 1, live already
                return found
            assert found.adapter_path is not None
            promoted = versioning.first_promotion(read_json_object(found.adapter_path / MANIFEST))
            if promoted is not None:
                write_manifest(found.adapter_path, promoted)
            write_live(target, version, pointer[1])
            self._load(target, force=True)
            return self._versions[voice_id][version]  # type: ignore[return-value]

    async def remove_version(self, voice_id: str, version: int) -> bool:
        return await asyncio.to_thread(self._remove_version, voice_id, version)

    def _remove_version(self, voice_id: str, version: int) -> bool:
        with self._lock:
            target = self._managed_folder(voice_id)
            exists = version in self._versions.get(voice_id, {})
            if not versioning.removable(voice_id, version, self._live.get(voice_id), exists):
                return False
            doomed = target / VERSIONS / f".deleted-{uuid.uuid4().hex}"
            (target / VERSIONS / str(version)).rename(doomed)  # gone at once, whole
            shutil.rmtree(doomed, ignore_errors=True)
            self._load(target, force=True)
            return True

    async def versions(self, voice_id: str) -> list[VoiceVersion] | None:
        await self.find(voice_id)
        with self._lock:
            entries = dict(self._versions.get(voice_id, {}))
            live = self._live.get(voice_id)
        if not entries:
            return versioning.builtin_versions() if voice_id in self.builtin else None
        listed = []
        for number, entry in sorted(entries.items()):
            if isinstance(entry, str):
                listed.append(VoiceVersion(number, "ready", number == live, None, {}, entry))
                continue
            assert entry.adapter_path is not None
            path = entry.adapter_path / MANIFEST
            try:
                manifest = await asyncio.to_thread(read_json_object, path) if path.exists() else {}
            except (InvalidAdapter, OSError):  # deleted or rewritten meanwhile
                continue
            listed.append(
                versioning.listed_version(number, entry.status, live, entry.checksum, manifest)
            )
        return listed

    async def remove(self, voice_id: str) -> bool:
        voice = await self.find(voice_id)
        folder = self.writable_root / voice_id
        if voice is None and voice_id not in self._broken:
            return False
        known = self._folders.get(voice_id)
        if voice_id in self.builtin and known is None:
            raise versioning.builtin_voice(voice_id)
        if known is None or known.resolve() != folder.resolve():
            raise ReadOnlyVoice(f"voice {voice_id!r} is not a deletable adapter")
        await asyncio.to_thread(shutil.rmtree, folder, True)  # every version, and its consent
        await asyncio.to_thread(self.scan)
        return True

    async def manifest(self, voice_id: str, version: int | None = None) -> dict | None:
        voice = await self.find(voice_id, version)
        if voice is None:
            return None
        if voice.adapter_path is None or not (voice.adapter_path / MANIFEST).exists():
            return {}
        return json.loads(await asyncio.to_thread((voice.adapter_path / MANIFEST).read_text))

    async def publish(
        self, voice_id: str, published: dict[str, object], version: int | None = None
    ) -> Voice | None:
        return await asyncio.to_thread(self._publish, voice_id, published, version)

    def _publish(
        self, voice_id: str, published: dict[str, object], version: int | None
    ) -> Voice | None:
        """Under the scan lock, so two publishes of one voice cannot both find it held."""
        if voice_id in self.builtin and voice_id not in self.adapters:
            raise versioning.builtin_voice(voice_id, NotHeld)
        with self._lock:
            if version is None:
                voice = self.adapters.get(voice_id)
            else:
                found = self._versions.get(voice_id, {}).get(version)
                voice = found if isinstance(found, Voice) else None
            if voice is None or voice.adapter_path is None:
                return None
            folder = voice.adapter_path
            path = folder / MANIFEST
            manifest = read_json_object(path) if path.exists() else {}
            versioning.check_publishable(voice_id, voice_status(manifest))
            write_manifest(folder, versioning.published_manifest(manifest, published))
            self._load(self._folders[voice_id], force=True)  # load it again now
            found = self._versions.get(voice_id, {}).get(voice.version)
            return found if isinstance(found, Voice) else None

    def voices(self) -> list[Voice]:
        """Every usable voice (its live version), sorted by id."""
        with self._lock:
            found = list(self.adapters.values())
        return sorted([*self.builtin.values(), *found], key=lambda v: v.voice_id)

    def broken_adapters(self) -> list[BrokenAdapter]:
        """Voice folders whose live version failed validation, with why."""
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


def _voice_stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Changes whenever a file of the voice (any version's) is added, removed or rewritten."""
    stamp = _folder_stamp(folder)
    for path in sorted((folder / VERSIONS).glob("*")) if (folder / VERSIONS).is_dir() else []:
        stamp += _folder_stamp(path)
    return stamp


def _folder_stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Changes whenever a file in the folder is added, removed or rewritten."""
    try:
        files = sorted(folder.iterdir())
        return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    except OSError:
        return ()
