"""Conformance with the real ``sglang.bench_serving`` (sglang 0.5.9).

Our client and bench_serving run one after the other against one mock server, with the same
prompts in the same order, the same output length, concurrency, request rate and one warmup
request. They must agree on the order, the successful count and the token totals exactly: the
mock speaks SGLang well enough for the peer tool. Every statistic is compared against the
scripted server's own truth, with measured tolerances, in ``test_bench_serving_statistics.py``;
the table printed here (means, and the mock's ``/kimi/ground_truth``) is for reading.

How bench_serving is fed our prompts offline: ``--dataset-name custom`` reads a JSONL of
``{"conversations": [user, assistant]}`` rows, shuffles them with ``random.seed(--seed)`` and
takes ``--num-prompts``; ``--sharegpt-output-len`` fixes the output length. We write the rows
pre-permuted so that its shuffle yields exactly our order, and check that it did (the prompts'
token counts are distinct, and bench_serving's ``--output-details`` lists them per request).
Token counts: bench_serving's input total is its own tokenization of the prompts (our bundled
tokenizer, which the mock also uses); its output total is the server's
``meta_info.completion_tokens``. Ours are server-reported for both.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from pytest_kimi.mock.tokenizer_files import count_tokens
from pytest_kimi.results.metrics import Summary, summarize
from pytest_kimi.results.records import RequestRecord
from pytest_kimi.testing.peer import bench_serving_argv, write_custom_dataset
from pytest_kimi.workload.client import ClientOptions, RequestSpec, run_requests
from pytest_kimi.workload.dataset import BUNDLED_DATASET, Prompt, load_workload

pytestmark = pytest.mark.slow

NUM_REQUESTS = 16
CONCURRENCY = 4
OUTPUT_LEN = 32  # bench_serving's warmup request uses min(output_len, 32): the same as ours
TIME_SCALE = 8.0  # cluster seconds per wall second: ~11 s of wall time per client run
WORKLOAD_SEED = 0
BENCH_SEED = 1  # bench_serving's default --seed
RUN_TIMEOUT_S = 300.0

MEANS = {  # our Summary attribute -> bench_serving --output-file key
    "ttft": ("ttft_ms", "mean_ttft_ms"),
    "tpot": ("tpot_ms", "mean_tpot_ms"),
    "e2e": ("e2e_ms", "mean_e2e_latency_ms"),
}


@dataclass(frozen=True)
class Truth:
    """The mock's own per-request timings for one run's measured requests, wall ms."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float


