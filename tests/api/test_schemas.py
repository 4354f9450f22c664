"""The wire schemas say exactly what the server takes: strict types, listed formats and rates."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from voicehost.api.speech import RealtimeConfig, SpeechRequest
from voicehost.api.voices import PublishRequest
from voicehost.audio.formats import FORMATS, SAMPLE_RATES

pytestmark = pytest.mark.unit

BASE = {"input": "Hi.", "voice": "tara"}


@pytest.mark.parametrize(
    "bad",
    [
        {"seed": True},  # a boolean is no integer here
        {"seed": "7"},
        {"sample_rate": "24000"},
        {"sample_rate": 24000.5},
        {"seed": 7.5},
        {"continuity": 0},
        {"normalize": "yes"},
        {"trim_silence": 1},
        {"input": 5},
        {"voice": ["tara"]},
        {"response_format": 3},
        {"speed": "2"},
        {"speed": True},
        {"speed": 4.5},
        {"speed": 0.2},
        {"instructions": 3},
    ],
)
def test_loose_types_are_refused(bad):
    with pytest.raises(ValidationError):
        SpeechRequest.model_validate({**BASE, **bad})


def test_the_right_types_pass_unchanged():
    body = SpeechRequest.model_validate(
        {**BASE, "seed": 7, "sample_rate": 16000, "continuity": False, "speed": 4}
    )
    assert (body.seed, body.sample_rate, body.continuity, body.speed) == (7, 16000, False, 4.0)
    assert RealtimeConfig.model_validate({"type": "config", "voice": "tara", "speed": 0.25}).speed


def test_integral_numbers_are_integers_as_json_schema_counts_them():
    """``3042.0`` is an integer to JSON Schema (and to the clients it generates): accepted for
    every integer field, as the integer it is."""
    body = SpeechRequest.model_validate({**BASE, "seed": 7.0, "sample_rate": 16000.0})
    assert (body.seed, body.sample_rate) == (7, 16000)
    assert isinstance(body.seed, int) and isinstance(body.sample_rate, int)
    promote = PublishRequest.model_validate({"reason": "heard it", "version": 3042.0})
    assert promote.version == 3042 and isinstance(promote.version, int)
    with pytest.raises(ValidationError):
        PublishRequest.model_validate({"reason": "heard it", "version": 3042.5})
    assert SpeechRequest.model_json_schema()["properties"]["seed"]["anyOf"][0]["type"] == "integer"


def test_the_document_lists_the_formats_rates_and_what_is_implemented():
    properties = SpeechRequest.model_json_schema()["properties"]
    assert properties["response_format"]["enum"] == list(FORMATS)
    assert properties["response_format"]["default"] == "mp3"  # as OpenAI's API
    assert properties["sample_rate"]["enum"] == [*SAMPLE_RATES, None]
    assert properties["input"]["minLength"] == 1
    assert (properties["speed"]["minimum"], properties["speed"]["maximum"]) == (0.25, 4.0)
    assert properties["instructions"]["anyOf"][0]["type"] == "string"
    config = RealtimeConfig.model_json_schema()["properties"]
    assert config["response_format"]["enum"] == list(FORMATS)
    assert config["response_format"]["default"] == "pcm"
