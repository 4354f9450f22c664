"""A tenant's named pronunciation lexicons: reading uploads (JSON, W3C PLS), their limits, and
where they are kept (``FolderLexicons``: one JSON file per lexicon; a cluster keeps the same
files in its shared store with Redis in front, ``voicehost.cluster.lexicons``).

What an entry does to the text is ``voicehost.text.lexicon``. Uploads are treated as hostile:
a PLS file is parsed with ``defusedxml`` with DTDs forbidden, so entity expansion and external
entities are refused before anything is expanded or fetched, and elements nested deeper than a
lexicon needs are refused as they are read.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import iterparse

from voicehost.config import LANGUAGE_TAG
from voicehost.errors import ServiceError
from voicehost.ids import as_iso, child, now_iso
from voicehost.model.languages import DEFAULT_LANGUAGE
from voicehost.text import TAG
from voicehost.text.lexicon import LexiconEntry

if TYPE_CHECKING:
    from voicehost.config import Settings

LEXICON_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
PLS_NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
MAX_PLS_DEPTH = 8  # lexicon > lexeme > grapheme is 3 deep
SHARED = "_shared"  # the folder of lexicons without a tenant (open mode); no tenant is named so
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACES = re.compile(r"\s+")


def is_lexicon_name(value: object) -> bool:
    return isinstance(value, str) and LEXICON_NAME_PATTERN.fullmatch(value) is not None


def checked_name(name: str) -> str:
    """``name`` if it is a lexicon's name, else ``LexiconError`` (``invalid_lexicon_name``)."""
    if not is_lexicon_name(name):
        message = f"name must match {LEXICON_NAME_PATTERN.pattern}"
        raise LexiconError(message, code="invalid_lexicon_name")
    return name


class LexiconNotFound(ServiceError, LookupError):
    """No lexicon of this name (the caller's tenant's)."""

    code = "lexicon_not_found"

    def __init__(self, name: str) -> None:
        super().__init__(f"lexicon {name!r} does not exist")


class LexiconError(ServiceError, ValueError):
    """A lexicon that is refused, with the API's code for why."""

    code = "invalid_lexicon"


class UnsafeLexicon(LexiconError):
    """A PLS file with a DTD, entities or nesting beyond a lexicon's: refused unexpanded."""

    code = "unsafe_lexicon"


class LexiconTooLarge(LexiconError):
    """More entries than a lexicon may hold."""

    code = "lexicon_too_large"


class EntryTooLong(LexiconError):
    """A grapheme or alias longer than an entry may be."""

    code = "lexicon_entry_too_long"


class TooManyLexicons(LexiconError):
    """The tenant already keeps as many lexicons as it may."""

    code = "too_many_lexicons"


@dataclass(frozen=True, slots=True)
class LexiconLimits:
    max_entries: int = 1000
    max_entry_chars: int = 200
    per_tenant: int = 100

    @classmethod
    def from_settings(cls, settings: Settings) -> LexiconLimits:
        return cls(
            settings.lexicon_max_entries,
            settings.lexicon_max_entry_chars,
            settings.lexicons_per_tenant,
        )


@dataclass(frozen=True, slots=True)
class StoredLexicon:
    name: str
    entries: tuple[LexiconEntry, ...]
    updated: str  # UTC, ISO 8601 (``now_iso``)
    language: str = DEFAULT_LANGUAGE  # it applies to the voices of this language (BCP-47)

    def document(self) -> str:
        """The stored form: JSON, as ``parse_stored`` reads it."""
        entries = [
            {"grapheme": e.grapheme, "alias": e.alias, "case_sensitive": e.case_sensitive}
            for e in self.entries
        ]
        return json.dumps(
            {
                "name": self.name,
                "updated": self.updated,
                "language": self.language,
                "entries": entries,
            }
        )


def parse_stored(document: str) -> StoredLexicon:
    """A lexicon as ``StoredLexicon.document`` wrote it (already checked when it was put); one
    written before timestamps were ISO holds Unix seconds, shown as ISO, and one written before
    lexicons had a language is English's."""
    data = json.loads(document)
    entries = tuple(
        LexiconEntry(e["grapheme"], e["alias"], bool(e["case_sensitive"])) for e in data["entries"]
    )
    # one written before lexicons had a language was English's
    language = data.get("language") or DEFAULT_LANGUAGE
    return StoredLexicon(data["name"], entries, as_iso(data["updated"]), language)


