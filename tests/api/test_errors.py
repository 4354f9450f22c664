"""The API's one error table (``voicehost.api.errors``): every code the code raises is a row,
every row is raised, the OpenAPI document's error answers are the table's, and an answer its
operation does not list is counted and logged by the error middleware (the suite's servers are
read for it as they stop: tests/helpers.py ``undocumented``)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import lora_training
import voicehost
from voicehost.api.edge import ROUTE_OPERATIONS, SERVICE, error_middleware
from voicehost.api.errors import ERRORS, KEYED, ApiError, answered_by, documented
from voicehost.api.routes import PUBLIC_ROUTES, document
from voicehost.errors import ServiceError
from voicehost.metrics import SpeechMetrics
from voicehost.tools import errors_doc

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# Codes made from an aiohttp HTTPException's reason (``error_middleware``), not written as literals
FROM_REASONS = {"bad_request", "method_not_allowed", "not_found"}
RAISERS = {"ApiError", "Refused", "AccessDenied", "InvalidToken"}


def source_files() -> list[Path]:
    return sorted([*(ROOT / "voicehost").rglob("*.py"), *(ROOT / "lora_training").rglob("*.py")])


SNAKE = re.compile(r"[a-z]+(_[a-z]+)+")


def literal(node: ast.expr) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def raised_codes() -> dict[str, str]:
    """code -> where: the first argument of every ``ApiError``/``Refused``/``AccessDenied``/
    ``InvalidToken`` call written with a literal, every ``code="..."`` a call passes, every
    class's ``code = "..."``, the code of
    every ``error_response(status, code, ...)`` written with one, and every module constant
    ``NAME = (code, message)`` (a stream's failure). A socket's own event codes (``idle_timeout``,
    ``invalid_message``: ``error_event``) are no HTTP answer and not the table's."""
    found: dict[str, str] = {}
    for path in source_files():
        if path.name == "errors.py" and path.parent.name == "api":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):  # InvalidOffer(message, code="no_audio")
                for keyword in node.keywords:
                    if keyword.arg == "code" and isinstance(literal(keyword.value), str):
                        found.setdefault(keyword.value.value, where)  # type: ignore[attr-defined]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                name, first = node.func.id, node.args[0]
                if name in RAISERS:
                    if isinstance(literal(first), str):
                        found.setdefault(first.value, where)  # type: ignore[attr-defined]
                    elif isinstance(first, ast.JoinedStr):  # f"invalid_{key}": each key it takes
                        for key in ("voice_id", "job_id"):
                            found.setdefault(f"invalid_{key}", where)
                elif name == "error_response" and len(node.args) > 1:
                    if isinstance(literal(node.args[1]), str):
                        found.setdefault(node.args[1].value, where)  # type: ignore[attr-defined]
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if (
                        isinstance(statement, ast.Assign)
                        and [getattr(t, "id", None) for t in statement.targets] == ["code"]
                        and isinstance(statement.value, ast.Constant)
                    ):
                        found.setdefault(statement.value.value, where)
        for statement in tree.body:  # SYNTHESIS_FAILED = ("synthesis_failed", "...")
            if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Tuple):
                items = [literal(e) for e in statement.value.elts]
                if len(items) == 2 and all(isinstance(i, str) for i in items):
                    if SNAKE.fullmatch(str(items[0])):
                        found.setdefault(str(items[0]), where)
    return found


def literal_statuses() -> list[tuple[int, str, str]]:
    """(status, code, where) of every ``error_response`` written with both as literals: the
    few answers made without the table (a probe's, a refused upgrade's) must agree with it."""
    found = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "error_response"
                and len(node.args) > 1
                and isinstance(literal(node.args[0]), int)
                and isinstance(literal(node.args[1]), str)
            ):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append((node.args[0].value, node.args[1].value, where))  # type: ignore[attr-defined]
    return found


def test_every_code_raised_is_a_row_of_the_table():
    missing = {code: where for code, where in raised_codes().items() if code not in ERRORS}
    assert not missing, f"raised but not in voicehost.api.errors: {missing}"


def test_every_row_is_raised_somewhere():
    """No row that nothing answers: each code is written where it is raised (or made from an
    aiohttp reason)."""
    raised = set(raised_codes()) | FROM_REASONS
    assert set(ERRORS) - raised == set()


def test_an_answer_written_with_its_status_has_the_tables():
    found = literal_statuses()
    assert found  # the scan sees them (healthz's `failed`)
    wrong = [(s, c, w) for s, c, w in found if ERRORS[c].status != s]
    assert wrong == []


