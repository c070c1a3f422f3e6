"""The report of a sweep: the set-up from the manifests, a table per workload point, the Pareto
view and the verdict table, in Markdown, JSON and HTML, all from the same numbers."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from pytest_kimi.config import Layout
from pytest_kimi.config.points import Point
from pytest_kimi.report import reporting
from pytest_kimi.report.comparison import render_markdown
from pytest_kimi.report.html import render_html
from pytest_kimi.report.matrix import meets_every_slo, verdict_table
from pytest_kimi.report.setup import NOT_SET, experiment_setup, split_flags
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.slo import evaluate, parse_slo


def records(tpot_s: float, n: int = 8, tokens: int = 5) -> list[RequestRecord]:
    """``n`` requests, one second apart, each ``tokens`` tokens ``tpot_s`` apart."""
    out = []
    for i in range(n):
        first = i + 0.5
        chunks = [Chunk(first + k * tpot_s, 1) for k in range(tokens)]
        out.append(RequestRecord(i, f"p{i}", 100, tokens, send_time=float(i),
                                 first_token_time=first, end_time=chunks[-1].time, chunks=chunks,
                                 completion_tokens=tokens, success=True))  # fmt: skip
    return out


TPOT_LIMIT = parse_slo("tpot_p95", "150ms", "test")


def result(layout: str, point: str, concurrency: int, tpot_s: float) -> LayoutResult:
    recs = records(tpot_s)
    summary = summarize(recs)
    return LayoutResult(layout, layout.upper(), summary, [evaluate(TPOT_LIMIT, summary)],
                        records=recs, point=point,
                        point_settings={"concurrency": concurrency})  # fmt: skip


def manifest(layout: str, tp: int, pp: int, gpus: int, args: dict) -> dict:
    nodes = [f"n{i}" for i in range(8)]
    preflight = {"driver": "580.95.05", "cuda": "13.0", "gpus": [{"name": "NVIDIA H200"}] * 8}
    dataset = {"path": "/data/sb", "file_sha256": "ab" * 32, "prompts_sha256": "cd" * 32}
    return {
        "model": "/models/kimi-k3",
        "cluster": {"name": "pro6000"},
        "backend": "sglang",
        "replicas": 2,
        "layout": {
            "name": layout, "tp": tp, "pp": pp, "ep": 4, "server_args": args,
            "router_policy": "round_robin", "nodes": nodes, "gpus": gpus,
        },
        "workload": {
            "num_requests": 16, "input_len": 16384, "output_len": 512, "concurrency": 4,
            "request_rate": "inf", "api": "generate", "speedbench_config": "throughput_16k",
            "category": None, "prompt": "raw", "dataset": dataset,
        },
        "points": [
            {"id": "c4", "settings": {"concurrency": 4}},
            {"id": "c8", "settings": {"concurrency": 8}},
        ],
        "client": {"python": "3.11.7", "packages": {"pytest-kimi": "0.1.0"}},
        "nodes": [
            {"node": n, "sglang_server_version": "0.5.9", "gpu_preflight": preflight}
            for n in nodes
        ],
    }  # fmt: skip


TP32_ARGS = {"chunked-prefill-size": 8192, "disable-radix-cache": True}
PP8_ARGS = {"chunked-prefill-size": 4096, "disable-radix-cache": True, "enable-dp-attention": True}
MANIFESTS = {
    "tp32": manifest("tp32", 32, 1, 64, TP32_ARGS),
    "pp8": manifest("pp8", 4, 8, 64, PP8_ARGS),
}


def test_shared_flags_and_each_layouts_own() -> None:
    shared, own = split_flags({name: m["layout"]["server_args"] for name, m in MANIFESTS.items()})
    assert shared == {"disable-radix-cache": True}
    assert own == {
        "tp32": {"chunked-prefill-size": 8192, "enable-dp-attention": NOT_SET},
        "pp8": {"chunked-prefill-size": 4096, "enable-dp-attention": True},
    }


def test_setup_says_model_hardware_dataset_and_versions() -> None:
    setup = experiment_setup(MANIFESTS)
    assert setup["model"] == "/models/kimi-k3"
    assert setup["hardware"] == ["8 nodes: 8 x NVIDIA H200, driver 580.95.05, CUDA 13.0"]
    assert setup["dataset"]["sha256"] == "ab" * 32
    assert setup["dataset"]["workload"]["concurrency"] == "4, 8"  # swept: every value
    assert setup["tools"]["sglang (servers)"] == "0.5.9"
    assert setup["layouts"]["pp8"]["parallel"] == "TP4/PP8/EP4"


@pytest.fixture
def model() -> dict:
    results = [
        result("tp32", "c4", 4, 0.05), result("pp8", "c4", 4, 0.10),
        result("tp32", "c8", 8, 0.20), result("pp8", "c8", 8, 0.12),
    ]  # fmt: skip
    built = reporting.comparison(results, run_id="r", backend="sglang", time_scale=1.0,
                                 setup=experiment_setup(MANIFESTS))  # fmt: skip
    assert built is not None
    return built


def test_a_table_per_point_and_a_verdict_per_point(model: dict) -> None:
    assert [s["id"] for s in model["points"]] == ["c4", "c8"]
    assert [lay["name"] for lay in model["points"][1]["layouts"]] == ["tp32", "pp8"]
    c4, c8 = model["verdicts"]
    assert c4["meeting"] == ["tp32", "pp8"]
    # tp32 decodes faster at c4: more output tokens per second from the same 64 GPUs
    per_gpu = c4["output_throughput_per_gpu"]
    assert per_gpu["tp32"] > per_gpu["pp8"] and c4["best"] == "tp32"
    assert c8["meeting"] == ["pp8"] and c8["failing"] == ["tp32"] and c8["best"] == "pp8"
    json.dumps(model, allow_nan=False)  # comparison.json can hold it


def test_the_pareto_data_is_each_layouts_curve_over_concurrency(model: dict) -> None:
    tp32 = model["pareto"]["tp32"]
    assert [p["concurrency"] for p in tp32] == [4, 8]
    assert [p["meets_slos"] for p in tp32] == [True, False]
    section = model["points"][1]
    tpot_row = next(r for r in section["rows"] if r["metric"] == "tpot_p95")
    assert tp32[1]["tpot_p95"] == tpot_row["values"]["tp32"]
    assert meets_every_slo(section["layouts"][1]) and not meets_every_slo(section["layouts"][0])


def test_markdown_opens_with_the_setup_then_points_pareto_and_verdict(model: dict) -> None:
    text = render_markdown(model)
    order = ["## Set-up", "## Workload point c4", "## Workload point c8", "## Pareto view",
             "## Verdict"]  # fmt: skip
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert "| c8 | pp8 | **pp8** |" in text
    assert "`--chunked-prefill-size 8192 --enable-dp-attention (not set)`" in text
    assert "Server flags every layout shares: `--disable-radix-cache`" in text
    assert "![throughput per GPU against TPOT p95 and TTFT p95](pareto.svg)" in text


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.ids += [value for key, value in attrs if key == "id"]


def test_html_has_the_pareto_plot_and_the_verdict(model: dict) -> None:
    page = render_html(model, {})
    parser = _Ids()
    parser.feed(page)
    assert {"point-c4", "point-c8", "pareto", "verdict"} <= set(parser.ids)
    assert "none meets every SLO" not in page  # a layout meets them at each point
    assert "Server flags every layout shares" in page


def test_a_search_outcome_joins_the_verdict(model: dict) -> None:
    model["max_concurrency"] = {"tp32": {"low": 1, "high": 8, "max_concurrency": 5,
                                         "first_failing": 6, "failed_slos": ["tpot_p95"],
                                         "tried": [1, 2, 4, 8, 6, 5], "capped": False}}  # fmt: skip
    expected = "**tp32**: 5 (6 fails: tpot_p95); tried 1, 2, 4, 8, 6, 5"
    assert expected in render_markdown(model)
    assert "5 (6 fails: tpot_p95)" in render_html(model, {})


def test_failed_requests_mean_the_slos_are_not_met(model: dict) -> None:
    entry = model["points"][0]["layouts"][0]
    assert meets_every_slo(entry)
    assert not meets_every_slo({**entry, "summary": {**entry["summary"], "failed": 1}})


def test_a_curve_runs_over_concurrency_only() -> None:
    results = [result("tp32", f"c{c}-out{n}", c, 0.05) for n in (512, 1024) for c in (4, 8)]
    for r in results:
        r.point_settings["output_len"] = int(r.point.rpartition("out")[2])
    model = reporting.comparison(results, run_id="r", backend="sglang", time_scale=1.0,
                                 setup=experiment_setup(MANIFESTS))  # fmt: skip
    assert model is not None
    assert {name: [p["concurrency"] for p in curve] for name, curve in model["pareto"].items()} == {
        "tp32 (output_len 512)": [4, 8],
        "tp32 (output_len 1024)": [4, 8],
    }


POINTS = tuple(Point((("concurrency", c),), ("concurrency",)) for c in (4, 8))


def test_a_deployment_that_never_came_up_leaves_each_point_its_error() -> None:
    deployment = LayoutResult("tp32", "TP32", error="BringUpError: node603 unreachable")
    stored = {("tp32", ""): deployment}
    covered = reporting.covered([Layout("tp32", 32, 1, 4)], POINTS, stored, "", None)
    assert [(r.case, r.error) for r in covered] == [
        ("tp32-c4", "BringUpError: node603 unreachable"),
        ("tp32-c8", "BringUpError: node603 unreachable"),
    ]


def test_the_deployments_notes_are_said_once_and_an_early_stop_is_named() -> None:
    deployment = LayoutResult("tp32", "TP32", notes=["processes left running: x"])
    c8 = result("tp32", "c8", 8, 0.05)  # c4 deselected (-k c8): the notes go with c8
    covered = reporting.covered(
        [Layout("tp32", 32, 1, 4), Layout("pp8", 4, 8, 4)], POINTS,
        {("tp32", ""): deployment, ("tp32", "c8"): c8}, "interrupted (Ctrl-C or SIGTERM)", None,
    )  # fmt: skip
    assert [r.case for r in covered] == ["tp32-c4", "tp32-c8", "pp8-c4", "pp8-c8"]
    assert covered[1].notes[0] == "processes left running: x"
    assert covered[0].error == covered[3].error == "not run: interrupted (Ctrl-C or SIGTERM)"


def test_a_layout_only_undecided_slos_keep_out_is_named_apart_from_failing(model: dict) -> None:
    """At a confidence an undecided SLO is not met (nothing shows the layout fits), but the
    verdict names it undecided, not failing: more requests or runs could still pass it."""
    section = model["points"][1]
    undecided = {**section["layouts"][1],
                 "slo": [{**section["layouts"][1]["slo"][0], "passed": False,
                          "outcome": "undecided"}]}  # fmt: skip
    points = [{**section, "layouts": [section["layouts"][0], undecided]}]
    [row] = verdict_table({"points": points}, {"tp32": 64, "pp8": 64})
    assert row["meeting"] == [] and row["undecided"] == ["pp8"] and row["failing"] == ["tp32"]
    text = render_markdown({**model, "verdicts": [row]})
    assert "| c8 | none (undecided: pp8) | none meets every SLO |" in text
