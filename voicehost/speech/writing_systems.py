"""How long a word is said, read from how it is written, for languages other than English.

The built-in aligner (``voicehost.speech.alignment``) weighs each word by its letters and its
syllables; English's are counted by English rules, after the text stage's English reading of
numbers and signs. A word of another language is weighed by its script instead:

- Latin script (fr, de, es, it, ...): its letters, and a syllable per vowel group (French's
  silent final e, es and verbs' ent left out);
- Han (zh, and kanji): a syllable a character (said as about three letters of pinyin); kana a
  mora a character;
- Hangul (ko): a syllable a block, its jamo (two or three) its letters;
- Devanagari (hi): a syllable an akshara (consonants a virama joins, with their vowel sign; an
  independent vowel), the inherent vowel of a final bare consonant not said, nor, right to left,
  that of a lone consonant between a vowel and a lone consonant with its vowel (schwa
  deletion: ``करने`` kar-ne);
- a word's last vowel that meets the next word's first (``vowels_meet``, Latin or Devanagari):
  a language may say the two as one syllable (Italian's and Spanish's synalepha);
- digits: about one and a half syllables each (no language's numbers are read here: the words
  they become are the text stage's);
- another script: its letters, a syllable each three.

A language written without spaces is cut into words here too: each Han or kana character is a
word, as is each run of other letters and digits, the punctuation beside it kept with it (so
every word is a span of the client's text).
"""

from __future__ import annotations

import re
from unicodedata import category

HAN_LETTERS = 3.0  # a Han character's pinyin: about three letters
KANA_LETTERS = 2.0
DIGIT_LETTERS = 4.0  # a digit is said as a word of about four letters
DIGIT_SYLLABLES = 1.5
OTHER_LETTERS_PER_SYLLABLE = 3
# a vowel group; a y before a vowel is a consonant ("playa", "yeux")
LATIN_VOWELS = re.compile(r"(?:[aeiouàáâãäåæèéêëìíîïòóôõöøùúûüýÿœ]|y(?![aeiouàáâèéêíîóôúû]))+")
FRENCH_SILENT_ENDING = re.compile(r"[^aeiouyàâéèêëîïôùûü](?:e|es|ent)$")
FRENCH_SAID_ENT = re.compile(r"(?:^.{1,2}|m|[aeo]uv|v)ent$")  # moment, souvent, vent, cent


def is_han(ch: str) -> bool:
    code = ord(ch)
    return 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF


def is_kana(ch: str) -> bool:
    return 0x3040 <= ord(ch) <= 0x30FF


def is_hangul(ch: str) -> bool:
    return 0xAC00 <= ord(ch) <= 0xD7A3


def is_devanagari(ch: str) -> bool:
    return 0x0900 <= ord(ch) <= 0x097F


def said_alone(ch: str) -> bool:
    """A character that is a word of its own: Han and kana (written without spaces)."""
    return is_han(ch) or is_kana(ch)


def unspaced_words(token: str) -> list[tuple[int, int]]:
    """The words of ``token`` (a run of non-space): each Han or kana character, and each run of
    other characters between them with a letter or digit, as (start, end) in ``token``;
    punctuation before the first goes with it, any other with the word before it. One word if
    the token has none to cut."""
    cores: list[tuple[int, int]] = []  # (start, end) of each word's letters
    alone = False  # whether the last core is a character said alone
    for index, ch in enumerate(token):
        if said_alone(ch):
            cores.append((index, index + 1))
            alone = True
        elif ch.isalnum() or is_devanagari(ch):
            if cores and not alone:  # "c'era", "Pourriez-vous": one word, as written
                cores[-1] = (cores[-1][0], index + 1)
            else:
                cores.append((index, index + 1))
            alone = False
    if len(cores) < 2:
        return [(0, len(token))]
    starts = [0] + [start for start, _ in cores[1:]]
    return [(a, b) for a, b in zip(starts, [*starts[1:], len(token)], strict=True)]


def hangul_jamo(ch: str) -> int:
    """The letters of a Hangul syllable block: an initial, a vowel and maybe a final."""
    return 3 if (ord(ch) - 0xAC00) % 28 else 2


DEVANAGARI_CONSONANT = re.compile(r"[\u0915-\u0939\u0958-\u095f\u0978-\u097f]")
DEVANAGARI_VOWEL = re.compile(r"[\u0904-\u0914\u0960\u0961\u0972-\u0977]")
DEVANAGARI_SIGN = re.compile(r"[\u093a\u093b\u093e-\u094c\u094e\u094f\u0955-\u0957\u0962\u0963]")
VIRAMA, NUKTA = "\u094d", "\u093c"
DEVANAGARI_NASAL = re.compile(r"[\u0901-\u0903]")  # candrabindu, anusvara, visarga


