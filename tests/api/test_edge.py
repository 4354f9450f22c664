"""The shared HTTP edge's pure parts: JSON that is refused before it can fail deeper."""

from __future__ import annotations

import pytest

from voicehost.api.edge import load_json

pytestmark = pytest.mark.unit


def test_plain_json_loads_unchanged():
    assert load_json('{"input": "Hé <laugh>", "n": [1, {"k": "v"}]}') == {
        "input": "Hé <laugh>",
        "n": [1, {"k": "v"}],
    }


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "Expecting property name"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"input": "\\ud800"}', "unpaired UTF-16 surrogate"),
        ('{"input": "ok", "deep": [["\\udfff"]]}', "unpaired UTF-16 surrogate"),
        ('{"\\ud83d": 1}', "unpaired UTF-16 surrogate"),  # a key, too
    ],
)
def test_what_would_fail_later_is_refused_here_with_why(text, why):
    with pytest.raises(ValueError, match=why):
        load_json(text)


def test_a_surrogate_pair_is_one_character_and_welcome():
    assert load_json('{"input": "\\ud83d\\ude00"}') == {"input": "\N{GRINNING FACE}"}
