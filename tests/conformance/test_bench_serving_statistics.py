"""Every statistic against SGLang's own benchmark client, per release, against the server's
own truth: ``sglang.bench_serving`` of 0.5.9 (its own venv, no torch) and
``sglang.benchmark.serving`` of 0.5.23 (``sglang.bench_serving`` is a shim for it from 0.5.15;
it runs from the real 0.5.23 server's venv, which has its imports), each its own run.

Both clients send the same 40 prompts in the same order, one run after the other, to the
scripted server (:mod:`pytest_kimi.testing.scripted`): concurrency 8, 64 tokens out in chunks
of 3, one warm-up request each. The server draws each request's script from its prompt (TTFT
40-80 ms, 4-8 ms between tokens), so both runs are asked the same, and it stamps on its own
clock when each request's first segment arrived, when its handler started and when each chunk
was written: a truth neither client can move. Every client stamp is on the same clock
(CLOCK_MONOTONIC): bench_serving's ``start_time`` and ``latency`` are read from what its own
``calculate_metrics`` is given (:mod:`pytest_kimi.testing.bench_observed`), since its output
file has neither.

What each check can catch:

- **Definitions** (``test_each_client_reports_...``): each client's figure is bench_serving's
  definition (``REFERENCE``: numpy's mean, median, population std, linear percentiles; its ITL
  split; its 1-second buckets) applied to that client's own per-request times, to float
  rounding. A client that aggregates another way fails here, by name.
- **Clocks** (``test_every_clock_...``): per request, each client's clock started before the
  request reached the server's kernel, and each of its stamps is not before the server's write
  it stands for. A clock started late or a stamp taken at the wrong chunk fails here.
- **Agreement** (``test_statistic_agrees_...``): for each statistic ``S``::

      |S(ours) - S(theirs)| <= e_S(ours) + e_S(theirs) + |S(truth, our run) - S(truth, theirs)|

  ``e_S(client)`` bounds how far that client's per-request errors (its time minus the
  server's) can move ``S``: the largest error for a percentile or median, the mean absolute
  error for a mean, the root mean square error for a standard deviation; the last term is the
  server's own run-to-run difference. Given the two checks above this follows (the triangle
  inequality): it is the reader's account of how much of the difference each client's measured
  error and the server explain, with no fixed percentage anywhere. It is asserted so that a
  figure outside its account cannot go unseen.

The differences in definition that exist are named in ``DEFINITIONS`` and handled in the open.
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

from pytest_kimi.deploy.ports import free_port
from pytest_kimi.mock.tokenizer_files import count_tokens
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.testing import realsglang
from pytest_kimi.testing.peer import bench_serving_argv, offline_env, write_custom_dataset
from pytest_kimi.testing.processes import Proc
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests

pytestmark = pytest.mark.slow

NUM_REQUESTS = 40
CONCURRENCY = 8
OUTPUT_LEN = 64
PROMPT_TOKENS = 1000
BENCH_SEED = 1  # bench_serving's --seed (its default)
RUN_TIMEOUT_S = 300.0
ROUNDING = 1e-6  # ms: float rounding between two computations of one definition

# bench_serving's definitions (calculate_metrics, 0.5.9 and 0.5.23 alike): numpy's mean,
# median, population standard deviation, linearly interpolated percentiles, max
REFERENCE: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda v: float(np.mean(v)),
    "median": lambda v: float(np.median(v)),
    "std": lambda v: float(np.std(v)),
    "p90": lambda v: float(np.percentile(v, 90)),
    "p95": lambda v: float(np.percentile(v, 95)),
    "p99": lambda v: float(np.percentile(v, 99)),
}
INFIX = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e_latency"}  # f"{stat}_{infix}_ms"


@dataclass(frozen=True)
class Peer:
    """One release's benchmark client: the statistics its output file carries per metric and
    the GET it closes its clock with."""

    release: str
    statistics: dict[str, tuple[str, ...]]
    closing_get: str


PEERS = {
    "0.5.9": Peer("0.5.9", {
        "ttft": ("mean", "median", "std", "p99"),
        "tpot": ("mean", "median", "std", "p99"),
        "itl": ("mean", "median", "std", "p95", "p99"),
        "e2e": ("mean", "median", "std", "p90", "p99"),
    }, "/get_server_info"),
    # 0.5.23 writes p90, p95 and p99 of every metric, and asks the non-deprecated path
    "0.5.23": Peer("0.5.23", dict.fromkeys(INFIX, ("mean", "median", "std", "p90", "p95", "p99")),
                   "/server_info"),
}  # fmt: skip
CASES = [(release, metric, stat) for release, peer in PEERS.items()
         for metric, stats in peer.statistics.items() for stat in stats]  # fmt: skip
CASE_IDS = [f"{release}-{metric}-{stat}" for release, metric, stat in CASES]
COUNTS = ("completed", "total_input_tokens", "total_output_tokens")
RATES = {  # throughput -> the counts it divides by the duration
    "request_throughput": ("completed",),
    "input_throughput": ("total_input_tokens",),
    "output_throughput": ("total_output_tokens",),
    "total_throughput": ("total_input_tokens", "total_output_tokens"),
}
CAUSALITY_SLACK_MS = 0.01  # kernel stamps are realtime moved onto the monotonic clock: us
DEFINITIONS = {
    "duration": (
        "bench_serving's clock runs from before it creates its request tasks to after its "
        "closing /get_server_info (0.5.23: /server_info) call; ours from the first request's "
        "start to the last one's end. Its duration is compared on ours: less the part outside "
        "its requests (its own per-request stamps), which the server confirms holds that call. "
        "Throughputs likewise."
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
    "concurrency": (
        "bench_serving's `concurrency` (sum of E2E / duration) and its output-token peak have "
        "no figure of ours; its bucketed peak of concurrent requests is ours as "
        "max_concurrent_requests_bucketed (beside the exact peak), checked by definition only: "
        "a one-second bucket can gain or lose a request on a microsecond's shift."
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
    starts: list[float] = field(default_factory=list)  # per request, client clock, s
    latencies: list[float] = field(default_factory=list)  # per request E2E, s
    # per request, ms: (server's stamp - client's) for the start, client - server for the
    # first token and the end: each >= 0 when the clock and the stamps are where they belong
    causality: list[tuple[float, float, float]] = field(default_factory=list)

    def bound(self, metric: str, stat: str) -> float:
        """How far this client's per-request errors can move ``stat`` of ``metric`` (a
        percentile or the median: the largest error; the mean: the mean absolute error; the
        standard deviation: the root mean square error)."""
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
    peer: Peer
    ours: dict[str, Any]  # our Summary.to_dict(): bench_serving's keys
    theirs: dict[str, Any]  # bench_serving's --output-file line
    ours_timed: Timed
    theirs_timed: Timed
    their_gets: list[dict[str, Any]]  # the server's stamps of its GETs
    their_request_ends: list[float]  # the server's [DONE] writes of its requests
    their_observed: dict[str, Any]
    argv: list[str]
    rows: list[str] = field(default_factory=list)


def _texts() -> list[str]:
    """Distinct prompts with distinct token counts, so each request can be told apart."""
    return [f"r{k} " + "tok " * (PROMPT_TOKENS + k - 1) for k in range(NUM_REQUESTS)]


def _itls(times_s: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """bench_serving's ITLs (ms) from chunk times (s) and each chunk's new tokens: after the
    first chunk, ``k`` values of gap/k per chunk of ``k`` tokens."""
    out: list[float] = []
    for (before, _), (now, k) in pairwise(zip(times_s, tokens, strict=True)):
        out.extend([(now - before) * 1000 / k] * k)
    return out


def bucketed_peak(starts: Sequence[float], latencies: Sequence[float]) -> int:
    """bench_serving 0.5.9's ``max_concurrent_requests``: requests counted in every whole
    second (from the first start) that their [start, end] touches; the fullest second."""
    first = min(starts)
    seconds = int(np.ceil(max(s + x for s, x in zip(starts, latencies, strict=True)) - first)) + 1
    counts = np.zeros(seconds)
    for start, latency in zip(starts, latencies, strict=True):
        begin, end = int(start - first), int(start + latency - first)
        counts[begin : min(end + 1, seconds)] += 1
    return int(counts.max())


def _truth(entry: dict[str, Any]) -> dict[str, list[float]]:
    """The server's own times for one request, in ms from its handler's entry."""
    chunks = entry["chunks"]
    ttft = (chunks[0][0] - entry["head"]) * 1000
    e2e = (entry["end"] - entry["head"]) * 1000
    tokens = sum(c[1] for c in chunks)
    itl = _itls([c[0] for c in chunks], [c[1] for c in chunks])
    return {"ttft": [ttft], "e2e": [e2e], "tpot": [(e2e - ttft) / (tokens - 1)], "itl": itl}


Own = dict[str, list[float]]  # one request's client times: ttft, e2e, tpot (one each), itl
Stamps = tuple[float, float, float]  # one request's start, first token, end on the client, s


def _collect(per_request: list[tuple[Own, Stamps, dict[str, Any]]]) -> Timed:
    """Client and server times paired request by request (ITLs value by value)."""
    timed = Timed()
    for own, _, entry in per_request:
        assert len(own["itl"]) == len(_truth(entry)["itl"]), (own["itl"], entry["chunks"])
    for metric in INFIX:
        timed.client[metric] = np.array([v for own, _, _ in per_request for v in own[metric]])
        timed.truth[metric] = np.array([v for *_, e in per_request for v in _truth(e)[metric]])
    entries = [e for *_, e in per_request]
    timed.true_span_ms = (max(e["end"] for e in entries) - min(e["head"] for e in entries)) * 1e3
    for _, (start, first, end), entry in per_request:
        arrived = entry.get("kernel_first") or entry["first_byte"]
        timed.causality.append((
            (arrived - start) * 1000,
            (first - entry["chunks"][0][2]) * 1000,
            (end - entry["end_before"]) * 1000,
        ))  # fmt: skip
        timed.starts.append(start)
        timed.latencies.append(end - start)
    starts = timed.starts
    timed.span_ms = (max(s + x for s, x in zip(starts, timed.latencies, strict=True))
                     - min(starts)) * 1000  # fmt: skip
    return timed


def _ours_timed(records: list[RequestRecord], truth: list[dict[str, Any]]) -> Timed:
    by_index = {str(e["index"]): e for e in truth}
    pairs: list[tuple[Own, Stamps, dict[str, Any]]] = []
    for record in (r for r in records if not r.warmup):
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
            "itl": _itls([c.time for c in record.chunks], [c.tokens for c in record.chunks]),
        }
        stamps = (start, record.first_token_time, record.end_time)
        pairs.append((own, stamps, by_index[record.request_id or ""]))
    return _collect(pairs)


def _theirs_timed(
    observed: dict[str, Any], truth: list[dict[str, Any]], texts: list[str]
) -> Timed:
    by_prompt: dict[str, dict[str, Any]] = {}
    for entry in sorted(truth, key=lambda e: e["index"]):  # its warm-up re-sends prompt 0
        by_prompt[entry["prompt_sha256"]] = entry  # so the later entry, the measured one, wins
    pairs: list[tuple[Own, Stamps, dict[str, Any]]] = []
    for text, out in zip(texts, observed["outputs"], strict=True):
        assert out["success"], out["error"]
        entry = by_prompt[hashlib.sha256(text.encode()).hexdigest()]
        ttft, e2e = out["ttft"] * 1000, out["latency"] * 1000
        itl = [v * 1000 for v in out["itl"]]
        own = {"ttft": [ttft], "e2e": [e2e], "tpot": [(e2e - ttft) / (out["output_len"] - 1)],
               "itl": itl}  # fmt: skip
        start = out["start_time"]
        pairs.append((own, (start, start + out["ttft"], start + out["latency"]), entry))
    return _collect(pairs)


class ScriptedServer(Proc):
    def __init__(self, log: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable, "-m", "pytest_kimi.testing.scripted", "--port", str(port),
            "--ttft-ms", "40", "--itl-ms", "4", "--jitter", "1.0", "--seed", "3",
            "--tokens-per-chunk", "3", "--script-key", "prompt",
        ]  # fmt: skip
        super().__init__(argv, log, env=offline_env())

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=60.0, trust_env=False)
        response.raise_for_status()
        return response.json() if path != "/reset" else None


def _peer_python(request: pytest.FixtureRequest, release: str) -> Path:
    """0.5.9: its bench_serving venv; 0.5.23: the real server's venv (its benchmark client
    imports torch through sglang.srt)."""
    if release == "0.5.9":
        return request.getfixturevalue("bench_serving_python")
    return realsglang.install(release)


@pytest.fixture(scope="module")
def runs_of(request: pytest.FixtureRequest, tmp_path_factory) -> Callable[[str], Runs]:
    """``runs_of(release)``: both clients' runs against that release's peer, made on first use
    and kept for the module (each test asks for the release it checks, in any order)."""
    made: dict[str, Runs] = {}

    def get(release: str) -> Runs:
        if release not in made:
            peer = PEERS[release]
            made[release] = _measure(peer, _peer_python(request, release), tmp_path_factory)
        return made[release]

    return get


@pytest.fixture(params=list(PEERS))
def release(request: pytest.FixtureRequest) -> str:
    """The peer's release a test checks (every test checks each one)."""
    return request.param


