"""Voices: what a request can name (a prompt voice of the base model, or a LoRA adapter), and the
``VoiceDirectory`` that finds them: on disk (``voicehost.voices.folders``) or in a cluster's Redis
(``voicehost.cluster.voices``).

A voice id names a sequence of immutable versions (1, 2, ...), each one adapter (by checksum)
with its own ``voice.json``; one version is live. ``"anna"`` is the live version, ``"anna@3"``
pins version 3 (``voicehost.ids.split_voice_ref``). A built-in voice is version 1, always. What
either directory may do with versions (numbering, promotion, deletion) is
``voicehost.voices.versioning``'s to say.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from voicehost.errors import ServiceError

if TYPE_CHECKING:
    from voicehost.voices.validation import ServedModels

PromptStyle = Literal["plain", "named"]
# held: a clone that measured below the evaluation gate; only its tenant and admins reach it,
# to listen, until one of them publishes it (``VoiceDirectory.publish``).
VoiceStatus = Literal["ready", "held"]
# How a version is listed: held (by the gate); else ready while it is live, retired once it has
# been live and another one is, candidate if it has never been live (added with promote false).
VersionStatus = Literal["candidate", "ready", "held", "retired"]


class VoiceNotFound(ServiceError, LookupError):
    """No such voice: or another tenant's, which is told the same (never that it exists)."""

    code = "voice_not_found"

    def __init__(self, ref: str, message: str | None = None) -> None:
        super().__init__(message or f"voice {ref!r} does not exist")


class VoiceExists(ServiceError, ValueError):
    """A voice with this id is already registered."""

    code = "voice_exists"


class ReadOnlyVoice(ServiceError, ValueError):
    """A voice this service may not delete (a built-in voice, or one it does not manage)."""

    code = "voice_read_only"


class NotHeld(ServiceError, ValueError):
    """Publishing a voice that is not held (it is ready already, or a built-in voice)."""

    code = "voice_not_held"


class NoSuchVersion(ServiceError, LookupError):
    """The voice has no such version."""

    code = "version_not_found"


class LiveVersion(ServiceError, ValueError):
    """Deleting the live version of a voice (promote another one first)."""

    code = "version_live"


class HeldVersion(ServiceError, ValueError):
    """Promoting a held version (publish it first)."""

    code = "version_held"


class UnusableVersion(ServiceError, ValueError):
    """Promoting a version whose adapter fails validation."""

    code = "voice_unusable"


class DuplicateVersion(ServiceError, ValueError):
    """A new version with the same adapter (checksum) as one the voice has."""

    code = "version_exists"


class RegistryRebuilding(ServiceError, LookupError):
    """A voice the cluster's store holds whose registry record is missing: Redis lost it and
    it is being rebuilt from the store (a 503 to retry, never a 404: the voice exists). Its
    ``tenant`` and ``held`` (read from the store) say who may be told so: to anyone else it
    is a voice that does not exist, as outside the gap."""

    code = "registry_rebuilding"

    def __init__(self, voice_id: str, tenant: str | None = None, held: bool = False) -> None:
        super().__init__(
            f"voice {voice_id!r} is being restored to the cluster's registry: try again"
        )
        self.voice_id = voice_id
        self.tenant = tenant
        self.held = held


