"""Normalisation: one segment's text -> words the model can say (see ``voicehost.text``).

Numbers, dates, times, currency, percentages, units and common abbreviations become words of
the segment's language: English here (``num2words``), the others in ``voicehost.text.languages``.
Emotive tags such as ``<laugh>`` pass through byte-identical.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from num2words import num2words

from voicehost.text import CLOSERS, EN_DASH
from voicehost.text.languages import chinese, european, hindi, korean
from voicehost.text.rules import Rule, apply_rules

_MINUS = "\N{MINUS SIGN}"

_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_MONTH_ABBREVIATIONS = {m[:3]: m for m in _MONTHS} | {"Sept": "September"}
_MONTH = (
    r"(?P<mon>(?:" + "|".join(_MONTHS) + r")\b"
    r"|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\b\.?)"
)
_DIGIT_WORDS = "zero one two three four five six seven eight nine".split()
# Longer digit runs are identifiers (phone, card, order numbers): read digit by digit.
_MAX_CARDINAL_DIGITS = 15
# Every number pattern starts where a digit run starts: retrying inside a run is quadratic.
_NUMBER = r"(?<![0-9])(?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.(?P<frac>[0-9]+))?"
_SIGN = rf"(?P<sign>(?<![\w-])[-{_MINUS}](?=[0-9]))?"
_YEAR = r"1[1-9][0-9]{2}|20[0-9]{2}"
_SENTENCE_FOLLOWS = re.compile(rf"[{re.escape(CLOSERS)}]*(?:\s*\Z|\s+[A-Z])")
_NAME_FOLLOWS = re.compile(r"\s+[A-Z]")


def _digits(digits: str) -> str:
    return " ".join(_DIGIT_WORDS[int(d)] for d in digits)


def _cardinal(digits: str) -> str:
    """``"1,234"`` -> ``"one thousand two hundred and thirty-four"``; ``"007"`` digit by digit."""
    plain = digits.replace(",", "")
    if (len(plain) > 1 and plain.startswith("0")) or len(plain) > _MAX_CARDINAL_DIGITS:
        return _digits(plain)
    # num2words writes "one thousand, two hundred": the comma would make the model pause.
    return num2words(int(plain)).replace(",", "")


def _number(int_part: str, frac: str | None, sign: str | None = None) -> str:
    words = _cardinal(int_part)
    if frac:
        words += " point " + _digits(frac)
    return f"minus {words}" if sign else words


def _ordinal(value: int) -> str:
    return num2words(value, to="ordinal").replace(",", "")


def _year(value: int) -> str:
    return num2words(value, to="year")


def _plural(words: str) -> str:
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _ends_sentence(match: re.Match[str]) -> bool:
    """Whether the ``.`` that ends ``match`` also ends its sentence (so it must be kept)."""
    return _SENTENCE_FOLLOWS.match(match.string, match.end()) is not None


def _like(original: str, words: str) -> str:
    return words[:1].upper() + words[1:] if original[:1].isupper() else words


def _iso_date(m: re.Match[str]) -> str | None:
    year, month, day = int(m["y"]), int(m["mo"]), int(m["d"])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return f"{_MONTHS[month - 1]} {_ordinal(day)}, {_year(year)}"


def _month(name: str) -> str:
    return _MONTH_ABBREVIATIONS.get(name.rstrip("."), name.rstrip("."))


def _month_day(m: re.Match[str]) -> str | None:
    day = int(m["d"])
    if not 1 <= day <= 31:
        return None
    words = f"{_month(m['mon'])} {_ordinal(day)}"
    return f"{words}, {_year(int(m['y']))}" if m["y"] else words


def _day_month(m: re.Match[str]) -> str | None:
    day = int(m["d"])
    if not 1 <= day <= 31:
        return None
    words = f"{m['the'] or 'the '}{_ordinal(day)} of {_month(m['mon'])}"
    return f"{words}, {_year(int(m['y']))}" if m["y"] else words


def _month_year(m: re.Match[str]) -> str:
    return f"{_month(m['mon'])} {_year(int(m['y']))}"


def _meridiem(m: re.Match[str]) -> str:
    letters = "a m" if m["ap"][0] in "aA" else "p m"
    return letters + "." if m["ap"].endswith(".") and _ends_sentence(m) else letters


def _clock(m: re.Match[str]) -> str | None:
    hour, minute = int(m["h"]), int(m["m"])
    if hour > 24:
        return None
    if minute == 0:
        words = _cardinal(m["h"].lstrip("0") or "0")
        words += "" if m["ap"] else " o'clock" if hour <= 12 else " hundred"
    else:
        words = f"{_cardinal(m['h'].lstrip('0') or '0')} "
        words += f"oh {_DIGIT_WORDS[minute]}" if minute < 10 else _cardinal(m["m"])
    return f"{words} {_meridiem(m)}" if m["ap"] else words


def _hour(m: re.Match[str]) -> str:
    return f"{_cardinal(m['h'].lstrip('0'))} {_meridiem(m)}"


# symbol -> (unit, units, subunit, subunits); no subunit: decimals are read as "point".
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
}
_SCALES = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion"}
_SCALES |= {"tn": "trillion", "thousand": "thousand", "million": "million"}
_SCALES |= {"billion": "billion", "trillion": "trillion"}


def _money(m: re.Match[str]) -> str:
    unit, units, subunit, subunits = _CURRENCIES[m["sym"]]
    sign = "minus " if m["sign"] else ""
    scale = m.groupdict().get("word") or m.groupdict().get("abbr")
    if scale:
        return f"{sign}{_number(m['int'], m['frac'])} {_SCALES[scale.lower()]} {units}"
    whole = int(m["int"].replace(",", ""))
    frac = m["frac"]
    if frac and (not subunit or len(frac) > 2):
        return f"{sign}{_number(m['int'], frac)} {units}"
    cents = int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if whole or not cents:
        parts.append(f"{_cardinal(m['int'])} {unit if whole == 1 else units}")
    if cents:
        parts.append(f"{_cardinal(str(cents))} {subunit if cents == 1 else subunits}")
    return sign + ", ".join(parts)


def _percent(m: re.Match[str]) -> str:
    return f"{_number(m['int'], m['frac'], m['sign'])} percent"


# unit -> (singular, plural)
_UNITS = {
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "ml": ("milliliter", "milliliters"),
    "lbs": ("pound", "pounds"),
    "lb": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "ft": ("foot", "feet"),
    "ms": ("millisecond", "milliseconds"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "kW": ("kilowatt", "kilowatts"),
    "KB": ("kilobyte", "kilobytes"),
    "kB": ("kilobyte", "kilobytes"),
    "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "TB": ("terabyte", "terabytes"),
    "kHz": ("kilohertz", "kilohertz"),
    "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "Hz": ("hertz", "hertz"),
}


def _measure(m: re.Match[str]) -> str:
    singular, plural = _UNITS[m["unit"]]
    one = m["int"] == "1" and not m["frac"] and not m["sign"]
    return f"{_number(m['int'], m['frac'], m['sign'])} {singular if one else plural}"


def _century_decade(m: re.Match[str]) -> str:
    return _plural(_year(int(m["century"] + m["d"] + "0")))


def _decade(m: re.Match[str]) -> str:
    return _plural(_cardinal(m["d"] + "0"))


def _year_in_context(m: re.Match[str]) -> str:
    words = f"{m['ctx']} {_year(int(m['y']))}"
    if m["y2"]:
        joiner = m["joiner"] if m["joiner"].strip() not in f"-{EN_DASH}" else " to "
        words += f"{joiner}{_year(int(m['y2']))}"
    return words


def _year_range(m: re.Match[str]) -> str:
    return f"{_year(int(m['y']))} to {_year(int(m['y2']))}"


def _ordinal_number(m: re.Match[str]) -> str | None:
    plain = m["int"].replace(",", "")
    return None if len(plain) > _MAX_CARDINAL_DIGITS else _ordinal(int(plain))


def _dotted(m: re.Match[str]) -> str:
    return " point ".join(_cardinal(part) for part in m[0].split("."))


def _plain_number(m: re.Match[str]) -> str:
    return _number(m["int"], m["frac"], m["sign"])


def _leading_point(m: re.Match[str]) -> str:
    return "point " + _digits(m["frac"])


_TITLES = {
    "dr": "Doctor",
    "mr": "Mister",
    "mrs": "Missus",
    "ms": "Miz",
    "prof": "Professor",
    "mt": "Mount",
    "gen": "General",
    "capt": "Captain",
    "rev": "Reverend",
}
_LATIN = {
    "e.g.": "for example",
    "i.e.": "that is",
    "etc.": "et cetera",
    "vs.": "versus",
    "vs": "versus",
    "approx.": "approximately",
    "jr.": "Junior",
    "sr.": "Senior",
}
_MAY_END_SENTENCE = frozenset({"etc.", "jr.", "sr."})


def _title(m: re.Match[str]) -> str:
    return _TITLES[(m["title"] or m["bare"]).lower()]


def _saint(m: re.Match[str]) -> str:
    # "St. Louis" is a saint, "Baker St." a street: only a following name tells them apart.
    return "Saint" if _NAME_FOLLOWS.match(m.string, m.end()) else "Street"


def _latin(m: re.Match[str]) -> str:
    key = m[0].lower()
    words = _like(m[0], _LATIN[key])
    return words + "." if key in _MAY_END_SENTENCE and _ends_sentence(m) else words


# Applied in order: abbreviations, then dates before times before money before plain numbers,
# each on what the previous ones left (their output has no digits, so no rule rereads it).
_RULES: tuple[Rule, ...] = (
    (
        re.compile(
            r"\b(?P<title>Dr|Mr|Mrs|Ms|Prof|Mt|Gen|Capt|Rev)\."
            r"|\b(?P<bare>Dr|Mr|Mrs|Ms)(?=\s+[A-Z])"
        ),
        _title,
    ),
    (re.compile(r"\bSt(?:\.|(?=\s+[A-Z]))"), _saint),
    (re.compile(r"\b(?:[eE]\.g\.|[iI]\.e\.|(?i:etc|approx|jr|sr|vs)\.|vs\b)"), _latin),
    (re.compile(r"\bNo\.(?=\s*[0-9])|#(?=[0-9])"), lambda m: "number"),
    (re.compile(r"(?<=\s)&(?=\s)"), lambda m: "and"),
    (re.compile(r"\b(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})\b"), _iso_date),
    (
        re.compile(
            rf"\b{_MONTH}\s+(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?\b(?![:.,]?[0-9])"
            r"(?:,?\s+(?P<y>[0-9]{4})\b(?![.,]?[0-9]))?"
        ),
        _month_day,
    ),
    (
        re.compile(
            rf"(?P<the>\b(?i:the)\s+)?\b(?P<d>[0-9]{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}"
            r"(?:,?\s+(?P<y>[0-9]{4})\b(?![.,]?[0-9]))?"
        ),
        _day_month,
    ),
    (re.compile(rf"\b{_MONTH}\s+(?P<y>[0-9]{{4}})\b(?![.,]?[0-9])"), _month_year),
    (
        re.compile(
            r"\b(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?!:?[0-9])"
            r"(?:\s?(?P<ap>[AaPp]\.?[Mm]\b\.?))?"
        ),
        _clock,
    ),
    (re.compile(r"\b(?P<h>1[0-2]|0?[1-9])\s?(?P<ap>[AaPp]\.?[Mm]\b\.?)"), _hour),
    (
        re.compile(
            rf"(?P<sign>(?<![\w-])[-{_MINUS}])?(?P<sym>[$€£¥])\s?{_NUMBER}"
            r"(?:\s+(?P<word>(?i:thousand|million|billion|trillion))\b"
            r"|(?P<abbr>[kKmMbB]|bn|mn|tn)\b)?"
        ),
        _money,
    ),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<sym>[$€£¥])"), _money),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?%"), _percent),
    (
        re.compile(
            rf"{_SIGN}{_NUMBER}\s?(?P<unit>"
            + "|".join(re.escape(unit) for unit in _UNITS)
            + r")(?![\w/])"
        ),
        _measure,
    ),
    (re.compile(r"\b(?P<century>1[1-9]|20)(?P<d>[0-9])0s\b"), _century_decade),
    (re.compile(r"(?<!\w)['\N{RIGHT SINGLE QUOTATION MARK}]?(?P<d>[2-9])0s\b"), _decade),
    (
        re.compile(
            r"\b(?P<ctx>(?i:in|since|by|from|until|till|through|during|circa|before|after|around"
            rf"|year|early|late|mid|between))\s+(?P<y>{_YEAR})(?![0-9]|[.,][0-9]|\s?%)"
            rf"(?:(?P<joiner>\s*[-{EN_DASH}]\s*|\s+(?:to|and|until|through)\s+)"
            rf"(?P<y2>{_YEAR})(?![0-9]))?"
        ),
        _year_in_context,
    ),
    (re.compile(rf"\b(?P<y>{_YEAR})[-{EN_DASH}](?P<y2>{_YEAR})\b"), _year_range),
    (re.compile(r"\b(?P<int>[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?i:st|nd|rd|th)\b"), _ordinal_number),
    (re.compile(r"(?<![0-9])[0-9]+(?:\.[0-9]+){2,}"), _dotted),
    (re.compile(r"(?<![\w.])\.(?P<frac>[0-9]+)"), _leading_point),
    (re.compile(rf"{_SIGN}{_NUMBER}"), _plain_number),
)


def normalize(text: str, language: str = "en") -> str:
    """One segment's text -> the words a speaker of ``language`` (a BCP-47 tag: "fr",
    "de-CH", "zh-Hans") would say; never raises. A language without rules here comes back
    unchanged: English rules are never applied to another language's text."""
    rules = normalizer(language)
    return text if rules is None else rules(text)


def normalize_english(text: str) -> str:
    """English text -> the words a speaker would say, for one segment; never raises.

    Numbers (cardinals, decimals, negatives, ordinals, years after words like "in"/"since",
    decades), dates (ISO, "March 5, 2024", "5 March 2024"), clock times, money ($ € £ ¥, with
    "million" or "5k"), percentages, common units and abbreviations (Dr. Mr. Mrs. St. e.g. i.e.
    etc. vs. approx.) become words. Emotive tags (``<laugh>``, any ``<word>``) and everything
    else come back byte-identical.
    """
    return apply_rules(text, _RULES)


@lru_cache(maxsize=64)
def normalizer(language: str) -> Callable[[str], str] | None:
    """The rules of a BCP-47 tag's language ("fr", "es-MX", "zh-Hans-CN"), ``None`` for a
    language without rules here (its text is said as written)."""
    primary, _, rest = language.replace("_", "-").lower().partition("-")
    region = next((part for part in rest.split("-") if len(part) in (2, 3)), "")
    if primary == "en":
        return normalize_english
    if primary == "ko":
        return korean.normalize
    if primary == "hi":
        return hindi.normalize
    if primary == "zh":
        return chinese.normalize
    return european.rules_for(primary, region)
