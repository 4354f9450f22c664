"""How a language's normalisation rules are applied (see ``voicehost.text.normalize``).

A rule is a pattern and what to say for a match (``None``: leave it as written). Rules run in
order, each over what the previous ones left; emotive tags are split out first and come back
byte-identical.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from voicehost.text import TAG

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str | None]]

_TAG_SPLIT = re.compile(f"({TAG.pattern})")


def apply_rule(rule: Rule, text: str, spaced: bool = True) -> str:
    """``text`` with every match of the rule's pattern said as its words. ``spaced``: keep the
    words apart from letters they were glued to ("mp3" -> "mp three"); off for a script written
    without spaces, where "2024年" becomes "二零二四年"."""
    pattern, convert = rule

    def replace(m: re.Match[str]) -> str:
        try:
            words = convert(m)
        except (ArithmeticError, ValueError, NotImplementedError, KeyError, IndexError):
            # num2words refuses some values; such text stays as written.
            return m[0]
        if words is None:
            return m[0]
        if spaced:
            before = m.string[m.start() - 1 : m.start()]
            after = m.string[m.end() : m.end() + 1]
            if before.isalnum() and words[:1].isalnum():
                words = " " + words
            if after.isalnum() and words[-1:].isalnum():
                words += " "
        return words

    return pattern.sub(replace, text)


def apply_rules(text: str, rules: Sequence[Rule], spaced: bool = True) -> str:
    """``text`` with ``rules`` applied in order outside emotive tags."""
    parts = _TAG_SPLIT.split(text)
    for i in range(0, len(parts), 2):  # odd indices are tags
        for rule in rules:
            parts[i] = apply_rule(rule, parts[i], spaced)
    return "".join(parts)
