"""``GET /openapi.json`` is true to the app: the same routes, valid OpenAPI 3.1, schemas from the
wire models, served as built; and schemathesis, fuzzing the real dev server from it, finds no
server error and no answer the document does not describe."""

import aiohttp
import pytest
import schemathesis
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import OpenAPIV31SpecValidator
from schemathesis import GenerationMode

from voicehost.api.auth import PUBLIC
from voicehost.api.errors import ErrorResponse
from voicehost.api.openapi import DOCUMENT, REF_TEMPLATE
from voicehost.api.routes import PUBLIC_ROUTES, document
from voicehost.api.server import create_app
from voicehost.api.speech import SpeechRequest
from voicehost.cluster.gateway import create_gateway_app
from voicehost.config import Settings
from voicehost.model.devmodel import DEV_VOICES

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
GATEWAY_ONLY = {("GET", "/v1/cluster"), ("POST", "/v1/cluster/route")}  # the cluster's own view
ACCESS = {(r.method, r.path): r.access for r in PUBLIC_ROUTES}
SPEECH = "/v1/audio/speech"


def app_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route but aiohttp's automatic HEADs and ``/internal/*``."""
    found = set()
    for route in app.router.routes():
        info = route.resource.get_info()
        path = info.get("path") or info["formatter"]
        if route.method != "HEAD" and not path.startswith("/internal/"):
            found.add((route.method, path))
    return found


def documented(doc: dict) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


@pytest.fixture
def local_settings(tmp_path) -> Settings:
    return Settings(dev=True, adapters_dir=tmp_path / "adapters", jobs_dir=tmp_path / "jobs")


@pytest.mark.unit
def test_every_served_route_is_documented_and_nothing_else(local_settings):
    assert app_routes(create_app(local_settings)) == documented(document())


def test_the_gateway_documents_its_public_routes_and_its_own(tmp_path, redis_server):
    settings = Settings(dev=True, redis_url=redis_server.url, shared_dir=tmp_path)
    app = create_gateway_app(settings)
    assert app_routes(app) == documented(app[DOCUMENT])
    assert app_routes(app) - GATEWAY_ONLY == documented(document())


# The module that declares the operation of a route whose handler each role supplies (a
# ``RoleHandler``): its contract (who answers it is each role's: serve speaks, a gateway
# proxies; health is the service's, in the route table)
ROLE_HANDLER_RESOURCES = {
    "speech": "voicehost.api.speech",
    "speech_captioned": "voicehost.api.speech",
    "speech_ws": "voicehost.api.realtime",
    "speech_webrtc": "voicehost.api.webrtc",
    "healthz": "voicehost.api.routes",
    "readyz": "voicehost.api.routes",
}


@pytest.mark.unit
def test_each_operation_is_declared_beside_its_handler():
    """A resource is one place: a route's OpenAPI operation is in the module of its handler
    (or of the contract of a handler each role supplies), never in the document's builder,
    which imports no resource."""
    import importlib

    from voicehost.api import openapi, routes

    for route in PUBLIC_ROUTES:
        if isinstance(route.handler, str):
            module = importlib.import_module(ROLE_HANDLER_RESOURCES[route.handler])
        else:
            module = importlib.import_module(route.handler.__module__)
        own = getattr(module, "OPERATIONS", None)
        if module is routes:
            own = routes._service_operations()
        assert own is not None and route.operation in own, (route.operation, module.__name__)
    imported = {
        line.split()[1]
        for line in open(openapi.__file__).read().splitlines()
        if line.startswith("from voicehost.api.")
    }
    assert imported <= {"voicehost.api.auth", "voicehost.api.errors", "voicehost.api.schemas"}


@pytest.mark.unit
def test_document_is_valid_openapi_3_1():
    doc = document()
    assert doc["openapi"].startswith("3.1")
    OpenAPIV31SpecValidator(doc).validate()