# --- uploads -----------------------------------------------------------------------------------


def _clean(value: str, what: str, limits: LexiconLimits) -> str:
    text = _SPACES.sub(" ", value).strip()
    if len(text) > limits.max_entry_chars:
        raise EntryTooLong(
            f"{what} {text[:40]!r}... has {len(text)} characters; at most {limits.max_entry_chars}"
        )
    if _CONTROL.search(text):
        raise LexiconError(f"{what} {text[:40]!r} holds a control character")
    return text


def checked_entries(entries: Iterable[LexiconEntry], limits: LexiconLimits) -> list[LexiconEntry]:
    """The entries, whitespace collapsed, checked against ``limits`` and the rules: a grapheme
    is not blank and holds no emotive tag; an alias has something to say (a letter or digit)."""
    found = []
    for entry in entries:
        if len(found) >= limits.max_entries:
            raise LexiconTooLarge(f"a lexicon holds at most {limits.max_entries} entries")
        grapheme = _clean(entry.grapheme, "grapheme", limits)
        alias = _clean(entry.alias, "alias", limits)
        if not grapheme:
            raise LexiconError("an entry's grapheme is blank")
        if TAG.search(grapheme):
            raise LexiconError(
                f"grapheme {grapheme!r} holds an emotive tag: tags are never matched"
            )
        if not any(ch.isalnum() for ch in alias):
            raise LexiconError(f"the alias of {grapheme!r} has nothing to say (no letter or digit)")
        found.append(LexiconEntry(grapheme, alias, entry.case_sensitive))
    return found


def _local(tag: object) -> str | None:
    """An element's name in the PLS namespace (or in none), else ``None``."""
    if not isinstance(tag, str):
        return None
    namespace, _, name = tag[1:].rpartition("}") if tag.startswith("{") else ("", "", tag)
    return name if namespace in ("", PLS_NAMESPACE) else None


XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


def pls_language(data: bytes) -> str | None:
    """The ``xml:lang`` of a PLS document's ``<lexicon>`` (PLS requires one), if it has one;
    read before the entries, from the root element alone."""
    try:
        for _, element in iterparse(io.BytesIO(data), events=("start",), forbid_dtd=True):
            language = element.get(XML_LANG)
            return language.strip() if language else None
    except (DefusedXmlException, ET.ParseError):
        return None  # parse_pls says why
    return None


def checked_language(language: str) -> str:
    """``language`` if it is a BCP-47 tag (``en``, ``fr``, ``pt-BR``), else ``LexiconError``."""
    if not LANGUAGE_TAG.fullmatch(language):
        message = f"language {language!r} is not a language tag (en, fr, pt-BR, zh)"
        raise LexiconError(message, code="invalid_lexicon")
    return language


def parse_pls(data: bytes, limits: LexiconLimits) -> tuple[list[LexiconEntry], int]:
    """The ``<alias>`` entries of a W3C PLS 1.0 document, and how many lexemes were left out:
    each ``<lexeme>``'s graphemes say its first alias, matched as written (case-sensitive); a
    lexeme with only ``<phoneme>``s is left out (this model reads text). A DTD (so any entity)
    is refused, and so is nesting beyond ``MAX_PLS_DEPTH``, while the document is read."""
    entries: list[LexiconEntry] = []
    skipped = depth = 0
    try:
        events = iterparse(io.BytesIO(data), events=("start", "end"), forbid_dtd=True)
        for event, element in events:
            if event == "start":
                depth += 1
                if depth > MAX_PLS_DEPTH:
                    raise UnsafeLexicon(f"elements are nested deeper than {MAX_PLS_DEPTH}")
                if depth == 1 and _local(element.tag) != "lexicon":
                    raise LexiconError("a PLS document's root is <lexicon>")
                continue
            depth -= 1
            if depth == 1 and _local(element.tag) == "lexeme":
                graphemes = [c.text or "" for c in element if _local(c.tag) == "grapheme"]
                aliases = [c.text or "" for c in element if _local(c.tag) == "alias"]
                if aliases:
                    entries += (LexiconEntry(g, aliases[0], case_sensitive=True) for g in graphemes)
                else:
                    skipped += 1
                if len(entries) > limits.max_entries:
                    raise LexiconTooLarge(f"a lexicon holds at most {limits.max_entries} entries")
                element.clear()
    except DefusedXmlException as exc:
        raise UnsafeLexicon(
            f"refused unexpanded: a PLS lexicon takes no DTD or entities ({type(exc).__name__})"
        ) from exc
    except ET.ParseError as exc:
        raise LexiconError(f"the PLS document is not well-formed XML: {exc}") from exc
    return checked_entries(entries, limits), skipped


