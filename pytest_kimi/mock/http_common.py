"""What every mock route shares: the application's state keys, SGLang's 400 body, JSON request
bodies and SSE framing. Kept apart so the route modules depend on it and not on each other."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.exported import ServerMetrics
from pytest_kimi.mock.faults import Faults
from pytest_kimi.mock.healthgate import HealthGate
from pytest_kimi.mock.wire.errors import error_response

ENGINE_KEY = web.AppKey("engine", Engine)
ARGS_KEY = web.AppKey("args", MockArgs)
FAULTS_KEY = web.AppKey("faults", Faults)
GATE_KEY = web.AppKey("health_gate", HealthGate)
METRICS_KEY = web.AppKey("metrics", ServerMetrics)
# a disaggregated server's side (pytest_kimi.mock.prefillside.PrefillSide or
# pytest_kimi.mock.decodeside.DecodeSide); absent on a unified server
SIDE_KEY = web.AppKey("disaggregation_side", object)
RECEIVED_KEY = "kimi_received"  # request[...]: time.time() when the request came in
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8"}  # as Starlette's


def error_body(message: str, status: int, kind: str) -> str:
    """SGLang's error object (``ErrorResponse`` in openai/protocol.py, as its http_server's
    exception handlers send it): flat, not nested under ``error``."""
    return json.dumps(error_response(message, kind, status))


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as FastAPI's ``ORJSONResponse`` sends it: ``Content-Type: application/json``, no
    charset parameter (aiohttp's ``json_response`` adds one SGLang does not send)."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


BARE_KEY = "kimi_bare"  # response[...]: sent without a Content-Type (server.py drops it)


def bare_response(text: str) -> web.Response:
    """A body with no ``Content-Type``, as FastAPI sends a plain ``Response(content)``."""
    response = web.Response(body=text.encode())
    response[BARE_KEY] = True
    return response


class BadRequest(web.HTTPBadRequest):
    """HTTP 400 with an ``ErrorResponse`` body: by default the one SGLang's request-validation
    handler answers (type ``Bad Request``); ``kind`` ``BadRequestError`` is an OpenAI route's
    refusal of a valid body (serving_base's ``create_error_response``)."""

    def __init__(self, message: str, kind: str = "Bad Request") -> None:
        body = error_body(message, 400, kind).encode()
        super().__init__(body=body, content_type="application/json")


class GenerateRefused(web.HTTPBadRequest):
    """HTTP 400 as ``/generate`` refuses a request: ``{"error": {"message"}}``."""

    def __init__(self, message: str) -> None:
        body = orjson.dumps({"error": {"message": message}})
        super().__init__(body=body, content_type="application/json")


async def read_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; anything else is a 400 that says why."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("1 validation error: JSON decode error") from None
    if not isinstance(body, dict):
        raise BadRequest("1 validation error: the body must be a JSON object")
    return body


async def sse_answer(request: web.Request, *events: Any) -> web.StreamResponse:
    """A 200 stream of ``events``, then ``[DONE]``: how SGLang refuses a request it found
    wrong only once it had started streaming."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    for event in events:
        await response.write(sse(event))
    await response.write(sse("[DONE]"))
    await response.write_eof()
    return response


def sse(data: Any) -> bytes:
    """One server-sent event: a JSON object, or a literal such as ``[DONE]``."""
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"
