"""What a base model speaks (``voicehost.model.languages``): the settings first, then the model's
own metadata (the dev model's ``voicehost.json``, a model card's ``language:``), then Canopy
Labs' checkpoint names, else English; each built-in voice's language, and an adapter's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from voicehost.config import ORPHEUS_VOICES, Settings
from voicehost.model.devmodel import DevModelPaths, dev_voices, write_languages
from voicehost.model.languages import (
    UnspokenLanguage,
    card_languages,
    check_language,
    checkpoint_languages,
    model_languages,
)
from voicehost.voices.validation import AdapterRules, InvalidAdapter
from voicehost.voices.versioning import builtin_voices

pytestmark = pytest.mark.unit


def test_an_english_model_speaks_english_with_orpheus_voices_as_before():
    spoken = model_languages(Settings(), "canopylabs/orpheus-3b-0.1-ft")
    assert spoken.languages == ("en",) and spoken.source == "the default"
    assert spoken.voices == dict.fromkeys(ORPHEUS_VOICES, "en")
    assert builtin_voices(spoken.voices)["tara"].language == "en"


def test_canopys_checkpoints_speak_their_languages_with_their_voices():
    french = model_languages(Settings(), "canopylabs/3b-fr-ft-research_release")
    assert french.languages == ("fr",) and french.source == "the checkpoint's name"
    assert french.voices == {"pierre": "fr", "amelie": "fr", "marie": "fr"}
    # one model, two languages: each voice its own
    both = model_languages(Settings(), "/models/3b-es_it-ft-research_release")
    assert both.languages == ("es", "it")
    assert both.voices["javi"] == "es" and both.voices["giulia"] == "it"
    assert both.describe() == "es (javi, sergio, maria); it (pietro, giulia, carlo)"
    # Korean: a finetune whose voice names are not known here has none until they are set
    korean = model_languages(Settings(), "canopylabs/3b-ko-ft-research_release")
    assert korean.languages == ("ko",) and korean.voices == {}
    hangul = Settings(builtin_voices=["유나", "준서"])
    named = model_languages(hangul, "x/3b-ko-ft-research_release")
    assert named.voices == {"유나": "ko", "준서": "ko"}
    assert checkpoint_languages("meta-llama/Llama-3.2-3B") == []


def test_the_models_own_metadata_and_model_card_say_what_it_speaks(tmp_path: Path):
    model = tmp_path / "my-finetune"
    model.mkdir()
    (model / "README.md").write_text("---\nlicense: apache-2.0\nlanguage:\n- de\n---\n# Mine\n")
    assert model_languages(Settings(), str(model)).languages == ("de",)
    assert model_languages(Settings(), str(model)).voices["jana"] == "de"
    (model / "voicehost.json").write_text(
        json.dumps({"languages": ["it", "es"], "voices": {"lucia": "es", "gianni": "it"}})
    )
    spoken = model_languages(Settings(), str(model))
    assert spoken.languages == ("it", "es") and spoken.default == "it"
    assert spoken.voices == {"lucia": "es", "gianni": "it"}
    assert "metadata" in spoken.source
    assert card_languages("---\nlanguage: [fr, 'de']\n---\n") == ["fr", "de"]
    assert card_languages("---\nlanguage: hi\n---\n") == ["hi"]
    assert card_languages("# no front matter\nlanguage: fr\n") == []


def test_the_settings_come_first_and_a_voice_outside_the_models_languages_is_refused():
    settings = Settings(languages="es,it", voice_languages={"tara": "it"}, builtin_voices=["tara"])
    spoken = model_languages(settings, "canopylabs/3b-fr-ft-research_release")
    assert spoken.languages == ("es", "it") and spoken.voices == {"tara": "it"}
    assert spoken.source == "VOICEHOST_LANGUAGES"
    with pytest.raises(ValueError, match="speaks de, which the model does not"):
        model_languages(Settings(voice_languages={"tara": "de"}), "orpheus")
    for bad in ("EN", "english", "fr_FR", "[]"):
        with pytest.raises(ValidationError):
            Settings(languages=bad)


def test_a_dev_model_of_a_language_answers_to_its_voices(tmp_path: Path):
    paths = DevModelPaths(tmp_path / "dev")
    paths.model.mkdir(parents=True)
    write_languages(paths, "fr")
    spoken = model_languages(Settings(), str(paths.model))
    assert spoken.languages == ("fr",) and set(spoken.voices) == {"pierre", "amelie", "marie"}
    assert dev_voices("ko") == {"ko-a": "ko", "ko-b": "ko"}


def test_an_adapter_speaks_a_language_of_its_base_model():
    rules = AdapterRules("orpheus", 16, languages=("es", "it"))
    assert rules.language_of({}) == "es"  # none said: the model's first
    assert rules.language_of({"language": "it"}) == "it"
    with pytest.raises(InvalidAdapter, match=r"speaks 'fr'.*speaks es, it"):
        rules.language_of({"language": "fr"})
    assert check_language("it", rules.languages) == "it"
    with pytest.raises(UnspokenLanguage) as refused:
        check_language("fr", rules.languages)
    assert refused.value.code == "unsupported_language"
