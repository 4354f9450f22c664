"""Ids that name folders: each pattern checked whole, at its edges, and ``child`` as the one way
from an id to a path under its root; the one timestamp format, and the older ones read back."""

from pathlib import Path

import pytest

from voicehost.ids import as_iso, child, is_job_id, is_voice_id, now_iso, parse_iso

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("voice_id", ["a", "0", "dev-a", "my_voice-2", "a" * 64, "9" + "_" * 63])
def test_voice_ids_of_1_to_64_lowercase_letters_digits_dashes_and_underscores_pass(voice_id):
    assert is_voice_id(voice_id)


@pytest.mark.parametrize(
    "voice_id",
    [
        "",
        "a" * 65,
        "dev.a",  # a dot inside: "." and ".." are the path components to keep out
        "dev.",
        ".dev",
        "a..b",
        "-dev",  # the first character is a letter or a digit
        "_dev",
        "Dev",
        "dev a",
        "dev/a",
        "dev\\a",
        "dev%2f",
        "dev-a\n",
        "d\u00e9v",
    ],
)
def test_voice_ids_outside_the_pattern_are_refused(voice_id):
    assert not is_voice_id(voice_id)


def test_only_strings_are_ids():
    assert not is_voice_id(None) and not is_voice_id(7) and not is_voice_id(b"dev-a")
    assert not is_job_id(None) and not is_job_id(b"job-0123456789abcdef")


@pytest.mark.parametrize(
    ("job_id", "valid"),
    [
        ("job-0123456789abcdef", True),
        ("job-0123456789abcde", False),  # 15 hex digits
        ("job-0123456789abcdef0", False),  # 17
        ("job-0123456789ABCDEF", False),
        ("job-0123456789abcde.", False),  # a dot inside
        ("job-01234567.9abcdef", False),
        ("jobs-0123456789abcdef", False),
        ("job-0123456789abcdeg", False),
    ],
)
def test_a_job_id_is_job_and_16_lowercase_hex_digits(job_id, valid):
    assert is_job_id(job_id) is valid


def test_a_plain_name_is_a_child_of_its_root(tmp_path: Path):
    assert child(tmp_path, "dev-a") == tmp_path / "dev-a"
    assert child(tmp_path, "a.b") == tmp_path / "a.b"  # a dot is fine in a file name
    assert child(tmp_path, "...") == tmp_path / "..."


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "/abs", "a\\b", "..\\x", "a\0b", "\0"])
def test_names_that_are_not_one_plain_component_are_refused(tmp_path: Path, name: str):
    with pytest.raises(ValueError, match="is not a plain file name"):
        child(tmp_path, name)


def test_dot_dot_is_refused_even_where_it_resolves_inside_the_root():
    # "/" / ".." resolves to "/" itself: only the name check keeps it out
    with pytest.raises(ValueError, match="is not a plain file name"):
        child(Path("/"), "..")


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "real")
    with pytest.raises(ValueError, match=f"'out' leads outside {root}"):
        child(root, "out")
    assert child(root, "in") == root / "in"  # a link that stays under the root is fine


def test_every_timestamp_is_utc_iso_8601_and_the_older_forms_read_back_alike():
    written = now_iso()
    assert written.endswith("+00:00") and parse_iso(written).tzinfo is not None
    older = ("2026-12-01T10:00:00Z", "2026-12-01T10:00:00+00:00", "2026-12-01T10:00:00")
    assert len({parse_iso(value) for value in older}) == 1  # promoted_at was written with Z
    with pytest.raises(ValueError):
        parse_iso("yesterday")


@pytest.mark.parametrize(
    "stored",
    [
        1733061791.5,  # Unix seconds, as jobs and lexicons stored them before ISO
        "1733061791.5",  # ... and a cluster's voice records, in a string
        "2024-12-01T14:03:11.500000+00:00",
        "2024-12-01T14:03:11.5Z",
        "2024-12-01T15:03:11.5+01:00",
    ],
)
def test_a_stored_time_in_seconds_or_iso_is_shown_in_now_isos_form(stored):
    assert as_iso(stored) == "2024-12-01T14:03:11.500000+00:00"


def test_now_isos_form_is_kept_as_it_is_and_anything_else_is_refused():
    written = now_iso()
    assert as_iso(written) == written
    for stored in ("yesterday", "", None):
        with pytest.raises(ValueError):
            as_iso(stored)