@pytest.mark.unit
def test_the_upload_has_its_two_shapes_a_new_voice_its_location_and_sse_its_events():
    paths = document()["paths"]
    create = paths["/v1/voices"]["post"]
    shapes = create["requestBody"]["content"]["multipart/form-data"]["schema"]["oneOf"]
    assert [s["required"] for s in shapes] == [["audio"], ["adapter_config", "adapter_model"]]
    assert "Location" in create["responses"]["201"]["headers"]
    assert "Location" in create["responses"]["202"]["headers"]
    assert "ambiguous_upload" in create["responses"]["400"]["description"]
    sse = paths["/v1/audio/speech"]["post"]["responses"]["200"]["content"]["text/event-stream"]
    # the schema is one event of the stream, as schemathesis (and OpenAPI 3.2) read it
    assert sse["schema"]["type"] == "object" and sse["schema"]["required"] == ["data"]
    kinds = [e["properties"]["type"]["const"] for e in sse["x-events"]["oneOf"]]
    assert kinds == ["speech.audio.delta", "speech.audio.done", "speech.word", "error"]


@pytest.mark.unit
def test_schemas_are_the_wire_models():
    schemas = document()["components"]["schemas"]
    speech = SpeechRequest.model_json_schema(ref_template=REF_TEMPLATE)
    assert schemas["SpeechRequest"] == speech
    error = ErrorResponse.model_json_schema(ref_template=REF_TEMPLATE, mode="serialization")
    assert schemas["ErrorResponse"] == {k: v for k, v in error.items() if k != "$defs"}
    assert schemas["ErrorDetail"] == error["$defs"]["ErrorDetail"]


@pytest.mark.unit
def test_errors_have_the_error_shape_keyed_routes_401_403_streams_429_with_retry_after():
    error_ref = {"$ref": REF_TEMPLATE.format(model="ErrorResponse")}
    streams = {("post", SPEECH), ("get", SPEECH + "/ws"), ("post", SPEECH + "/webrtc")}
    streams.add(("post", SPEECH + "/captioned"))
    for path, item in document()["paths"].items():
        for method, op in item.items():
            if method not in HTTP_METHODS:
                continue
            responses = op["responses"]
            for status, response in responses.items():
                if int(status) >= 400:
                    assert response["content"]["application/json"]["schema"] == error_ref
            # open: the probes, this document, the playground
            keyed = ACCESS[(method.upper(), path)] != PUBLIC
            assert ({"bearerAuth": []} in op["security"]) == keyed, path
            # a keyed route: the key's errors, and its own request rate (429 rate_limited)
            assert ({"401", "403", "429"} <= set(responses)) == keyed, path
            if keyed:
                assert "Retry-After" in responses["429"]["headers"]
            if (method, path) in streams:
                assert "Retry-After" in responses["503"]["headers"]


@pytest.mark.unit
def test_the_realtime_route_describes_every_message_type():
    from voicehost.api.realtime import MESSAGES

    description = document()["paths"]["/v1/audio/speech/ws"]["get"]["description"]
    for kind in MESSAGES:
        assert f"`{kind}`" in description


async def test_server_serves_the_document(server):
    async with aiohttp.ClientSession() as http, http.get(server.url + "/openapi.json") as r:
        assert r.status == 200
        assert await r.json() == document()


async def test_gateway_serves_the_same_document_with_its_own_routes(tmp_path, redis_server):
    settings = Settings(dev=True, redis_url=redis_server.url, shared_dir=tmp_path)
    gateway = TestServer(create_gateway_app(settings), host="127.0.0.1")
    await gateway.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(gateway.make_url("/openapi.json")) as r:
                assert r.status == 200
                served = await r.json()
        own = {path: served["paths"].pop(path) for path in ("/v1/cluster", "/v1/cluster/route")}
        route_request = served["components"]["schemas"].pop("RouteRequest")  # its own model
        assert served == document()
        assert route_request["required"] == ["voices"]
        assert own["/v1/cluster"]["get"]["x-scopes"] == ["admin"]
        assert own["/v1/cluster/route"]["post"]["operationId"] == "cluster_route"
    finally:
        await gateway.close()


async def test_metrics_count_open_asyncio_tasks(server):
    async with aiohttp.ClientSession() as http, http.get(server.url + "/metrics") as r:
        text = await r.text()
    values = [
        line.split()[-1] for line in text.splitlines() if line.startswith("voicehost_asyncio_")
    ]
    assert len(values) == 1 and float(values[0]) >= 1  # at least the task serving this request


