"""The languages a base model speaks and the language of each of its built-in voices.

One Orpheus-format checkpoint may speak several languages (Canopy Labs' Spanish and Italian
finetune is one model with Spanish and Italian voices), and every voice speaks one: a request's
language is its voice's. What a model speaks is read, first found first:

1. the settings: ``VOICEHOST_LANGUAGES``, and ``VOICEHOST_VOICE_LANGUAGES`` for a built-in
   voice's own;
2. the model's own metadata: ``voicehost.json`` in its folder (``{"languages": [...],
   "voices": {"pierre": "fr"}}``; the dev model writes one), else the ``language:`` of its
   model card's front matter (``README.md``, as the Hugging Face hub writes it);
3. Canopy Labs' checkpoint names (``3b-fr-ft-research_release``: French; ``3b-es_it-...``:
   Spanish and Italian), with each finetune's voices from its model card
   (``../shared/ORPHEUS.md``);
4. English, Orpheus' own 8 voices.

Built-in voices are the setting's (``VOICEHOST_BUILTIN_VOICES``) if set, else the metadata's,
else the known voices of each language the model speaks. Their names need not be voice ids
(Korean voices are named in Hangul): a built-in voice is looked up by its name as the model
knows it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from voicehost.config import LANGUAGE_TAG, ORPHEUS_VOICES, Settings
from voicehost.errors import ServiceError
from voicehost.text.stage import primary_language

DEFAULT_LANGUAGE = "en"
METADATA = "voicehost.json"  # in a model's folder: its languages and its voices' languages
MODEL_CARD = "README.md"

# The voices of each language's finetune, from the model cards (ORPHEUS.md): Korean, Hindi
# and Mandarin finetunes exist, but their voice names are not confirmed here (set
# VOICEHOST_BUILTIN_VOICES for them).
KNOWN_VOICES: dict[str, tuple[str, ...]] = {
    "en": tuple(ORPHEUS_VOICES),
    "fr": ("pierre", "amelie", "marie"),
    "de": ("jana", "thomas", "max"),
    "es": ("javi", "sergio", "maria"),
    "it": ("pietro", "giulia", "carlo"),
}
# Canopy Labs' multilingual release: canopylabs/3b-<langs>-(ft|pretrain)-research_release
_CANOPY_NAME = re.compile(r"(?:^|/)3b-(?P<langs>[a-z]{2}(?:_[a-z]{2})*)-(?:ft|pretrain)")
_FRONT_MATTER = re.compile(r"\A---\s*\n(?P<body>.*?)\n---\s*(\n|\Z)", re.S)


class UnspokenLanguage(ServiceError, ValueError):
    """A voice asked for in a language the base model does not speak."""

    code = "unsupported_language"


def same_language(a: str, b: str) -> bool:
    """Whether two tags name one language: their primary subtags agree (``en-US`` and ``en``;
    a region or script does not change which words a lexicon or a text rule applies to)."""
    return primary_language(a) == primary_language(b)


def check_language(language: str, spoken: tuple[str, ...]) -> str:
    """``language`` if it is one of ``spoken`` (a base model's), else ``UnspokenLanguage``
    naming them."""
    if not LANGUAGE_TAG.fullmatch(language) or language not in spoken:
        raise UnspokenLanguage(f"language {language!r}: the base model speaks {', '.join(spoken)}")
    return language


@dataclass(frozen=True)
class ModelLanguages:
    """What one base model speaks: its languages (the first is a new voice's default) and
    each built-in voice's language; ``source`` says where they were read."""

    languages: tuple[str, ...]
    voices: dict[str, str] = field(default_factory=dict)
    source: str = "default"

    @property
    def default(self) -> str:
        return self.languages[0]

    def speaks(self, language: str) -> bool:
        return language in self.languages

    def describe(self) -> str:
        """``fr (pierre, amelie, marie)``: each language and its built-in voices."""
        parts = []
        for language in self.languages:
            voices = [v for v, lang in self.voices.items() if lang == language]
            parts.append(f"{language} ({', '.join(voices)})" if voices else language)
        return "; ".join(parts)


def read_metadata(model: Path) -> tuple[list[str], dict[str, str]]:
    """The languages and voices a model's folder declares (``voicehost.json``, else its model
    card's ``language:``); empty where it says nothing."""
    if not model.is_dir():
        return [], {}
    own = model / METADATA
    if own.is_file():
        data = json.loads(own.read_text())
        voices = {str(k): str(v) for k, v in (data.get("voices") or {}).items()}
        return [str(lang) for lang in data.get("languages") or []], voices
    card = model / MODEL_CARD
    if card.is_file():
        return card_languages(card.read_text(errors="replace")), {}
    return [], {}


def card_languages(card: str) -> list[str]:
    """The ``language:`` of a model card's YAML front matter: ``language: fr`` or a list
    (``- fr`` lines or ``[fr, de]``)."""
    found = _FRONT_MATTER.match(card)
    if not found:
        return []
    languages: list[str] = []
    lines = found["body"].splitlines()
    for index, line in enumerate(lines):
        key, _, value = line.partition(":")
        if key.strip() != "language" or line.startswith((" ", "\t")):
            continue
        value = value.strip()
        if value.startswith("["):
            languages = [v.strip(" '\"") for v in value.strip("[]").split(",") if v.strip()]
        elif value:
            languages = [value.strip("'\"")]
        else:
            for item in lines[index + 1 :]:
                if not item.lstrip().startswith("- "):
                    break
                languages.append(item.lstrip()[2:].strip(" '\""))
        break
    return [lang for lang in languages if lang]


def checkpoint_languages(name: str) -> list[str]:
    """The languages of a Canopy Labs checkpoint, from its name (``3b-es_it-ft-...``)."""
    found = _CANOPY_NAME.search(name.lower())
    return found["langs"].split("_") if found else []


def model_languages(settings: Settings, model: str) -> ModelLanguages:
    """What ``model`` (the weights served: a folder or a hub id) speaks, as the module says."""
    declared, declared_voices = read_metadata(Path(model))
    if settings.languages:
        languages, source = list(settings.languages), "VOICEHOST_LANGUAGES"
    elif declared:
        languages, source = declared, f"the model's metadata ({model})"
    elif named := checkpoint_languages(model):
        languages, source = named, "the checkpoint's name"
    else:
        languages, source = [DEFAULT_LANGUAGE], "the default"
    if settings.builtin_voices is not None:
        names = list(settings.builtin_voices)
    elif declared_voices:
        names = list(declared_voices)
    else:
        names = [v for lang in languages for v in KNOWN_VOICES.get(lang, ())]
    known = {v: lang for lang in languages for v in KNOWN_VOICES.get(lang, ())}
    voices = {}
    for name in names:
        language = (
            settings.voice_languages.get(name)
            or declared_voices.get(name)
            or known.get(name)
            or languages[0]
        )
        if language not in languages:
            raise ValueError(
                f"built-in voice {name!r} speaks {language}, which the model does not "
                f"({', '.join(languages)}): set VOICEHOST_LANGUAGES or VOICEHOST_VOICE_LANGUAGES"
            )
        voices[name] = language
    return ModelLanguages(tuple(dict.fromkeys(languages)), voices, source)
