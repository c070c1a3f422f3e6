"""``--kimi-until-decided`` on requests whose truth is known (no processes): the run layer's
loop (:func:`pytest_kimi.run.untildecided.send_until_decided`) with a sender that answers
each request with a TTFT drawn from a uniform distribution over 0..1000 ms, whose p95 is
950 ms. A limit at the truth stays undecided (almost always: at most the stated error rate
decides it), limits 20% off are decided early, and the records say which batch each
request came in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.config.inputs import UsageProblem, load_inputs
from pytest_kimi.config.options import Options
from pytest_kimi.config.points import Point
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.run.untildecided import send_until_decided

CLUSTER = """\
name: t
nodes:
  - {name: n1, host: 127.0.0.1, gpus: 8}
deployment: {replicas: 1, nodes_per_replica: 1}
layouts:
  tp8: {tp: 8}
server:
  model_path: builtin:mock-tokenizer
router: {}
workload:
  dataset: builtin:speedbench16k
  num_requests: 40
  input_len: 16384
  output_len: 2
  concurrency: 8
  warmup_requests: 0
slo: {ttft_p95: 950ms}
mock: {time_scale: 1}
"""


def _inputs(tmp_path: Path, limit: str, most: int = 400, **kw):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.replace("950ms", limit))
    return load_inputs(Options(path, ("tp8",), tmp_path / "reports", confidence="0.95",
                               until_decided=most, **kw))  # fmt: skip


def _records(rng: np.random.Generator, n: int) -> list[RequestRecord]:
    out = []
    for i in range(n):
        first = rng.uniform(0, 1)
        out.append(RequestRecord(i, f"p{i}", 16384, 2, send_time=0.0, first_token_time=first,
                                 end_time=first + 0.01, chunks=[Chunk(first, 1),
                                 Chunk(first + 0.01, 1)], prompt_tokens=16384,
                                 completion_tokens=2, success=True))  # fmt: skip
    return out


def _run(inputs, seed: int) -> tuple[list[RequestRecord], int, str]:
    rng = np.random.default_rng(seed)
    return send_until_decided(inputs, "tp8", Point(), _records(rng, 40),
                              lambda specs: _records(rng, len(specs)))  # fmt: skip


def test_a_limit_at_the_true_p95_stays_undecided_to_the_most(tmp_path: Path):
    inputs = _inputs(tmp_path, "950ms")
    assert [len(w) for w in inputs.batches_of(Point())] == [60] * 6  # 40 planned + 6 x 60
    ended = [_run(inputs, seed) for seed in range(40)]
    undecided = [note for _, _, note in ended if "still undecided" in note]
    # a decision at the truth is one by chance: each side spends 5%, so at most ~10% of runs
    assert len(undecided) >= 36, [note for _, _, note in ended]
    records, look, note = next(e for e in ended if "still undecided" in e[2])
    assert look == 6 and len(records) == 400 and note.endswith("after the most requests, 400")
    assert [records[i].batch for i in (0, 39, 40, 99, 100, 399)] == [0, 0, 1, 1, 2, 6]
    assert len({r.index for r in records}) == 400


@pytest.mark.parametrize(("limit", "outcome"), [("760ms", "fail"), ("1140ms", "pass")])
def test_limits_a_fifth_off_the_truth_are_decided_early(tmp_path: Path, limit: str, outcome: str):
    inputs = _inputs(tmp_path, limit)
    sent = []
    for seed in range(20):
        records, _, note = _run(inputs, seed)
        assert "every SLO decided" in note, note
        sent.append(len(records))
    # a fail needs no upper bound: 40 requests; a pass of a p95 needs 59 at least: 100
    assert max(sent) <= 100 and (min(sent) == 40) == (outcome == "fail"), sent


def test_until_decided_needs_a_confidence_and_a_closed_loop(tmp_path: Path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    with pytest.raises(UsageProblem, match="give --kimi-confidence C"):
        load_inputs(Options(path, ("tp8",), tmp_path / "r", until_decided=400))
    with pytest.raises(UsageProblem, match="must be more than the 40 planned"):
        _inputs(tmp_path, "950ms", most=40)
    path.write_text(CLUSTER.replace("concurrency: 8", "concurrency: 8\n  request_rate: 2"))
    with pytest.raises(UsageProblem, match="sends more requests of a closed loop"):
        load_inputs(Options(path, ("tp8",), tmp_path / "r", confidence="0.95",
                            until_decided=400))  # fmt: skip