# --- schemathesis against the running dev server ----------------------------------------------

EXAMPLES = 12  # per operation and generation mode: cheap answers (errors, lists, probes)
SPEECH_EXAMPLES = 3  # with a real voice, a valid case synthesizes on the CPU engine (seconds)
schemathesis.checks.load_all_checks()
CHECKS = list(schemathesis.checks.CHECKS.get_all())  # --checks all
# ... but where a valid request is more than the document can say: each operation named, why
ACCEPTS_LESS_THAN_ITS_SCHEMA = {
    # a WebSocket: schemathesis makes a plain GET, never the upgrade (400); test_realtime
    # speaks the socket's messages
    ("GET", "/v1/audio/speech/ws"): "the upgrade",
    # an upload's files are judged by what they are: audio that decodes, a PEFT adapter that
    # loads (400 with the reason); test_hostile_uploads and test_cloning send real ones
    ("POST", "/v1/voices"): "its files' contents",
    ("POST", "/v1/voices/{voice_id}/versions"): "its files' contents",
    # a PLS document is XML with a <lexicon> root; test_lexicons sends real ones
    ("PUT", "/v1/lexicons/{name}"): "its XML",
    # since: a time in ISO 8601 (a real date: no pattern can say which days a month has) or
    # Unix seconds; test_audit's parse_time tests take both
    ("GET", "/v1/audit"): "since's calendar",
    ("GET", "/v1/usage"): "since's calendar",
    # an SDP offer is a session description with audio and a data channel; test_webrtc sends
    # real ones, and hostile ones
    ("POST", "/v1/audio/speech/webrtc"): "a real offer",
    # a session's id is one the server gave; test_webrtc trickles into a real one
    ("PATCH", "/v1/audio/speech/webrtc/{session_id}"): "a real session",
    ("DELETE", "/v1/audio/speech/webrtc/{session_id}"): "a real session",
}
# ... and where the server takes more than a typed parameter can say: an empty query value
# means unset (allowEmptyValue), which schemathesis counts as a wrong type for `limit`
TAKES_MORE_THAN_ITS_SCHEMA = {("GET", "/v1/audit"): "an empty limit or after"}


# SDP and trickled candidates are text: sent as the strings schemathesis makes for them
schemathesis.serializer.alias("application/sdp", "text/plain")
schemathesis.serializer.alias("application/trickle-ice-sdpfrag", "text/plain")


def with_real_voice(case: schemathesis.Case) -> schemathesis.Case:
    """Speak with a voice that exists, so that valid cases reach the engine (random ids: 404)."""
    if isinstance(case.body, dict):
        case.body["voice"] = DEV_VOICES[0]
    return case


def fuzz(strategy, examples: int, base_url: str, excluded=()) -> None:
    @given(case=strategy)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the first failure is reported
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        checks = [check for check in CHECKS if check not in excluded]
        case.call_and_validate(base_url=base_url, checks=checks, timeout=120)

    run()


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    fuzzed = {(op.method.upper(), op.path) for op in operations}
    assert documented(document()) - fuzzed <= {("GET", "/openapi.json")}  # all but the schema
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = op.as_strategy(generation_mode=mode)
            runs = [(strategy, EXAMPLES)]
            # random voices are answered before the engine; then real ones (valid cases only:
            # a negative case may be wrong in its voice alone)
            if op.path == SPEECH and mode == GenerationMode.POSITIVE:
                runs.append((strategy.map(with_real_voice), SPEECH_EXAMPLES))
            excluded = []
            if (op.method.upper(), op.path) in ACCEPTS_LESS_THAN_ITS_SCHEMA:
                excluded.append(schemathesis.checks.positive_data_acceptance)
            if (op.method.upper(), op.path) in TAKES_MORE_THAN_ITS_SCHEMA:
                excluded.append(schemathesis.checks.negative_data_rejection)
            for cases, examples in runs:
                try:
                    fuzz(cases, examples, server.url, excluded)
                except Unsatisfiable:
                    pass  # nothing to make invalid (no parameters, no body)
                except (Exception, BaseExceptionGroup) as exc:  # schemathesis: a group
                    failures.append(f"{op.label} ({mode.value}): {exc}")
    assert not failures, "\n\n".join(failures)
