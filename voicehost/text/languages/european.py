"""French, German, Spanish and Italian: numbers as each writes them, said in its words.

One set of rules, in this order: numeric and worded dates, clock times, money (the symbol before
or after, "Mio."/"millions" scales), percentages, units, ordinals (``1er``, ``3.``, ``2.º``,
``1°``), then plain numbers. ``Spelling`` holds what differs: the decimal mark and the thousands
separators (French ``1 000,5``, German ``1.000,5``, Mexican Spanish ``1,000.5``), and the words.
Cardinals and ordinals come from ``num2words``; money, dates and times are put together here,
in the order each language says them ("quarante-deux euros cinquante", "zweiundvierzig Euro
fünfzig").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from num2words import num2words

from voicehost.text.languages import alternatives
from voicehost.text.rules import Rule, apply_rules

_MINUS = "\N{MINUS SIGN}"
_NBSP = "\N{NO-BREAK SPACE}\N{NARROW NO-BREAK SPACE}"
_MAX_CARDINAL_DIGITS = 15
# A round amount of millions takes "of" before its currency in fr/es/it.
_MILLIONS = ("million", "millions", "milliard", "milliards", "millón", "millones", "milione")
_MILLIONS += ("milioni", "miliardo", "miliardi")


@dataclass(frozen=True)
class Currency:
    """A currency's words: (singular, plural) and its hundredth's, and gender of the unit."""

    unit: tuple[str, str]
    cents: tuple[str, str]
    feminine: bool = False


@dataclass(frozen=True)
class Spelling:
    """What one language writes and says differently."""

    lang: str  # num2words' language
    decimal: str  # the decimal mark
    groups: str  # thousands separators
    point: str  # the word for the decimal mark
    minus: str
    percent: str
    months: tuple[str, ...]
    currencies: dict[str, Currency]
    units: dict[str, tuple[str, str]]  # symbol -> (singular, plural)
    # "quarante-deux euros cinquante": how whole units and cents are joined.
    money_join: str = " "
    cents_named: bool = False  # say the cents' word ("con cincuenta céntimos")
    # a scale as written after a number -> (singular, plural): "Mio." -> Million, Millionen
    millions: dict[str, tuple[str, str]] = field(default_factory=dict)
    of_before_currency: str = ""  # "un million d'euros", "un millón de euros"
    fraction_as_number: bool = True  # "trois virgule quatorze", not "virgule un quatre"
    one_masculine: str = ""  # "un" before a masculine noun (fr/es/it), "ein" (de)
    one_feminine: str = ""
    date: str = "{day} {month} {year}"
    date_no_year: str = "{day} {month}"
    first_day: str = ""  # "premier" (fr), "primo" (it): how the 1st of a month is said
    hour: Callable[[int, int], str] | None = None


# Italian writes a compound ending in "tre" with an accent: ventitré, duemilaventitré.
_ITALIAN_TRE = re.compile(r"(?<=\w)tre\b")


@lru_cache(maxsize=4096)  # digit by digit, a long run asks for the same ten words
def _say(value: int, lang: str, to: str = "cardinal") -> str:
    """``num2words`` in ``lang``, with the spelling it gets wrong put right."""
    words = num2words(value, lang=lang, to=to)
    return _ITALIAN_TRE.sub("tré", words) if lang == "it" else words


def _cardinal(spelling: Spelling, digits: str) -> str:
    plain = digits
    for sep in spelling.groups:
        plain = plain.replace(sep, "")
    if (len(plain) > 1 and plain.startswith("0")) or len(plain) > _MAX_CARDINAL_DIGITS:
        return " ".join(_say(int(d), spelling.lang) for d in plain)
    return _say(int(plain), spelling.lang).replace(",", "")


def _fraction(spelling: Spelling, frac: str) -> str:
    if spelling.fraction_as_number and len(frac) <= 3:
        zeros = len(frac) - len(frac.lstrip("0"))
        rest = frac.lstrip("0")
        words = [_say(0, spelling.lang)] * zeros
        if rest:
            words.append(_say(int(rest), spelling.lang))
        return " ".join(words)
    return " ".join(_say(int(d), spelling.lang) for d in frac)


def _number(spelling: Spelling, int_part: str, frac: str | None, sign: str | None = None) -> str:
    words = _cardinal(spelling, int_part)
    if frac:
        words += f" {spelling.point} {_fraction(spelling, frac)}"
    return f"{spelling.minus} {words}" if sign else words


def _before_noun(spelling: Spelling, words: str, feminine: bool) -> str:
    """A cardinal said before a noun: "un euro", "veintiún euros", "eine Million"."""
    one = spelling.one_feminine if feminine else spelling.one_masculine
    if not one:
        return words
    if spelling.lang == "de":
        return one if words == "eins" else words
    if words == _say(1, spelling.lang):
        return one
    if spelling.lang == "es" and words.endswith("uno"):
        return words[:-3] + ("una" if feminine else "ún" if words.endswith("iuno") else "un")
    if spelling.lang == "fr" and feminine and words.endswith(" et un"):
        return words + "e"
    return words


class Rules:
    """One language's rules, built from its ``Spelling``."""

    def __init__(self, spelling: Spelling) -> None:
        s = self.s = spelling
        groups = re.escape(s.groups)
        # At most five groups of thousands (past 15 digits a run is read digit by digit): an
        # unbounded run retried from each group would take quadratic time.
        self.number = (
            rf"(?<![0-9])(?P<int>[0-9]{{1,3}}(?:[{groups}][0-9]{{3}}){{1,5}}(?![0-9])|[0-9]+)"
            rf"(?:{re.escape(s.decimal)}(?P<frac>[0-9]+))?"
        )
        self.sign = rf"(?P<sign>(?<![\w-])[-{_MINUS}](?=[0-9]))?"
        self.month_names = {m.lower(): i for i, m in enumerate(s.months, 1)}
        months = "|".join(s.months)
        symbols = alternatives(s.currencies)
        scales = alternatives(s.millions)
        scale = rf"(?:\s?(?P<scale>{scales})(?![\w]))?" if scales else ""
        units = alternatives(s.units)
        self.rules: list[Rule] = [
            (
                re.compile(r"\b(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})\b"),
                self._numeric_date,
            ),
            (
                re.compile(
                    r"(?<![0-9.,/])(?P<d>[0-9]{1,2})(?P<sep>[./])(?P<mo>[0-9]{1,2})(?P=sep)"
                    r"(?P<y>[0-9]{4}|[0-9]{2})(?![0-9]|[.,/][0-9])"
                ),
                self._numeric_date,
            ),
            (
                re.compile(
                    r"(?<![0-9])(?P<d>[0-9]{1,2})(?P<ord>er|\.|º|°|o)?\s+(?:de\s+)?"
                    rf"(?P<mon>(?i:{months}))\b"
                    r"(?:,?\s+(?:de(?:l)?\s+)?(?P<y>[0-9]{4})\b(?![.,]?[0-9]))?"
                ),
                self._worded_date,
            ),
            *self._time_rules(),
            (
                re.compile(
                    rf"{self.sign}(?P<sym>{symbols})\s?{self.number}{scale}"
                    if symbols
                    else r"(?!x)x"
                ),
                self._money,
            ),
            (
                re.compile(
                    rf"{self.sign}{self.number}{scale}\s?(?P<sym>{symbols})(?![\w])"
                    if symbols
                    else r"(?!x)x"
                ),
                self._money,
            ),
            (re.compile(rf"{self.sign}{self.number}\s?%"), self._percent),
            *self._degree_ordinal_rules(),
            (
                re.compile(rf"{self.sign}{self.number}\s?(?P<unit>{units})(?![\w/'’])"),
                self._measure,
            ),
            *self._ordinal_rules(),
            *self._year_rules(),
            (re.compile(rf"{self.sign}{self.number}"), self._plain),
        ]

    def __call__(self, text: str) -> str:
        return apply_rules(text, self.rules)

    # -- dates and times -------------------------------------------------------------------

    def _day(self, day: int, before: str, ordinal: bool) -> str:
        if self.s.lang == "de":  # "am dritten März", "dritter März"
            words = _say(day, "de", "ordinal")
            return words + ("n" if _dative(before) else "r")
        if day == 1 and (self.s.first_day or ordinal):
            return self.s.first_day or _say(1, self.s.lang, "ordinal")
        return _say(day, self.s.lang)

    def _date(
        self, day: int, month: int, year: str | None, before: str, ordinal: bool = False
    ) -> str | None:
        if not (1 <= month <= 12 and 1 <= day <= 31):
            return None
        words = {"day": self._day(day, before, ordinal), "month": self.s.months[month - 1]}
        if year is None:
            return self.s.date_no_year.format(**words)
        return self.s.date.format(**words, year=self._year(year))

    def _year(self, digits: str) -> str:
        value = int(digits if len(digits) == 4 else f"20{digits}")
        # German says 1999 "neunzehnhundertneunundneunzig"; the others say a year as a number.
        to = "year" if self.s.lang == "de" else "cardinal"
        return _say(value, self.s.lang, to)

    def _numeric_date(self, m: re.Match[str]) -> str | None:
        return self._date(int(m["d"]), int(m["mo"]), m["y"], m.string[: m.start()])

    def _worded_date(self, m: re.Match[str]) -> str | None:
        month = self.month_names[m["mon"].lower()]
        return self._date(int(m["d"]), month, m["y"], m.string[: m.start()], bool(m["ord"]))

    def _time_rules(self) -> list[Rule]:
        lang = self.s.lang
        rules: list[Rule] = []
        if lang == "fr":
            rules.append(
                (
                    re.compile(r"(?<![0-9])(?P<h>[0-9]{1,2})\s?h\s?(?P<m>[0-5][0-9])?(?![\w])"),
                    self._clock,
                )
            )
        if lang == "de":
            rules.append(
                (
                    re.compile(r"(?<![0-9])(?P<h>[0-9]{1,2})(?:[:.](?P<m>[0-5][0-9]))?\s?Uhr\b"),
                    self._clock,
                )
            )
        if lang == "it":
            rules.append(
                (
                    re.compile(
                        r"\b(?P<at>(?i:all'|alle|dalle|ore|le)\s?)"
                        r"(?P<h>[0-9]{1,2})[.:](?P<m>[0-5][0-9])\b"
                    ),
                    self._clock,
                )
            )
        rules.append(
            (
                re.compile(
                    r"(?<![0-9:.])(?P<h>[0-9]{1,2}):(?P<m>[0-5][0-9])(?!:?[0-9])(?:\s?h\b)?"
                ),
                self._clock,
            )
        )
        return rules

    def _clock(self, m: re.Match[str]) -> str | None:
        hour, minute = int(m["h"]), int(m["m"] or 0)
        if hour > 24 or self.s.hour is None:
            return None
        return (m.groupdict().get("at") or "") + self.s.hour(hour, minute)

    # -- money, percentages, units -----------------------------------------------------------

    def _money(self, m: re.Match[str]) -> str:
        s = self.s
        currency = s.currencies[m["sym"]]
        sign = f"{s.minus} " if m["sign"] else ""
        scale = m.groupdict().get("scale")
        if scale:
            count = _number(s, m["int"], m["frac"])
            singular, plural = s.millions[scale]
            scale_words = singular if count == _say(1, s.lang) else plural
            count = _before_noun(s, count, feminine=s.lang == "de")  # eine Million
            return f"{sign}{count} {scale_words} {s.of_before_currency}{currency.unit[1]}"
        frac = m["frac"]
        whole_words = _cardinal(s, m["int"])
        if frac and len(frac) > 2:
            return f"{sign}{_number(s, m['int'], frac)} {currency.unit[1]}"
        cents = int(frac.ljust(2, "0")) if frac else 0
        whole = int(re.sub(r"[^0-9]", "", m["int"]))
        parts = []
        if whole or not cents:
            unit = currency.unit[0] if whole == 1 else currency.unit[1]
            if whole_words.endswith(_MILLIONS) and s.of_before_currency:
                of = s.of_before_currency  # "un million d'euros", "un millón de euros"
                unit = f"{of}{unit}"
            parts.append(f"{_before_noun(s, whole_words, currency.feminine)} {unit}")
        if cents:
            cents_words = _say(cents, s.lang)
            if s.cents_named or not whole:
                unit = currency.cents[0] if cents == 1 else currency.cents[1]
                cents_words = f"{_before_noun(s, cents_words, False)} {unit}"
            parts.append(cents_words)
        return sign + s.money_join.join(parts)

    def _percent(self, m: re.Match[str]) -> str:
        return f"{_number(self.s, m['int'], m['frac'], m['sign'])} {self.s.percent}"

    def _measure(self, m: re.Match[str]) -> str:
        singular, plural = self.s.units[m["unit"]]
        one = m["int"] == "1" and not m["frac"] and not m["sign"]
        words = _number(self.s, m["int"], m["frac"], m["sign"])
        if one:
            words = _before_noun(self.s, words, feminine=False)
        return f"{words} {singular if one else plural}"

    # -- ordinals and plain numbers -----------------------------------------------------------

    def _ordinal_rules(self) -> list[Rule]:
        lang = self.s.lang
        if lang == "fr":
            pattern = r"(?<![0-9])(?P<n>[0-9]{1,4})(?P<suf>ère|ere|re|er|ème|eme|e|es|èmes)\b"
        elif lang == "es":
            pattern = r"(?<![0-9])(?P<n>[0-9]{1,4})\.?(?P<suf>º|ª|°|er)"
        elif lang == "it":
            pattern = r"(?<![0-9])(?P<n>[0-9]{1,4})(?P<suf>°|º|ª)"
        else:  # de: "der 3. Platz", "wurde 2. im"; not "bis 3. Dann" (a sentence end)
            pattern = (
                r"(?<![0-9.,])(?P<n>[0-9]{1,3})(?P<suf>\.)(?=\s+(?:[a-zäöüß]|(?!(?:Dann|Danach|"
                r"Der|Die|Das|Ich|Er|Sie|Es|Wir|Ihr|Aber|Und|Doch|Man|Im|Am|In)\b)[A-ZÄÖÜ][a-zäöüß]))"
            )
        return [(re.compile(pattern), self._ordinal)]

    def _degree_ordinal_rules(self) -> list[Rule]:
        """Italian and Spanish write "2° piano", "1° maggio" with a degree sign: an ordinal
        where a word follows it, read before units make it degrees."""
        if self.s.lang not in ("it", "es"):
            return []
        return [
            (re.compile(r"(?<![0-9])(?P<n>[0-9]{1,3})(?P<suf>°)(?=\s+[a-zà-ú])"), self._ordinal)
        ]

    def _year_rules(self) -> list[Rule]:
        """German says a bare 1100..1999 as a year: "neunzehnhundertneunundneunzig"."""
        if self.s.lang != "de":
            return []
        return [
            (
                re.compile(r"(?<![0-9.,])(?P<y>1[1-9][0-9]{2})(?![0-9]|[.,][0-9])"),
                lambda m: self._year(m["y"]),
            )
        ]

    def _ordinal(self, m: re.Match[str]) -> str:
        s, value, suffix = self.s, int(m["n"]), m["suf"]
        words = _say(value, s.lang, "ordinal")
        if s.lang == "fr":
            if value == 1 and suffix in ("re", "ère", "ere"):
                return "première"
            return f"{words}s" if suffix in ("es", "èmes") else words
        if s.lang == "es":
            if suffix == "ª":
                return " ".join(w[:-1] + "a" if w.endswith("o") else w for w in words.split())
            if suffix == "er":
                return words[:-1] if words.endswith(("primero", "tercero")) else words
            return words
        if s.lang == "it":
            return words[:-1] + "a" if suffix == "ª" and words.endswith("o") else words
        return words + "n" if _dative(m.string[: m.start()]) else words

    def _plain(self, m: re.Match[str]) -> str:
        return _number(self.s, m["int"], m["frac"], m["sign"])


