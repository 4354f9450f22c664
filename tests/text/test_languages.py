"""The text stage in each language: its case set, said right; a language without rules said as
written; sentences and clauses cut by each script's marks."""

from __future__ import annotations

import time

import pytest

from tests.text.language_cases import CASES
from tests.text.language_heldout import HELD_OUT
from voicehost.text.normalize import normalize

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("language", "raw", "spoken"),
    [(language, raw, spoken) for language, cases in CASES.items() for raw, spoken in cases],
)
def test_each_language_says_its_numbers_money_dates_and_times(language, raw, spoken):
    assert normalize(raw, language) == spoken


def test_every_language_has_at_least_20_cases():
    assert {language: len(cases) >= 20 for language, cases in CASES.items()} == dict.fromkeys(
        ["fr", "de", "es", "it", "ko", "hi", "zh"], True
    )


@pytest.mark.parametrize("language", ["ja", "ru", "pt-BR", "sw", "xx", ""])
def test_a_language_without_rules_is_said_as_written(language):
    text = "It costs $5 on 2024-03-05, 42,50 € le 3 mars."
    assert normalize(text, language) == text


@pytest.mark.parametrize(
    ("tag", "raw", "spoken"),
    [
        ("fr-CA", "42,50 €", "quarante-deux euros cinquante"),
        ("de_AT", "3,5 %", "drei Komma fünf Prozent"),
        ("zh-Hans-CN", "35%", "百分之三十五"),
        ("es-MX", "$1,500.50", "mil quinientos dólares con cincuenta centavos"),
        ("es-ES", "1.500,50 €", "mil quinientos euros con cincuenta céntimos"),
        ("EN-us", "$5", "five dollars"),
    ],
)
def test_a_tag_picks_its_languages_rules_and_region(tag, raw, spoken):
    assert normalize(raw, tag) == spoken


@pytest.mark.parametrize("language", sorted(CASES))
def test_emotive_tags_pass_through_every_language(language):
    assert normalize("<laugh>12<sigh>", language).startswith("<laugh>")
    assert "<sigh>" in normalize("<laugh>12<sigh>", language)


@pytest.mark.parametrize("language", sorted(CASES))
def test_no_language_raises_on_odd_input(language):
    for text in ["9" * 400, "-", "1.2.3.4.5", "€€ 1,,2", "99:99", "31/02/2024", "0,000001 %"]:
        assert isinstance(normalize(text, language), str)


@pytest.mark.parametrize(
    ("language", "raw", "spoken"),
    [(language, raw, spoken) for language, cases in HELD_OUT.items() for raw, spoken in cases],
)
def test_the_held_out_cases_are_said_right(language, raw, spoken):
    assert normalize(raw, language) == spoken


@pytest.mark.parametrize("language", sorted(CASES))
def test_each_language_takes_linear_time_on_long_runs_of_numbers(language):
    runs = ["9" * 50_000, "100 " * 10_000, "12," * 10_000, "1.000." * 5_000, "1:2:" * 10_000]
    started = time.monotonic()
    for run in runs:
        normalize(run, language)
    assert time.monotonic() - started < 3  # a quadratic regex takes tens of seconds here
