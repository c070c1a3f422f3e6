"""The history gate against the plain baseline gate, on synthetic nightly series.

Every series is built here, so the truth is known before either gate looks: quiet nights
(a whole-run drift of ``--drift`` x a normal), and in the detection series a 10% step for the
worse from a known night on. A night's 40 requests are the mission's 40 on the mock (the
offline twin of ``clusters/local.yaml``, TP32: their real TTFT and TPOT, which differ a lot
from request to request: a long queue, a prefill in the way), the same prompts every night as
on a real nightly, scaled to the night's level, each with its own 2% jitter; the night's figure
is computed from them (TTFT p95, TPOT mean). Throughput is one number per night: level x drift.
The mock itself has no run-to-run spread (``benchmarks/mock_spread.py``: 0.000% with the
shared clock), so the drift is the parameter: 1-3% is what whole runs drift on real clusters.

* **history gate**: ``--kimi-gate history`` (:func:`pytest_kimi.judge.history.gate.judge_series`),
  each night judged against the nights before it;
* **baseline gate**: ``--kimi-baseline`` (:func:`pytest_kimi.judge.baseline.judge`), each night
  judged against the first night of its series, stored as the baseline.

Detection: the step is caught on its first or second night. False alarms: regressions per
100 quiet nights (the nights after the first ``--warmup`` of a quiet series).

    python benchmarks/history_gate.py                      # ~6 min on 2 cores
    python benchmarks/history_gate.py --quick              # ~1 min, coarse
    python benchmarks/history_gate.py --json gate.json     # also write the table as JSON
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("ttft_p95", "tpot_mean", "output_throughput")
STEP = 0.10
JITTER = 0.02  # each request's own night-to-night jitter (relative sigma)


@dataclass(frozen=True)
class Case:
    metric: str
    drift: float
    series: int
    quiet_series: int
    nights: int
    warmup: int
    seed: int


def mock_requests() -> dict[str, np.ndarray]:
    """Per-request TTFT and TPOT (ms) of the mission's TP32 run on the mock (the twin)."""
    from pytest_kimi.config import load_cluster
    from pytest_kimi.mock.mission import (
        deployment,
        mission_input_lens,
        profile_of,
        simulate_deployment,
        twin_records,
    )
    from pytest_kimi.results.metrics import per_request_ms

    cluster = load_cluster(ROOT / "clusters" / "local.yaml")
    run = simulate_deployment(profile_of(cluster), deployment(cluster, "tp32"),
                              mission_input_lens(cluster))  # fmt: skip
    samples = per_request_ms(twin_records(run, chunks=False))
    return {"ttft": np.asarray(samples["ttft"]), "tpot": np.asarray(samples["tpot"])}


REQUESTS = 40  # the mission's measured requests


Night = tuple[float, list[float]]  # a night's figure and its requests (ms)


def night(
    case: Case, rng: np.random.Generator, factor: float, pool: dict[str, np.ndarray]
) -> Night:
    """One night's figure and its requests at ``factor`` x the mock's level: the same 40
    prompts every night (the mock's per-request latencies), each with its own jitter."""
    level = factor * math.exp(case.drift * rng.standard_normal())
    if case.metric == "output_throughput":
        return 1000.0 / level, []  # worse = lower throughput
    prefix = case.metric.partition("_")[0]
    base = pool[prefix]
    requests = level * base * np.exp(JITTER * rng.standard_normal(base.size))
    figure = np.percentile(requests, 95) if case.metric == "ttft_p95" else requests.mean()
    return float(figure), list(requests)


def series(
    case: Case, rng: np.random.Generator, pool: dict[str, np.ndarray], step_at: int | None
) -> list[Night]:
    return [night(case, rng, (1 + STEP) if step_at is not None and n >= step_at else 1.0, pool)
            for n in range(case.nights)]  # fmt: skip


