"""The one vocabulary of metrics: name, unit, direction, kind, row label, bench_serving key.

Every place a user sees a figure (SLO names and test ids, the regression gate, the comparison
table, JUnit properties, pytest-benchmark's ``extra_info``) names it as this module does:
``ttft_p95``, ``tpot_mean``, ``output_throughput``. ``bench_key`` is the same figure's key in
``sglang.bench_serving --output-file`` (``p95_ttft_ms``), kept in ``summary.json`` so results
compare with peers. Standard library only: the plugin imports it at collection time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LATENCY_PREFIXES: dict[str, tuple[str, str]] = {
    # prefix -> (label, bench_serving key infix)
    "ttft": ("TTFT", "ttft"),
    "tpot": ("TPOT", "tpot"),
    "itl": ("ITL", "itl"),
    "e2e": ("E2E", "e2e_latency"),
    # time to first answer token: after a reasoning model's thinking; = TTFT without reasoning
    "ttfat": ("TTFAT", "ttfat"),
    # open-loop runs (a request rate, a trace): how late each request left against its
    # schedule, and TTFT / E2E counted from the schedule's instant (docs/metrics.md)
    "dispatch_delay": ("Dispatch delay", "dispatch_delay"),
    "ttft_from_schedule": ("TTFT from schedule", "ttft_from_schedule"),
    "e2e_from_schedule": ("E2E from schedule", "e2e_from_schedule"),
}
SCHEDULE_PREFIXES: tuple[str, ...] = ("dispatch_delay", "ttft_from_schedule", "e2e_from_schedule")
"""Figures only an open-loop run has: its records keep the instant each request was due."""
STATS: tuple[str, ...] = ("mean", "median", "std", "min", "max")
PER_REQUEST_PREFIXES: tuple[str, ...] = ("ttft", "tpot", "e2e", "ttfat", *SCHEDULE_PREFIXES)
_LATENCY_NAME = re.compile(
    r"^(" + "|".join(LATENCY_PREFIXES) + r")_(mean|median|std|min|max|p(\d+(?:\.\d+)?))$"
)


@dataclass(frozen=True)
class Metric:
    """One figure of a run and how to read it."""

    name: str  # what users type and read: ttft_p95, output_throughput
    label: str  # the comparison table's row label
    unit: str  # ms, s, tok/s, req/s, count, or "" (a fraction)
    higher_is_better: bool  # False also for figures that only describe (peak concurrency)
    per_request: bool  # a statistic over per-request values (bootstrap intervals apply)
    bench_key: str | None  # sglang.bench_serving's output-file key, where it has one

    @property
    def upper_bound(self) -> bool:
        """An SLO on this metric is a ceiling (latency) rather than a floor (throughput)."""
        return not self.higher_is_better

    @property
    def stat(self) -> str:
        """``p95`` for ``ttft_p95``; "" for an aggregate."""
        return self.name.rpartition("_")[2] if self.prefix else ""

    @property
    def prefix(self) -> str:
        """``ttft`` for ``ttft_p95``, ``dispatch_delay`` for ``dispatch_delay_p99``; "" for an
        aggregate (a statistic's name has no underscore, so the prefix is all before the
        last one)."""
        return latency_prefix(self.name)

    @property
    def is_percentile(self) -> bool:
        return self.stat.startswith("p")

    @property
    def percentile(self) -> float | None:
        return float(self.stat[1:]) if self.is_percentile else None


def latency_prefix(name: str) -> str:
    """The latency a statistic's name is of (``ttft`` of ``ttft_p95``); "" for any other."""
    head = name.rpartition("_")[0]
    return head if head in LATENCY_PREFIXES else ""


def _aggregate(name: str, label: str, unit: str, higher: bool, key: str | None) -> Metric:
    return Metric(name, label, unit, higher, False, key)


AGGREGATES: dict[str, Metric] = {
    m.name: m
    for m in (
        _aggregate("completed", "Successful requests", "count", True, "completed"),
        _aggregate("failed", "Failed requests", "count", False, "failed"),
        _aggregate("success_rate", "Success rate", "", True, "success_rate"),
        _aggregate("duration", "Benchmark duration", "s", False, "duration"),
        _aggregate("request_throughput", "Request rate", "req/s", True, "request_throughput"),
        _aggregate("input_throughput", "Input TPS", "tok/s", True, "input_throughput"),
        _aggregate("output_throughput", "Output TPS", "tok/s", True, "output_throughput"),
        _aggregate("total_throughput", "Total TPS", "tok/s", True, "total_throughput"),
        _aggregate("goodput", "Goodput (req/s meeting per-request SLOs)", "req/s", True, "goodput"),
        _aggregate(
            "peak_concurrency",
            "Peak concurrent requests (exact)",
            "count",
            False,
            "peak_concurrency_exact",
        ),
        _aggregate(
            "peak_concurrency_bucketed",
            "Peak concurrent requests (bench_serving)",
            "count",
            False,
            "max_concurrent_requests_bucketed",
        ),
        _aggregate("total_input_tokens", "Input tokens", "count", False, "total_input_tokens"),
        _aggregate("total_output_tokens", "Output tokens", "count", False, "total_output_tokens"),
        _aggregate(
            "total_reasoning_tokens",
            "Reasoning tokens (of output)",
            "count",
            False,
            "total_reasoning_tokens",
        ),
        _aggregate(
            "total_answer_tokens",
            "Answer tokens (of output)",
            "count",
            False,
            "total_answer_tokens",
        ),
        # speculative decoding: tokens per verify step (SGLang's spec_accept_length)
        _aggregate(
            "spec_accept_length",
            "Spec accept length (tokens per step)",
            "tok/step",
            True,
            "spec_accept_length",
        ),
    )
}

