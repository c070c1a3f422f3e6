"""SLO verdicts at a confidence (``--kimi-confidence``), against a known truth: how often each
way of judging ``ttft_p95 <= limit`` is wrong, undecided, and how many requests it used.

The truth comes from the offline twin of ``clusters/local.yaml`` (TP32, the mission's
16K-in/512-out requests at concurrency 8): one long run of ``--pool`` requests, less the first
40 (the start's burst, which a steady state does not repeat), is the distribution; its p95 is
the true one. The twin is deterministic, so a simulated run draws its requests independently
from that distribution (the assumption every interval here makes; a real deployment's
requests are only nearly independent). For limits at 0.8, 0.95, 1.0, 1.05 and 1.2 x the true
p95, over ``--runs`` runs each:

* **point**: today's comparison of the measured p95 of 40 requests with the limit;
* **fixed n**: the order-statistic bounds at C = 0.95 of 40 and of 100 requests
  (:func:`pytest_kimi.results.intervals.quantile_bounds`);
* **sequential**: looks at 40, 100, 160, ... 400 requests, each at its spent level
  (:func:`pytest_kimi.judge.looks.look_plan`: power-family alpha spending, each side on its
  own), stopping at the first decisive look: what ``--kimi-until-decided`` does.

A verdict is wrong when it passes a limit under the true p95 or fails one at or over it (a p95
at its limit meets ``p95 <= limit``); at 1.0 x a pass is not wrong but as much a chance as a
fail, and the table shows both.

    python benchmarks/slo_verdicts.py                  # ~30 s on 2 cores
    python benchmarks/slo_verdicts.py --jitter 0.1     # steps that vary: a smoother tail
    python benchmarks/slo_verdicts.py --runs 200       # quicker
    python benchmarks/slo_verdicts.py --json out.json  # also write the table as JSON
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pytest_kimi.judge.looks import look_plan
from pytest_kimi.results.intervals import quantile_ranks

ROOT = Path(__file__).resolve().parents[1]
FACTORS = (0.8, 0.95, 1.0, 1.05, 1.2)
CONFIDENCE = 0.95
PLAN = look_plan(40, 400, CONFIDENCE)  # what --kimi-until-decided plans for 40 requests


def twin_pool(requests: int, jitter: float) -> np.ndarray:
    """Per-request TTFT (ms) of one long twin run of the mission's TP32 layout, less its
    first 40 requests; ``jitter``: each scheduler step's time varies by that relative sigma
    (the mock profile's ``jitter``; 0, the shipped profile's, makes every step exact)."""
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
    lens = mission_input_lens(cluster)
    dep = replace(deployment(cluster, "tp32"), num_requests=requests)
    lens = (lens * (requests // len(lens) + 1))[:requests]
    run = simulate_deployment(replace(profile_of(cluster), jitter=jitter), dep, lens)
    return np.asarray(per_request_ms(twin_records(run, chunks=False))["ttft"])[40:]


def true_p95(pool: np.ndarray) -> float:
    """The p95 of the pool as a distribution: the least value with 95% at or under it."""
    ordered = np.sort(pool)
    return float(ordered[math.ceil(0.95 * len(ordered)) - 1])


@functools.cache
def ranks(n: int, confidence: float) -> tuple[int | None, int | None]:
    return quantile_ranks(n, 0.95, confidence)


def judge(values: np.ndarray, limit: float, passing: float, failing: float) -> str:
    """passed, failed or undecided: the p95's order-statistic upper bound at confidence
    ``passing`` and lower bound at ``failing`` (1: that side not judged) against ``limit``."""
    ordered = np.sort(values)
    hi = ranks(len(values), passing)[1] if passing < 1 else None
    lo = ranks(len(values), failing)[0] if failing < 1 else None
    if hi is not None and ordered[hi - 1] <= limit:
        return "passed"
    if lo is not None and ordered[lo - 1] > limit:
        return "failed"
    return "undecided"


def _levels() -> tuple[list[float], list[float]]:
    """:data:`PLAN`'s error levels for the upper bounds (passing) and the lower (failing)."""
    upper = PLAN.levels(lambda n, a: a > 0 and ranks(n, 1 - a)[1] is not None)
    lower = PLAN.levels(lambda n, a: a > 0 and ranks(n, 1 - a)[0] is not None)
    return upper, lower