def _dative(before: str) -> bool:
    """Whether a German ordinal after ``before`` takes "-n" ("am dritten", "zum zweiten")."""
    words = before.rstrip().rsplit(maxsplit=1)
    return bool(words) and words[-1].lower() in {
        "am", "vom", "zum", "im", "beim", "dem", "den", "des", "zur", "ab", "seit",
    }  # fmt: skip


# -- the languages --------------------------------------------------------------------------


def _fr_hour(hour: int, minute: int) -> str:
    words = "une" if hour == 1 else "vingt et une" if hour == 21 else _say(hour, "fr")
    words += " heure" if hour in (0, 1) else " heures"
    return f"{words} {_say(minute, 'fr')}" if minute else words


def _de_hour(hour: int, minute: int) -> str:
    words = "ein" if hour == 1 else _say(hour, "de")
    return f"{words} Uhr {_say(minute, 'de')}" if minute else f"{words} Uhr"


def _es_hour(hour: int, minute: int) -> str:
    words = "una" if hour == 1 else "veintiuna" if hour == 21 else _say(hour, "es")
    return f"{words} y {_say(minute, 'es')}" if minute else words


def _it_hour(hour: int, minute: int) -> str:
    words = "una" if hour == 1 else _say(hour, "it")
    return f"{words} e {_say(minute, 'it')}" if minute else words


