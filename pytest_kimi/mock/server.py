"""SGLang's HTTP surface over the mock engine (aiohttp): the application and its routes.

Endpoints and stream formats follow SGLang's: native ``/generate`` (``native_api``) streams
cumulative text with ``meta_info``; the OpenAI routes (``openai_api``) stream deltas and, when
asked, a final usage chunk; ``status_api`` answers health, info, load and metrics.
``/kimi/...`` (``kimi_api``) is the mock's own, test-only: ground truth and fault knobs.

Every answer goes out as SGLang's FastAPI app on uvicorn sends it: ``server: uvicorn``,
``vary: Origin`` (its CORS middleware), FastAPI's JSON body for an unknown path or method,
and each request counted per endpoint in ``/metrics`` as SGLang's HTTP middleware counts it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from pytest_kimi.mock import kimi_api, native_api, openai_api, status_api
from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.exported import ServerMetrics
from pytest_kimi.mock.faults import Faults
from pytest_kimi.mock.healthgate import HealthGate
from pytest_kimi.mock.http_common import (
    ARGS_KEY,
    BARE_KEY,
    ENGINE_KEY,
    FAULTS_KEY,
    GATE_KEY,
    METRICS_KEY,
    RECEIVED_KEY,
    json_response,
)
from pytest_kimi.mock.status_api import VERSION
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FASTAPI_ERRORS = {404: "Not Found", 405: "Method Not Allowed"}


@web.middleware
async def as_sglang(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stamp the request's arrival, count it as SGLang's ``track_http_status_code``
    middleware does (the route's path, else the path asked for), and answer an unknown path
    or method with FastAPI's ``{"detail": ...}``."""
    request[RECEIVED_KEY] = time.time()
    route = request.match_info.route.resource
    path = route.canonical if route is not None else request.path
    counts: ServerMetrics = request.app[METRICS_KEY]
    counts.http_started(path, request.method)
    status: int | None = None
    try:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status not in FASTAPI_ERRORS or exc.content_type == "application/json":
                raise
            response = json_response({"detail": FASTAPI_ERRORS[exc.status]}, exc.status)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        counts.http_finished(path, request.method, status)


async def _uvicorn_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "uvicorn"
    response.headers["Vary"] = "Origin"
    if response.get(BARE_KEY):
        response.headers.pop("Content-Type", None)


def build_app(args: MockArgs, engine: Engine, faults: Faults | None = None) -> web.Application:
    """The rank-0 application: every SGLang endpoint the product and its peers use."""
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[as_sglang])
    app[ENGINE_KEY], app[ARGS_KEY] = engine, args
    app[FAULTS_KEY] = faults or Faults()
    app[GATE_KEY] = HealthGate()
    app[METRICS_KEY] = ServerMetrics(args)
    app.on_response_prepare.append(_uvicorn_headers)
    r = app.router
    r.add_get("/health", status_api.health)
    r.add_get("/health_generate", status_api.health)
    r.add_get("/get_model_info", status_api.model_info)
    r.add_get("/model_info", status_api.model_info)
    r.add_get("/get_server_info", status_api.server_info)
    r.add_get("/server_info", status_api.server_info)
    r.add_get("/v1/models", status_api.models)
    r.add_post("/generate", native_api.generate)
    r.add_post("/abort_request", native_api.abort_request)
    r.add_post("/v1/completions", openai_api.completions)
    r.add_post("/v1/chat/completions", openai_api.chat)
    r.add_route("*", "/flush_cache", status_api.flush_cache)
    r.add_route("*", "/freeze_gc", status_api.freeze_gc)
    if args.wire == "0.5.9":  # 0.5.23 has no /get_load
        r.add_get("/get_load", status_api.get_load)
    r.add_get("/metrics", status_api.metrics)
    r.add_get("/kimi/ground_truth", kimi_api.ground_truth)
    r.add_post("/kimi/faults", kimi_api.set_faults)
    return app


__all__ = ["TOKENIZER_DIR", "VERSION", "build_app"]
