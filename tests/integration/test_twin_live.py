"""The twin check on the live product path: the mock's DP2 run of tp32, pp8 and tp32-cp4k,
and the disaggregated pd-pp8-tp32 (a PP8 prefill server handing each prompt's KV cache to a
TP32 decode server), through the real router and the product's client, must equal the offline
twin of the same prompts, show the seed's headline trade-off (PP8: lower TTFT p95, higher
TPOT, longer, lower throughput) and what its proposal expects of disaggregation (TTFT near
PP8's, TPOT no worse than TP32's), move TTFT and TPOT with a smaller chunked prefill as
the model predicts, and, speculating (tp32-eagle), accept more drafts on low-entropy prompts
than on high-entropy ones and decode faster than tp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.mock import mission
from pytest_kimi.mock.calibrate import CELLS  # the seed table's twelve cells
from pytest_kimi.testing.processes import shipped_mission
from pytest_kimi.testing.realsglang import router_python

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
LOCAL = ROOT / "clusters" / "local.yaml"
TOLERANCE = 0.01  # each live cell within 1% of the twin: two live runs within 2% of each other


@pytest.fixture(scope="module")
def mission_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of the mission's command on the mock, with tp32-cp4k; its run folder. It plays
    the cluster at 5x the shipped time scale: on one clock, cluster time (all the twin knows)
    does not depend on how fast the wall clock plays it."""
    work = tmp_path_factory.mktemp("twin-live")
    return shipped_mission(work, "--layout=tp32,pp8,tp32-cp4k,pd-pp8-tp32,tp32-eagle")


@pytest.mark.parametrize("layout", ["tp32", "pp8", "tp32-cp4k", "pd-pp8-tp32", "tp32-eagle"])
def test_the_live_mock_equals_its_twin_on_every_seed_cell(mission_run: Path, layout: str):
    """The mock's model, run live (8 server processes, the router, the product's client, one
    shared clock), gives what the offline twin gives on the same prompts: the wall time of
    client, router and HTTP is kept out of cluster time (docs/mock.md, "One clock"); for the
    disaggregated layout also the wall time of the two sides' notices to each other."""
    cluster = load_cluster(LOCAL)
    lens = mission.mission_input_lens(cluster)
    records = [json.loads(line) for line in (mission_run / layout / "records.jsonl").open()]
    measured = sorted((r for r in records if r["index"] >= 0), key=lambda r: r["index"])
    assert [r["prompt_tokens"] for r in measured] == lens  # the same prompts, in order
    twin = _twin(cluster, layout)
    live = json.loads((mission_run / layout / "summary.json").read_text())
    off = {
        cell: round(live[cell] / twin[cell] - 1, 4)
        for cell in CELLS
        if abs(live[cell] / twin[cell] - 1) > TOLERANCE
    }
    clock = [n for n in live["notes"] if n.startswith("one clock")]
    assert not off, (f"live vs twin beyond {TOLERANCE:.0%}: {off}", clock)
    notes = " ".join(live["notes"])
    assert "one clock:" in notes and "nobody let go" not in notes, live["notes"]


def test_mock_dp2_reproduces_the_seed_directions(mission_run: Path):
    rows = {
        r["metric"]: r["values"]
        for r in json.loads((mission_run / "comparison.json").read_text())["rows"]
    }

    def lower(metric: str) -> bool:
        return rows[metric]["pp8"] < rows[metric]["tp32"]

    assert lower("ttft_p95"), rows["ttft_p95"]
    for metric in ("tpot_mean", "tpot_median", "tpot_p95", "duration"):
        assert not lower(metric), (metric, rows[metric])
    for metric in ("input_throughput", "output_throughput", "total_throughput"):
        assert lower(metric), (metric, rows[metric])


def _twin(cluster, layout: str) -> dict:
    lens = mission.mission_input_lens(cluster)
    if cluster.layout(layout).disaggregated:
        return mission.summarize_twin(mission.simulate_pd_layout(cluster, layout, lens)).to_dict()
    deployment = mission.deployment(cluster, layout)
    prompts = mission.mission_prompts(cluster)  # speculation accepts by the prompt's text
    return mission.summarize_twin(
        mission.simulate_deployment(mission.profile_of(cluster), deployment, lens,
                                    prompts=prompts)
    ).to_dict()