_EURO = "€"
FRENCH = Spelling(
    lang="fr",
    decimal=",",
    groups=f" {_NBSP}.",
    point="virgule",
    minus="moins",
    percent="pour cent",
    months=tuple(
        "janvier février mars avril mai juin juillet août septembre octobre novembre "
        "décembre".split()
    ),
    currencies={
        _EURO: Currency(("euro", "euros"), ("centime", "centimes")),
        "EUR": Currency(("euro", "euros"), ("centime", "centimes")),
        "$": Currency(("dollar", "dollars"), ("cent", "cents")),
        "£": Currency(("livre", "livres"), ("penny", "pence"), feminine=True),
        "CHF": Currency(("franc", "francs"), ("centime", "centimes")),
    },
    units={
        "km/h": ("kilomètre heure", "kilomètres heure"),
        "km": ("kilomètre", "kilomètres"),
        "cm": ("centimètre", "centimètres"),
        "mm": ("millimètre", "millimètres"),
        "m": ("mètre", "mètres"),
        "kg": ("kilo", "kilos"),
        "g": ("gramme", "grammes"),
        "mg": ("milligramme", "milligrammes"),
        "ml": ("millilitre", "millilitres"),
        "l": ("litre", "litres"),
        "°C": ("degré Celsius", "degrés Celsius"),
        "°": ("degré", "degrés"),
        "min": ("minute", "minutes"),
        "Go": ("gigaoctet", "gigaoctets"),
        "Mo": ("mégaoctet", "mégaoctets"),
    },
    millions={
        "millions": ("million", "millions"),
        "million": ("million", "millions"),
        "milliards": ("milliard", "milliards"),
        "milliard": ("milliard", "milliards"),
        "M": ("million", "millions"),
        "Md": ("milliard", "milliards"),
        "Mds": ("milliard", "milliards"),
    },
    of_before_currency="d'",
    one_masculine="un",
    one_feminine="une",
    first_day="premier",
    hour=_fr_hour,
)

