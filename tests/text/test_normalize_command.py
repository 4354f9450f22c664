"""``voicehost normalize``: the segments the engine would get, one a line, in each language."""

from __future__ import annotations

import json

import pytest

from voicehost.cli import main

pytestmark = pytest.mark.unit


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(["normalize", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_french_is_said_in_french_one_segment_a_line(capsys, monkeypatch):
    monkeypatch.setenv("VOICEHOST_SEGMENT_MAX_CHARS", "80")
    text = "Ça fait 42,50 €, merci. Rendez-vous le 3 mars 2024 à 14h30 au 2e étage, d'accord ?"
    code, lines, _ = run(capsys, "--language", "fr", text)
    assert code == 0
    assert lines == [
        "Ça fait quarante-deux euros cinquante, merci.",
        # Said, the second sentence is longer than a segment: cut again between words.
        "Rendez-vous le trois mars deux mille vingt-quatre à quatorze heures trente au",
        "deuxième étage, d'accord ?",
    ]


def test_chinese_is_cut_at_its_marks_and_said_in_chinese(capsys, monkeypatch):
    monkeypatch.setenv("VOICEHOST_SEGMENT_MAX_CHARS", "200")  # 66 Han characters a segment
    text = "价格是42.50元。" + "会议在2024年3月3日14:30开始，" * 4 + "请准时参加！"
    code, lines, _ = run(capsys, "--language", "zh", "--json", text)
    assert code == 0
    segments = [json.loads(line) for line in lines]
    assert "".join(s["text"] for s in segments) == text
    assert segments[0] == {
        "said": "价格是四十二元五角。",
        "text": "价格是42.50元。",
        "start": 0,
        "end": 10,
    }
    clause = "会议在二零二四年三月三日十四点三十分开始，"
    assert [s["said"] for s in segments[1:]] == [clause * 3, clause + "请准时参加！"]
    assert all(len(s["text"]) <= 66 for s in segments)


def test_the_lexicon_is_said_before_the_language_rules(capsys, tmp_path):
    lexicon = tmp_path / "words.json"
    lexicon.write_text(json.dumps({"entries": [{"grapheme": "TVA", "alias": "té vé a"}]}))
    code, lines, _ = run(
        capsys, "--language", "fr", "--lexicon", str(lexicon), "La TVA est de 20 %."
    )
    assert (code, lines) == (0, ["La té vé a est de vingt pour cent."])


def test_a_language_without_rules_is_printed_as_written(capsys):
    assert run(capsys, "--language", "ja", "42,50 €")[:2] == (0, ["42,50 €"])


def test_a_bad_lexicon_or_empty_text_is_refused(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": [{"grapheme": "", "alias": "x"}]}')
    code, _, err = run(capsys, "--lexicon", str(bad), "hello")
    assert code == 2 and "blank" in err
    code, _, err = run(capsys, "...")
    assert code == 1 and "nothing to say" in err
