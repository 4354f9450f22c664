"""Mandarin (Chinese script): numbers read in Chinese numerals, no space added between words.

Cardinals in groups of four digits (万, 亿) with 零 where digits are skipped and 两 for a leading
2 before 千/万/亿; digit runs that name rather than count (years before 年, leading zeros,
decimals after 点, long identifiers) are read digit by digit. Dates (``2024年3月3日``,
``2024-03-03``), clock times (``14:30``), money (``¥42.50``, ``42.50元``, ``$100``),
percentages (``35%`` -> 百分之三十五), signs and common units are rewritten in Chinese order.
Written by hand (measured against cn2an in ``docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import re

from voicehost.text.languages import alternatives
from voicehost.text.rules import Rule, apply_rules

_DIGITS = "零一二三四五六七八九"
_FULLWIDTH = str.maketrans("０１２３４５６７８９％", "0123456789%")
# An 11-digit run is a mobile number, longer ones are identifiers: read digit by digit.
_MAX_CARDINAL_DIGITS = 10
# At most five groups of thousands (past 15 digits a run is read digit by digit): an
# unbounded run retried from each group would take quadratic time.
_NUMBER = r"(?<![0-9])(?P<int>[0-9]{1,3}(?:,[0-9]{3}){1,5}(?![0-9])|[0-9]+)(?:\.(?P<frac>[0-9]+))?"
_SIGN = r"(?P<sign>(?<![0-9A-Za-z-])[-\N{MINUS SIGN}](?=[0-9]))?"


def digits(run: str) -> str:
    return "".join(_DIGITS[int(d)] for d in run)


def _below_10000(value: int, leading: bool) -> str:
    """0 < value < 10000; ``leading``: the first group (no 零 before it, 十五 not 一十五)."""
    out = []
    zero = False
    for unit, power in (("千", 1000), ("百", 100), ("十", 10), ("", 1)):
        d = value // power % 10
        if d == 0:
            zero = bool(out)
            continue
        if zero:
            out.append("零")
        zero = False
        if d == 2 and unit in ("千",) and not out:
            out.append("两")
        elif d == 1 and unit == "十" and not out and leading:
            pass  # 十五, not 一十五
        else:
            out.append(_DIGITS[d])
        out.append(unit)
    return "".join(out)


def cardinal(run: str) -> str:
    """``"12345"`` -> 一万两千三百四十五; a run with a leading zero or too long, digit by digit."""
    run = run.replace(",", "")
    if (len(run) > 1 and run.startswith("0")) or len(run) > _MAX_CARDINAL_DIGITS:
        return digits(run)
    value = int(run)
    if value == 0:
        return "零"
    groups = []
    while value:
        groups.append(value % 10000)
        value //= 10000
    out = []
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        if group == 0:
            continue
        leading = index == len(groups) - 1
        words = _below_10000(group, leading)
        if not leading and group < 1000 and not out[-1].endswith("零"):
            words = words if words.startswith("零") else "零" + words
        if leading and group == 2 and index > 0:
            words = "两"
        out.append(words + ("", "万", "亿", "万亿")[index])
    return "".join(out)


def _number(int_part: str, frac: str | None, sign: str | None = None) -> str:
    words = cardinal(int_part)
    if frac:
        words += "点" + digits(frac)
    return "负" + words if sign else words


def _date(m: re.Match[str]) -> str | None:
    month, day = int(m["mo"]), int(m["d"]) if m["d"] else 1
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    words = f"{digits(m['y'])}年" if m["y"] else ""
    words += f"{cardinal(str(month))}月"
    if m["d"]:
        words += f"{cardinal(str(day))}{m['day'] or '日'}"
    return words


def _clock(m: re.Match[str]) -> str | None:
    hour, minute = int(m["h"]), int(m["m"])
    if hour > 24:
        return None
    words = f"{cardinal(str(hour))}点"
    if minute:
        words += ("零" if minute < 10 else "") + f"{cardinal(str(minute))}分"
    return words


# symbol -> its name (said after the amount)
_CURRENCIES = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑", "HK$": "港元"}


def _yuan(m: re.Match[str]) -> str:
    """42.50 -> 四十二元五角; other currencies -> 四十二点五美元."""
    name = _CURRENCIES.get(m["sym"], m["sym"])
    sign = "负" if m["sign"] else ""
    frac = m["frac"]
    if name != "元" or not frac or len(frac) > 2:
        return f"{sign}{_number(m['int'], frac)}{name}"
    jiao, fen = int(frac[0]), int(frac[1]) if len(frac) > 1 else 0
    words = f"{cardinal(m['int'])}元" if m["int"] != "0" else ""
    if jiao:
        words += f"{_DIGITS[jiao]}角"
    if fen:
        words += ("零" if not jiao and words else "") + f"{_DIGITS[fen]}分"
    return sign + (words or "零元")


def _percent(m: re.Match[str]) -> str:
    return ("负" if m["sign"] else "") + "百分之" + _number(m["int"], m["frac"])


_UNITS = {
    "km/h": "公里每小时",
    "km": "公里",
    "cm": "厘米",
    "mm": "毫米",
    "m": "米",
    "kg": "公斤",
    "g": "克",
    "ml": "毫升",
    "°C": "摄氏度",
    "℃": "摄氏度",
    "°": "度",
    "GB": "G",
}


def _measure(m: re.Match[str]) -> str:
    return _number(m["int"], m["frac"], m["sign"]) + _UNITS[m["unit"]]


def _plain(m: re.Match[str]) -> str:
    return _number(m["int"], m["frac"], m["sign"])


_UNIT_PATTERN = alternatives(_UNITS)
_SYMBOLS = alternatives(_CURRENCIES)

RULES: tuple[Rule, ...] = (
    (
        re.compile(
            r"(?<![0-9])(?P<y>[0-9]{4})[-/.](?P<mo>[0-9]{1,2})[-/.](?P<d>[0-9]{1,2})(?P<day>)"
            r"(?![0-9])"
        ),
        _date,
    ),
    (
        re.compile(
            r"(?:(?<![0-9])(?P<y>[0-9]{2,4})\s?年\s?)?(?<![0-9])(?P<mo>[0-9]{1,2})\s?月"
            r"(?:\s?(?P<d>[0-9]{1,2})\s?(?P<day>[日号]))?"
        ),
        _date,
    ),
    (re.compile(r"(?<![0-9])(?P<y>[0-9]{4})\s?年"), lambda m: f"{digits(m['y'])}年"),
    (re.compile(r"(?<![0-9:])(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?!:?[0-9])"), _clock),
    (re.compile(rf"{_SIGN}(?P<sym>{_SYMBOLS})\s?{_NUMBER}"), _yuan),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<sym>元|块)"), _yuan),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?[%％]"), _percent),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<unit>{_UNIT_PATTERN})(?![A-Za-z/])"), _measure),
    # A lone 2 counting things is 两 (两个, 两次), not 二; an ordinal stays 二 (第二次).
    (
        re.compile(r"(?<![0-9.,\-第])2(?![0-9.,])(?=\s?[个位次本件只条张天份种家台辆杯碗])"),
        lambda m: "两",
    ),
    (re.compile(rf"{_SIGN}{_NUMBER}"), _plain),
)


def normalize(text: str) -> str:
    """Chinese text -> what a Mandarin speaker says, for one segment; never raises."""
    return apply_rules(text.translate(_FULLWIDTH), RULES, spaced=False)