def gates(case: Case, nights_: list[Night], n: int) -> tuple[bool, bool]:
    """(history gate, baseline gate) on night ``n`` of a series: regressed or not."""
    from pytest_kimi.judge import baseline as baseline_mod
    from pytest_kimi.judge.history.gate import Tonight, judge_series
    from pytest_kimi.judge.history.store import RunRecord, SeriesEntry
    from pytest_kimi.results import catalogue

    def run(k: int) -> RunRecord:
        return RunRecord(f"night-{k}", f"2026-11-01T{k % 24:02d}:00:00", "bench", "0" * 64,
                         "sglang", 1.0, None, None, None, None, True, (), uid=f"u{k}")  # fmt: skip

    threshold = catalogue.DEFAULT_THRESHOLDS[case.metric]
    history = [SeriesEntry(run(k), v, s, {}) for k, (v, s) in enumerate(nights_[:n])]
    value, samples = nights_[n]
    ours = judge_series("tp32", case.metric, history, Tonight(run(n), value, samples),
                        threshold).regressed  # fmt: skip
    prefix = case.metric.partition("_")[0]

    def entry(k: int) -> dict:
        v, s = nights_[k]
        return {"metrics": {case.metric: v}, "samples": {prefix: s}}

    plain = baseline_mod.judge("tp32", case.metric, threshold, entry(0), entry(n)).regressed
    return ours, plain


def measure(case: Case) -> dict:
    rng = np.random.default_rng(case.seed)
    pool = mock_requests() if case.metric != "output_throughput" else {}
    step_at = case.nights - 2
    caught = [0, 0]
    for _ in range(case.series):
        nights_ = series(case, rng, pool, step_at)
        first, second = gates(case, nights_, step_at), gates(case, nights_, step_at + 1)
        for g in (0, 1):
            caught[g] += first[g] or second[g]
    alarms, judged = [0, 0], 0
    for _ in range(case.quiet_series):
        nights_ = series(case, rng, pool, None)
        for n in range(case.warmup, case.nights):
            verdicts = gates(case, nights_, n)
            judged += 1
            for g in (0, 1):
                alarms[g] += verdicts[g]
    return {
        "metric": case.metric, "drift": case.drift, "detection_series": case.series,
        "quiet_nights": judged,
        "history_detected": caught[0] / case.series, "baseline_detected": caught[1] / case.series,
        "history_false_per_100": 100 * alarms[0] / judged,
        "baseline_false_per_100": 100 * alarms[1] / judged,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drift", default="0.01,0.02,0.03",
                        help="run-to-run drift, relative sigma (comma list)")  # fmt: skip
    parser.add_argument("--series", type=int, default=100, help="detection series per cell")
    parser.add_argument("--quiet-series", type=int, default=10)
    parser.add_argument("--nights", type=int, default=30, help="nights per series")
    parser.add_argument("--warmup", type=int, default=5, help="quiet nights not judged")
    parser.add_argument("--quick", action="store_true", help="20 series, 4 quiet ones")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.series, args.quiet_series = 20, 4
    drifts = [float(d) for d in args.drift.split(",")]
    cases = [Case(m, d, args.series, args.quiet_series, args.nights, args.warmup, seed)
             for seed, (d, m) in enumerate((d, m) for d in drifts for m in METRICS)]  # fmt: skip
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool() as pool:
        rows = pool.map(measure, cases)
    print(f"step {STEP:.0%} for the worse, caught within two nights; false alarms per 100 quiet "
          f"nights; {args.nights} nights per series, {REQUESTS} requests per night "
          f"({time.perf_counter() - start:.0f} s)")  # fmt: skip
    print(f"{'metric':<18}{'drift':>6}  {'detected: history':>17}  {'baseline':>8}  "
          f"{'false/100: history':>18}  {'baseline':>8}  (series, quiet nights)")  # fmt: skip
    for r in rows:
        print(f"{r['metric']:<18}{r['drift']:>6.0%}  {r['history_detected']:>17.1%}  "
              f"{r['baseline_detected']:>8.1%}  {r['history_false_per_100']:>18.2f}  "
              f"{r['baseline_false_per_100']:>8.2f}  ({r['detection_series']}, "
              f"{r['quiet_nights']})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
