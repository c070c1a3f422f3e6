"""``python -m pytest_kimi.report`` re-renders a comparison from saved folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pytest_kimi.report.__main__ import main
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord, write_records
from pytest_kimi.results.store import write_json


def _save(folder: Path, name: str, tpot_s: float) -> None:
    rng = np.random.default_rng(len(name))
    records = []
    for i in range(10):
        first = i + 1.0 + rng.random() * 0.1
        chunks = [Chunk(first + k * tpot_s, 1) for k in range(5)]
        records.append(RequestRecord(i, f"p{i}", 100, 5, send_time=float(i),
                                     first_token_time=first, end_time=chunks[-1].time,
                                     chunks=chunks, completion_tokens=5, success=True))  # fmt: skip
    folder.mkdir(parents=True)
    write_records(folder / "records.jsonl", records)
    summary = summarize(records, time_scale=40.0).to_dict()
    slo = {"name": "tpot_mean", "limit": 3000.0, "unit": "ms", "upper_bound": True,
           "source": "test", "measured": summary["mean_tpot_ms"], "passed": True}  # fmt: skip
    write_json(folder / "summary.json", {**summary, "layout": name, "label": name.upper(),
                                         "backend": "mock", "slo": [slo]})  # fmt: skip


def test_rerender_from_two_runs(tmp_path: Path, capsys):
    _save(tmp_path / "runA" / "tp32", "tp32", 0.05)
    _save(tmp_path / "runB" / "pp8", "pp8", 0.08)
    out = tmp_path / "out"
    code = main([str(tmp_path / "runA" / "tp32"), str(tmp_path / "runB" / "pp8"),
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    model = json.loads((out / "comparison.json").read_text())
    assert [lay["name"] for lay in model["layouts"]] == ["tp32", "pp8"]
    tpot = next(r for r in model["rows"] if r["metric"] == "tpot_mean")
    assert abs(tpot["delta"]["pp8"] - 0.6) < 1e-9
    assert tpot["ci"]["pp8"]["excludes_zero"] is True
    assert (out / "report.html").read_text().count("<svg") >= 5
    assert "tpot_mean" in (out / "comparison.md").read_text()
    assert "pp8 vs tp32" in capsys.readouterr().out


def test_same_layout_from_two_runs_is_told_apart(tmp_path: Path):
    _save(tmp_path / "monday" / "tp32", "tp32", 0.05)
    _save(tmp_path / "tuesday" / "tp32", "tp32", 0.06)
    assert main([str(tmp_path / "monday" / "tp32"), str(tmp_path / "tuesday" / "tp32"),
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    names = [
        lay["name"] for lay in json.loads((tmp_path / "comparison.json").read_text())["layouts"]
    ]
    assert names == ["monday/tp32", "tuesday/tp32"]


def test_not_a_result_folder_is_a_clear_error(tmp_path: Path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "summary.json: not a saved layout result" in capsys.readouterr().err
