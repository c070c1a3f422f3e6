"""Every statistic against ``sglang.bench_serving`` 0.5.9, with tolerances the run measures.

Both clients send the same 40 prompts in the same order, one run after the other, to the
scripted server (:mod:`pytest_kimi.testing.scripted`): concurrency 8, 64 tokens out, one
warm-up request each. The server draws each request's script from its prompt (TTFT 40-80 ms,
4-8 ms between tokens), so both runs are asked the same, and it stamps on its own clock when
each request's handler starts and when each chunk was written: a truth neither client can
move. Every client stamp is on the same clock (CLOCK_MONOTONIC): bench_serving's ``start_time``
and ``latency`` are read from what its own ``calculate_metrics`` is given
(:mod:`pytest_kimi.testing.bench_observed`), since its output file has neither.

For each statistic ``S`` the test asserts::

    |S(ours) - S(theirs)| <= e_S(ours) + e_S(theirs) + |S(truth, our run) - S(truth, theirs)|

``e_S(client)`` bounds how far that client's per-request errors (its time minus the server's)
can move ``S``: the largest error for a percentile, median or maximum; the mean absolute error
for a mean; the root mean square error for a standard deviation. The last term is the server's
own run-to-run difference. Nothing is a fixed percentage: if the two clients disagree by more
than their measured errors allow, one of them computes the statistic another way.

Each client's reported statistics must also equal bench_serving's definitions applied to that
client's own per-request times (``REFERENCE``, to float rounding): there a definition
difference shows by name. The differences that do exist are named in ``DEFINITIONS`` and
handled in the open, never folded into a tolerance.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from pytest_kimi.deploy.plan import free_port
from pytest_kimi.metrics import summarize
from pytest_kimi.mock.tokenizer_files import count_tokens
from pytest_kimi.testing.peer import bench_serving_argv, offline_env, write_custom_dataset
from pytest_kimi.testing.processes import Proc
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.records import RequestRecord

pytestmark = pytest.mark.slow

NUM_REQUESTS = 40
CONCURRENCY = 8
OUTPUT_LEN = 64
PROMPT_TOKENS = 1000
BENCH_SEED = 1  # bench_serving's --seed (its default)
RUN_TIMEOUT_S = 300.0
ROUNDING = 1e-6  # ms: float rounding between two computations of one definition

# bench_serving's definitions (calculate_metrics, 0.5.9): numpy's mean, median, population
# standard deviation, linearly interpolated percentiles, max
REFERENCE: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda v: float(np.mean(v)),
    "median": lambda v: float(np.median(v)),
    "std": lambda v: float(np.std(v)),
    "p90": lambda v: float(np.percentile(v, 90)),
    "p95": lambda v: float(np.percentile(v, 95)),
    "p99": lambda v: float(np.percentile(v, 99)),
}
# the statistics bench_serving's output file carries, per metric (key: f"{stat}_{infix}_ms")
STATISTICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ttft": ("ttft", ("mean", "median", "std", "p99")),
    "tpot": ("tpot", ("mean", "median", "std", "p99")),
    "itl": ("itl", ("mean", "median", "std", "p95", "p99")),
    "e2e": ("e2e_latency", ("mean", "median", "std", "p90", "p99")),
}
CASES = [(metric, stat) for metric, (_, stats) in STATISTICS.items() for stat in stats]
COUNTS = {  # count -> the throughput that divides it by the duration
    "completed": "request_throughput",
    "total_input_tokens": "input_throughput",
    "total_output_tokens": "output_throughput",
}
DEFINITIONS = {
    "duration": (
        "bench_serving's clock runs from before it creates its request tasks to after its "
        "closing /get_server_info call; ours from the first request's start to the last one's "
        "end. Its duration is compared on ours: less the part outside its requests (its own "
        "per-request stamps), which the server confirms holds that call. Throughputs likewise."
    ),
    "itl of a chunk with no new token": (
        "bench_serving skips such a chunk and keeps its gap running into the next; ours counts "
        "it as one token. SGLang's /generate never sends one (every chunk carries new tokens), "
        "and this run has none (asserted)."
    ),
    "per-request times": (
        "bench_serving's file has no per-request start or E2E; they are what its own "
        "calculate_metrics is given (pytest_kimi.testing.bench_observed)."
    ),
}


@dataclass
class Timed:
    """One client's run: per request its own times and the server's, in ms (ITLs pooled in
    request order, as both clients pool them)."""

    client: dict[str, np.ndarray] = field(default_factory=dict)
    truth: dict[str, np.ndarray] = field(default_factory=dict)
    span_ms: float = 0.0  # client: first start -> last end
    true_span_ms: float = 0.0  # server: first handler entry -> last [DONE] written

    def bound(self, metric: str, stat: str) -> float:
        """How far this client's per-request errors can move ``stat`` of ``metric``."""
        error = self.client[metric] - self.truth[metric]
        if stat == "mean":
            return float(np.mean(np.abs(error)))
        if stat == "std":
            return float(np.sqrt(np.mean(error**2)))
        return float(np.max(np.abs(error)))

    @property
    def span_error_ms(self) -> float:
        return abs(self.span_ms - self.true_span_ms)


