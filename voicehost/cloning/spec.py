"""The training spec: what one run of the recipe (``lora_training.recipe.VoiceJob``) gets, built
in this one place from the service's settings, for a clone job (``voicehost.cloning.intake``)
and for ``voicehost train`` alike; each caller says only what it chooses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from lora_training.recipe import VoiceJob
from lora_training.train import TrainSettings, learning_rate_for
from voicehost.config import Settings
from voicehost.model.served import served_codec, served_model


def training_spec(
    settings: Settings,
    audio: list[Path],
    voice_id: str,
    adapters_dir: Path,
    work_dir: Path,
    **chosen: Any,
) -> VoiceJob:
    """A run that trains ``voice_id`` from ``audio`` on the served base model and codec, with
    the settings' epochs, learning rate, least speech and speaker checks; ``chosen`` overrides
    any of ``VoiceJob``'s fields (``name``, ``transcripts``, ``train``, ``trim``, ...)."""
    spec = VoiceJob(
        audio=audio,
        voice_id=voice_id,
        name=voice_id,
        base_model=served_model(settings),
        base_model_name=settings.served_base_name(),
        codec=served_codec(settings),
        adapters_dir=adapters_dir,
        work_dir=work_dir,
        train=TrainSettings(
            epochs=settings.clone_epochs, learning_rate=learning_rate_for(settings.dev)
        ),
        min_speech_seconds=settings.min_speech_seconds,
        speaker_embedder=settings.speaker_embedder,
        speaker_min_similarity=settings.speaker_min_similarity,
        speaker_min_pitch_shift=settings.speaker_min_pitch_shift,
    )
    return replace(spec, **chosen)
