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


def _records(rng: np.random.Generator, ids: list[str]) -> list[RequestRecord]:
    """One answered request per prompt id, its TTFT drawn from U(0, 1 s)."""
    out = []
    for i, prompt_id in enumerate(ids):
        first = rng.uniform(0, 1)
        out.append(RequestRecord(i, prompt_id, 16384, 2, send_time=0.0, first_token_time=first,
                                 end_time=first + 0.01, chunks=[Chunk(first, 1),
                                 Chunk(first + 0.01, 1)], prompt_tokens=16384,
                                 completion_tokens=2, success=True))  # fmt: skip
    return out


def _run(inputs, seed: int) -> tuple[list[RequestRecord], dict[str, int], str]:
    rng = np.random.default_rng(seed)
    planned = [p.id for p in inputs.prompts_of(Point()).prompts]
    def send(specs: list) -> list[RequestRecord]:
        return _records(rng, [spec.prompt_id for spec in specs])

    return send_until_decided(inputs, "tp8", Point(), _records(rng, planned), send)


def test_a_limit_at_the_true_p95_stays_undecided_to_the_most(tmp_path: Path):
    inputs = _inputs(tmp_path, "950ms")
    assert [len(w) for w in inputs.batches_of(Point())] == [60] * 6  # 40 planned + 6 x 60
    ended = [_run(inputs, seed) for seed in range(40)]
    undecided = [note for _, _, note in ended if "still undecided" in note]
    # a decision at the truth is one by chance: each side spends 5%, so at most ~10% of runs
    assert len(undecided) >= 36, [note for _, _, note in ended]
    records, looks, note = next(e for e in ended if "still undecided" in e[2])
    assert looks == {"ttft_p95": 6} and len(records) == 400
    assert "still undecided after the most requests, 400; " in note
    # the builtin set has 48 rows: 40 planned, then batches of 60 drawn from the same rows
    repeated = int(note.split("; ")[1].split(" of the ")[0])
    assert 400 - 48 <= repeated < 400 and "of the 400 prompts repeated earlier ones" in note
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


def test_an_slo_keeps_the_verdict_of_its_first_decisive_look(tmp_path: Path):
    """ttft_p95 at 1.14 s passes at 100 requests; ttft_mean at 505 ms (the truth: 500) keeps
    the run going. Later looks, at their smaller levels, never take the pass back: the final
    verdict of each SLO is judged at the look it was decided at, on the requests by then."""
    from pytest_kimi.judge.looks import verdicts_at

    inputs = _inputs(tmp_path, "1140ms, ttft_mean: 505ms")
    records, looks, note = _run(inputs, 3)
    assert looks == {"ttft_p95": 1, "ttft_mean": 6} and "ttft_mean still undecided" in note
    verdicts = {v.slo.name: v for v in verdicts_at(inputs, "tp8", records, looks)}
    assert verdicts["ttft_p95"].outcome == "passed" and verdicts["ttft_p95"].bounds.n == 100
    assert verdicts["ttft_mean"].outcome == "undecided" and verdicts["ttft_mean"].bounds.n == 400
