"""Adapters across machines: a shared store that holds every voice's files, and each worker's
local disk cache of the adapters it serves.

An adapter is named by a URI. The store here is a shared directory; its URIs are relative to
the store's root (``shared:adapters/<voice_id>/<checksum>``), so machines may mount it at
different paths. An object-store backend implements the same ``AdapterStore`` protocol. The cache
verifies the weights' SHA-256 against the registry's checksum before use and evicts the least
recently used adapters beyond its size cap (never one used in the last ``IN_USE_SECONDS``,
which the engine may be loading).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from voicehost.ids import child, is_voice_id
from voicehost.voices.validation import (
    MANIFEST,
    TENANT,
    read_json_object,
    weights_checksum,
    write_manifest,
)

log = logging.getLogger(__name__)

SCHEME = "shared:"
IN_USE_SECONDS = 60.0
CHECKSUM = re.compile(r"[0-9a-f]{64}")
CHECKSUM_PREFIX = re.compile(r"[0-9a-f]{32}")  # an adapter's folder in the store
LIVE = "live"  # in a voice's folder of the store: the folder name of its live version's adapter


@dataclass(frozen=True, slots=True)
class StoredVoice:
    """A voice as the store holds it: the URI of its live version's adapter and of every
    version's (what a lost registry record is rebuilt from)."""

    live: str
    adapters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Owner:
    """Whose a stored voice is, and whether it is held (who may see it: ``can_see``)."""

    tenant: str | None
    held: bool


class AdapterFetchError(RuntimeError):
    """The adapter could not be fetched, or its weights do not match the registry's checksum."""


def _folder_names(voice_id: str, checksum: str) -> None:
    """Refuse a voice id or checksum that could not name a folder under the store or cache."""
    if not is_voice_id(voice_id) or not CHECKSUM.fullmatch(checksum):
        raise AdapterFetchError(f"bad adapter name {voice_id!r} / checksum {checksum!r}")


class AdapterStore(Protocol):
    """Where the cluster keeps adapter files."""

    def publish(self, folder: Path, voice_id: str, checksum: str) -> str:
        """Copy an adapter folder into the store; returns its URI."""
        ...

    def owner(self, voice_id: str) -> Owner | None:
        """Whose ``voice_id`` is, from its live version's manifest; None if the store does not
        hold it."""
        ...

    def download(self, uri: str, target: Path) -> None:
        """Copy the adapter at ``uri`` into the (new) folder ``target``."""
        ...

    def folder(self, uri: str) -> Path:
        """The adapter's files, read in place (a gateway validates them there)."""
        ...

    def delete(self, uri: str) -> None: ...

    def write_manifest(self, uri: str, manifest: dict) -> None:
        """Replace the adapter's ``voice.json`` (its weights, and so its URI, stay)."""
        ...

    def set_live(self, uri: str) -> None:
        """Record that the adapter at ``uri`` is its voice's live version."""
        ...

    def published(self) -> dict[str, StoredVoice]:
        """Every voice the store holds: its live adapter (as ``set_live`` said, else the
        newest) and all of them."""
        ...