@pytest.fixture
def runs(runs_of: Callable[[str], Runs], release: str) -> Runs:
    return runs_of(release)


def _measure(peer: Peer, python: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    work = tmp_path_factory.mktemp(f"statistics-{peer.release}")
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
        argv = bench_serving_argv(python, server.url, dataset, output,
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
        theirs_timed = _theirs_timed(observed, their_truth, texts)
        ends = [e["end"] for e in their_truth]
        gets = [g for g in server.get("/gets") if g["path"] == peer.closing_get]
    finally:
        server.stop()
    result = Runs(peer, ours, theirs, ours_timed, theirs_timed, gets, ends,
                  {"dur_s": observed["dur_s"], "called": observed["called"]}, argv)  # fmt: skip
    result.rows = _table(result)
    (work / "comparison.md").write_text("\n".join(result.rows) + "\n")
    print("\n" + " ".join(argv) + "\n" + "\n".join(result.rows))
    return result


def _key(metric: str, stat: str) -> str:
    return f"{stat}_{INFIX[metric]}_ms"


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
    for metric, stat in ((m, s) for m, stats in runs.peer.statistics.items() for s in stats):
        key = _key(metric, stat)
        tol, a, b, c = _tolerance(runs, metric, stat)
        rows.append(f"| {key} | {runs.ours[key]:.3f} | {runs.theirs[key]:.3f} | "
                    f"{runs.ours[key] - runs.theirs[key]:+.3f} | {tol:.3f} "
                    f"({a:.3f} + {b:.3f} + {c:.3f}) |")  # fmt: skip
    their_duration = runs.theirs["duration"] * 1000
    rows.append(f"| duration ms (its: as reported / on ours) | {runs.ours['duration'] * 1000:.1f} "
                f"| {their_duration:.1f} / {runs.theirs_timed.span_ms:.1f} | "
                f"{runs.ours['duration'] * 1000 - runs.theirs_timed.span_ms:+.3f} | "
                f"{_duration_tolerance(runs):.3f} |")  # fmt: skip
    for count in COUNTS:
        rows.append(f"| {count} | {runs.ours[count]} | {runs.theirs[count]} | | exact |")
    ours_peak, theirs_peak = runs.ours["max_concurrent_requests_bucketed"], runs.theirs[
        "max_concurrent_requests"]  # fmt: skip
    rows.append(f"| bucketed peak of concurrent requests | {ours_peak} | {theirs_peak} | | "
                "definition only |")  # fmt: skip
    before = runs.theirs_timed.starts and (
        min(runs.theirs_timed.starts) - (runs.their_observed["called"] - runs.theirs["duration"])
    )
    after = runs.their_observed["called"] - (min(runs.theirs_timed.starts)
                                             + runs.theirs_timed.span_ms / 1000)  # fmt: skip
    rows.append(f"| bench_serving's duration outside its requests, ms (before / after) | | "
                f"{before * 1000:.3f} / {after * 1000:.3f} | | named: duration |")  # fmt: skip
    return rows


def test_same_counts_and_token_totals(runs: Runs) -> None:
    for count in COUNTS:
        assert runs.ours[count] == runs.theirs[count], (count, "\n".join(runs.rows))
    assert runs.ours["completed"] == NUM_REQUESTS
    assert runs.theirs["total_output_tokens"] == NUM_REQUESTS * OUTPUT_LEN


@pytest.mark.parametrize("client", ["ours", "bench_serving"])
def test_every_clock_starts_before_its_request_arrives_and_stamps_after_the_writes(
    runs: Runs, client: str
) -> None:
    """bench_serving's definition: the clock starts before the request is issued; TTFT and
    E2E end when the first token and the end were read. The server's kernel and writes say
    when those could happen at the earliest."""
    timed = runs.ours_timed if client == "ours" else runs.theirs_timed
    worst = np.array(timed.causality).min(axis=0)
    names = ("arrival - start", "first token read - written", "end read - written")
    assert (worst >= -CAUSALITY_SLACK_MS).all(), dict(zip(names, worst.tolist(), strict=True))


@pytest.mark.parametrize(("release", "metric", "stat"), CASES, ids=CASE_IDS)
def test_statistic_agrees_within_both_clients_measured_errors(runs: Runs, metric, stat) -> None:
    key = _key(metric, stat)
    tol, ours_bound, theirs_bound, server = _tolerance(runs, metric, stat)
    difference = runs.ours[key] - runs.theirs[key]
    assert abs(difference) <= tol + ROUNDING, (
        f"{key}: ours {runs.ours[key]:.3f} ms, bench_serving {runs.theirs[key]:.3f} ms "
        f"({difference:+.3f}); allowed {tol:.3f} = ours {ours_bound:.3f} + its "
        f"{theirs_bound:.3f} + server {server:.3f}\n" + "\n".join(runs.rows)
    )


@pytest.mark.parametrize(("release", "metric", "stat"), CASES, ids=CASE_IDS)
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


def test_each_client_reports_bench_servings_bucketed_peak_of_its_own_times(runs: Runs) -> None:
    ours, theirs = runs.ours_timed, runs.theirs_timed
    assert runs.ours["max_concurrent_requests_bucketed"] == bucketed_peak(
        ours.starts, ours.latencies
    )
    assert runs.theirs["max_concurrent_requests"] == bucketed_peak(theirs.starts, theirs.latencies)


def test_duration_and_throughputs_agree_on_one_definition(runs: Runs) -> None:
    """bench_serving's duration is wider by definition (``DEFINITIONS["duration"]``): set its
    part outside its requests aside, then hold both to their measured errors."""
    theirs_s, span_s = runs.theirs["duration"], runs.theirs_timed.span_ms / 1000
    assert theirs_s == runs.their_observed["dur_s"]  # what it divided by is what it wrote
    # the part after its requests holds one closing GET (/get_server_info, 0.5.23's
    # /server_info), by the server's clock: it came after its last request's end was written,
    # and its answer's write began before the clock stopped (the observer stamps the call that
    # follows its reading of that clock; the server's stamp after the write may come later, if
    # the server was preempted after it)
    assert theirs_s > span_s
    last_end, ended = max(runs.their_request_ends), runs.their_observed["called"]
    inside = [g for g in runs.their_gets if last_end <= g["head"] and g["end_before"] <= ended]
    assert len(inside) == 1, (runs.their_gets, last_end, ended)
    ours_s = runs.ours["duration"]
    assert ours_s * 1000 == pytest.approx(runs.ours_timed.span_ms, abs=ROUNDING)  # its definition
    tol_ms = _duration_tolerance(runs)
    assert abs(ours_s - span_s) * 1000 <= tol_ms + ROUNDING, "\n".join(runs.rows)
    for rate, counts in RATES.items():
        amount = sum(runs.ours[count] for count in counts)
        assert runs.ours[rate] == pytest.approx(amount / ours_s, rel=1e-9)
        assert runs.theirs[rate] == pytest.approx(amount / theirs_s, rel=1e-9)
        # on one definition: |C/a - C/b| = C |a - b| / (a b), with |a - b| <= tol
        allowed = amount * tol_ms / 1000 / (ours_s * span_s)
        assert abs(runs.ours[rate] - amount / span_s) <= allowed * (1 + 1e-9), (rate, allowed)
