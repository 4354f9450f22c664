"""The text stage: raw text -> speakable segments, called in one place (``stage.TextStage``).

Three steps, applied in this order:

1. A lexicon (``lexicon``) says its aliases in place of the words they stand for.
2. Segmentation (``TextSegmenter`` for text that arrives in pieces, ``split_text`` for a complete
   text) cuts the text that is said into segments that partition it exactly. It cuts only where
   whitespace follows, or right after a Chinese or Japanese mark (``。！？，、``), or, for a word
   longer than ``max_chars``, hard), so a number or an emotive tag is never split across two
   segments; only the ``max_chars`` fallback (cut at a space) can split a multi-word expression
   such as "$1.5 million".
3. Normalisation (``normalize``) rewrites one segment for the model: numbers, dates, times,
   currency, percentages, units and common abbreviations become words of the segment's language
   (English, or ``languages``: fr, de, es, it, ko, hi, zh); a language without rules is said as
   written. Emotive tags such as ``<laugh>`` pass through byte-identical.

A segment may be blank (whitespace only, e.g. trailing whitespace at the end of the input): callers
skip blank segments instead of synthesizing them.
"""

from __future__ import annotations

import re

EN_DASH = "\N{EN DASH}"
# Characters that may close a sentence after its mark (quotes, brackets).
CLOSERS = "\"'\N{RIGHT DOUBLE QUOTATION MARK}\N{RIGHT SINGLE QUOTATION MARK}»)]}"

# An emotive tag (`<laugh>`, `<sigh>`, any `<word>`): never rewritten, never cut.
TAG = re.compile(r"<[A-Za-z][\w-]{0,30}>")