class SharedDirStore:
    """The store as a directory that every gateway and worker mounts."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, uri: str) -> Path:
        if not uri.startswith(SCHEME):
            raise AdapterFetchError(f"unsupported adapter URI {uri!r} (this store holds shared:)")
        path = (self.root / uri.removeprefix(SCHEME)).resolve()
        if not path.is_relative_to((self.root / "adapters").resolve()):
            raise AdapterFetchError(f"adapter URI {uri!r} is outside the shared store")
        return path

    def publish(self, folder: Path, voice_id: str, checksum: str) -> str:
        _folder_names(voice_id, checksum)
        relative = Path("adapters") / voice_id / checksum[:32]
        target = child(child(self.root / "adapters", voice_id), checksum[:32])
        if not target.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.parent / f".{uuid.uuid4().hex}"
            shutil.copytree(folder, staging)
            try:
                staging.rename(target)
            except OSError:  # published meanwhile by someone else: same checksum, same files
                shutil.rmtree(staging, ignore_errors=True)
        return SCHEME + relative.as_posix()

    def folder(self, uri: str) -> Path:
        source = self._path(uri)
        if not source.is_dir():
            raise AdapterFetchError(f"adapter {uri!r} is not in the shared store")
        return source

    def download(self, uri: str, target: Path) -> None:
        shutil.copytree(self.folder(uri), target)

    def write_manifest(self, uri: str, manifest: dict) -> None:
        write_manifest(self.folder(uri), manifest)

    def set_live(self, uri: str) -> None:
        folder = self.folder(uri)
        staging = folder.parent / f".{LIVE}.{uuid.uuid4().hex}"
        staging.write_text(folder.name)
        os.replace(staging, folder.parent / LIVE)  # one rename: the old pointer or the new

    def published(self) -> dict[str, StoredVoice]:
        found: dict[str, StoredVoice] = {}
        root = self.root / "adapters"
        for voice in sorted(root.iterdir()) if root.is_dir() else []:
            if not is_voice_id(voice.name):
                continue  # staging folders (".<uuid>") and strays
            if (stored := self._stored(voice)) is not None:
                found[voice.name] = stored
        return found

    def owner(self, voice_id: str) -> Owner | None:
        if not is_voice_id(voice_id):
            return None
        stored = self._stored(self.root / "adapters" / voice_id)
        if stored is None:
            return None
        try:
            manifest = read_json_object(self.folder(stored.live) / MANIFEST)
        except (OSError, ValueError, AdapterFetchError):  # unreadable: nobody's to be told of
            return Owner(tenant="", held=True)
        return Owner(manifest.get(TENANT), manifest.get("status") == "held")

    def _stored(self, voice: Path) -> StoredVoice | None:
        """The voice in ``voice`` (its folder), or None if it holds no adapter."""
        try:
            adapters = {
                p.name: p
                for p in voice.iterdir()
                if p.is_dir() and CHECKSUM_PREFIX.fullmatch(p.name)
            }
            if not adapters:
                return None
            pointer = voice / LIVE
            named = pointer.read_text().strip() if pointer.is_file() else ""
            live = adapters.get(named) or max(adapters.values(), key=lambda p: p.stat().st_mtime)
            uris = tuple(SCHEME + p.relative_to(self.root).as_posix() for p in adapters.values())
            return StoredVoice(SCHEME + live.relative_to(self.root).as_posix(), uris)
        except OSError:  # deleted meanwhile, or never there
            return None

    def delete(self, uri: str) -> None:
        path = self._path(uri)
        shutil.rmtree(path, ignore_errors=True)
        voice = path.parent
        try:
            if not any(p.is_dir() for p in voice.iterdir()):  # its last version is gone
                (voice / LIVE).unlink(missing_ok=True)
            voice.rmdir()  # the voice's folder, once its last version is gone
        except OSError:
            pass


class AdapterCache:
    """A worker's local copies of adapters: ``<dir>/<checksum>/<voice_id>/``, LRU-evicted."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        store: AdapterStore,
        in_use_seconds: float = IN_USE_SECONDS,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.store = store
        self.in_use_seconds = in_use_seconds
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)

    def fetch(self, uri: str, checksum: str, voice_id: str) -> Path:
        """A verified local folder of the adapter (named ``voice_id``), fetched if needed;
        marks it used (call it for every use, so that eviction is least recently used)."""
        _folder_names(voice_id, checksum)
        entry = child(self.root, checksum[:32])
        folder = child(entry, voice_id)
        with self._lock:
            if folder.is_dir():
                os.utime(entry)
                return folder
        staging = self.root / f".{uuid.uuid4().hex}"
        try:
            self.store.download(uri, staging / voice_id)
            actual = weights_checksum(staging / voice_id)
            if actual != checksum:
                raise AdapterFetchError(
                    f"adapter {voice_id!r} from {uri} has checksum {actual[:12]}..., "
                    f"the registry says {checksum[:12]}..."
                )
            with self._lock:
                entry.mkdir(exist_ok=True)
                try:
                    (staging / voice_id).rename(folder)
                except OSError:  # another front end of this host fetched it meanwhile
                    if not folder.is_dir():
                        raise
                os.utime(entry)
                self._evict(keep=entry)
        except OSError as exc:
            raise AdapterFetchError(
                f"fetching adapter {voice_id!r} from {uri} failed: {exc}"
            ) from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return folder

    def entries(self) -> list[Path]:
        """Cached adapters, least recently used first."""
        found = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return sorted(found, key=lambda p: p.stat().st_mtime)

    def size(self) -> int:
        return sum(_tree_size(p) for p in self.entries())

    def _evict(self, keep: Path) -> None:
        entries = self.entries()
        sizes = {p: _tree_size(p) for p in entries}
        total = sum(sizes.values())
        recent = time.time() - self.in_use_seconds
        for entry in entries:
            if total <= self.max_bytes:
                break
            if entry == keep or entry.stat().st_mtime > recent:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            total -= sizes[entry]
            log.info("adapter cache: evicted %s (%d bytes)", entry.name, sizes[entry])


def _tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