GERMAN = Spelling(
    lang="de",
    decimal=",",
    groups=f".{_NBSP} ",
    point="Komma",
    minus="minus",
    percent="Prozent",
    months=tuple(
        "Januar Februar März April Mai Juni Juli August September Oktober November Dezember".split()
    ),
    currencies={
        _EURO: Currency(("Euro", "Euro"), ("Cent", "Cent")),
        "EUR": Currency(("Euro", "Euro"), ("Cent", "Cent")),
        "$": Currency(("Dollar", "Dollar"), ("Cent", "Cent")),
        "£": Currency(("Pfund", "Pfund"), ("Penny", "Pence")),
        "CHF": Currency(("Franken", "Franken"), ("Rappen", "Rappen")),
    },
    units={
        "km/h": ("Kilometer pro Stunde", "Kilometer pro Stunde"),
        "km": ("Kilometer", "Kilometer"),
        "cm": ("Zentimeter", "Zentimeter"),
        "mm": ("Millimeter", "Millimeter"),
        "m": ("Meter", "Meter"),
        "kg": ("Kilogramm", "Kilogramm"),
        "g": ("Gramm", "Gramm"),
        "mg": ("Milligramm", "Milligramm"),
        "ml": ("Milliliter", "Milliliter"),
        "l": ("Liter", "Liter"),
        "°C": ("Grad Celsius", "Grad Celsius"),
        "°": ("Grad", "Grad"),
        "Min.": ("Minute", "Minuten"),
        "GB": ("Gigabyte", "Gigabyte"),
    },
    millions={
        "Mio.": ("Million", "Millionen"),
        "Millionen": ("Million", "Millionen"),
        "Million": ("Million", "Millionen"),
        "Mrd.": ("Milliarde", "Milliarden"),
        "Milliarden": ("Milliarde", "Milliarden"),
        "Milliarde": ("Milliarde", "Milliarden"),
    },
    fraction_as_number=False,  # "drei Komma eins vier"
    one_masculine="ein",
    one_feminine="eine",
    date="{day} {month} {year}",
    hour=_de_hour,
)