@dataclass(repr=False)  # a failure shows its table, not this
class Runs:
    ours: dict[str, Any]  # our Summary.to_dict(): bench_serving's keys
    theirs: dict[str, Any]  # bench_serving's --output-file line
    ours_timed: Timed
    theirs_timed: Timed
    their_span_ms: float  # its own first start -> last end
    their_gets: list[dict[str, Any]]  # the server's stamps of its GETs
    their_request_ends: list[float]  # the server's [DONE] writes of its requests
    their_observed: dict[str, Any]
    argv: list[str]
    rows: list[str] = field(default_factory=list)


def _texts() -> list[str]:
    """Distinct prompts with distinct token counts, so each request can be told apart."""
    return [f"r{k} " + "tok " * (PROMPT_TOKENS + k - 1) for k in range(NUM_REQUESTS)]


def _itls(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """bench_serving's ITLs from chunk times and each chunk's new tokens: after the first
    chunk, ``k`` values of gap/k per chunk of ``k`` tokens."""
    out: list[float] = []
    for (before, _), (now, k) in pairwise(zip(times, tokens, strict=True)):
        out.extend([(now - before) / k] * k)
    return out


def _truth(entry: dict[str, Any]) -> dict[str, list[float]]:
    """The server's own times for one request, in ms from its handler's entry."""
    chunks = entry["chunks"]
    ttft = (chunks[0][0] - entry["head"]) * 1000
    e2e = (entry["end"] - entry["head"]) * 1000
    tokens = sum(c[1] for c in chunks)
    itl = _itls([c[0] * 1000 for c in chunks], [c[1] for c in chunks])
    return {"ttft": [ttft], "e2e": [e2e], "tpot": [(e2e - ttft) / (tokens - 1)], "itl": itl}


def _collect(per_request: list[tuple[dict[str, list[float]], dict[str, Any]]]) -> Timed:
    timed = Timed()
    for metric in STATISTICS:
        timed.client[metric] = np.array([v for own, _ in per_request for v in own[metric]])
        timed.truth[metric] = np.array([v for _, e in per_request for v in _truth(e)[metric]])
        assert timed.client[metric].shape == timed.truth[metric].shape, metric
    entries = [e for _, e in per_request]
    timed.true_span_ms = (max(e["end"] for e in entries) - min(e["head"] for e in entries)) * 1e3
    return timed


def _ours_timed(records: list[RequestRecord], truth: list[dict[str, Any]]) -> Timed:
    by_index = {str(e["index"]): e for e in truth}
    measured = [r for r in records if not r.warmup]
    pairs = []
    for record in measured:
        assert record.success, record.error
        assert record.first_token_time is not None and record.end_time is not None
        no_new_token = DEFINITIONS["itl of a chunk with no new token"]
        assert all(c.tokens > 0 for c in record.chunks), no_new_token
        start = record.latency_start
        ttft = (record.first_token_time - start) * 1000
        e2e = (record.end_time - start) * 1000
        own = {
            "ttft": [ttft],
            "e2e": [e2e],
            "tpot": [(e2e - ttft) / (record.output_tokens - 1)],
            "itl": _itls([c.time * 1000 for c in record.chunks], [c.tokens for c in record.chunks]),
        }
        pairs.append((own, by_index[record.request_id or ""]))
    timed = _collect(pairs)
    ends = [r.end_time for r in measured if r.end_time is not None]
    timed.span_ms = (max(ends) - min(r.latency_start for r in measured)) * 1000
    return timed


def _theirs_timed(
    observed: dict[str, Any], truth: list[dict[str, Any]], texts: list[str]
) -> tuple[Timed, float]:
    by_prompt: dict[str, dict[str, Any]] = {}
    for entry in sorted(truth, key=lambda e: e["index"]):  # its warm-up re-sends prompt 0
        by_prompt[entry["prompt_sha256"]] = entry  # first: the later one is the measured one
    pairs = []
    for text, out in zip(texts, observed["outputs"], strict=True):
        assert out["success"], out["error"]
        entry = by_prompt[hashlib.sha256(text.encode()).hexdigest()]
        ttft, e2e = out["ttft"] * 1000, out["latency"] * 1000
        itl = [v * 1000 for v in out["itl"]]
        own = {"ttft": [ttft], "e2e": [e2e], "tpot": [(e2e - ttft) / (out["output_len"] - 1)],
               "itl": itl}  # fmt: skip
        pairs.append((own, entry))
    timed = _collect(pairs)
    outputs = observed["outputs"]
    start = min(o["start_time"] for o in outputs)
    timed.span_ms = (max(o["start_time"] + o["latency"] for o in outputs) - start) * 1000
    return timed, start


class ScriptedServer(Proc):
    def __init__(self, log: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable, "-m", "pytest_kimi.testing.scripted", "--port", str(port),
            "--ttft-ms", "40", "--itl-ms", "4", "--jitter", "1.0", "--seed", "3",
            "--script-key", "prompt",
        ]  # fmt: skip
        super().__init__(argv, log, env=offline_env())

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=60.0, trust_env=False)
        response.raise_for_status()
        return response.json() if path != "/reset" else None


