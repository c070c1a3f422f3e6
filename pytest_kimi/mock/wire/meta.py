"""``meta_info`` of a ``/generate`` answer, as each SGLang version's tokenizer manager builds it.

0.5.9 (``srt/managers/tokenizer_manager.py``: ``_handle_batch_output``,
``_calculate_timing_metrics``, ``_wait_one_response``) and 0.5.23 (the same, with
``srt/observability/req_time_stats.py``'s ``convert_to_output_meta_info``) differ in names
(``total_retractions`` / ``num_retractions``, the ``spec_*`` counts) and in which timing keys
come when. Both add the scheduler's timings to every chunk and the request's own on the last
one only with ``--enable-metrics``.

Every time here is the mock's own, in wall-clock seconds like SGLang's ``time.time()``
(:class:`Times`; docs/mock.md says how each is derived), so the durations agree with the
timestamps they are differences of.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# 0.5.23's names for 0.5.9's speculative-decoding counts (tokenizer_manager.py,
# _calculate_spec_decoding_metrics)
SPEC_RENAMES = {
    "spec_accept_token_num": "spec_num_correct_drafts",
    "spec_draft_token_num": "spec_num_proposed_drafts",
    "spec_accept_histogram": "spec_correct_drafts_histogram",
}
ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


@dataclass(frozen=True)
class Times:
    """One request's timeline in wall-clock seconds. ``received``: it reached the HTTP server;
    ``dispatched``: it went to the scheduler; ``admitted``: it left the waiting queue for its
    first forward pass; ``first_token``: its prefill ended with its first token; ``finished``:
    the HTTP side had its last output; ``sent``: its first answer went to the client;
    ``first_output``: the HTTP side had its first output (a whole request's come every 50
    tokens). ``None``: not (yet) happened. A request's first answer is stamped ``sent`` as it
    is written, so ``sent`` is set on every answer rendered."""

    received: float
    dispatched: float
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    sent: float | None = None
    first_output: float | None = None


@dataclass(frozen=True)
class Progress:
    """Where a request stands when an answer is written: ``finish`` is ``None`` (running),
    ``"length"`` or ``"abort"``; ``first_chunk``: this is the request's first answer (a
    stream's first chunk, or a whole request's answer); ``spec``: a finished request's
    speculative counts (0.5.9 names)."""

    rid: str
    prompt: int
    generated: int
    finish: str | None = None
    stream: bool = False
    first_chunk: bool = False
    spec: dict[str, Any] = field(default_factory=dict)
    cached: int = 0  # prompt tokens its replica's prefix cache held (0 before admission)

    def finish_reason(self) -> dict[str, Any] | None:
        if self.finish == "abort":
            return dict(ABORT)
        if self.finish is not None:
            return {"type": "length", "length": self.generated}
        return None


def cached_details(version: str, cached: int) -> dict[str, int] | None:
    """``meta_info.cached_tokens_details``: 0.5.23 gives where the cached prompt tokens came
    from once there are any (``OutputStreamer.get_cached_tokens_details``: all from the
    device without a host cache); 0.5.9 only under HiCache, which the mock does not model.
    Also what ``sglang:cached_tokens_total`` is labelled by: ``cache_source="device"`` from
    the details, else ``"total"``."""
    if version == "0.5.9" or cached <= 0:
        return None
    return {"device": cached, "host": 0}


def meta_info(version: str, p: Progress, t: Times, metrics: bool) -> dict[str, Any]:
    """The ``meta_info`` of one answer (a chunk, or a whole request's) in ``version``."""
    if p.finish == "abort" and t.admitted is None:
        return _aborted_waiting(version, p, t)
    if version == "0.5.9":
        return _meta_0_5_9(p, t, metrics)
    return _meta_0_5_23(p, t, metrics)


def _aborted_waiting(version: str, p: Progress, t: Times) -> dict[str, Any]:
    """A request aborted before the scheduler ran it: the tokenizer manager answers for it
    (``_handle_abort_req``), with none of the scheduler's keys."""
    assert t.finished is not None
    waiting = {"type": "abort", "message": "Abort in waiting queue"}
    m: dict[str, Any] = {"id": p.rid, "finish_reason": waiting, "weight_version": "default",
                         "e2e_latency": t.finished - t.received}  # fmt: skip
    if version != "0.5.9":  # the scheduler's abort carries the (empty) weight-version span
        m["weight_versions"] = [{"version": "default", "start": 0, "end": 0}]
    m["completion_tokens"] = 0
    m["response_sent_to_client_ts"] = t.sent
    return m


def _meta_0_5_9(p: Progress, t: Times, metrics: bool) -> dict[str, Any]:
    m: dict[str, Any] = {"id": p.rid, "finish_reason": p.finish_reason(),
                         "prompt_tokens": p.prompt, "weight_version": "default",
                         "total_retractions": 0}  # fmt: skip
    if metrics and t.admitted is not None:
        m["queue_time"] = t.admitted - t.dispatched
        m["prefill_launch_delay"] = 0.0  # the mock launches a batch the moment it is formed
        if t.first_token is not None:
            m["prefill_launch_latency"] = t.first_token - t.admitted
            m["prefill_finished_ts"] = t.first_token
    m.update(completion_tokens=p.generated, cached_tokens=p.cached, cached_tokens_details=None)
    if p.finish is None:
        if p.stream and p.first_chunk:
            m["response_sent_to_client_ts"] = t.sent
        return m
    assert t.finished is not None
    m["e2e_latency"] = t.finished - t.received
    m.update(p.spec)
    if metrics:
        m["request_received_ts"] = t.received
        m["request_sent_to_scheduler_ts"] = t.dispatched
        if not p.first_chunk:  # set when the first chunk went out
            m["response_sent_to_client_ts"] = t.sent
        m["decode_finished_ts"] = t.finished
        if t.admitted is not None:
            m["inference_time"] = t.finished - t.admitted
        if t.first_output is not None and t.first_output < t.finished and p.generated > 0:
            m["decode_throughput"] = p.generated / (t.finished - t.first_output)
    if p.first_chunk:  # _wait_one_response stamps the first answer, this one
        m["response_sent_to_client_ts"] = t.sent
    return m


def _meta_0_5_23(p: Progress, t: Times, metrics: bool) -> dict[str, Any]:
    m: dict[str, Any] = {"id": p.rid, "finish_reason": p.finish_reason(),
                         "prompt_tokens": p.prompt, "weight_version": "default",
                         "num_retractions": 0}  # fmt: skip
    if metrics and t.admitted is not None:
        m.update(storage_prefetch_wait=0.0, storage_staging_wait=0.0,
                 forward_entry_time=t.admitted)  # fmt: skip
        if t.first_token is not None:
            m["prefill_finished_time"] = t.first_token
        m["queue_time"] = t.admitted - t.dispatched
    m.update(reasoning_tokens=0, completion_tokens=p.generated, cached_tokens=p.cached)
    if p.finish is not None:
        m["weight_versions"] = [{"version": "default", "start": 0, "end": p.generated}]
    m.update(cached_tokens_details=cached_details("0.5.23", p.cached), dp_rank=None)
    if p.finish is None:
        if p.stream and p.first_chunk:
            m["response_sent_to_client_ts"] = t.sent
        return m
    assert t.finished is not None
    m["e2e_latency"] = t.finished - t.received
    m.update({SPEC_RENAMES.get(k, k): v for k, v in p.spec.items()})
    if metrics:
        m["request_received_ts"] = t.received
        if t.first_token is not None and t.first_token > t.received:
            m["first_token_latency"] = t.first_token - t.received
        m["api_server_dispatch_finish_ts"] = t.dispatched
        m["response_sent_to_client_ts"] = t.sent
        m["request_finished_ts"] = t.finished
        first = t.first_token
        if first is not None and p.generated > 1 and t.finished > first:
            m["decode_throughput"] = (p.generated - 1) / (t.finished - first)
    return m
