"""The cluster file's ``workload`` as pydantic models: what the benchmark sends.

SPEED-Bench rows, lengths, concurrency and arrivals (each of which a list sweeps), the
percentiles reported and the goodput limits. Part of the file's shape
(:mod:`pytest_kimi.config.models`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pytest_kimi.config.fields import (
    APIS,
    CLOCK_STARTS,
    Count,
    NonNegative,
    Percentiles,
    RequestRate,
    Seconds,
    Sweep,
    Text,
    TextValue,
    one_of,
)
from pytest_kimi.config.strictmodel import StrictModel
from pytest_kimi.workload.sessions import THINK_KINDS

PROMPT_MODES = ("raw", "chat_template", "chat_template_or_raw")  # workload.prompts.PROMPT_MODES


class Goodput(StrictModel):
    """Per-request limits for goodput (vLLM --goodput): a request counts if it meets all."""

    ttft: TextValue | None = Field(None, description="Time to first token, e.g. 30s.")
    tpot: TextValue | None = Field(None, description="Time per output token, e.g. 200ms.")
    e2e: TextValue | None = Field(None, description="End-to-end latency, e.g. 60s.")


_SWEEP = "; a list sweeps it: one workload point per value (docs/cluster-file.md)."


class Workload(StrictModel):
    """The benchmark workload: SPEED-Bench rows, lengths, concurrency."""

    dataset: Text = Field(
        description="SPEED-Bench data (relative to this file): a .jsonl or .parquet file, a "
        "local snapshot directory of nvidia/SPEED-Bench, or builtin:NAME."
    )
    speedbench_config: Text = Field(
        "throughput_16k",
        description="Config read from a snapshot directory, as its dataset card's configs: "
        "name them (qualitative, throughput_1k .. throughput_32k).",
    )
    prompt: one_of(*PROMPT_MODES) = Field(
        "raw",
        description="What is sent: raw (the first turn as is) or chat_template (the first turn "
        "in the served model's chat template, as SGLang's SPEED-Bench loader); "
        "chat_template_or_raw falls back to raw when the tokenizer has no template.",
    )
    num_requests: Sweep[Count] = Field(description="Measured requests per layout" + _SWEEP)
    input_len: Sweep[Count] = Field(description="Nominal prompt length in tokens" + _SWEEP)
    output_len: Sweep[Count] = Field(description="Tokens generated per request" + _SWEEP)
    concurrency: Sweep[Count] = Field(description="Requests in flight at once" + _SWEEP)
    warmup_requests: NonNegative = Field(1, description="Unmeasured requests sent first.")
    api: Sweep[one_of(*APIS)] = Field(
        "generate", description="Server API the client calls" + _SWEEP
    )
    clock_start: one_of(*CLOCK_STARTS) = Field(
        "request",
        description="Where TTFT and E2E start: request (before the request is issued, "
        "connecting included: sglang.bench_serving's definition) or send (when its first byte "
        "is written, once connected).",
    )
    seed: NonNegative = Field(0, description="Seed of row selection and arrivals.")
    category: Sweep[Text] | None = Field(
        None, description="Only SPEED-Bench rows of this category" + _SWEEP
    )
    request_timeout_s: Seconds = Field(3600.0, description="Seconds one request may take.")
    request_rate: Sweep[RequestRate] = Field(
        "inf",
        description="Requests/s (Poisson arrivals); 'inf': as fast as concurrency allows" + _SWEEP,
    )
    percentiles: Percentiles = Field(
        default_factory=lambda: [50.0, 90.0, 95.0, 99.0], description="Percentiles reported."
    )
    goodput: Goodput = Field(default_factory=Goodput, description=Goodput.__doc__)


WORKLOAD_KINDS = ("requests", "sessions", "agentic", "trace")


class ThinkTime(StrictModel):
    """The pause between an answer and the session's next turn (cluster seconds)."""

    seconds: Annotated[float, Field(ge=0)] = Field(0.0, description="The pause, or its mean.")
    kind: one_of(*THINK_KINDS) = Field(
        "fixed", description="fixed: every pause is `seconds`; exponential: drawn, seeded."
    )


class NamedWorkload(Workload):
    """A workload the cluster file names (``workloads: {NAME: ...}``), picked with
    --kimi-workload NAME: its settings over the file's ``workload``, which gives the rest."""

    kind: one_of(*WORKLOAD_KINDS) = Field(
        "requests",
        description="requests: single-turn SPEED-Bench prompts (the seed's); sessions: "
        "multi-turn sessions from `dataset` (SPEED-Bench rows of several turns, or ShareGPT "
        "JSONL); agentic: seeded synthetic agent sessions; trace: a Mooncake-format trace "
        "(`dataset`) replayed at its timestamps. For sessions and agentic, num_requests "
        "counts sessions and concurrency counts sessions in flight.",
    )
    dataset: Text | None = Field(None, description="As workload.dataset (default: its).")
    num_requests: Sweep[Count] | None = Field(None, description="As workload.num_requests.")
    input_len: Sweep[Count] | None = Field(None, description="As workload.input_len.")
    output_len: Sweep[Count] | None = Field(
        None, description="As workload.output_len; for sessions, the answer tokens per turn."
    )
    concurrency: Sweep[Count] | None = Field(None, description="As workload.concurrency.")
    turns: Count = Field(6, description="agentic: turns per session (a task, then tool results).")
    system_prompt_tokens: NonNegative = Field(
        2048, description="agentic: the system prompt every session shares."
    )
    task_tokens: Count = Field(256, description="agentic: the first user turn.")
    tool_result_tokens: Count = Field(512, description="agentic: each later turn.")
    think_time: ThinkTime = Field(default_factory=ThinkTime, description=ThinkTime.__doc__)
    trace_speed: Annotated[float, Field(gt=0)] = Field(
        1.0, description="trace: replay speed (2: twice as fast); --kimi-trace-speed overrides."
    )
    arrivals: Text | None = Field(
        None,
        description="requests, sessions or agentic: a recorded arrival list to replay instead of "
        "a closed loop or request_rate's Poisson arrivals: JSONL rows with `timestamp` in ms "
        "(a Mooncake trace is one), relative to the cluster file; request (or session) i is "
        "due at row i's timestamp after the first's, divided by trace_speed.",
    )