@pytest.fixture(scope="module")
def runs(bench_serving_python, tmp_path_factory) -> Runs:
    work = tmp_path_factory.mktemp("statistics")
    server = ScriptedServer(work / "scripted.log")
    try:
        server.wait_http(server.url + "/health")
        texts = _texts()
        specs = [RequestSpec(f"p{k}", t, count_tokens(t)) for k, t in enumerate(texts)]

        # 1. ours, in this process (warm-up: the first prompt, as bench_serving's)
        server.get("/reset")
        options = ClientOptions(api="generate", output_len=OUTPUT_LEN, concurrency=CONCURRENCY)
        records = asyncio.run(run_requests(server.url, specs, options, warmup=specs[:1]))
        ours = summarize(records, time_scale=1.0).to_dict()
        ours_timed = _ours_timed(records, server.get("/truth"))

        # 2. bench_serving, observed
        server.get("/reset")
        dataset, output = work / "prompts.jsonl", work / "result.jsonl"
        observe, log = work / "observed.json", work / "bench_serving.log"
        write_custom_dataset(dataset, texts, BENCH_SEED)
        argv = bench_serving_argv(bench_serving_python, server.url, dataset, output,
                                  num_prompts=NUM_REQUESTS, output_len=OUTPUT_LEN,
                                  concurrency=CONCURRENCY, seed=BENCH_SEED,
                                  observe=observe)  # fmt: skip
        with log.open("wb") as fh:
            done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, env=offline_env(),
                                  cwd=work, timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
        text = log.read_text(errors="replace")
        if done.returncode != 0 or not output.is_file() or not observe.is_file():
            pytest.fail(f"bench_serving failed (exit {done.returncode}):\n{' '.join(argv)}\n{text}")
        theirs = json.loads(output.read_text().splitlines()[-1])
        assert theirs["input_lens"] == [count_tokens(t) for t in texts], "not our order"
        observed = json.loads(observe.read_text())
        their_truth = server.get("/truth")
        theirs_timed, their_start = _theirs_timed(observed, their_truth, texts)
        ends = [e["end"] for e in their_truth]
        gets = [g for g in server.get("/gets") if g["path"] == "/get_server_info"]
    finally:
        server.stop()
    result = Runs(ours, theirs, ours_timed, theirs_timed, theirs_timed.span_ms, gets, ends,
                  {"dur_s": observed["dur_s"], "start": their_start}, argv)  # fmt: skip
    result.rows = _table(result)
    (work / "comparison.md").write_text("\n".join(result.rows) + "\n")
    print("\n" + " ".join(argv) + "\n" + "\n".join(result.rows))
    return result


def _key(metric: str, stat: str) -> str:
    return f"{stat}_{STATISTICS[metric][0]}_ms"


def _tolerance(runs: Runs, metric: str, stat: str) -> tuple[float, float, float, float]:
    """(tolerance, our bound, its bound, the server's run-to-run difference) for one statistic."""
    ref = REFERENCE[stat]
    ours, theirs = runs.ours_timed.bound(metric, stat), runs.theirs_timed.bound(metric, stat)
    server = abs(ref(runs.ours_timed.truth[metric]) - ref(runs.theirs_timed.truth[metric]))
    return ours + theirs + server, ours, theirs, server


def _duration_tolerance(runs: Runs) -> float:
    ours, theirs = runs.ours_timed, runs.theirs_timed
    return ours.span_error_ms + theirs.span_error_ms + abs(ours.true_span_ms - theirs.true_span_ms)