def aksharas(word: str) -> tuple[int, int]:
    """(syllables, letters) of a Devanagari word: its aksharas, less those whose inherent vowel
    is not said (schwa deletion): a final bare consonant's (``बाज़ार`` baa-zaar), and, right to
    left, a lone consonant's between a vowel said and a lone consonant with its vowel
    (``बैठकर`` baith-kar, ``करने`` kar-ne); and its consonants and vowels."""
    consonants: list[int] = []  # of each akshara
    vowels: list[str] = []  # each akshara's: "a" inherent, "v" a sign or its own, "" a virama's
    letters, joined = 0, False
    for ch in word:
        if DEVANAGARI_CONSONANT.match(ch):
            letters += 1
            if joined and consonants:  # a virama joins it to the akshara before
                consonants[-1] += 1
                vowels[-1] = "a"
            else:
                consonants.append(1)
                vowels.append("a")
        elif DEVANAGARI_VOWEL.match(ch):
            letters += 1
            consonants.append(0)
            vowels.append("v")
        elif DEVANAGARI_SIGN.match(ch) or DEVANAGARI_NASAL.match(ch):
            letters += DEVANAGARI_SIGN.match(ch) is not None
            if vowels:
                vowels[-1] = "v"
        elif ch == VIRAMA and vowels:
            vowels[-1] = ""
        joined = ch == VIRAMA or (joined and ch == NUKTA)
    said = [vowel != "" for vowel in vowels]
    if len(vowels) > 1 and vowels[-1] == "a":
        said[-1] = False
    for i in range(len(vowels) - 2, 0, -1):
        lone = consonants[i] == 1 and vowels[i] == "a"
        if lone and said[i - 1] and said[i + 1] and consonants[i + 1] == 1:
            said[i] = False
    return sum(said), letters


def vowels_meet(before: str, after: str) -> bool:
    """Whether word ``before`` ends with a vowel and ``after`` begins with one, each as written,
    punctuation aside: a Latin vowel (a silent h before the second), or Devanagari's (a vowel
    sign, nasalised or not, then an independent vowel). Where a language runs them together
    (Italian's "mare e", Spanish's "vamos a la", Hindi's "क्या आप") they are one syllable's
    level, one peak."""
    last = "".join(ch for ch in before.lower() if ch.isalpha() or category(ch)[0] == "M")
    first = "".join(ch for ch in after.lower() if ch.isalpha() or category(ch)[0] == "M")
    if not last or not first:
        return False
    if is_devanagari(last[-1]) or is_devanagari(first[0]):
        last = last.rstrip("\u0901\u0902")  # a nasalised vowel is a vowel
        return bool(last and DEVANAGARI_SIGN.match(last[-1]) and DEVANAGARI_VOWEL.match(first))
    first = first[1:2] if first[:1] == "h" else first[:1]
    return bool(first) and all(LATIN_VOWELS.fullmatch(ch) for ch in (last[-1], first))


def latin_syllables(part: str, language: str) -> int:
    """The vowel groups of a lower-case run of Latin letters; at least one."""
    groups = len(LATIN_VOWELS.findall(part))
    if (
        language == "fr"
        and groups > 1
        and FRENCH_SILENT_ENDING.search(part)
        and not FRENCH_SAID_ENT.search(part)
    ):
        groups -= 1
    return max(1, groups)


def spoken_length(word: str, language: str) -> tuple[float, int]:
    """(letters, syllables) of how ``word`` (a word of ``text_words``, punctuation and all) is
    said in ``language`` (a primary subtag: ``fr``), read from its script."""
    letters, syllables = 0.0, 0.0
    for run in re.finditer(r"[\u0900-\u097f]+|[^\W\d_]+|\d+", word.lower()):
        part = run.group()
        if part.isdigit():
            letters += DIGIT_LETTERS * len(part)
            syllables += DIGIT_SYLLABLES * len(part)
        elif is_devanagari(part[0]):
            said, written = aksharas(part)
            letters, syllables = letters + written, syllables + said
        elif LATIN_VOWELS.search(part):
            letters += len(part)
            syllables += latin_syllables(part, language)
        elif part.isascii():  # no vowel: an elision ("l'", "c'era") or a consonant's name
            letters += len(part)
        else:
            for ch in part:
                if is_han(ch):
                    letters, syllables = letters + HAN_LETTERS, syllables + 1
                elif is_kana(ch):
                    letters, syllables = letters + KANA_LETTERS, syllables + 1
                elif is_hangul(ch):
                    letters, syllables = letters + hangul_jamo(ch), syllables + 1
                else:
                    letters, syllables = letters + 1, syllables + 1 / OTHER_LETTERS_PER_SYLLABLE
    return letters, max(1, round(syllables))