class RegistryIncomplete(ServiceError, LookupError):
    """A list of the cluster's voices while its registry is being rebuilt: it would miss some
    (a 503 to retry, never a list that silently omits)."""

    code = "registry_rebuilding"

    def __init__(self) -> None:
        super().__init__(
            "the cluster's voice registry is being restored from its store: a list now would "
            "miss voices; try again"
        )


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice a request can name: a prompt voice of the base model, or a LoRA adapter."""

    voice_id: str
    name: str
    prompt_style: PromptStyle = "named"
    adapter_path: Path | None = None
    checksum: str | None = None  # of the adapter weights; a changed adapter is a new adapter
    tenant: str | None = None  # whose voice it is; None: shared with every tenant
    status: VoiceStatus = "ready"
    version: int = 1  # which of the voice's versions this is
    language: str = "en"  # the one it speaks (BCP-47): a request's language is its voice's
    base_model: str = ""  # the base model its adapter is for ("": the served one, built in)

    def prompt_name(self) -> str | None:
        """The speaker name put before the text, or ``None`` for a plain prompt."""
        return self.voice_id if self.prompt_style == "named" else None


@dataclass(frozen=True, slots=True)
class VoiceVersion:
    """One version of a voice, as its versions are listed."""

    version: int
    status: VersionStatus
    live: bool
    checksum: str | None
    manifest: dict
    error: str | None = None  # why its adapter is unusable, if it is


@dataclass(frozen=True, slots=True)
class BrokenAdapter:
    """An adapter folder that failed validation."""

    voice_id: str
    path: Path
    error: str


class VoiceDirectory(Protocol):
    """Where voices are registered: the adapter folders on disk
    (``voicehost.voices.folders.FolderVoiceDirectory``) or Redis plus a shared adapter store
    (``voicehost.cluster.voices.RedisVoiceDirectory``)."""

    models: ServedModels  # the served model's adapter rules (``own``) and a gateway's workers'
    builtin: dict[str, Voice]

    async def find(self, voice_id: str, version: int | None = None) -> Voice | None:
        """The voice's live version (or ``version``), ready or held (who may reach a held one
        is the edge's rule), or ``None``."""
        ...

    def broken(self, voice_id: str, version: int | None = None) -> str | None:
        """Why a voice (its live version, or ``version``) that exists cannot be used, if it
        cannot."""
        ...

    def loaded(self) -> int:
        """Adapters this process has validated and can hand to the engine."""
        ...

    def missing(self) -> int:
        """Voices known to exist that the directory cannot name yet (a cluster's Redis that
        lost its records, being rebuilt from the shared store); 0 when it is whole."""
        ...

    async def health(self) -> dict[str, object]:
        """What ``/healthz`` says of the directory: ``registry`` whole or rebuilding (with
        ``missing_voices``), and in a cluster whether ``redis`` answers, as they are now (the
        field is the cluster's Redis registry's; a directory of folders is always whole)."""
        ...

    async def list_voices(self) -> tuple[list[Voice], list[BrokenAdapter]]:
        """Usable voices, ready or held (sorted by id), and unusable adapters."""
        ...

    async def exists(self, voice_id: str) -> bool: ...

    async def add(self, voice_id: str, folder: Path) -> Voice:
        """Register a staged adapter folder (moved or copied); raises ``VoiceExists``,
        ``InvalidAdapter``."""
        ...

    async def remove(self, voice_id: str) -> bool:
        """Delete a voice; ``False`` if there is none; raises ``ReadOnlyVoice``."""
        ...

    async def manifest(self, voice_id: str, version: int | None = None) -> dict | None:
        """The ``voice.json`` of the voice's live version (or ``version``; empty for a built-in
        voice), or ``None``."""
        ...

    async def publish(
        self, voice_id: str, published: dict[str, object], version: int | None = None
    ) -> Voice | None:
        """Make a held version (the live one by default) ready, recording ``published`` (why,
        by whom, when) under that key in its ``voice.json``; the adapter's weights, and so its
        checksum, stay as they are. ``None`` if there is no such voice or version; raises
        ``NotHeld`` for one that is not held."""
        ...

    async def versions(self, voice_id: str) -> list[VoiceVersion] | None:
        """The voice's versions, oldest first, or ``None`` if there is no such voice."""
        ...

    async def add_version(self, voice_id: str, folder: Path, promote: bool) -> Voice:
        """Add a staged adapter folder (moved or copied) as the voice's next version, live at
        once if ``promote`` (and it is not held). Raises ``NoSuchVersion`` if the voice does
        not exist, ``ReadOnlyVoice``, ``DuplicateVersion``, ``InvalidAdapter``."""
        ...

    async def promote(self, voice_id: str, version: int) -> Voice:
        """Make ``version`` the live one, in one atomic step; the one it replaces stays
        servable when pinned. Raises ``NoSuchVersion``, ``HeldVersion``, ``ReadOnlyVoice``,
        ``UnusableVersion``."""
        ...

    async def remove_version(self, voice_id: str, version: int) -> bool:
        """Delete one version; ``False`` if there is none. Raises ``LiveVersion`` for the live
        one, ``ReadOnlyVoice``."""
        ...