def test_every_service_error_names_a_code_of_the_table():
    """Each ``ServiceError`` class of the package, imported, has a code the table answers
    (or takes one per instance: those are checked where they are raised, above)."""
    for package in (voicehost, lora_training):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".tools.bench" in module.name or module.name.endswith("__main__"):
                continue
            importlib.import_module(module.name)
    pending = list(ServiceError.__subclasses__())
    seen = []
    while pending:
        cls = pending.pop()
        seen.append(cls)
        pending.extend(cls.__subclasses__())
        if cls.code:
            assert cls.code in ERRORS, f"{cls.__module__}.{cls.__name__}: {cls.code!r}"
    assert len(seen) >= 25  # the domain's errors are ServiceErrors (a guard against no import)


def test_a_code_names_one_status_and_an_unknown_code_is_refused_at_once():
    assert ApiError("voice_exists", "taken").status == 409
    with pytest.raises(ValueError, match="not in the API's error table"):
        ApiError("voice_exsts", "a typo fails where it is written, not as a 500 later")


def test_the_documents_error_answers_are_the_tables():
    """Each operation's error answers list exactly the codes the table says it answers, each
    under its status, with the auth layer's on keyed routes only."""
    paths = document()["paths"]
    for route in PUBLIC_ROUTES:
        assert route.operation is not None
        op = paths[route.path][route.method.lower()]
        keyed = bool(op["security"])
        listed = {
            (int(status), code)
            for status, answer in op["responses"].items()
            if int(status) >= 400
            for code in ERRORS
            if f"`{code}`:" in answer["description"]
        }
        expected = {(k.status, k.code) for k in answered_by(route.operation, keyed)}
        assert listed == expected, route.operation
        assert any(KEYED in ERRORS[code].answered_by for _, code in listed) == keyed


def test_the_upload_documents_what_its_domain_raises():
    """The codes that were once documented apart from the code that raised them."""
    for code in ("voice_exists", "not_enough_speech", "consent_speaker_mismatch"):
        assert documented("create_voice", True, code)
    assert documented("speak", False, "registry_rebuilding")
    assert not documented("get_model", True, "voice_exists")


async def test_an_answer_its_operation_does_not_list_is_counted_and_logged(caplog):
    """The error middleware, in front of the real route of ``GET /v1/models/{model}``, whose
    handler here answers ``voice_exists`` (which that operation does not list) and then
    ``model_not_found`` (which it does)."""
    codes = iter(["voice_exists", "model_not_found"])

    async def handler(request: web.Request) -> web.Response:
        raise ApiError(next(codes), "as the table says")

    class Service:
        metrics = SpeechMetrics()

    app = web.Application(middlewares=[error_middleware])
    app[SERVICE] = Service()  # type: ignore[assignment]
    app[ROUTE_OPERATIONS] = {("GET", "/v1/models/{model}"): ("get_model", True)}
    app.router.add_get("/v1/models/{model}", handler)
    async with TestClient(TestServer(app)) as client:
        first = await client.get("/v1/models/x")
        second = await client.get("/v1/models/x")
        assert (first.status, (await first.json())["error"]["code"]) == (409, "voice_exists")
        assert second.status == 404
    sample = Service.metrics.registry.get_sample_value
    name = "voicehost_undocumented_errors_total"
    assert sample(name, {"operation": "get_model", "code": "voice_exists"}) == 1
    assert sample(name, {"operation": "get_model", "code": "model_not_found"}) is None
    assert "get_model answered 'voice_exists'" in caplog.text


async def test_a_service_error_gets_its_tables_status_and_retry_after():
    class Full(ServiceError):
        code = "at_capacity"

    async def handler(request: web.Request) -> web.Response:
        raise Full("every stream is taken")

    class Service:
        metrics = SpeechMetrics()

    app = web.Application(middlewares=[error_middleware])
    app[SERVICE] = Service()  # type: ignore[assignment]
    app.router.add_post("/v1/audio/speech", handler)
    async with TestClient(TestServer(app)) as client:
        response = await client.post("/v1/audio/speech")
        body = await response.json()
    assert response.status == 503 and response.headers["Retry-After"] == "1"
    assert body == {"error": {"code": "at_capacity", "message": "every stream is taken"}}


def test_the_api_docs_table_of_errors_is_the_one_the_table_makes(monkeypatch):
    text = errors_doc.API_DOC.read_text()
    assert errors_doc.replaced(text) == text, "docs/API.md's error table is stale: make docs"
    monkeypatch.setitem(ERRORS, "no_workers", dataclasses.replace(ERRORS["no_workers"], status=502))
    assert errors_doc.replaced(text) != text
