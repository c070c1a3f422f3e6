"""The calibration tool and the twin of a cluster file's run (offline, no processes)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.mock import calibrate as cal
from pytest_kimi.mock import mission
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.tokenizer_files import count_tokens

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "clusters" / "local.yaml"
SEED = ROOT / "pytest_kimi" / "data" / "seed_target.json"
KNOBS = ["mfu", "step_overhead"]


@pytest.fixture(scope="module")
def local():
    cluster = load_cluster(LOCAL)
    deps = {name: mission.deployment(cluster, name) for name in mission.unified_layouts(cluster)}
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


def _misses(cells: dict[str, dict[str, float]], target, name: str) -> list[str]:
    """What keeps ``name`` from the done-when bar: cells off by 20% or more, wrong directions."""
    off = [c for c, v in target[name].items() if abs(cells[name][c] / v - 1) >= 0.20]
    wrong = [c for c, d in _directions(cells).items() if d != _directions(target)[c]]
    return off + [f"direction of {c}" for c in wrong]


@pytest.mark.parametrize(
    ("fit", "other", "start", "max_evals"),
    [
        # tp32's prefill is network bound, so it shows mfu only weakly and pp8's TTFT p95
        # lands at -19.8% (docs/mock.md): the fit has to converge, which 40 simulations do
        ("tp32", "pp8", {"mfu": 0.2, "step_overhead_ms": 20.0}, 40),
        # a pp8 simulation is ~7x a tp32 one; twelve of them get there from this start
        ("pp8", "tp32", {"mfu": 0.05, "step_overhead_ms": 25.0}, 12),
    ],
)
def test_fitted_on_one_layout_the_other_is_predicted_within_20pct_with_every_direction(
    local, fit, other, start, max_evals
):
    """Done-when bullet 1: only ``mfu`` and ``step_overhead_ms`` are fitted, on one layout;
    every cell of the other lands within 20% of the seed and all twelve directions (pp8 vs
    tp32) match it. The start's own prediction misses, so the fit is what gets it there."""
    cluster, deps, lens = local
    target = cal.load_target(SEED)
    first = replace(mission.profile_of(cluster), **start)
    start_cells = {name: cal.predict(first, deps[name], lens) for name in target}
    assert _misses(start_cells, target, other)  # the start is not the answer
    result = cal.calibrate(target, [fit], deps, lens, first, knobs=KNOBS, max_evals=max_evals)
    assert set(result.fitted) == {"mfu", "step_overhead_ms"}
    assert _misses(result.layouts, target, other) == [], result.errors(target)[other]
    assert _misses(result.layouts, target, fit) == [], result.errors(target)[fit]


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
    assert data["profile"]["step_overhead_ms"] == Profile().step_overhead_ms
    assert "pp8 twin (predicted)" in err
    code = cal.main(["--target", str(target), "--cluster", str(LOCAL), "--fit-layout", "tp32"])
    assert code == 2
    assert "--fit-layout tp32: not in the target" in capsys.readouterr().err


def test_minimise_finds_a_quadratic_minimum_within_its_budget():
    calls = []

    def f(x: np.ndarray) -> float:
        calls.append(x)
        return float(np.sum((x - [1.0, -2.0]) ** 2))

    best = cal.minimise(f, np.zeros(2), max_evals=200)
    assert len(calls) <= 200
    assert best == pytest.approx([1.0, -2.0], abs=0.02)
