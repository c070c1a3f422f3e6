"""What the client is asked to send: its options, one request, and an open loop's gaps.

A module of its own so that both senders, of single requests (:mod:`.client`) and of
sessions (:mod:`.sessionsend`), read the same options.
"""

from __future__ import annotations

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


def arrival_gaps(n: int, rate: float, seed: int) -> list[float]:
    """Seconds to wait after sending request ``i``: a seeded Poisson process at ``rate``
    requests/s (exponential gaps, as bench_serving's ``--request-rate``); all zero for inf."""
    if rate == float("inf"):
        return [0.0] * n
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 or inf, got {rate}")
    rng = random.Random(seed)
    return [rng.expovariate(rate) if i + 1 < n else 0.0 for i in range(n)]
