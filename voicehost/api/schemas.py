"""What the wire models of every resource share: an integer as JSON Schema has it, a seed, a
version number. Each resource's models live in its module beside its handlers and its OpenAPI
operations (``speech``, ``realtime``, ``voices``, ``uploads``, ``jobs``, ``lexicons``, ``audit``,
``models``, ``tokens``; ``errors`` for the one error shape; the gateway's ``RouteRequest``)."""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Lt
from pydantic import (
    BeforeValidator,
    StrictInt,
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