def test_disaggregation_keeps_pp8s_ttft_and_tp32s_tpot(mission_run: Path):
    """The seed's proposal: prefill on PP8 (its TTFT p95 was the better), decode on TP32 (its
    TPOT was). The KV cache now crosses the network (1.15 GB a 16K prompt, to each of 32
    decode ranks), and one prefill replica serves every prompt, so TTFT p95 comes close to
    PP8's rather than below it; decoding alone, the TP32 side's TPOT is below TP32's."""
    summary = {name: json.loads((mission_run / name / "summary.json").read_text())
               for name in ("tp32", "pp8", "pd-pp8-tp32")}  # fmt: skip
    pd, pp8, tp32 = summary["pd-pp8-tp32"], summary["pp8"], summary["tp32"]
    assert abs(pd["p95_ttft_ms"] / pp8["p95_ttft_ms"] - 1) < 0.25, (pd["p95_ttft_ms"], pp8)
    assert pd["p95_ttft_ms"] < tp32["p95_ttft_ms"]
    assert pd["mean_tpot_ms"] < tp32["mean_tpot_ms"] and pd["p95_tpot_ms"] < tp32["p95_tpot_ms"]


def test_a_smaller_chunked_prefill_moves_ttft_and_tpot_as_the_model_predicts(mission_run: Path):
    """tp32-cp4k is tp32 with ``chunked-prefill-size: 4096`` (its own ``args``): a 16K prompt
    takes four prefill steps instead of two, each paying the per-step overhead, so the model
    predicts a longer TTFT and, with more steps between decodes, a longer TPOT. The live run
    must move the same way, by about as much."""
    cluster = load_cluster(LOCAL)
    twin = {name: _twin(cluster, name) for name in ("tp32", "tp32-cp4k")}
    live = {name: json.loads((mission_run / name / "summary.json").read_text())
            for name in ("tp32", "tp32-cp4k")}  # fmt: skip
    for cell in ("mean_ttft_ms", "mean_tpot_ms", "p95_tpot_ms"):
        predicted = twin["tp32-cp4k"][cell] / twin["tp32"][cell] - 1
        measured = live["tp32-cp4k"][cell] / live["tp32"][cell] - 1
        assert predicted > 2 * TOLERANCE, (cell, predicted)  # the model says it matters
        assert measured > 0 and abs(measured - predicted) <= 2 * TOLERANCE, (
            cell, predicted, measured)  # fmt: skip


def test_speculation_accepts_more_on_low_entropy_and_decodes_faster(mission_run: Path):
    """SPEED-Bench's point: acceptance depends on the text. The client's per-request counts
    (meta_info) give the accept length overall and per category; low entropy accepts more
    than high entropy, and TPOT (mean) is below tp32's. The twin predicts the same lengths."""
    eagle = json.loads((mission_run / "tp32-eagle" / "summary.json").read_text())
    tp32 = json.loads((mission_run / "tp32" / "summary.json").read_text())
    assert eagle["spec_accept_length_source"] == "meta_info"
    by = eagle["by_category"]
    assert sorted(by) == ["high_entropy", "low_entropy", "mixed"]
    lengths = {name: by[name]["spec_accept_length"] for name in by}
    assert lengths["low_entropy"] > lengths["mixed"] > lengths["high_entropy"] > 1.0, lengths
    assert eagle["mean_tpot_ms"] < tp32["mean_tpot_ms"]
    assert tp32["spec_accept_length"] is None and "mean_tpot_ms" in tp32["by_category"]["mixed"]
    twin = _twin(load_cluster(LOCAL), "tp32-eagle")
    assert eagle["spec_accept_length"] == pytest.approx(twin["spec_accept_length"], rel=TOLERANCE)


def test_the_shipped_mission_names_smg_as_its_router(mission_run: Path):
    """Behind the default router (``router.package: auto``: smg in the project's venv), each
    layout names smg's true release and launch line (tests/integration/test_router_packages.py
    holds sglang-router 0.3.2 to the same)."""
    from test_router_packages import assert_routed_by

    assert_routed_by(mission_run, ("tp32", "pp8", "tp32-cp4k"), router_python("smg", ""), "smg")
