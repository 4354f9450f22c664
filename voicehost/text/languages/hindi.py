"""Hindi: numbers in Hindi words (num2words has no Hindi), Devanagari digits (०-९) and Latin
ones, Indian grouping (``1,00,000`` -> एक लाख) and the Western one, money (``₹42.50`` ->
बयालीस रुपये पचास पैसे, ``Rs. 500``), dates (``15 अगस्त 1947``, ``03/03/2024``), clock times
(``3:30`` -> तीन बजकर तीस मिनट), percentages (प्रतिशत), ordinals (``5वीं`` -> पाँचवीं),
signs and common units.
"""

from __future__ import annotations

import re

from voicehost.text.languages import alternatives
from voicehost.text.rules import Rule, apply_rules

# 0..99: Hindi's names for them are irregular, so they are listed.
_BELOW_100 = (
    "शून्य एक दो तीन चार पाँच छह सात आठ नौ दस ग्यारह बारह तेरह चौदह पंद्रह सोलह सत्रह अठारह "
    "उन्नीस बीस इक्कीस बाईस तेईस चौबीस पच्चीस छब्बीस सत्ताईस अट्ठाईस उनतीस तीस इकतीस बत्तीस "
    "तैंतीस चौंतीस पैंतीस छत्तीस सैंतीस अड़तीस उनतालीस चालीस इकतालीस बयालीस तैंतालीस चवालीस "
    "पैंतालीस छियालीस सैंतालीस अड़तालीस उनचास पचास इक्यावन बावन तिरेपन चौवन पचपन छप्पन सत्तावन "
    "अट्ठावन उनसठ साठ इकसठ बासठ तिरेसठ चौंसठ पैंसठ छियासठ सड़सठ अड़सठ उनहत्तर सत्तर इकहत्तर "
    "बहत्तर तिहत्तर चौहत्तर पचहत्तर छिहत्तर सतहत्तर अठहत्तर उनासी अस्सी इक्यासी बयासी तिरासी "
    "चौरासी पचासी छियासी सत्तासी अट्ठासी नवासी नब्बे इक्यानवे बानवे तिरानवे चौरानवे पंचानवे "
    "छियानवे सत्तानवे अट्ठानवे निन्यानवे"
).split()
assert len(_BELOW_100) == 100
_SCALES = ((10**9, "अरब"), (10**7, "करोड़"), (10**5, "लाख"), (1000, "हज़ार"), (100, "सौ"))
_DEVANAGARI_DIGITS = str.maketrans("०१२३४५६७८९", "0123456789")
_MAX_CARDINAL_DIGITS = 13
# Indian grouping (1,00,000) or Western (100,000); then a decimal point.
# A bounded number of groups (past 15 digits a run is read digit by digit): an
# unbounded run retried from each group would take quadratic time.
_NUMBER = (
    r"(?<![0-9])(?P<int>[0-9]{1,2}(?:,[0-9]{2}){0,6},[0-9]{3}(?![0-9])"
    r"|[0-9]{1,3}(?:,[0-9]{3}){1,5}(?![0-9])|[0-9]+)(?:\.(?P<frac>[0-9]+))?"
)
_SIGN = r"(?P<sign>(?<![\w-])[-\N{MINUS SIGN}](?=[0-9]))?"
_MONTHS = "जनवरी फ़रवरी मार्च अप्रैल मई जून जुलाई अगस्त सितंबर अक्टूबर नवंबर दिसंबर".split()
_MONTH_SPELLINGS = {m: m for m in _MONTHS} | {"फरवरी": "फ़रवरी", "सितम्बर": "सितंबर"}
_MONTH_SPELLINGS |= {"अक्तूबर": "अक्टूबर", "नवम्बर": "नवंबर", "दिसम्बर": "दिसंबर"}


def _digits(run: str) -> str:
    return " ".join(_BELOW_100[int(d)] for d in run)


def _words(value: int) -> str:
    if value < 100:
        return _BELOW_100[value]
    for size, name in _SCALES:
        if value >= size:
            high, rest = divmod(value, size)
            words = f"{_words(high)} {name}"
            return f"{words} {_words(rest)}" if rest else words
    raise AssertionError(value)


def cardinal(run: str) -> str:
    """``"1,25,000"`` -> एक लाख पच्चीस हज़ार; leading zeros and long runs digit by digit."""
    run = run.replace(",", "")
    if (len(run) > 1 and run.startswith("0")) or len(run) > _MAX_CARDINAL_DIGITS:
        return _digits(run)
    return _words(int(run))


def _number(int_part: str, frac: str | None, sign: str | None = None) -> str:
    words = cardinal(int_part)
    if frac:
        words += " दशमलव " + _digits(frac)
    return "माइनस " + words if sign else words


def _year(run: str) -> str:
    value = int(run)
    if 1100 <= value < 2000:  # 1947: उन्नीस सौ सैंतालीस
        high, rest = divmod(value, 100)
        return f"{_BELOW_100[high]} सौ {_BELOW_100[rest]}" if rest else f"{_BELOW_100[high]} सौ"
    return cardinal(run)


def _date(m: re.Match[str]) -> str | None:
    day = int(m["d"])
    month = int(m["mo"]) if m["mo"] else _MONTHS.index(_MONTH_SPELLINGS[m["mon"]]) + 1
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    words = f"{_BELOW_100[day]} {_MONTHS[month - 1]}"
    return f"{words} {_year(m['y'])}" if m["y"] else words


