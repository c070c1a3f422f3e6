"""What the client is asked to send: its options, one request, and an open loop's gaps.

A module of its own so that both senders, of single requests (:mod:`.client`) and of
sessions (:mod:`.sessionsend`), read the same options.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_kimi.workload.prompts import ChatTemplate
from pytest_kimi.workload.sessions import Message, ThinkTime, raw_text


@dataclass(frozen=True)
class ClientOptions:
    """How to send the workload."""

    api: str = "generate"
    output_len: int = 512
    concurrency: int = 8
    request_rate: float = float("inf")  # Poisson arrivals when finite
    timeout_s: float = 3600.0
    pooled: bool = False
    model: str = "default"
    seed: int = 0
    clock_start: str = "request"  # where TTFT and E2E start: "request" | "send" (records.py)
    # sessions (sessions.py): the pause before each later turn, in the client's clock's
    # seconds; the served model's chat template, which makes a conversation the text
    # /generate and /v1/completions send (none: the contents, a blank line apart)
    think_time: ThinkTime = field(default_factory=ThinkTime)
    chat_template: ChatTemplate | None = None

    def render(self, messages: Sequence[Message]) -> str:
        """A session's conversation as the text of a /generate or /v1/completions body."""
        if self.chat_template is None:
            return raw_text(messages)
        return self.chat_template.render(list(messages))


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt and its nominal length."""

    prompt_id: str
    text: str
    nominal_tokens: int
    category: str | None = None  # its SPEED-Bench category (the dataset row's)
    # a replayed trace's: this request's own answer length (None: the workload's), and when
    # it is due, seconds of the client's clock after the schedule's origin (None: the
    # request rate's Poisson arrivals, or a closed loop)
    output_len: int | None = None
    offset_s: float | None = None

    def answer_tokens(self, options: ClientOptions) -> int:
        """Tokens this request asks the server to generate."""
        return self.output_len if self.output_len is not None else options.output_len


def due_offsets(requests: Sequence[RequestSpec], options: ClientOptions) -> list[float] | None:
    """When each request is due after the schedule's origin: a trace's own offsets, else
    the request rate's seeded Poisson arrivals; None for a closed loop."""
    if requests and all(r.offset_s is not None for r in requests):
        first = requests[0].offset_s or 0.0
        return [(r.offset_s or 0.0) - first for r in requests]
    if any(r.offset_s is not None for r in requests):
        raise ValueError("a trace's requests all keep their arrival offsets, or none does")
    if options.request_rate == float("inf"):
        return None
    gaps = arrival_gaps(len(requests), options.request_rate, options.seed)
    return list(itertools.accumulate(gaps, initial=0.0))[: len(requests)]


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait after sending request ``i``: a seeded Poisson process at ``rate``
    requests/s (exponential gaps, as bench_serving's ``--request-rate``); all zero for inf."""
    if rate == float("inf"):
        return [0.0] * n
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 or inf, got {rate}")
    rng = random.Random(seed)
    return [rng.expovariate(rate) if i + 1 < n else 0.0 for i in range(n)]
