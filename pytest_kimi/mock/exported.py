"""What a mock server counts for ``/metrics``, where SGLang counts it.

SGLang's tokenizer manager (the HTTP side) counts a request when it has its outputs: time to
first token at the first one, inter-token latency at each later one, and at the last one the
request, its tokens and its latency (``collect_metrics``; an aborted request is counted
there too, with the tokens it got, besides ``num_aborted_requests_total``). Its scheduler
sets the queue and token gauges. Its HTTP middleware counts requests and responses per
endpoint. The mock counts the same at the same points, in its own wall-clock seconds, and
:class:`~pytest_kimi.mock.wire.metrics.MetricStore` writes them in the wire version's
families (which label sets exist from start-up, which only after the first abort or the
first streamed request, are the recording's and the store's business, not this module's).
"""

from __future__ import annotations

import os
import time

from pytest_kimi.config.versions import SGLangProfile
from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.wire import recording
from pytest_kimi.mock.wire.info import max_total_tokens
from pytest_kimi.mock.wire.meta import cached_details
from pytest_kimi.mock.wire.metrics import MetricStore

HTTP_FAMILIES = ("sglang:http_requests_total", "sglang:http_responses_total",
                 "sglang:http_requests_active")  # fmt: skip
PER_STAGE = "sglang:per_stage_req_latency_seconds"


