"""Normalisation rules of the languages other than English, one module per language or family:
``european`` (fr, de, es, it: one set of rules over each language's words and number writing),
``korean``, ``hindi`` and ``chinese``. Each gives ``normalize(text) -> str`` for one segment;
``voicehost.text.normalize.normalizer`` picks one by a BCP-47 tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def alternatives(words: Iterable[str], escape: bool = True) -> str:
    """A regular expression's alternation of ``words``, the longest first (so ``km`` is not
    taken for the ``k`` of ``km``)."""
    ordered = sorted(words, key=len, reverse=True)
    return "|".join(re.escape(w) if escape else w for w in ordered)
