"""Voices: what a request can name (a prompt voice of the base model, or a LoRA adapter), and the
``VoiceDirectory`` that finds them: on disk (``voicehost.voice_folders``) or in a cluster's Redis
(``voicehost.cluster.voices``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from voicehost.adapter_validation import AdapterRules

PromptStyle = Literal["plain", "named"]
# held: a clone that measured below the evaluation gate; only its tenant and admins reach it,
# to listen, until one of them publishes it (``VoiceDirectory.publish``).
VoiceStatus = Literal["ready", "held"]


class VoiceExists(ValueError):
    """A voice with this id is already registered."""


class ReadOnlyVoice(ValueError):
    """A voice this service may not delete (a built-in voice, or one it does not manage)."""


class NotHeld(ValueError):
    """Publishing a voice that is not held (it is ready already, or a built-in voice)."""


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

    def prompt_name(self) -> str | None:
        """The speaker name put before the text, or ``None`` for a plain prompt."""
        return self.voice_id if self.prompt_style == "named" else None


@dataclass(frozen=True, slots=True)
class BrokenAdapter:
    """An adapter folder that failed validation."""

    voice_id: str
    path: Path
    error: str


class VoiceDirectory(Protocol):
    """Where voices are registered: the adapter folders on disk
    (``voicehost.voice_folders.FolderVoiceDirectory``) or Redis plus a shared adapter store
    (``voicehost.cluster.voices.RedisVoiceDirectory``)."""

    rules: AdapterRules
    builtin: dict[str, Voice]

    async def find(self, voice_id: str) -> Voice | None:
        """The voice, ready or held (who may reach a held one is the edge's rule), or ``None``."""
        ...

    def broken(self, voice_id: str) -> str | None:
        """Why a voice that exists cannot be used, if it cannot."""
        ...

    def loaded(self) -> int:
        """Adapters this process has validated and can hand to the engine."""
        ...

    def missing(self) -> int:
        """Voices known to exist that the directory cannot name yet (a cluster's Redis that
        lost its records, being rebuilt from the shared store); 0 when it is whole."""
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

    async def manifest(self, voice_id: str) -> dict | None:
        """The voice's ``voice.json`` (empty for a built-in voice), or ``None``."""
        ...

    async def publish(self, voice_id: str, published: dict[str, object]) -> Voice | None:
        """Make a held voice ready, recording ``published`` (why, by whom, when) under that key
        in its ``voice.json``; the adapter's weights, and so its checksum, stay as they are.
        ``None`` if there is no such voice; raises ``NotHeld`` for one that is not held."""
        ...
