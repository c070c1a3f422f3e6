"""SGLang's read-only endpoints: health, model and server info, load, Prometheus metrics,
and ``/flush_cache``. What the router and the product ask a server about itself."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from pytest_kimi.mock.http_common import ARGS_KEY, ENGINE_KEY, FAULTS_KEY, GATE_KEY

VERSION = "0.5.9-kimi-mock"


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


async def dummy_health(request: web.Request) -> web.Response:
    """Ranks >= 1: SGLang's dummy health endpoint always answers 200."""
    return web.Response(status=200)


async def model_info(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    return web.json_response(
        {
            "model_path": args.model_path,
            "tokenizer_path": args.tokenizer_path or args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_mock",
            "architectures": ["KimiMockForCausalLM"],
        }
    )


async def server_info(request: web.Request) -> web.Response:
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    info = args.server_info()
    info["version"] = VERSION
    info["internal_states"] = [
        {"last_gen_throughput": 0.0, "load": engine.running, "memory_usage": {}}
    ]
    info["kimi_mock"] = {"time_scale": engine.time_scale, "profile": args.profile}
    return web.json_response(info)


async def models(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    model = {
        "id": args.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": args.model_path,
        "max_model_len": args.context_length,
    }
    return web.json_response({"object": "list", "data": [model]})


async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\nPlease check backend logs for more details.\n")


async def get_load(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    load = {"dp_rank": 0, "num_reqs": engine.running, "num_waiting_reqs": engine.queued}
    return web.json_response([load])


async def metrics(request: web.Request) -> web.Response:
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    if not args.enable_metrics:
        return web.Response(status=404, text="metrics are off; start with --enable-metrics\n")
    label = f'{{model_name="{args.served_model_name}"}}'
    lines = [
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{label} {engine.running}",
        "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
        "# TYPE sglang:num_queue_reqs gauge",
        f"sglang:num_queue_reqs{label} {engine.queued}",
        "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE sglang:prompt_tokens_total counter",
        f"sglang:prompt_tokens_total{label} {engine.prompt_tokens_total}",
        "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
        "# TYPE sglang:generation_tokens_total counter",
        f"sglang:generation_tokens_total{label} {engine.emitted_tokens}",
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