class ServerMetrics:
    """One server's counts (see the module docstring); :meth:`render` is its ``/metrics``."""

    def __init__(self, args: MockArgs) -> None:
        self.total_tokens = max_total_tokens(args.wire, args.max_total_tokens)
        self.version = args.wire
        kind = args.disaggregation_mode if args.disaggregation_mode != "null" else "unified"
        fill = {"model_name": str(args.served_model_name), "pid": str(os.getpid()),
                "engine_type": kind, "num_pages": str(self.total_tokens), "page_size": "1"}
        self.store = MetricStore(recording(args.wire), fill, own=HTTP_FAMILIES)
        # a disaggregated side of 0.5.10 and later observes its own queue time (cluster
        # seconds, from its wait queue: pytest_kimi.mock.prefillside and decodeside)
        self.side_queue = kind != "unified" and not SGLangProfile(args.wire).pd_queue_stages
        fam = self.store.families.get(PER_STAGE)
        self.stages = {s.get("stage") for s in fam.ready} if fam is not None else set()

    # -- the HTTP middleware ------------------------------------------------------------
    def http_started(self, endpoint: str, method: str) -> None:
        self.store.inc("sglang:http_requests_total", endpoint=endpoint, method=method)
        self.store.inc("sglang:http_requests_active", endpoint=endpoint, method=method)

    def http_finished(self, endpoint: str, method: str, status: int | None) -> None:
        if status is not None:
            self.store.inc("sglang:http_responses_total", endpoint=endpoint, method=method,
                           status_code=str(status))  # fmt: skip
        self.store.inc("sglang:http_requests_active", -1.0, endpoint=endpoint, method=method)

    # -- the scheduler ------------------------------------------------------------------
    def admitted(self, queue_s: float, prefill_s: float) -> None:
        """A request left the waiting queue after ``queue_s`` and prefilled in ``prefill_s``
        (wall seconds); SGLang's unified per-stage stages that the version exports."""
        if not self.side_queue:
            self.store.observe("sglang:queue_time_seconds", queue_s)
        seconds = {"prefill_waiting": queue_s, "prefill_forward": prefill_s,
                   "request_process": 0.0}  # fmt: skip
        for stage in sorted(s for s in self.stages if s in seconds):
            self.store.observe(PER_STAGE, seconds[stage], stage=stage)

    # -- the tokenizer manager ----------------------------------------------------------
    def first_output(self, ttft_s: float, streaming: bool) -> None:
        self.store.observe("sglang:time_to_first_token_seconds", ttft_s,
                           is_streaming=_flag(streaming))  # fmt: skip

    def later_output(self, interval_s: float, new_tokens: int) -> None:
        self.store.observe_spread("sglang:inter_token_latency_seconds", interval_s, new_tokens)

    def finished(self, prompt: int, generated: int, streaming: bool, e2e_s: float,
                 decode_s: float | None, cached: int = 0) -> None:  # fmt: skip
        """A request's last output (also an aborted one's): counters and histograms.
        ``cached``: its prompt tokens the prefix cache held (SGLang's scheduler counts its
        prefill's computed and cached tokens per batch; summed over a run, the same)."""
        flag = _flag(streaming)
        store = self.store
        if cached > 0:  # the counter appears with the first cached token, as SGLang's
            source = "device" if cached_details(self.version, cached) else "total"
            store.inc("sglang:cached_tokens_total", cached, cache_source=source)
            store.inc("sglang:realtime_tokens_total", cached, mode="prefill_cache")
            store.inc("sglang:prefill_effective_tokens_total", cached, mode="device_hit")
        store.inc("sglang:prefill_effective_tokens_total", prompt - cached, mode="input")
        store.inc("sglang:prompt_tokens_total", prompt, is_streaming=flag)
        store.inc("sglang:generation_tokens_total", generated, is_streaming=flag)
        store.inc("sglang:num_requests_total", is_streaming=flag)
        store.observe("sglang:e2e_request_latency_seconds", e2e_s, is_streaming=flag)
        store.observe("sglang:num_retractions", 0.0)
        store.observe("sglang:prompt_tokens_histogram", float(prompt))
        store.observe("sglang:uncached_prompt_tokens_histogram", float(prompt - cached))
        store.observe("sglang:generation_tokens_histogram", float(generated))
        if decode_s is not None and generated > 1:
            store.observe("sglang:request_time_per_output_token_seconds",
                          decode_s / (generated - 1), is_streaming=flag)  # fmt: skip
        store.inc("sglang:realtime_tokens_total", prompt - cached, mode="prefill_compute")
        store.inc("sglang:realtime_tokens_total", generated, mode="decode")

    def aborted(self) -> None:
        self.store.inc("sglang:num_aborted_requests_total")

    # -- a scrape -----------------------------------------------------------------------
    def render(self, engine: Engine, skip: tuple[str, ...] = ()) -> str:
        """``/metrics`` now: the scheduler's gauges read from the engine, then every family.
        ``skip``: families a disaggregated side writes itself."""
        store, sim = self.store, engine.sim
        # SGLang's running batch: requests past their prefill (one being prefilled is in
        # neither gauge); its waiting queue
        decoding = sum(1 for r in sim.running if r.finished_at is None and r.generated > 0)
        store.set("sglang:num_running_reqs", decoding)
        store.set("sglang:num_queue_reqs", engine.queued)
        used = sum(r.prompt_tokens + r.generated for r in sim.running if r.finished_at is None)
        store.set("sglang:num_used_tokens", used)
        store.set("sglang:kv_used_tokens", used)
        store.set("sglang:kv_available_tokens", max(0, self.total_tokens - used))
        store.set("sglang:token_usage", used / self.total_tokens)
        store.set("sglang:max_total_num_tokens", self.total_tokens)
        if sim.cache is not None:  # the last prefill batch's, as SGLang's scheduler logs it
            store.set("sglang:cache_hit_rate", sim.cache.log.hit_rate)
        spec = sim.spec_counters
        if spec.logged:  # set at each decode log, as SGLang's scheduler does
            store.set("sglang:spec_accept_length", spec.accept_length)
            store.set("sglang:spec_accept_rate", spec.accept_rate)
        store.set("sglang:process_cpu_seconds_total", time.process_time(), component="tokenizer")
        return store.render(skip)

    def gauge(self, name: str, value: float) -> None:
        """A gauge the mock computes elsewhere (a disaggregated side's queues)."""
        self.store.set(name, value)


def _flag(streaming: bool) -> str:
    return "true" if streaming else "false"
