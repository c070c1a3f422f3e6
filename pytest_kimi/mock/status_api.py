"""SGLang's read-only endpoints: health, model and server info, load, Prometheus metrics,
and ``/flush_cache``. What the router and the product ask a server about itself."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from pytest_kimi.mock.disagg import DecodeSide, PrefillSide
from pytest_kimi.mock.http_common import ARGS_KEY, ENGINE_KEY, FAULTS_KEY, GATE_KEY, SIDE_KEY

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
    info["status"] = "ready"  # scheduler_info, merged in by SGLang's /server_info
    state = {**args.server_info(), "last_gen_throughput": 0.0}
    average = engine.sim.spec_counters.average()
    if engine.sim.spec is not None and average is not None:  # Scheduler.get_internal_state
        state["avg_spec_accept_length"] = average
    info["internal_states"] = [state]
    info["version"] = VERSION
    if args.mock_server_info_extras:  # keys SGLang lacks: only when asked for
        info["unrecognized_args"] = list(args.unknown)
        info["kimi_mock"] = {"time_scale": engine.time_scale, "profile": args.profile}
    return web.json_response(info)


async def models(request: web.Request) -> web.Response:
    args = request.app[ARGS_KEY]
    model = {
        "id": args.served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": args.served_model_name,
        "max_model_len": args.context_length,
    }
    return web.json_response({"object": "list", "data": [model]})


async def flush_cache(request: web.Request) -> web.Response:
    return web.Response(text="Cache flushed.\nPlease check backend logs for more details.\n")


async def get_load(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    load = {"dp_rank": 0, "num_reqs": engine.running, "num_waiting_reqs": engine.queued}
    return web.json_response([load])


def _family(name: str, kind: str, doc: str, labels: str, value: float) -> list[str]:
    return [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{labels} {value}"]


async def metrics(request: web.Request) -> web.Response:
    """SGLang 0.5.9's metric names and labels (srt/metrics/collector.py): the scheduler's
    gauges carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``, the tokenizer
    manager's counters ``model_name`` only, and count finished requests."""
    args, engine = request.app[ARGS_KEY], request.app[ENGINE_KEY]
    if not args.enable_metrics:
        return web.Response(status=404, text="metrics are off; start with --enable-metrics\n")
    model = args.served_model_name
    kind = args.disaggregation_mode if args.disaggregation_mode != "null" else "unified"
    sched = (
        f'{{model_name="{model}",engine_type="{kind}",tp_rank="0",pp_rank="0",moe_ep_rank="0"}}'
    )
    tok = f'{{model_name="{model}"}}'
    done, spec = engine.counters, engine.sim.spec_counters
    lines = [
        *_family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                 sched, engine.running),
        *_family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                 sched, engine.queued),
        *_family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                 tok, done.prompt_tokens),
        *_family("sglang:generation_tokens_total", "counter",
                 "Number of generation tokens processed.", tok, done.generation_tokens),
        *_family("sglang:num_requests_total", "counter", "Number of requests processed.",
                 tok, done.requests),
        *_family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.",
                 tok, done.aborted),
    ]  # fmt: skip
    if spec.logged:  # SGLang's scheduler sets these at each decode log; no sample before one
        lines += [
            *_family("sglang:spec_accept_length", "gauge",
                     "The average acceptance length of speculative decoding.", sched,
                     spec.accept_length),
            *_family("sglang:spec_accept_rate", "gauge",
                     "The average acceptance rate of speculative decoding (`accepted tokens / "
                     "total draft tokens` in batch).", sched, spec.accept_rate),
        ]  # fmt: skip
    side = request.app.get(SIDE_KEY)
    if isinstance(side, PrefillSide | DecodeSide):
        lines += _disaggregation(side, engine.cluster_now(), sched)
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


# SGLang 0.5.9's PD gauges (srt/metrics/collector.py, SchedulerMetricsCollector)
QUEUE_DOCS = {
    "num_prefill_prealloc_queue_reqs": "The number of requests in the prefill prealloc queue.",
    "num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
}
# exported by a prefill server and never set in 0.5.9 (scheduler_metrics_mixin.py): always 0
KV_TRANSFER_DOCS = {
    "kv_transfer_speed_gb_s": "The transfer speed of the KV cache in GB/s.",
    "kv_transfer_latency_ms": "The transfer latency of the KV cache in ms.",
    "kv_transfer_bootstrap_ms": "The bootstrap time of the KV transfer in ms.",
    "kv_transfer_alloc_ms": "The allocation waiting time of the KV transfer in ms.",
    "kv_transfer_total_mb": "The total number of tokens transferred in the KV cache.",
}
PD_COUNTER_DOCS = {
    "num_bootstrap_failed_reqs_total": "The number of bootstrap failed requests.",
    "num_transfer_failed_reqs_total": "The number of transfer failed requests.",
    "num_prefill_retries_total": "Total number of prefill retries.",
}


def _disaggregation(side: PrefillSide | DecodeSide, now: float, sched: str) -> list[str]:
    """A disaggregated server's queue gauges, failure counters (declared: the mock has no
    failures, and prometheus_client shows a labelled counter's sample from its first one),
    the prefill's KV transfer gauges (0, as SGLang's) and the per-stage latency histogram."""
    lines: list[str] = []
    for name, value in side.gauges(now).items():
        lines += _family(f"sglang:{name}", "gauge", QUEUE_DOCS[name], sched, value)
    for name, doc in PD_COUNTER_DOCS.items():  # declared; no sample until one fails
        lines += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} counter"]
    if isinstance(side, PrefillSide):
        for name, doc in KV_TRANSFER_DOCS.items():
            lines += _family(f"sglang:{name}", "gauge", doc, sched, 0.0)
    return lines + side.stages.lines(sched)