@dataclass(frozen=True)
class Runs:
    """Both clients' results on the same server and workload."""

    ours: Summary
    ours_records: list[RequestRecord]
    ours_wall_s: float
    theirs: dict[str, Any]
    theirs_wall_s: float
    command: list[str]
    truth_ours: Truth
    truth_theirs: Truth

    def table(self) -> str:
        rows = [
            "| metric | pytest-kimi | bench_serving | rel. diff | mock truth (ours / theirs) |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, (attr, key) in MEANS.items():
            ours = getattr(self.ours, attr).mean
            theirs = float(self.theirs[key])
            truth = f"{getattr(self.truth_ours, attr):.2f} / {getattr(self.truth_theirs, attr):.2f}"
            rows.append(
                f"| mean {name} ms | {ours:.2f} | {theirs:.2f} | "
                f"{(ours - theirs) / theirs:+.2%} | {truth} |"
            )
        rows += [
            f"| completed | {self.ours.completed} | {self.theirs['completed']} | | |",
            f"| total input tokens | {self.ours.total_input_tokens} "
            f"| {self.theirs['total_input_tokens']} | | |",
            f"| total output tokens | {self.ours.total_output_tokens} "
            f"| {self.theirs['total_output_tokens']} | | |",
            f"| wall time of the run, s | {self.ours_wall_s:.1f} | {self.theirs_wall_s:.1f} | | |",
        ]
        return "\n".join(rows)


def _specs(prompts: tuple[Prompt, ...]) -> list[RequestSpec]:
    return [RequestSpec(p.id, p.text, count_tokens(p.text)) for p in prompts]


def _ground_truth(url: str) -> list[dict[str, Any]]:
    response = httpx.get(url + "/kimi/ground_truth", timeout=10.0, trust_env=False)
    response.raise_for_status()
    return response.json()["requests"]


def _truth(requests: list[dict[str, Any]], time_scale: float) -> Truth:
    """Model-side means of a run's requests (its warmup, the first one, left out)."""
    measured = requests[1:]
    assert len(measured) == NUM_REQUESTS, f"expected {NUM_REQUESTS} requests, got {len(measured)}"
    ms = 1000.0 / time_scale
    ttft = [(r["first_token"] - r["arrival"]) * ms for r in measured]
    e2e = [(r["finished"] - r["arrival"]) * ms for r in measured]
    tpot = [(e - t) / (OUTPUT_LEN - 1) for t, e in zip(ttft, e2e, strict=True)]
    return Truth(*(sum(v) / len(v) for v in (ttft, tpot, e2e)))


@pytest.fixture(scope="module")
def runs(bench_serving_python, start_mock, peer_env, tmp_path_factory) -> Runs:
    server = start_mock(
        "--tp-size", "32", "--enable-metrics", "--mock-time-scale", f"{TIME_SCALE:g}"
    )  # fmt: skip
    workload = load_workload(BUNDLED_DATASET, num_requests=NUM_REQUESTS, seed=WORKLOAD_SEED)
    specs = _specs(workload.prompts)

    # 1. our client: same first prompt as bench_serving's warmup, then the measured run
    options = ClientOptions(api="generate", output_len=OUTPUT_LEN, concurrency=CONCURRENCY)
    started = time.perf_counter()
    records = asyncio.run(run_requests(server.url, specs, options, warmup=specs[:1]))
    ours_wall = time.perf_counter() - started
    truth = _ground_truth(server.url)
    seen = len(truth)
    truth_ours = _truth(truth, TIME_SCALE)

    # 2. bench_serving, after ours has finished
    work = tmp_path_factory.mktemp("bench_serving")
    dataset, output, log = work / "prompts.jsonl", work / "result.jsonl", work / "stdout.log"
    write_custom_dataset(dataset, [s.text for s in specs], BENCH_SEED)
    argv = bench_serving_argv(bench_serving_python, server.url, dataset, output,
                              num_prompts=len(specs), output_len=OUTPUT_LEN,
                              concurrency=CONCURRENCY, seed=BENCH_SEED)  # fmt: skip
    started = time.perf_counter()
    with log.open("wb") as fh:
        try:
            done = subprocess.run(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=peer_env,
                cwd=work,
                timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"bench_serving did not finish in {RUN_TIMEOUT_S:g}s:\n{log.read_text()}")
    theirs_wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    if done.returncode != 0 or not output.is_file():
        pytest.fail(f"bench_serving failed (exit {done.returncode}):\n{' '.join(argv)}\n{text}")
    theirs = json.loads(output.read_text().splitlines()[-1])
    truth_theirs = _truth(_ground_truth(server.url)[seen:], TIME_SCALE)

    result = Runs(
        ours=summarize(records, time_scale=1.0),
        ours_records=records,
        ours_wall_s=ours_wall,
        theirs=theirs,
        theirs_wall_s=theirs_wall,
        command=argv,
        truth_ours=truth_ours,
        truth_theirs=truth_theirs,
    )
    (work / "comparison.md").write_text(result.table() + "\n")
    print(f"\n{' '.join(argv)}\n{result.table()}")
    return result


def _measured(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted((r for r in records if not r.warmup), key=lambda r: r.index)


def test_same_requests_in_same_order(runs: Runs) -> None:
    """bench_serving sent our prompts in our order: per-request prompt token counts match."""
    ours = [r.input_tokens for r in _measured(runs.ours_records)]
    assert len(set(ours)) == len(ours), "prompt lengths must be distinct to identify the order"
    assert runs.theirs["input_lens"] == ours
    assert not any(runs.theirs["errors"]), runs.theirs["errors"]


def test_same_completed_count(runs: Runs) -> None:
    assert runs.ours.failed == 0, [r.error for r in runs.ours_records if not r.success]
    assert runs.ours.completed == runs.theirs["completed"] == NUM_REQUESTS, runs.table()


def test_same_token_totals(runs: Runs) -> None:
    """Server-reported counts (ours) equal bench_serving's tokenizer / meta_info counts."""
    assert runs.ours.total_input_tokens == runs.theirs["total_input_tokens"], runs.table()
    assert runs.ours.total_output_tokens == runs.theirs["total_output_tokens"], runs.table()
    assert runs.theirs["total_output_tokens"] == NUM_REQUESTS * OUTPUT_LEN
    assert runs.theirs["total_output_tokens_retokenized"] == runs.theirs["total_output_tokens"]
