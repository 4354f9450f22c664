"""The model this process serves, as the settings name it: the weights and the codec (the dev
model's with ``--dev``), the folders its voice adapters are found in, and whether a segment of
text fits its context. Here, not in the settings, because they need the dev model's layout and
Orpheus' token format, which the settings (read by every layer) do not import."""

from __future__ import annotations

from pathlib import Path

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths


def served_model(settings: Settings) -> str:
    """The weights to load: the dev model's directory or the configured model."""
    if settings.dev:
        return str(DevModelPaths(settings.dev_dir).model)
    return settings.configured_model()


def served_codec(settings: Settings) -> str:
    """The SNAC weights: the dev model's small codec or the configured one."""
    return str(DevModelPaths(settings.dev_dir).codec) if settings.dev else settings.codec


def adapter_roots(settings: Settings) -> list[Path]:
    """Folders holding ``<voice_id>/`` adapters: the adapters dir, plus the dev voices."""
    roots = [settings.adapters_dir]
    if settings.dev:
        roots.append(DevModelPaths(settings.dev_dir).adapters)
    return roots


def check_segments_fit(settings: Settings) -> None:
    """A segment of ``segment_max_chars`` must fit: the speech it needs, its text and the
    previous segment's carried in the prompt (at worst a token per character); ``ValueError``
    otherwise (a server refuses to start, a runtime change is refused)."""
    chars = settings.segment_max_chars
    carried = orpheus.TOKENS_PER_FRAME * settings.continuity_frames
    needed = orpheus.min_audio_tokens("x" * chars) + 2 * chars + carried
    if needed + 32 > settings.max_model_len:
        raise ValueError(
            f"segment_max_chars {chars} needs up to {needed + 32} tokens of context with "
            f"continuity_frames {settings.continuity_frames}; max_model_len is "
            f"{settings.max_model_len}: lower segment_max_chars"
        )