def sequential(values: np.ndarray, limit: float, levels: tuple[list[float], list[float]]
               ) -> tuple[str, int]:  # fmt: skip
    """The first decisive look of :data:`PLAN` over ``values`` (at least ``PLAN.most``)."""
    for n, up, down in zip(PLAN.sizes(), *levels, strict=True):
        outcome = judge(values[:n], limit, 1 - up, 1 - down)
        if outcome != "undecided":
            return outcome, n
    return "undecided", PLAN.most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--pool", type=int, default=2040)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jitter", type=float, default=0.0, help="the twin's step jitter")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    pool = twin_pool(args.pool, args.jitter)
    truth = true_p95(pool)
    rng = np.random.default_rng(args.seed)
    print(f"twin TP32 steady state (step jitter {args.jitter:g}): {len(pool)} requests, "
          f"true TTFT p95 {truth:.0f} ms; "
          f"{args.runs} runs per limit; C = {CONFIDENCE}")  # fmt: skip
    levels = _levels()
    print("looks at " + ", ".join(map(str, PLAN.sizes())) + "; error per look, passing: "
          + ", ".join(f"{a:.4f}" for a in levels[0]) + "; failing: "
          + ", ".join(f"{a:.4f}" for a in levels[1]))  # fmt: skip
    rows = []
    for factor in FACTORS:
        limit = factor * truth
        wrong = "passed" if factor < 1 else "failed"  # at the truth the SLO holds
        tally: dict[str, list] = {k: [] for k in ("point", "n40", "n100", "seq")}
        used = []
        for _ in range(args.runs):
            values = rng.choice(pool, size=PLAN.most)
            point = "passed" if np.percentile(values[:40], 95) <= limit else "failed"
            tally["point"].append(point)
            tally["n40"].append(judge(values[:40], limit, CONFIDENCE, CONFIDENCE))
            tally["n100"].append(judge(values[:100], limit, CONFIDENCE, CONFIDENCE))
            outcome, n = sequential(values, limit, levels)
            tally["seq"].append(outcome)
            used.append((outcome, n))
        row = {"factor": factor, "limit_ms": limit}
        for key, outcomes in tally.items():
            for outcome in ("passed", "failed", "undecided"):
                row[f"{key}_{outcome}"] = outcomes.count(outcome) / len(outcomes)
            row[f"{key}_wrong"] = row[f"{key}_{wrong}"]
        row["seq_mean_requests"] = float(np.mean([n for _, n in used]))
        row["seq_decided_by_100"] = sum(o != "undecided" and n <= 100 for o, n in used) / len(used)
        rows.append(row)
    header = ("limit", "wrong verdict", "point (40)", "n = 40", "n = 100", "sequential",
              "mean requests", "decided by 100")  # fmt: skip
    print("passed / failed / undecided per method; wrong: the sequential's")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        cells = [f"{r['factor']:.2f} x", f"{r['seq_wrong']:.1%}"]
        for key in ("point", "n40", "n100", "seq"):
            cells.append(" / ".join(f"{r[f'{key}_{o}']:.1%}"
                                    for o in ("passed", "failed", "undecided")))  # fmt: skip
        cells += [f"{r['seq_mean_requests']:.0f}", f"{r['seq_decided_by_100']:.1%}"]
        print("| " + " | ".join(cells) + " |")
    print(f"took {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"true_p95_ms": truth, "runs": args.runs, "rows": rows},
                                        indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
