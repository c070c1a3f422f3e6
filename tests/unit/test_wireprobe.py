"""The wire probe's ``/abort_request`` step against a scheduler whose running gauge is stale,
as 0.5.9's is after a client went away (it still said 1 while nothing ran, and the probe
aborted a request still waiting: CI on 3eb0079). The fake moves only when the probe reads
``/metrics``, so the order of events is driven, not raced."""

from __future__ import annotations

import json
import threading

import httpx

from pytest_kimi.testing import wireprobe

PREFILL_AFTER_READS = 3  # the long request's prefill, this many /metrics reads after it came
DECODE_LOG_AFTER_READS = 6  # its first decode log (the gauge says 1), this many reads after


class StaleGauge:
    """A 0.5.9 scheduler as ``/metrics`` shows it: the gauge changes only when a prefill is
    logged (the batch beside it: 0 here) or a decode step is; it starts at a stale 1."""

    def __init__(self) -> None:
        self.gauge = 1
        self.reads_since_arrival: int | None = None
        self.prefilled = False
        self.aborted = threading.Event()
        self.tiny_requests = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self._metrics())
        body = json.loads(request.content)
        if request.url.path == "/abort_request":
            if self.reads_since_arrival is not None:  # known to the scheduler: aborted
                self.aborted.set()
            return httpx.Response(200)
        if body["sampling_params"]["max_new_tokens"] == 1:  # ends at its prefill
            self.tiny_requests += 1
            self.gauge = 0
            return httpx.Response(200, json={"text": "x", "meta_info": {}})
        self.reads_since_arrival = 0
        assert self.aborted.wait(30), "the probe never aborted the long request"
        return httpx.Response(200, json=self._aborted_answer(body["rid"]))

    def _metrics(self) -> str:
        if self.reads_since_arrival is not None:
            self.reads_since_arrival += 1
            if self.reads_since_arrival == PREFILL_AFTER_READS:
                self.prefilled, self.gauge = True, 0
            elif self.reads_since_arrival == DECODE_LOG_AFTER_READS:
                self.gauge = 1
        return f'sglang:num_running_reqs{{engine_type="unified"}} {self.gauge}.0\n'

    def _aborted_answer(self, rid: str) -> dict:
        if not self.prefilled:  # SGLang's tokenizer manager, _handle_abort_req
            reason = {"type": "abort", "message": "Abort in waiting queue"}
            meta = {"id": rid, "finish_reason": reason}
            return {"text": "", "output_ids": [], "meta_info": meta}
        reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        meta = {"id": rid, "finish_reason": reason, "completion_tokens": 2}
        return {"text": "w1 w2", "output_ids": [1, 2], "meta_info": meta}


def test_the_abort_waits_for_the_request_to_run_though_the_gauge_said_1_before_it():
    server = StaleGauge()
    with httpx.Client(transport=httpx.MockTransport(server.handle), base_url="http://fake") as c:
        answers = wireprobe._abort_request_whole(c)
    meta = answers["abort/generate"].body["meta_info"]
    assert meta["finish_reason"]["message"] == "Aborted", meta  # not "Abort in waiting queue"
    assert server.tiny_requests == 1  # one request that ended at its prefill set the gauge to 0
