"""How near pytest-kimi's client times a reasoning chat stream to the server's own clock.

The scripted ground-truth server (``pytest_kimi.testing.scripted``) streams SGLang's reasoning
chunks (``delta.reasoning_content``, then ``delta.content``) on a per-request script and stamps
every write on CLOCK_MONOTONIC, the clock the client stamps its records on. Per request, the
figure a user reads (``per_request_ms``) less the server's instant it names
(``pytest_kimi.testing.truth.reasoning_timings``) is the client's error: the chunk's trip back
over loopback plus the client's parsing and event loop. TTFT is timed to the first thinking
token, TTFAT to the first answer token, TPOT over every token.

Goals on a quiet machine: at least 85 % of requests within 1 ms (TTFT, TTFAT) and 0.05 ms
(TPOT), none beyond 10 ms, the mean |error| within half the goal. These are this machine's
figures: other jobs on the 2 cores make the client late by milliseconds, so no test asserts
them (``tests/integration/test_reasoning.py`` checks the definitions, right against wrong).

Run: ``python benchmarks/reasoning_accuracy.py [--requests 24] [--concurrency 4] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.testing.processes import Proc
from pytest_kimi.testing.truth import (
    REASONING,
    TOTAL,
    ReasoningTiming,
    reasoning_server_argv,
    reasoning_timings,
    run_reasoning_chat,
)

GOALS_MS = {"ttft": 1.0, "ttfat": 1.0, "tpot": 0.05}
GOAL_SHARE = 0.85  # of requests within the goal
SPIKE_LIMIT_MS = 10.0


def measure(n: int, concurrency: int, work: Path) -> list[ReasoningTiming]:
    """One run of ``n`` reasoning chat streams against a fresh scripted server."""
    port = free_port()
    server = Proc(reasoning_server_argv(port), work / "scripted.log")
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait_http(url + "/health")
        records = run_reasoning_chat(url, n, concurrency)
        truth = httpx.get(url + "/truth", timeout=30.0, trust_env=False).json()
        return reasoning_timings(records, truth)
    finally:
        server.stop()


def figures(timings: Sequence[ReasoningTiming]) -> dict[str, dict[str, float]]:
    """Per metric: mean |error|, p50, p95 and max error, and the share within the goal."""
    out = {}
    for key, goal in GOALS_MS.items():
        errors = np.array([getattr(t, key) for t in timings])
        out[key] = {
            "mean_abs": float(np.mean(np.abs(errors))),
            "p50": float(np.percentile(errors, 50)),
            "p95": float(np.percentile(errors, 95)),
            "max": float(np.max(np.abs(errors))),
            "within_goal": float(np.mean(np.abs(errors) <= goal)),
        }
    out["there"] = {"mean": statistics.mean(t.there for t in timings),
                    "max": max(t.there for t in timings)}  # fmt: skip
    return out


def goal_lines(table: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for key, goal in GOALS_MS.items():
        row = table[key]
        met = (row["within_goal"] >= GOAL_SHARE and row["max"] <= SPIKE_LIMIT_MS
               and row["mean_abs"] <= goal / 2)  # fmt: skip
        lines.append(
            f"{key}: {row['within_goal']:.0%} within {goal:g} ms (goal {GOAL_SHARE:.0%}), "
            f"max {row['max']:.3f} ms (goal {SPIKE_LIMIT_MS:g}), mean |error| "
            f"{row['mean_abs']:.3f} ms (goal {goal / 2:g}): {'met' if met else 'MISSED'}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="kimi-reasoning-") as work:
        timings = measure(args.requests, args.concurrency, Path(work))
    table = figures(timings)
    print(f"{args.requests} streams of {REASONING} thinking + {TOTAL - REASONING} answer "
          f"tokens, concurrency {args.concurrency}; client - server's truth (ms):")  # fmt: skip
    print("| metric | mean abs | p50 | p95 | max abs | within goal |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in GOALS_MS:
        row = table[key]
        print(f"| {key} | {row['mean_abs']:.3f} | {row['p50']:.3f} | {row['p95']:.3f} | "
              f"{row['max']:.3f} | {row['within_goal']:.0%} |")  # fmt: skip
    print(f"request's trip to the server's handler: mean {table['there']['mean']:.3f} ms, "
          f"max {table['there']['max']:.3f} ms")  # fmt: skip
    for line in goal_lines(table):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
