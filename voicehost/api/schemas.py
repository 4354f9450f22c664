"""What the wire models of every resource share: an integer as JSON Schema has it, a seed, a
version number. Each resource's models live in its module beside its handlers and its OpenAPI
operations (``speech``, ``realtime``, ``voices``, ``uploads``, ``audit``, ``models``, ``tokens``,
``errors`` for the one error shape, the gateway's ``RouteRequest``); the clone job's and the
lexicons' are still here, to move with their modules (``jobs``, ``lexicons``)."""

from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge, Lt
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)


def _integral(value: object) -> object:
    """A JSON number with no fraction is an integer (JSON Schema counts ``3042.0`` as one);
    anything else is left for ``StrictInt`` to judge (a string, a boolean, ``2.5``: refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# an integer as JSON Schema has it: 7 or 7.0, not "7", true or 7.5
JsonInt = Annotated[StrictInt, BeforeValidator(_integral)]
# ... from 0 (a seed) or 1 (a version) up: bounds before the validator, so that the document
# says them as JSON Schema does (minimum, exclusiveMaximum), not as pydantic's ge and lt
Seed = Annotated[StrictInt, Ge(0), Lt(2**63), BeforeValidator(_integral)]
VersionNumber = Annotated[StrictInt, Ge(1), Lt(10**9), BeforeValidator(_integral)]


class CloneJobInfo(BaseModel):
    """A clone job: queued, preparing, training (with progress), evaluating, then done, held
    (the voice measured below the gate's thresholds), failed or cancelled. ``runner_lost``: its
    runner stopped (its lease lapsed) and another takes it over from its last checkpoint."""

    id: str
    voice_id: str
    status: Literal[
        "queued",
        "preparing",
        "training",
        "evaluating",
        "runner_lost",
        "done",
        "held",
        "failed",
        "cancelled",
    ]
    runner: str | None = Field(
        None, description="The worker running the job now (while runner_lost: the one lost)."
    )
    runners_lost: list[str] = Field(
        default_factory=list, description="Runners that stopped while the job was theirs."
    )
    progress: float = Field(description="0..1 of the training steps")
    stage: str | None = None
    error: str | None = None
    eval_loss: list[float] = Field(default_factory=list)
    data: dict[str, object] | None = Field(
        None,
        description="The data quality report, from the end of the preparing stage on: each "
        "clip's figures, the clips left out (another speaker) and the warnings.",
    )
    eval: dict[str, object] | None = Field(
        None,
        description="The evaluation of the trained voice (as in its voice.json): speaker "
        "similarity to held-out references, the baseline voice, start of speech, real-time "
        "factor, the findings, and whether the gate only reported.",
    )
    held_reason: str | None = Field(None, description="Why the gate held the voice.")
    created: str = Field(description="When it was submitted: UTC, ISO 8601.")
    updated: str = Field(description="When its record last changed: UTC, ISO 8601.")


class PronunciationEntry(BaseModel):
    """Say ``alias`` where ``grapheme`` is written: whole words only, longest match first."""

    model_config = ConfigDict(extra="forbid")

    grapheme: StrictStr = Field(min_length=1, description="A word or phrase, as written.")
    alias: StrictStr = Field(min_length=1, description="What to say instead.")
    case_sensitive: StrictBool = Field(
        False, description="Match it only as written (else in any case)."
    )


class LexiconUpload(BaseModel):
    """``PUT /v1/lexicons/{name}`` as JSON (a W3C PLS document is the other way to send it)."""

    model_config = ConfigDict(extra="ignore")

    entries: list[PronunciationEntry]


class LexiconInfo(BaseModel):
    name: str
    entries: int = Field(description="How many entries it holds.")
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")


class LexiconSaved(BaseModel):
    """What a put stored: the lexicon, and the PLS lexemes left out (a ``<phoneme>`` but no
    ``<alias>``: this model reads text)."""

    lexicon: LexiconInfo
    skipped: int = 0


class LexiconList(BaseModel):
    lexicons: list[LexiconInfo]


class LexiconDetail(BaseModel):
    name: str
    entries: list[PronunciationEntry]
    updated: str = Field(description="When it was last put: UTC, ISO 8601.")