# --- where lexicons are kept -----------------------------------------------------------------


class LexiconStore(Protocol):
    """A tenant's lexicons (``None``: those of open mode, shared)."""

    limits: LexiconLimits

    async def get(self, tenant: str | None, name: str) -> StoredLexicon | None: ...

    async def put(
        self,
        tenant: str | None,
        name: str,
        entries: list[LexiconEntry],
        language: str = DEFAULT_LANGUAGE,
    ) -> bool:
        """Store (or replace) a checked lexicon of ``language``; ``True`` if it is new.
        ``TooManyLexicons`` beyond the tenant's limit."""
        ...

    async def delete(self, tenant: str | None, name: str) -> bool: ...

    async def list(self, tenant: str | None) -> list[StoredLexicon]: ...


class FolderLexicons:
    """Lexicons as files, ``<root>/<tenant>/<name>.json`` (``_shared/`` without a tenant),
    each written whole to a temporary file and renamed into place."""

    def __init__(self, root: Path, limits: LexiconLimits) -> None:
        self.root = root
        self.limits = limits
        self._lock = asyncio.Lock()  # a tenant's count and its write, one put at a time

    def folder(self, tenant: str | None) -> Path:
        return child(self.root, tenant or SHARED)

    def path(self, tenant: str | None, name: str) -> Path:
        if not is_lexicon_name(name):
            raise ValueError(f"{name!r} is not a lexicon name")
        return self.folder(tenant) / f"{name}.json"

    def read(self, tenant: str | None, name: str) -> str | None:
        """The stored document, or ``None``."""
        try:
            return self.path(tenant, name).read_text()
        except FileNotFoundError:
            return None

    def names(self, tenant: str | None) -> list[str]:
        folder = self.folder(tenant)
        if not folder.is_dir():
            return []
        found = (p.stem for p in folder.iterdir() if p.suffix == ".json")
        return sorted(n for n in found if is_lexicon_name(n))

    def write(self, tenant: str | None, lexicon: StoredLexicon) -> bool:
        """Write ``lexicon``; ``True`` if it is new; ``TooManyLexicons`` past the limit."""
        target = self.path(tenant, lexicon.name)
        new = not target.exists()
        if new and len(self.names(tenant)) >= self.limits.per_tenant:
            raise TooManyLexicons(
                f"a tenant keeps at most {self.limits.per_tenant} lexicons; delete one first"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{lexicon.name}.{uuid.uuid4().hex}.tmp")
        try:
            staged.write_text(lexicon.document())
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)
        return new

    def remove(self, tenant: str | None, name: str) -> bool:
        try:
            self.path(tenant, name).unlink()
        except FileNotFoundError:
            return False
        return True

    async def get(self, tenant: str | None, name: str) -> StoredLexicon | None:
        document = await asyncio.to_thread(self.read, tenant, name)
        return parse_stored(document) if document is not None else None

    async def put(
        self,
        tenant: str | None,
        name: str,
        entries: list[LexiconEntry],
        language: str = DEFAULT_LANGUAGE,
    ) -> bool:
        lexicon = StoredLexicon(name, tuple(entries), now_iso(), language)
        async with self._lock:
            return await asyncio.to_thread(self.write, tenant, lexicon)

    async def delete(self, tenant: str | None, name: str) -> bool:
        return await asyncio.to_thread(self.remove, tenant, name)

    async def list(self, tenant: str | None) -> list[StoredLexicon]:
        def read_all() -> list[StoredLexicon]:
            documents = (self.read(tenant, name) for name in self.names(tenant))
            return [parse_stored(d) for d in documents if d is not None]

        return await asyncio.to_thread(read_all)