TELEMETRY: dict[str, Metric] = {
    m.name: m
    for m in (
        _aggregate("gpu_util_mean", "GPU utilization mean (%)", "%", False, None),
        _aggregate("gpu_util_peak", "GPU utilization peak (%, all-GPU mean)", "%", False, None),
        _aggregate("power_mean_w", "GPU power mean (W, all GPUs)", "W", False, None),
        _aggregate("power_peak_w", "GPU power peak (W, all GPUs)", "W", False, None),
        _aggregate(
            "energy_per_output_token_j", "GPU energy per output token (J)", "J/tok", False, None
        ),
    )
}
"""GPU telemetry over the measured run (:mod:`pytest_kimi.results.telemetry_stats` defines each): on
the layout's result, not in its :class:`~pytest_kimi.results.summary.Summary`. They describe (no
SLO, no gate); lower energy per token is better, utilisation and power are for reading."""

TELEMETRY_ROWS: tuple[str, ...] = tuple(TELEMETRY)
"""Rows the comparison adds at the end when any layout was sampled."""

COMPARISON_ROWS: tuple[str, ...] = (
    "completed", "failed", "duration",
    "input_throughput", "output_throughput", "total_throughput",
    "ttft_mean", "ttft_median", "ttft_p95", "ttft_p99",
    "tpot_mean", "tpot_median", "tpot_p95",
    "e2e_mean", "e2e_p95",
    "peak_concurrency", "goodput",
)  # fmt: skip
"""The seed report's rows, in its order."""

REASONING_ROWS: tuple[str, ...] = (
    "ttfat_mean", "ttfat_median", "ttfat_p95", "total_reasoning_tokens", "total_answer_tokens",
)  # fmt: skip
"""Rows the comparison adds after the TTFT rows when any layout streamed reasoning tokens:
elsewhere TTFAT equals TTFT and the split is all answer, so they would say nothing new."""

SCHEDULE_ROWS: tuple[str, ...] = (
    "dispatch_delay_mean", "dispatch_delay_p50", "dispatch_delay_p99", "dispatch_delay_max",
    "ttft_from_schedule_p95", "ttft_from_schedule_p99", "e2e_from_schedule_p95",
    "e2e_from_schedule_p99",
)  # fmt: skip
"""Rows the comparison adds after the E2E rows when any layout ran open loop: how late the
client sent against the schedule, and what a user arriving on schedule waited."""

SPEC_ROWS: tuple[str, ...] = ("spec_accept_length",)
"""The row the comparison adds after the TPOT rows when any layout decoded speculatively."""

BASELINE_METRICS: tuple[str, ...] = (
    "ttft_mean", "ttft_median", "ttft_p95", "ttft_p99",
    "tpot_mean", "tpot_median", "tpot_p95", "tpot_p99",
    "e2e_mean", "e2e_median", "e2e_p95", "e2e_p99",
    "input_throughput", "output_throughput", "total_throughput", "request_throughput",
    "success_rate", "goodput",
)  # fmt: skip
"""What a baseline stores of each layout (plus any metric with a threshold)."""

DEFAULT_THRESHOLDS: dict[str, float] = {
    "ttft_p95": 0.10,
    "tpot_mean": 0.05,
    "output_throughput": 0.05,
}


class UnknownMetric(KeyError):
    """A name that is no metric; ``str()`` lists what is."""

    def __str__(self) -> str:
        return str(self.args[0])


def known_names() -> str:
    """A one-line list of valid names, for error messages."""
    prefixes = "/".join(f"{p}_" for p in LATENCY_PREFIXES)
    return f"{prefixes} + mean|median|std|min|max|pNN, " + ", ".join(AGGREGATES)


def metric(name: str) -> Metric:
    """The metric called ``name`` (``ttft_p95``, ``tpot_mean``, ``goodput``)."""
    if name in AGGREGATES:
        return AGGREGATES[name]
    if name in TELEMETRY:
        return TELEMETRY[name]
    match = _LATENCY_NAME.match(name)
    if match is None:
        raise UnknownMetric(f"unknown metric {name!r} (known: {known_names()})")
    prefix, stat, pct = match.groups()
    if pct is not None and not 0 < float(pct) <= 100:
        raise UnknownMetric(f"metric {name!r}: percentile {pct} is not in (0, 100]")
    label, infix = LATENCY_PREFIXES[prefix]
    keyed = ("mean", "median", "std", *(("max",) if prefix in SCHEDULE_PREFIXES else ()))
    bench = f"{stat}_{infix}_ms" if stat in keyed or pct else None
    return Metric(name, f"{label} {stat}", "ms", False, prefix in PER_REQUEST_PREFIXES, bench)


def sloable(m: Metric) -> bool:
    """Whether an SLO can bound ``m``: any latency statistic (a ceiling) or an aggregate where
    more is better (a floor). Counts of failures and durations describe, they are no goal."""
    return bool(m.prefix) or m.higher_is_better


def gateable(m: Metric) -> bool:
    """Whether the regression gate can judge ``m``: a latency's mean, median or percentile
    (bootstrap intervals exist for those), or an aggregate where more is better."""
    if m.prefix:
        return m.stat in ("mean", "median") or m.is_percentile
    return m.higher_is_better