_SPANISH_MONTHS = tuple(
    "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre "
    "diciembre".split()
)
SPANISH = Spelling(
    lang="es",
    decimal=",",
    groups=f".{_NBSP} ",
    point="coma",
    minus="menos",
    percent="por ciento",
    months=_SPANISH_MONTHS,
    currencies={
        _EURO: Currency(("euro", "euros"), ("céntimo", "céntimos")),
        "EUR": Currency(("euro", "euros"), ("céntimo", "céntimos")),
        "$": Currency(("dólar", "dólares"), ("centavo", "centavos")),
        "US$": Currency(("dólar", "dólares"), ("centavo", "centavos")),
        "£": Currency(("libra", "libras"), ("penique", "peniques"), feminine=True),
    },
    units={
        "km/h": ("kilómetro por hora", "kilómetros por hora"),
        "km": ("kilómetro", "kilómetros"),
        "cm": ("centímetro", "centímetros"),
        "mm": ("milímetro", "milímetros"),
        "m": ("metro", "metros"),
        "kg": ("kilo", "kilos"),
        "g": ("gramo", "gramos"),
        "mg": ("miligramo", "miligramos"),
        "ml": ("mililitro", "mililitros"),
        "l": ("litro", "litros"),
        "°C": ("grado centígrado", "grados centígrados"),
        "°": ("grado", "grados"),
        "min": ("minuto", "minutos"),
    },
    millions={
        "millones": ("millón", "millones"),
        "millón": ("millón", "millones"),
        "M": ("millón", "millones"),
        "mil millones": ("mil millones", "mil millones"),
    },
    of_before_currency="de ",
    money_join=" con ",
    cents_named=True,
    fraction_as_number=True,
    one_masculine="un",
    one_feminine="una",
    date="{day} de {month} de {year}",
    date_no_year="{day} de {month}",
    hour=_es_hour,
)
# Mexico, the United States and Central America write "1,500.50".
SPANISH_POINT = dataclasses.replace(SPANISH, decimal=".", groups=f",{_NBSP} ", point="punto")
_POINT_REGIONS = frozenset({"mx", "us", "gt", "hn", "sv", "ni", "pa", "do", "pr", "cu", "419"})

