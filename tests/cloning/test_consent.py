"""The consent part of a clone, read and checked by the cloning service (not the HTTP layer):
each refusal is a ``ServiceError`` whose code the API's error table answers with a 400."""

import json
from pathlib import Path

import pytest

from voicehost.api.errors import kind_of
from voicehost.cloning.consent import (
    ConsentRequired,
    InvalidConsent,
    check_parts,
    read_record,
)

pytestmark = pytest.mark.unit

RECORD = {
    "speaker_name": "Anna Berg",
    "statement": "I agree to have my voice cloned for the support line.",
    "collected_by": "ops@example.com",
    "collected_at": "2026-12-01T10:00:00+01:00",
    "purpose": "support line",
}


def refusal(text: str) -> tuple[int, str, str]:
    with pytest.raises(InvalidConsent) as refused:
        read_record(text)
    return kind_of(refused.value).status, refused.value.code, refused.value.message


def test_a_record_is_read_validated_and_stored_as_json():
    stored = read_record(json.dumps(RECORD))
    assert stored == RECORD  # its time as sent, with its zone


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{speaker: 1,", "Invalid JSON"),
        ("[1]", "Input should be an object"),
        ("[" * 30_000 + "]" * 30_000, "recursion limit"),  # deep but small: no crash
        ('{"speaker_name": "\\ud800"}', "Invalid JSON"),  # an unpaired surrogate
        ('{"speaker_name": "A"}', "statement: Field required"),  # fields missing
        ('{"speaker_name": "A", "collected_at": "2026-12-01T10:00:00"}', "collected_at"),
    ],
)
def test_a_record_that_is_not_one_is_400_invalid_consent(text: str, said: str):
    status, code, message = refusal(text)
    assert (status, code) == (400, "invalid_consent")
    assert said in message


def test_a_record_with_unknown_fields_or_blank_values_is_refused():
    for bad in ({**RECORD, "extra": 1}, {**RECORD, "purpose": "   "}):
        assert refusal(json.dumps(bad))[:2] == (400, "invalid_consent")


def test_the_parts_go_together(tmp_path: Path):
    recording = tmp_path / "consent_recording"
    record = dict(RECORD)
    check_parts(record, recording, from_audio=True, required=True)  # all there
    check_parts(None, None, from_audio=False, required=True)  # an adapter needs none
    check_parts(None, None, from_audio=True, required=False)  # not required here
    with pytest.raises(ConsentRequired, match="goes with its 'consent' record"):
        check_parts(None, recording, from_audio=True, required=False)
    with pytest.raises(InvalidConsent, match="checked against audio to clone"):
        check_parts(record, recording, from_audio=False, required=False)
    with pytest.raises(ConsentRequired) as missing:
        check_parts(None, None, from_audio=True, required=True)
    assert kind_of(missing.value).status == 400 and missing.value.code == "consent_required"
