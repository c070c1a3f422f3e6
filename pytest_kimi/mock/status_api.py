"""SGLang's read-only endpoints: health, model and server info, load, Prometheus metrics,
and ``/flush_cache``, ``/freeze_gc``. What the router and the product ask a server about
itself, in the keys of the mock's wire version (:mod:`pytest_kimi.mock.wire.info`)."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from pytest_kimi.mock.decodeside import DecodeSide
from pytest_kimi.mock.exported import PER_STAGE
from pytest_kimi.mock.http_common import (
    ARGS_KEY,
    ENGINE_KEY,
    FAULTS_KEY,
    GATE_KEY,
    METRICS_KEY,
    SIDE_KEY,
    bare_response,
    json_response,
)
from pytest_kimi.mock.prefillside import PrefillSide
from pytest_kimi.mock.wire import info as wire_info

log = logging.getLogger("sglang.mock")
VERSION = "0.5.9-kimi-mock"  # the default wire version's; /get_server_info says the one used
# the exposition format prometheus_client 0.26 (both versions' pin) answers a plain scrape in
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def health(request: web.Request) -> web.Response:
    faults, gate = request.app[FAULTS_KEY], request.app[GATE_KEY]
    if faults.health == "fail":
        return web.Response(status=503, text="unhealthy (mock fault)\n")
    busy = request.app[ENGINE_KEY].running > 0 or gate.held > 0  # held requests are in flight
    delay = faults.health_delay(busy=busy)
    if delay:
        try:
            await asyncio.sleep(delay)
        finally:  # answered late, or cancelled because its client gave up: late either way
            if busy and faults.hold_until_late_health:
                gate.probe_answered_late(delay, client_gone=request.transport is None)
    return web.Response(status=200)


# SGLang's old names of its endpoints, which answer and log that they are deprecated
DEPRECATED = {"/get_model_info": "/model_info", "/get_server_info": "/server_info",
              "/get_load": "/v1/loads"}  # fmt: skip


def _deprecated(request: web.Request) -> None:
    new = DEPRECATED.get(request.path)
    if new is not None:
        log.warning("Endpoint '%s' is deprecated and will be removed in a future version. "
                    "Please use '%s' instead.", request.path, new)  # fmt: skip


async def model_info(request: web.Request) -> web.Response:
    _deprecated(request)
    args = request.app[ARGS_KEY]
    return json_response(wire_info.model_info(args.wire, args.server_info()))


async def server_info(request: web.Request) -> web.Response:
    _deprecated(request)
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    scheduler: dict[str, float | int] = {
        "max_total_num_tokens": request.app[METRICS_KEY].total_tokens,
        "max_running_requests": engine.sim.max_running,
    }
    average = engine.sim.spec_counters.average()
    if engine.sim.spec is not None and average is not None:  # Scheduler.get_internal_state
        scheduler["avg_spec_accept_length"] = average
    info = wire_info.server_info(args.wire, args.server_info(), scheduler)
    if args.mock_server_info_extras:  # keys SGLang lacks: only when asked for
        info["unrecognized_args"] = list(args.unknown)
        info["kimi_mock"] = {"time_scale": engine.time_scale, "profile": args.profile}
    return json_response(info)


async def models(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    model = {
        "id": args.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": args.served_model_name,
        "parent": None,
        "max_model_len": args.context_length,
    }
    return json_response({"object": "list", "data": [model]})


async def flush_cache(request: web.Request) -> web.Response:
    """SGLang empties its prefix cache, unless requests are running or waiting
    (``Scheduler.flush_cache``); the answer is the same either way."""
    engine = request.app[ENGINE_KEY]
    cache = engine.sim.cache
    if cache is not None and not engine.running and not engine.queued:
        cache.flush()
    return bare_response("Cache flushed.\nPlease check backend logs for more details. (When "
                         "there are running or waiting requests, the operation will not be "
                         "performed.)\n")  # fmt: skip


async def freeze_gc(request: web.Request) -> web.Response:
    """SGLang freezes its processes' garbage collectors; the mock has nothing to freeze."""
    return bare_response("Garbage collection frozen.\n")


async def get_load(request: web.Request) -> web.Response:
    """0.5.9's ``GetLoadReqOutput`` (0.5.23 has no ``/get_load``)."""
    _deprecated(request)
    engine = request.app[ENGINE_KEY]
    tokens = sum(r.prompt_tokens + r.generated for r in engine.sim.running
                 if r.finished_at is None)  # fmt: skip
    load = {"rid": None, "http_worker_ipc": None, "dp_rank": None, "num_reqs": engine.running,
            "num_waiting_reqs": engine.queued, "num_tokens": tokens,
            "ts_tic": time.perf_counter()}  # fmt: skip
    return json_response([load])


async def metrics(request: web.Request) -> web.Response:
    """The wire version's families with the mock's values
    (:class:`~pytest_kimi.mock.exported.ServerMetrics`); a disaggregated server's per-stage
    latencies and queue gauges come from its side."""
    args, engine, counts = request.app[ARGS_KEY], request.app[ENGINE_KEY], request.app[METRICS_KEY]
    if not args.enable_metrics:  # SGLang mounts /metrics only with --enable-metrics
        return json_response({"detail": "Not Found"}, 404)
    side = request.app.get(SIDE_KEY)
    if not isinstance(side, PrefillSide | DecodeSide):
        return _text(counts.render(engine))
    for name, value in side.gauges(engine.timebase.now()).items():
        counts.gauge(f"sglang:{name}", value)
    for name, value in side.observed:  # the side's histograms (0.5.10 and later), once each
        counts.store.observe(name, value)
    side.observed.clear()
    kind = args.disaggregation_mode
    sched = (f'{{engine_type="{kind}",model_name="{args.served_model_name}",moe_ep_rank="0",'
             f'pp_rank="0",tp_rank="0"}}')  # fmt: skip
    stages = side.stages.lines(sched)
    return _text(counts.render(engine, skip=(PER_STAGE,)) + "\n".join(stages) + "\n")


def _text(body: str) -> web.Response:
    response = web.Response(body=body.encode())
    response.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return response