ITALIAN = Spelling(
    lang="it",
    decimal=",",
    groups=f".{_NBSP} ",
    point="virgola",
    minus="meno",
    percent="per cento",
    months=tuple(
        "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre "
        "dicembre".split()
    ),
    currencies={
        _EURO: Currency(("euro", "euro"), ("centesimo", "centesimi")),
        "EUR": Currency(("euro", "euro"), ("centesimo", "centesimi")),
        "$": Currency(("dollaro", "dollari"), ("centesimo", "centesimi")),
        "£": Currency(("sterlina", "sterline"), ("penny", "pence"), feminine=True),
    },
    units={
        "km/h": ("chilometro orario", "chilometri orari"),
        "km": ("chilometro", "chilometri"),
        "cm": ("centimetro", "centimetri"),
        "mm": ("millimetro", "millimetri"),
        "m": ("metro", "metri"),
        "kg": ("chilo", "chili"),
        "g": ("grammo", "grammi"),
        "mg": ("milligrammo", "milligrammi"),
        "ml": ("millilitro", "millilitri"),
        "l": ("litro", "litri"),
        "°C": ("grado centigrado", "gradi centigradi"),
        "°": ("grado", "gradi"),
        "min": ("minuto", "minuti"),
    },
    millions={
        "milioni": ("milione", "milioni"),
        "milione": ("milione", "milioni"),
        "mln": ("milione", "milioni"),
        "miliardi": ("miliardo", "miliardi"),
        "mld": ("miliardo", "miliardi"),
    },
    of_before_currency="di ",
    money_join=" e ",
    one_masculine="un",
    one_feminine="una",
    first_day="primo",
    hour=_it_hour,
)


# Built at import (about 20 ms): a first request in a language then pays no regex compiling,
# which takes up to 7 ms a language.
_RULES = {
    "fr": Rules(FRENCH),
    "de": Rules(GERMAN),
    "es": Rules(SPANISH),
    "it": Rules(ITALIAN),
}
_SPANISH_POINT_RULES = Rules(SPANISH_POINT)


def rules_for(language: str, region: str = "") -> Rules | None:
    """The rules of a primary language subtag (``fr``) and its region (``mx``), or ``None``."""
    if language == "es" and region in _POINT_REGIONS:
        return _SPANISH_POINT_RULES
    return _RULES.get(language)
