"""``GET /v1/models`` and ``GET /v1/models/{model}``, in OpenAI's shape: clients that list the
models before speaking (or check theirs is there) find the names a speech request may send."""

from __future__ import annotations

import time
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from voicehost.api.edge import SERVICE
from voicehost.api.errors import ApiError
from voicehost.api.openapi import Json, Models, json_body, operation, ref
from voicehost.config import Settings

# --- its wire models ---


# OpenAI's speech models: accepted in ``model`` and listed by GET /v1/models, so clients
# configured with one of them (LiveKit's and Pipecat's plugins default to gpt-4o-mini-tts) work.
OPENAI_SPEECH_MODELS: tuple[str, ...] = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class ModelInfo(BaseModel):
    """One entry of ``GET /v1/models``, in OpenAI's shape."""

    id: str
    object: Literal["model"] = "model"
    # Unix seconds, not ISO: OpenAI's shape, which its clients parse
    created: int = Field(description="Unix time: when this server started.")
    owned_by: str = "voicehost"
    languages: list[str] = Field(
        description="The languages the model speaks (BCP-47), each of its voices one of them."
    )


class ModelList(BaseModel):
    """``GET /v1/models``: every model name a speech request may send (one model serves them
    all), as OpenAI lists its models; behind a gateway, each other base model its workers
    serve too, by its name."""

    object: Literal["list"] = "list"
    data: list[ModelInfo]


STARTED = int(time.time())


def model_names(settings: Settings) -> list[str]:
    """``orpheus`` (the speech request's default), the served model's name, then OpenAI's speech
    models: all spoken by the one served model."""
    names = ["orpheus"]
    try:
        names.append(settings.served_base_name())
    except ValueError:  # no model configured: a process that only routes
        pass
    names.extend(OPENAI_SPEECH_MODELS)
    return list(dict.fromkeys(names))


def listed_models(request: web.Request) -> dict[str, ModelInfo]:
    """The served model's names with its languages, then (a gateway's) each other base model
    its workers serve, with that model's."""
    service = request.app[SERVICE]
    own = list(service.voices.models.own.languages)
    listed = {
        n: ModelInfo(id=n, created=STARTED, languages=own) for n in model_names(service.settings)
    }
    for rules in service.voices.models.all():
        if rules.base_model not in listed:
            languages = list(rules.languages)
            listed[rules.base_model] = ModelInfo(
                id=rules.base_model, created=STARTED, languages=languages
            )
    return listed


async def list_models(request: web.Request) -> web.Response:
    listing = ModelList(data=list(listed_models(request).values()))
    return web.json_response(listing.model_dump())


async def get_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    model = listed_models(request).get(name)
    if model is None:
        raise ApiError("model_not_found", f"model {name!r} does not exist; see GET /v1/models")
    return web.json_response(model.model_dump())


# --- its OpenAPI operations (voicehost.api.openapi builds the document from them) ---


def _operations() -> dict[str, Json]:
    return {
        "list_models": operation(
            "The model names a speech request may send (OpenAI's shape)",
            {"200": json_body(ref(ModelList), "Every name; one model speaks them all.")},
            tag="models",
        ),
        "get_model": operation(
            "One model name (OpenAI's shape)",
            {"200": json_body(ref(ModelInfo), "The model.")},
            tag="models",
        ),
    }


OPERATIONS: dict[str, Json] = _operations()
MODELS: Models = ((ModelList, "serialization"), (ModelInfo, "serialization"))