def _clock(m: re.Match[str]) -> str | None:
    """``3 बजे`` -> तीन बजे, ``3:30 बजे`` or ``3:30`` -> तीन बजकर तीस मिनट."""
    hour, minute = (int(m["h"]), int(m["m"] or 0)) if m["h"] else (int(m["h2"]), int(m["m2"]))
    if hour > 24:
        return None
    if not minute:
        return f"{_BELOW_100[hour]} बजे"
    return f"{_BELOW_100[hour]} बजकर {_BELOW_100[minute]} मिनट"


def _rupees(m: re.Match[str]) -> str:
    name = _CURRENCIES.get(m["sym"], "रुपये")
    sign = "माइनस " if m["sign"] else ""
    frac = m["frac"]
    if frac and len(frac) <= 2 and name == "रुपये":
        paise = int(frac.ljust(2, "0"))
        words = f"{cardinal(m['int'])} रुपये" if int(m["int"].replace(",", "")) else ""
        if paise:
            words = f"{words} {_BELOW_100[paise]} पैसे".strip()
        return sign + words
    return f"{sign}{_number(m['int'], frac)} {name}"


_CURRENCIES = {"₹": "रुपये", "Rs.": "रुपये", "Rs": "रुपये", "रु.": "रुपये", "रु": "रुपये"}
_CURRENCIES |= {"$": "डॉलर", "€": "यूरो", "£": "पाउंड"}
_UNITS = {
    "km/h": "किलोमीटर प्रति घंटा",
    "km": "किलोमीटर",
    "किमी": "किलोमीटर",
    "cm": "सेंटीमीटर",
    "mm": "मिलीमीटर",
    "m": "मीटर",
    "kg": "किलोग्राम",
    "किलो": "किलो",
    "g": "ग्राम",
    "ml": "मिलीलीटर",
    "°C": "डिग्री सेल्सियस",
    "°": "डिग्री",
}
# 5वाँ -> पाँचवाँ; the first four and the sixth have their own words.
_ORDINAL_STEMS = {1: "पहल", 2: "दूसर", 3: "तीसर", 4: "चौथ", 6: "छठ"}


def _ordinal(m: re.Match[str]) -> str:
    value, suffix = int(m["int"]), m["suf"]
    if value in _ORDINAL_STEMS:
        ending = {"वाँ": "ा", "वां": "ा", "वा": "ा", "वीं": "ी", "वी": "ी", "वें": "े"}
        ending |= {"ला": "ा", "ली": "ी", "ले": "े", "रा": "ा", "री": "ी", "रे": "े"}
        ending |= {"था": "ा", "थी": "ी", "थे": "े", "ठा": "ा", "ठी": "ी", "ठे": "े"}
        return _ORDINAL_STEMS[value] + ending[suffix]
    return cardinal(m["int"]) + suffix


def _measure(m: re.Match[str]) -> str:
    return f"{_number(m['int'], m['frac'], m['sign'])} {_UNITS[m['unit']]}"


def _plain(m: re.Match[str]) -> str:
    return _number(m["int"], m["frac"], m["sign"])


_SYMBOLS = alternatives(_CURRENCIES)
_UNIT_PATTERN = alternatives(_UNITS)
_MONTH_PATTERN = alternatives(_MONTH_SPELLINGS, escape=False)

RULES: tuple[Rule, ...] = (
    (
        re.compile(
            r"(?<![0-9./])(?P<d>[0-9]{1,2})[/.-](?P<mo>[0-9]{1,2})[/.-](?P<y>[0-9]{4})(?![0-9])"
            r"(?P<mon>)"
        ),
        _date,
    ),
    (
        re.compile(
            rf"(?<![0-9])(?P<d>[0-9]{{1,2}})\s+(?P<mon>{_MONTH_PATTERN})(?P<mo>)"
            r"(?:,?\s+(?P<y>[0-9]{4})(?![0-9]))?"
        ),
        _date,
    ),
    (
        re.compile(
            r"(?<![0-9:])(?P<h>[0-9]{1,2})(?::(?P<m>[0-5][0-9]))?(?!:?[0-9])\s?बजे"
            r"|(?<![0-9:])(?P<h2>[0-9]{1,2}):(?P<m2>[0-5][0-9])(?!:?[0-9])"
        ),
        _clock,
    ),
    (
        re.compile(r"(?<![0-9,.])(?P<y>1[1-9][0-9]{2})(?=\s+(?:में|से|तक|का|की|के)(?!\S))"),
        lambda m: _year(m["y"]),
    ),
    (re.compile(rf"{_SIGN}(?P<sym>{_SYMBOLS})\s?{_NUMBER}"), _rupees),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<sym>रुपये|रुपए|रुपया)"), _rupees),
    (re.compile(rf"{_SIGN}{_NUMBER}\s?%"), lambda m: f"{_plain(m)} प्रतिशत"),
    (
        re.compile(rf"{_SIGN}{_NUMBER}\s?(?P<unit>{_UNIT_PATTERN})(?![A-Za-z/\u0900-\u097f])"),
        _measure,
    ),
    (
        re.compile(
            r"(?<![0-9])(?P<int>[0-9]{1,4})\s?(?P<suf>वाँ|वां|वीं|वें|वी|वा|ला|ली|ले|रा|री|रे|था|थी|थे|ठा|ठी|ठे)"
            r"(?![\u0900-\u097f])"
        ),
        _ordinal,
    ),
    (re.compile(rf"{_SIGN}{_NUMBER}"), _plain),
)


def normalize(text: str) -> str:
    """Hindi text -> what a Hindi speaker says, for one segment; never raises."""
    return apply_rules(text.translate(_DEVANAGARI_DIGITS), RULES)