def _table(runs: Runs) -> list[str]:
    rows = [
        "| statistic | pytest-kimi | bench_serving | difference | tolerance "
        "(ours + its + server) |",
        "|---|---:|---:|---:|---:|",
    ]
    for metric, stat in CASES:
        key = _key(metric, stat)
        tol, a, b, c = _tolerance(runs, metric, stat)
        rows.append(f"| {key} | {runs.ours[key]:.3f} | {runs.theirs[key]:.3f} | "
                    f"{runs.ours[key] - runs.theirs[key]:+.3f} | {tol:.3f} "
                    f"({a:.3f} + {b:.3f} + {c:.3f}) |")  # fmt: skip
    their_duration = runs.theirs["duration"] * 1000
    rows.append(f"| duration ms (its: as reported / on ours) | {runs.ours['duration'] * 1000:.1f} "
                f"| {their_duration:.1f} / {runs.their_span_ms:.1f} | "
                f"{runs.ours['duration'] * 1000 - runs.their_span_ms:+.3f} | "
                f"{_duration_tolerance(runs):.3f} |")  # fmt: skip
    for count in COUNTS:
        rows.append(f"| {count} | {runs.ours[count]} | {runs.theirs[count]} | | exact |")
    return rows


def test_same_counts_and_token_totals(runs: Runs) -> None:
    for count in COUNTS:
        assert runs.ours[count] == runs.theirs[count], (count, "\n".join(runs.rows))
    assert runs.ours["completed"] == NUM_REQUESTS
    assert runs.theirs["total_output_tokens"] == NUM_REQUESTS * OUTPUT_LEN


@pytest.mark.parametrize(("metric", "stat"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_statistic_agrees_within_both_clients_measured_errors(runs: Runs, metric, stat) -> None:
    key = _key(metric, stat)
    tol, ours_bound, theirs_bound, server = _tolerance(runs, metric, stat)
    difference = runs.ours[key] - runs.theirs[key]
    assert abs(difference) <= tol + ROUNDING, (
        f"{key}: ours {runs.ours[key]:.3f} ms, bench_serving {runs.theirs[key]:.3f} ms "
        f"({difference:+.3f}); allowed {tol:.3f} = ours {ours_bound:.3f} + its "
        f"{theirs_bound:.3f} + server {server:.3f}\n" + "\n".join(runs.rows)
    )


@pytest.mark.parametrize(("metric", "stat"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_each_client_reports_bench_servings_definition_of_its_own_times(
    runs: Runs, metric, stat
) -> None:
    """Where a definition differed, this names it: the statistic each client reports is
    bench_serving's definition applied to that client's own per-request times."""
    key, ref = _key(metric, stat), REFERENCE[stat]
    for name, reported, timed in (("ours", runs.ours, runs.ours_timed),
                                  ("bench_serving", runs.theirs, runs.theirs_timed)):  # fmt: skip
        expected = ref(timed.client[metric])
        assert reported[key] == pytest.approx(expected, rel=1e-9, abs=ROUNDING), (name, key)


def test_duration_and_throughputs_agree_on_one_definition(runs: Runs) -> None:
    """bench_serving's duration is wider by definition (``DEFINITIONS["duration"]``): set its
    part outside its requests aside, then hold both to their measured errors."""
    theirs_s, span_s = runs.theirs["duration"], runs.their_span_ms / 1000
    assert theirs_s == runs.their_observed["dur_s"]  # what it divided by is what it wrote
    # the part outside its requests holds a /get_server_info call, by the server's clock
    # (it makes one more afterwards, for its result file: outside its duration)
    assert theirs_s > span_s
    start, last_end = runs.their_observed["start"], max(runs.their_request_ends)
    inside = [g for g in runs.their_gets if last_end <= g["head"] and g["end"] <= start + theirs_s]
    assert len(inside) == 1, (runs.their_gets, start, last_end, theirs_s)
    ours_s = runs.ours["duration"]
    assert ours_s * 1000 == pytest.approx(runs.ours_timed.span_ms, abs=ROUNDING)  # its definition
    tol_ms = _duration_tolerance(runs)
    assert abs(ours_s - span_s) * 1000 <= tol_ms + ROUNDING, "\n".join(runs.rows)
    for count, rate in COUNTS.items():
        amount = runs.ours[count]
        assert runs.ours[rate] == pytest.approx(amount / ours_s, rel=1e-9)
        assert runs.theirs[rate] == pytest.approx(amount / theirs_s, rel=1e-9)
        # on one definition: |C/a - C/b| = C |a - b| / (a b), with |a - b| <= tol
        allowed = amount * tol_ms / 1000 / (ours_s * span_s)
        assert abs(runs.ours[rate] - amount / span_s) <= allowed * (1 + 1e-9), (rate, allowed)
