"""The model this process serves, as the settings name it: the weights and the codec (the dev
model's with ``--dev``), its languages and built-in voices, what its adapters must be and the
folders they are found in, and whether a segment of text fits its context. Here, not in the
settings, because they need the dev model's layout and Orpheus' token format, which the
settings (read by every layer) do not import."""

from __future__ import annotations

from pathlib import Path

from voicehost.config import Settings
from voicehost.model import orpheus
from voicehost.model.devmodel import DevModelPaths
from voicehost.model.languages import ModelLanguages, model_languages
from voicehost.voices.validation import AdapterRules, ModelShape


def served_model(settings: Settings) -> str:
    """The weights to load: the dev model's directory or the configured model."""
    if settings.dev:
        return str(DevModelPaths(settings.dev_dir).model)
    return settings.configured_model()


def served_codec(settings: Settings) -> str:
    """The SNAC weights: the dev model's small codec or the configured one."""
    return str(DevModelPaths(settings.dev_dir).codec) if settings.dev else settings.codec


def served_languages(settings: Settings) -> ModelLanguages:
    """What the served model speaks and its built-in voices (``voicehost.model.languages``);
    a process that serves no model (a gateway without one) has the settings' or English."""
    try:
        model = served_model(settings)
    except ValueError:
        model = ""
    return model_languages(settings, model)


def adapter_rules(settings: Settings, model: str | None = None) -> AdapterRules:
    """What an adapter must be to be served by ``model`` (by default the served one): its
    base model, rank, projection shapes (when the model's config is at hand) and languages."""
    served = model or served_model(settings)
    config = Path(served) / "config.json"
    shape = ModelShape.from_config(config) if config.is_file() else None
    languages = served_languages(settings).languages
    return AdapterRules.from_settings(settings, served, shape, languages)


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
