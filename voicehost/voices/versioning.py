"""The rules of a voice's versions, as pure functions over plain data: both voice directories
(``voicehost.voices.folders``, versions on disk; ``voicehost.cluster.voices``, versions in
Redis) decide with them, and each stores the outcome its own way.

- A version is one adapter: a version whose checksum the voice already has is refused.
- Numbers count up from 1 and are never reused: the next is one past the newest ever given.
- Every version is its voice's tenant's, whatever its staged ``voice.json`` says.
- Only a ready version goes live (a held one waits for its publish); its ``voice.json`` records
  when it first did, so a version that has been live is listed as retired, not as a candidate.
- The live version cannot be deleted: promote another one first, or delete the voice.
- Publishing makes a held version ready and records why.
- A built-in voice is version 1, always, and neither directory changes it.

The error types are the ``VoiceDirectory`` protocol's (``voicehost.voices.voice``); their
messages are written here, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from voicehost.ids import now_iso
from voicehost.voices.validation import PROMOTED, STATUS, VERSION, voice_status, with_tenant
from voicehost.voices.voice import (
    DuplicateVersion,
    HeldVersion,
    LiveVersion,
    NoSuchVersion,
    NotHeld,
    ReadOnlyVoice,
    VersionStatus,
    Voice,
    VoiceExists,
    VoiceStatus,
    VoiceVersion,
)

# --- numbering --------------------------------------------------------------------------------


def newest_version(live: int, newest: int | None) -> int:
    """The highest number the voice has given a version: at least the live one's (a voice from
    before versions kept a count has only its live one)."""
    return max(live, newest or live)


def next_version(newest: int) -> int:
    """The number of a voice's next version: one past the newest ever given, so a deleted
    version's number is never given again."""
    return newest + 1


# --- adding, promoting, publishing, deleting -------------------------------------------------


def refuse_duplicate(voice_id: str, checksum: str | None, existing: Iterable[str | None]) -> None:
    """Raises ``DuplicateVersion`` if the voice has a version with the adapter ``checksum``."""
    if any(known == checksum for known in existing):
        raise DuplicateVersion(f"voice {voice_id!r} has a version with this adapter")


def new_version_manifest(
    staged: dict, number: int, tenant: str | None, promote: bool
) -> tuple[dict, bool]:
    """The ``voice.json`` of a staged adapter added as version ``number`` of a voice whose tenant
    is ``tenant`` (whatever ``staged`` says), and whether it goes live at once: when asked to
    and it is ready (a held version waits for its publish)."""
    live = promote and voice_status(staged) == "ready"
    manifest = {**staged, VERSION: number}
    if live:
        manifest[PROMOTED] = now_iso()
    return with_tenant(manifest, tenant), live


def first_promotion(manifest: dict) -> dict | None:
    """A version's ``voice.json`` as it goes live: with when it first did; ``None`` if it has
    been live before (it keeps that date)."""
    return None if PROMOTED in manifest else {**manifest, PROMOTED: now_iso()}


def check_promotable(voice_id: str, version: int, status: VoiceStatus | None) -> None:
    """A version may go live if it exists (``status`` not ``None``) and is not held; raises
    ``NoSuchVersion`` or ``HeldVersion``."""
    if status is None:
        raise no_such_version(voice_id, version)
    if status == "held":
        raise HeldVersion(f"version {version} of {voice_id!r} is held: publish it first")


def removable(voice_id: str, version: int, live: int | None, exists: bool) -> bool:
    """Whether ``version`` can be deleted: ``False`` if the voice has no such version; raises
    ``LiveVersion`` for the live one."""
    if not exists:
        return False
    if version == live:
        raise LiveVersion(
            f"version {version} is the live version of {voice_id!r}: promote another one "
            "first, or delete the voice"
        )
    return True


def check_publishable(voice_id: str, status: str | None) -> None:
    """Only a held version is published; raises ``NotHeld`` for any other."""
    if status != "held":
        raise NotHeld(f"voice {voice_id!r} is not held")


def published_manifest(manifest: dict, published: dict[str, object]) -> dict:
    """A held version's ``voice.json`` once published: ready, with ``published`` (why, by whom,
    when) recorded; the weights, and so the checksum, stay as they are."""
    return {**manifest, STATUS: "ready", "published": published}


# --- listing --------------------------------------------------------------------------------


def version_status(gate: VoiceStatus, live: bool, promoted: bool) -> VersionStatus:
    """How a version is listed, from its gate status, whether it is live, and whether it has
    ever been (its ``voice.json`` records when it was first promoted)."""
    if gate == "held":
        return "held"
    if live:
        return "ready"
    return "retired" if promoted else "candidate"


def listed_version(
    number: int,
    gate: VoiceStatus,
    live: int | None,
    checksum: str | None,
    manifest: dict,
    error: str | None = None,
) -> VoiceVersion:
    """Version ``number`` as the voice's versions are listed (``live``: the live one's number)."""
    is_live = number == live
    status = version_status(gate, is_live, PROMOTED in manifest)
    return VoiceVersion(number, status, is_live, checksum, manifest, error)


# --- built-in voices ------------------------------------------------------------------------


def builtin_voices(
    builtin: Mapping[str, str] | Iterable[str], base_model: str = ""
) -> dict[str, Voice]:
    """The voices of ``base_model`` by name: ``{name: language}``
    (``voicehost.model.languages``), or names alone (English)."""
    languages = builtin if isinstance(builtin, Mapping) else dict.fromkeys(builtin, "en")
    return {
        name: Voice(voice_id=name, name=name.capitalize(), language=language, base_model=base_model)
        for name, language in languages.items()
    }


def builtin_version(voice: Voice, version: int | None) -> Voice | None:
    """A built-in voice's ``version`` (``None``: the live one): it has version 1 only."""
    return voice if version in (None, 1) else None


def builtin_versions() -> list[VoiceVersion]:
    """A built-in voice's versions, as listed."""
    return [VoiceVersion(1, "ready", True, None, {})]


# --- what is refused, said once -----------------------------------------------------------------


def voice_exists(voice_id: str) -> VoiceExists:
    return VoiceExists(f"voice {voice_id!r} already exists")


def no_such_voice(voice_id: str) -> NoSuchVersion:
    return NoSuchVersion(f"voice {voice_id!r} does not exist")


def no_such_version(voice_id: str, version: int) -> NoSuchVersion:
    return NoSuchVersion(f"voice {voice_id!r} has no version {version}")


def builtin_voice(voice_id: str, error: type[ValueError] = ReadOnlyVoice) -> ValueError:
    """A built-in voice cannot be changed: ``ReadOnlyVoice`` (or ``NotHeld``, to publish it)."""
    return error(f"voice {voice_id!r} is a built-in voice")
