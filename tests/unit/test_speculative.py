"""Speculative decoding in the mock's model: SGLang's flag resolution, the stated acceptance
model, its cost, and what the scheduler makes of it."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.mock import mission
from pytest_kimi.mock.args import parse_args
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.speculative import (
    A_MAX,
    A_MIN,
    Drafts,
    SpecCounters,
    Speculation,
    SpeculativeError,
    accept_length,
    acceptance,
    repeat_share,
)
from pytest_kimi.workload.dataset import load_workload, resolve_dataset

ROOT = Path(__file__).resolve().parents[2]


def _args(*flags: str):
    return parse_args(["--model-path", "m", "--tp-size", "32", *flags])


def test_flags_resolve_as_sglangs_server_args():
    args = _args("--speculative-algorithm", "NEXTN", "--enable-mixed-chunk")
    assert args.speculation == Speculation("EAGLE", 3, 1, 4)  # NEXTN is EAGLE; (3, 1, 4)
    assert args.max_running_requests == 48 and args.enable_mixed_chunk is False
    # top-k 1: the draft tokens follow the steps, whatever was asked
    args = _args("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5",
                 "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", "8")  # fmt: skip
    assert args.speculation == Speculation("EAGLE3", 5, 1, 6)
    assert args.server_info()["speculative_num_draft_tokens"] == 6
    assert _args("--max-running-requests", "8", "--speculative-algorithm",
                 "EAGLE").max_running_requests == 8  # fmt: skip
    assert _args().speculation is None and _args().max_running_requests is None


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--pp-size", "8", "--speculative-algorithm", "EAGLE"], "Pipeline parallelism"),
        (["--speculative-algorithm", "NGRAM"], "NGRAM"),
        (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
          "--speculative-num-steps", "3"], "top-k 1"),
        (["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "4"],
         "need --speculative-num-steps"),
        (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"],
         "needs --speculative-eagle-topk"),
    ],
)
def test_refusals_name_the_flag(flags, says):
    with pytest.raises(SpeculativeError, match=says):
        _args(*flags)


def test_acceptance_follows_the_prompts_repeats():
    assert repeat_share("a b c d e f") == 0.0
    assert repeat_share("a b a b a b") == pytest.approx(3 / 5)  # (a,b) (b,a) seen before
    assert repeat_share([7, 8, 7, 8]) == pytest.approx(1 / 3)
    assert acceptance("a b c") == A_MIN
    assert acceptance("x y " * 100) == pytest.approx(A_MIN + (A_MAX - A_MIN) * 197 / 199)


def test_speedbench_tiers_get_the_published_span_of_accept_lengths():
    """Low entropy accepts most, high entropy least; at 3 steps the lengths span what Kimi
    K2-family EAGLE3 drafts publish (about 2 to 3.2)."""
    workload = load_workload(resolve_dataset("builtin:speedbench16k"), num_requests=48, seed=1)
    by_tier: dict[str, list[float]] = {}
    for prompt in workload.prompts:
        by_tier.setdefault(prompt.category, []).append(acceptance(prompt.text))
    lengths = {tier: accept_length(statistics.mean(a), 3) for tier, a in by_tier.items()}
    assert lengths["low_entropy"] > lengths["mixed"] > lengths["high_entropy"]
    assert 1.8 < lengths["high_entropy"] < 2.1 and 3.0 < lengths["low_entropy"] < 3.3


@pytest.mark.parametrize("a", [0.5, 0.7, 0.86])
def test_draws_follow_the_chain_model(a):
    """Accepted drafts stop at the first rejection: the mean tokens per step over many steps
    is (1 - a^(k+1)) / (1 - a), and the histogram sums to the steps."""
    drafts = Drafts(a, seed=11)
    tokens = [1 + drafts.step(3) for _ in range(20000)]
    assert statistics.mean(tokens) == pytest.approx(accept_length(a, 3), rel=0.02)
    assert sum(drafts.histogram) == drafts.verify_ct == 20000
    assert drafts.accepted == sum(tokens) - 20000
    assert _draws(a, 5, 50) == _draws(a, 5, 50)  # the same seed draws the same drafts


def _draws(a: float, seed: int, n: int) -> list[int]:
    drafts = Drafts(a, seed)
    return [drafts.step(3) for _ in range(n)]


def test_meta_is_sglangs_arithmetic():
    drafts = Drafts(0.7, 3)
    for _ in range(10):
        drafts.step(3)
    meta = drafts.meta(completion_tokens=25, max_drafts=3)
    assert meta["spec_verify_ct"] == 10 and meta["spec_accept_length"] == 2.5
    assert meta["spec_draft_token_num"] == 30
    assert meta["spec_accept_rate"] == drafts.accepted / 30
    assert Drafts(0.7, 3).meta(1, 3) == {}  # no verify yet: SGLang adds no keys


def test_gauges_take_the_decode_log_window():
    counters = SpecCounters()
    for _ in range(39):
        counters.verified(accepted=8, batch=4, draft_tokens=4, log_every=40)
    assert counters.accept_length == 0.0 and counters.average() is None  # not logged yet
    counters.verified(accepted=8, batch=4, draft_tokens=4, log_every=40)
    assert counters.accept_length == 3.0  # (8 + 4) / 4 per forward
    assert counters.accept_rate == 12 / 16  # SGLang's: tokens over drafted positions
    assert counters.average() == 3.0


def test_a_verify_costs_more_than_a_decode_and_drafts_are_cheap():
    cost = CostModel(Profile(), tp=32, pp=1, ep=4, gpus_per_node=8)
    decode = cost.stage_time([], [16000] * 4)
    verify = cost.verify_time([16000] * 4, 4)
    assert verify > decode  # 16 positions touch more experts than 4
    assert 0 < cost.draft_time(4) < decode / 10


def _one_request(spec: Speculation | None, text: str, new: int = 100) -> ReplicaSim:
    sim = ReplicaSim(CostModel(Profile(), tp=32, pp=1, ep=4, gpus_per_node=8),
                     chunk_size=8192, max_running=48, spec=spec)  # fmt: skip
    drafts = Drafts(acceptance(text), 1) if spec else None
    sim.add("r", 1000, new, 0.0, drafts)
    events = sim.advance(1e9)
    assert sum(e.count for e in events) == new and events[-1].finished
    return sim


def test_the_scheduler_emits_accepted_tokens_together_and_stops_at_max_new():
    spec = Speculation("EAGLE3", 3, 1, 4)
    sim = _one_request(spec, "a b " * 500, new=101)
    req = sim.requests["r"]
    assert req.generated == 101 and len(req.token_times) == 101
    assert 101 / req.drafts.verify_ct > 2.5  # a repetitive prompt: long accepts
    plain = _one_request(None, "")
    assert sim.requests["r"].finished_at < plain.requests["r"].finished_at


def test_the_telling_time_never_passes_a_speculative_finish():
    """On a shared clock the engine bounds time at the next first or last token; a verify that
    can finish a request early (4 tokens at once) must count as telling."""
    spec = Speculation("EAGLE3", 3, 1, 4)
    sim = ReplicaSim(CostModel(Profile(), tp=32, pp=1, ep=4, gpus_per_node=8),
                     chunk_size=8192, max_running=48, spec=spec)  # fmt: skip
    for i in range(3):
        sim.add(f"r{i}", 2000, 30 + i, 0.0, Drafts(0.86, i))
    while (nxt := sim.next_event_time()) is not None:
        bound = sim.next_telling_time()
        for event in sim.advance(nxt):
            if event.finished or event.generated == event.count:
                assert event.time >= bound - 1e-12


def test_the_twin_shows_tp32_eagle_faster_than_tp32():
    """Offline, on the mission's prompts: speculation lowers TPOT (mean) and the run's
    duration; the verify's extra experts keep high-entropy requests from gaining much."""
    cluster = load_cluster(ROOT / "clusters" / "local.yaml")
    prompts, lens = mission.mission_prompts(cluster), mission.mission_input_lens(cluster)
    profile = mission.profile_of(cluster)
    runs = {name: mission.summarize_twin(mission.simulate_deployment(
                profile, mission.deployment(cluster, name), lens, prompts=prompts))
            for name in ("tp32", "tp32-eagle")}  # fmt: skip
    assert mission.deployment(cluster, "tp32-eagle").spec == Speculation("EAGLE3", 3, 1, 4)
    assert runs["tp32-eagle"].tpot_ms.mean < 0.85 * runs["tp32"].tpot_ms.mean
    assert runs["tp32-eagle"].duration_s < runs["tp32"].duration_s


def test_the_gauges_appear_at_the_first_decode_log_as_sglangs_do():
    """SGLang sets sglang:spec_accept_length at each decode log (every 40 decode steps): no
    sample before the first, 0 on a server that does not speculate; a finishing request's
    drafts beyond its max_new_tokens are not counted there."""
    plain = SpecCounters()
    for _ in range(39):
        plain.decoded(40)
    assert not plain.logged
    plain.decoded(40)
    assert plain.logged and plain.accept_length == 0.0
    spec = Speculation("EAGLE3", 3, 1, 4)
    sim = ReplicaSim(CostModel(Profile(), tp=32, pp=1, ep=4, gpus_per_node=8),
                     chunk_size=8192, max_running=48, spec=spec, decode_log_interval=5)  # fmt: skip
    sim.add("r", 100, 6, 0.0, Drafts(1.0, 1))  # every draft accepted: 1 + 4 tokens, then 1
    sim.advance(1e9)
    assert sim.requests["r"].drafts.verify_ct == 2 and sim.requests["r"].generated == 6
    assert sim.spec_counters.window_tokens == (3 + 1) + (0 + 1)  # kept drafts + the own token
