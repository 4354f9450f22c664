"""Korean: numbers in Sino-Korean words (``num2words``), native words before the counters that
take them (``3시`` -> 세 시, ``2개`` -> 두 개, ``1번째`` -> 첫 번째), money (``5,000원``,
``₩5,000``, ``$100`` -> 백 달러), dates (``2024년 3월 3일``, ``2024.03.03.``, with 유월 and 시월),
clock times (``14:30`` -> 열네 시 삼십 분), percentages (퍼센트), signs and common units.
"""

from __future__ import annotations

import re

from num2words import num2words

from voicehost.text.languages import alternatives
from voicehost.text.rules import Rule, apply_rules

# At most five groups of thousands (past 15 digits a run is read digit by digit): an
# unbounded run retried from each group would take quadratic time.
_NUMBER = r"(?<![0-9])(?P<int>[0-9]{1,3}(?:,[0-9]{3}){1,5}(?![0-9])|[0-9]+)(?:\.(?P<frac>[0-9]+))?"
_SIGN = r"(?P<sign>(?<![0-9A-Za-z-])[-\N{MINUS SIGN}](?=[0-9]))?"
_SINO_DIGITS = "영 일 이 삼 사 오 육 칠 팔 구".split()
_MAX_CARDINAL_DIGITS = 15

# Native numbers as said before a counter (한 개, not 하나 개), 1..99.
_NATIVE_ONES = ["", "한", "두", "세", "네", "다섯", "여섯", "일곱", "여덟", "아홉"]
_NATIVE_TENS = ["", "열", "스물", "서른", "마흔", "쉰", "예순", "일흔", "여든", "아흔"]
# Counters said with native numbers (up to 99; Sino-Korean beyond).
_NATIVE_COUNTERS = "시 개 명 살 마리 잔 권 번 병 대 사람 가지 송이 켤레 척 장 그릇 달".split()


def _native(value: int) -> str:
    tens, ones = divmod(value, 10)
    if tens == 2 and ones == 0:
        return "스무"
    return _NATIVE_TENS[tens] + _NATIVE_ONES[ones]


def _digits(run: str) -> str:
    return " ".join(_SINO_DIGITS[int(d)] for d in run)


def cardinal(run: str) -> str:
    """Sino-Korean: ``"12,000"`` -> 만 이천 (num2words); leading zeros digit by digit."""
    run = run.replace(",", "")
    if (len(run) > 1 and run.startswith("0")) or len(run) > _MAX_CARDINAL_DIGITS:
        return _digits(run)
    return "영" if int(run) == 0 else num2words(int(run), lang="ko")


def _number(int_part: str, frac: str | None, sign: str | None = None) -> str:
    words = cardinal(int_part)
    if frac:
        words += " 점 " + _digits(frac)
    return "마이너스 " + words if sign else words


def _month(value: int) -> str:
    return {6: "유", 10: "시"}.get(value, cardinal(str(value)))


def _date(m: re.Match[str]) -> str | None:
    month = int(m["mo"])
    day = int(m["d"]) if m["d"] else 1
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    words = []
    if m["y"]:
        words.append(f"{cardinal(m['y'])} 년")
    words.append(f"{_month(month)}월")
    if m["d"]:
        words.append(f"{cardinal(m['d'])}일")
    return " ".join(words)


def _clock(m: re.Match[str]) -> str | None:
    hour, minute = int(m["h"]), int(m["m"] or 0)
    if hour > 24:
        return None
    words = f"{_native(hour) if hour else '영'} 시"
    return f"{words} {cardinal(str(minute))} 분" if minute else words


_CURRENCIES = {"₩": "원", "$": "달러", "€": "유로", "£": "파운드", "¥": "엔", "US$": "달러"}


def _money(m: re.Match[str]) -> str:
    name = _CURRENCIES.get(m["sym"], m["sym"])
    return f"{_number(m['int'], m['frac'], m['sign'])} {name}"


def _counted(m: re.Match[str]) -> str:
    value = int(m["int"].replace(",", ""))
    counter = m["counter"]
    if counter == "번째":
        return (
            ("첫" if value == 1 else _native(value)) + " 번째"
            if value < 100
            else (f"{cardinal(m['int'])} 번째")
        )
    if 0 < value < 100:
        return f"{_native(value)} {counter}"
    return f"{cardinal(m['int'])} {counter}"


_UNITS = {
    "km/h": "킬로미터",
    "km": "킬로미터",
    "cm": "센티미터",
    "mm": "밀리미터",
    "m": "미터",
    "kg": "킬로그램",
    "g": "그램",
    "ml": "밀리리터",
    "°C": "도",
    "℃": "도",
    "°": "도",
    "GB": "기가바이트",
}


def _measure(m: re.Match[str]) -> str:
    return f"{_number(m['int'], m['frac'], m['sign'])} {_UNITS[m['unit']]}"


def _plain(m: re.Match[str]) -> str:
    return _number(m["int"], m["frac"], m["sign"])


_SYMBOLS = alternatives(_CURRENCIES)
_UNIT_PATTERN = alternatives(_UNITS)
_COUNTERS = alternatives(["번째", *_NATIVE_COUNTERS], escape=False)

RULES: tuple[Rule, ...] = (
    (
        re.compile(
            r"(?<![0-9])(?P<y>[0-9]{4})[-./]\s?(?P<mo>[0-9]{1,2})[-./]\s?(?P<d>[0-9]{1,2})\.?"
            r"(?![0-9])"
        ),
        _date,
    ),
    (
        re.compile(
            r"(?:(?<![0-9])(?P<y>[0-9]{4})\s?년\s?)?(?<![0-9])(?P<mo>[0-9]{1,2})\s?월"
            r"(?:\s?(?P<d>[0-9]{1,2})\s?일)?"
        ),
        _date,
    ),
    (re.compile(r"(?<![0-9])(?P<y>[0-9]{4})\s?년"), lambda m: f"{cardinal(m['y'])} 년"),
    (re.compile(r"(?<![0-9:])(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?!:?[0-9])"), _clock),
    (
        re.compile(r"(?<![0-9])(?P<h>[0-9]{1,2})\s?시(?:\s?(?P<m>[0-5]?[0-9])\s?분)?"),
        _clock,
    ),
    (re.compile(rf"{_SIGN}(?P<sym>{_SYMBOLS})\s?{_NUMBER}"), _money),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<sym>원|달러|유로|엔)"), _money),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?[%％]"), lambda m: f"{_plain(m)} 퍼센트"),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<unit>{_UNIT_PATTERN})(?![A-Za-z/])"), _measure),
    (
        re.compile(
            rf"(?<![0-9.,제])(?P<int>[0-9]{{1,3}}(?:,[0-9]{{3}})*)(?![0-9])\s?(?P<counter>{_COUNTERS})"
        ),
        _counted,
    ),
    (re.compile(rf"{_SIGN}{_NUMBER}"), _plain),
)


def normalize(text: str) -> str:
    """Korean text -> what a Korean speaker says, for one segment; never raises."""
    return apply_rules(text, RULES, spaced=False)
