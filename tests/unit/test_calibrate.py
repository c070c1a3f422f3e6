"""The calibration tool and the twin of a cluster file's run (offline, no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.mock import calibrate as cal
from pytest_kimi.mock import mission
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.tokenizer_files import count_tokens

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "clusters" / "local.yaml"
SEED = ROOT / "pytest_kimi" / "data" / "seed_target.json"
# a start that knows nothing of the seed: the fit has to find the fitted constants itself
NEUTRAL = {
    "mfu": 0.25, "intra_node_latency_us": 10.0, "inter_node_latency_us": 30.0,
    "step_overhead_ms": 10.0,
}  # fmt: skip


@pytest.fixture(scope="module")
def local():
    cluster = load_cluster(LOCAL)
    deps = {name: mission.deployment(cluster, name) for name in cluster.layouts}
    return cluster, deps, mission.mission_input_lens(cluster)


def _directions(cells: dict[str, dict[str, float]]) -> dict[str, bool]:
    return {c: cells["pp8"][c] > cells["tp32"][c] for c in cal.CELLS}


def test_the_shipped_profile_lands_within_20pct_of_the_seed_with_every_direction(local):
    """Done-when bullet 2's offline half: the mission's command on the mock (the twin with an
    instant client, which the live mock equals) against the seed, every cell of both layouts."""
    cluster, deps, lens = local
    target = cal.load_target(SEED)
    result = cal.calibrate(target, [], deps, lens, mission.profile_of(cluster))
    for name, errors in result.errors(target).items():
        worst = max(errors, key=lambda c: abs(errors[c]))
        assert abs(errors[worst]) < 0.20, (name, worst, errors[worst])
    assert _directions(result.layouts) == _directions(target)


def test_a_fit_on_tp32_alone_fits_tp32_and_fixes_its_decode_step_not_its_split(local):
    """From a neutral start, tp32 alone fits its own twelve cells, and its decode step (step
    overhead + 122 all-reduces' ring latencies) lands on the two-layout fit's: that sum is what
    tp32 shows. How the sum splits between the overhead (paid 8 times by PP8) and the link
    latencies, and ``mfu`` (tp32's prefill is network bound), tp32 cannot show: its pp8
    prediction is not held to 20% (docs/mock.md, "What one layout can fix")."""
    _, deps, lens = local
    target = cal.load_target(SEED)
    result = cal.calibrate(target, ["tp32"], deps, lens, Profile(**NEUTRAL), max_evals=40)
    errors = result.errors(target)
    assert all(abs(e) < 0.20 for e in errors["tp32"].values()), errors["tp32"]

    def decode_step(profile: Profile) -> float:
        cost = CostModel(profile, tp=32, pp=1, ep=4, gpus_per_node=8)
        return cost.stage_time([], [16384] * 4)

    assert decode_step(result.profile) == pytest.approx(decode_step(Profile()), rel=0.10)
    assert decode_step(Profile(**NEUTRAL)) > 1.5 * decode_step(Profile())  # the start was far


def test_the_twin_summary_uses_the_product_definitions(local):
    cluster, deps, lens = local
    run = mission.simulate_deployment(mission.profile_of(cluster), deps["tp32"], lens)
    figures = mission.summarize_twin(run).to_dict()
    ttft = [r.first_token_at - r.arrival for r in run.requests]
    tpot = [(r.finished_at - r.first_token_at) / (r.generated - 1) for r in run.requests]
    assert figures["mean_ttft_ms"] == pytest.approx(1000 * np.mean(ttft))
    assert figures["p95_tpot_ms"] == pytest.approx(1000 * np.percentile(tpot, 95))
    assert figures["duration"] == pytest.approx(run.duration)
    assert figures["total_input_tokens"] == sum(lens)
    assert figures["completed"] == 40 and figures["median_itl_ms"] > 0


def test_twin_prompts_are_the_measured_prompts_of_the_run(local):
    """The warm-up prompt is sent first and not measured: the twin starts at the second."""
    cluster, _, lens = local
    from pytest_kimi.workload.dataset import load_workload, resolve_dataset

    wl = cluster.workload
    every = load_workload(
        resolve_dataset(wl.dataset, cluster.path.parent),
        num_requests=wl.num_requests + wl.warmup_requests,
        seed=wl.seed,
    ).prompts
    assert len(lens) == wl.num_requests == 40 and wl.warmup_requests == 1
    assert lens == [count_tokens(p.text) for p in every[1:]]
    assert min(lens) > 15000 and max(lens) < 17500 and len(set(lens)) > 10


def test_target_files_json_yaml_aliases_and_a_single_summary(tmp_path):
    (tmp_path / "t.yaml").write_text("tp32: {ttft_p95: 20790, duration: 238.18, backend: x}\n")
    assert cal.load_target(tmp_path / "t.yaml") == {
        "tp32": {"p95_ttft_ms": 20790.0, "duration": 238.18}
    }
    summary = {"layout": "pp8", "mean_tpot_ms": 126.86, "completed": 40, "notes": []}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert cal.load_target(tmp_path / "summary.json") == {"pp8": {"mean_tpot_ms": 126.86}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"tp32": {"mean_ttft_ms": "8s"}}', r"t.json: tp32.mean_ttft_ms: expected a number"),
        ('{"tp32": {"duration": 0}}', r"t.json: tp32.duration: must be positive"),
        ('{"tp32": {"completed": 40}}', r"t.json: tp32: none of the known metrics"),
        ('{"tp32": [1]}', r"t.json: tp32: expected a mapping"),
        ("[1, 2]", r"t.json: expected a mapping of layout name"),
        ("{", r"t.json: not valid json"),
    ],
)
def test_bad_target_files_name_the_file_and_field(tmp_path, text, message):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(cal.TargetError, match=message):
        cal.load_target(tmp_path / "t.json")


def test_cli_predicts_every_layout_as_json_and_refuses_an_unknown_layout(tmp_path, capsys):
    target = tmp_path / "t.json"
    target.write_text(json.dumps({"pp8": {"mean_tpot_ms": 126.86}}))
    assert cal.main(["--target", str(target), "--cluster", str(LOCAL), "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert set(data["layouts"]) == {"pp8"} and set(data["layouts"]["pp8"]) == set(cal.CELLS)
    assert data["fit_layouts"] == [] and data["fitted"] == {}
    assert data["profile"]["step_overhead_ms"] == 12.0
    assert "pp8 twin (predicted)" in err
    code = cal.main(["--target", str(target), "--cluster", str(LOCAL), "--fit-layout", "tp32"])
    assert code == 2
    assert "--fit-layout tp32: not in the target" in capsys.readouterr().err


def test_nelder_mead_finds_a_quadratic_minimum():
    best = cal.nelder_mead(lambda x: float(np.sum((x - [1.0, -2.0]) ** 2)), np.zeros(2))
    assert best == pytest.approx([1.0, -2.0], abs=0.02)
