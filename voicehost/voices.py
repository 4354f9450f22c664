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


class VoiceExists(ValueError):
    """A voice with this id is already registered."""


class ReadOnlyVoice(ValueError):
    """A voice this service may not delete (a built-in voice, or one it does not manage)."""


@dataclass(frozen=True, slots=True)
class Voice:
    """A voice a request can name: a prompt voice of the base model, or a LoRA adapter."""

    voice_id: str
    name: str
    prompt_style: PromptStyle = "named"
    adapter_path: Path | None = None
    checksum: str | None = None  # of the adapter weights; a changed adapter is a new adapter
    tenant: str | None = None  # whose voice it is; None: shared with every tenant

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
        """The voice, ready to synthesize with, or ``None``."""
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
        """Usable voices (sorted by id) and unusable adapters."""
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
