"""What every mock route shares: the application's state keys, SGLang's 400 body, JSON request
bodies and SSE framing. Kept apart so the route modules depend on it and not on each other."""

from __future__ import annotations

import json
from typing import Any

import orjson
from aiohttp import web

from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.faults import Faults
from pytest_kimi.mock.healthgate import HealthGate

ENGINE_KEY = web.AppKey("engine", Engine)
ARGS_KEY = web.AppKey("args", MockArgs)
FAULTS_KEY = web.AppKey("faults", Faults)
GATE_KEY = web.AppKey("health_gate", HealthGate)
# a disaggregated server's side (pytest_kimi.mock.disagg.PrefillSide or DecodeSide); absent
# on a unified server
SIDE_KEY = web.AppKey("disaggregation_side", object)


def error_body(message: str, status: int, kind: str) -> str:
    """SGLang 0.5.9's error object (``ErrorResponse`` in openai/protocol.py, as its
    http_server's exception handlers send it): flat, not nested under ``error``."""
    error = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return json.dumps(error)


class BadRequest(web.HTTPBadRequest):
    """HTTP 400 with the body SGLang's request-validation handler answers."""

    def __init__(self, message: str) -> None:
        body = error_body(message, 400, "Bad Request")
        super().__init__(text=body, content_type="application/json")


async def read_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; anything else is a 400 that says why."""
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def sse(data: Any) -> bytes:
    """One server-sent event: a JSON object, or a literal such as ``[DONE]``."""
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"
