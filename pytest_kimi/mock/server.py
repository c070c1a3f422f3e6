"""SGLang's HTTP surface over the mock engine (aiohttp): the application and its routes.

Endpoints and stream formats follow SGLang's: native ``/generate`` (``native_api``) streams
cumulative text with ``meta_info``; the OpenAI routes (``openai_api``) stream deltas and, when
asked, a final usage chunk; ``status_api`` answers health, info, load and metrics.
``/kimi/...`` (``kimi_api``) is the mock's own, test-only: ground truth and fault knobs.
"""

from __future__ import annotations

from aiohttp import web

from pytest_kimi.mock import kimi_api, native_api, openai_api, status_api
from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.faults import Faults
from pytest_kimi.mock.healthgate import HealthGate
from pytest_kimi.mock.http_common import ARGS_KEY, ENGINE_KEY, FAULTS_KEY, GATE_KEY
from pytest_kimi.mock.status_api import VERSION
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR


def build_app(args: MockArgs, engine: Engine, faults: Faults | None = None) -> web.Application:
    """The rank-0 application: every SGLang endpoint the product and its peers use."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY], app[ARGS_KEY] = engine, args
    app[FAULTS_KEY] = faults or Faults()
    app[GATE_KEY] = HealthGate()
    r = app.router
    r.add_get("/health", status_api.health)
    r.add_get("/health_generate", status_api.health)
    r.add_get("/get_model_info", status_api.model_info)
    r.add_get("/model_info", status_api.model_info)
    r.add_get("/get_server_info", status_api.server_info)
    r.add_get("/server_info", status_api.server_info)
    r.add_get("/v1/models", status_api.models)
    r.add_post("/generate", native_api.generate)
    r.add_post("/v1/completions", openai_api.completions)
    r.add_post("/v1/chat/completions", openai_api.chat)
    r.add_route("*", "/flush_cache", status_api.flush_cache)
    r.add_get("/get_load", status_api.get_load)
    r.add_get("/metrics", status_api.metrics)
    r.add_get("/kimi/ground_truth", kimi_api.ground_truth)
    r.add_post("/kimi/faults", kimi_api.set_faults)
    return app


__all__ = ["TOKENIZER_DIR", "VERSION", "build_app"]
