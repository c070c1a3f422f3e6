"""The run folder's owner: what is written is read back exactly, nothing recomputed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_kimi.report.comparison import build_comparison
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.metrics import summarize
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.results.slo import evaluate, parse_slo
from pytest_kimi.results.store import RunFolder, SavedRunError, load_layout
from pytest_kimi.results.summary import Summary


def _records(seed: int, n: int = 12) -> list[RequestRecord]:
    warm = RequestRecord(-1, "warm", 10, 4, send_time=0.0, first_token_time=0.1, end_time=0.2,
                         chunks=[Chunk(0.1, 1)], completion_tokens=4, success=True,
                         warmup=True)  # fmt: skip
    out = [warm]
    for i in range(n):
        first = 1.0 + i + (seed * 7919 + i * 104729) % 97 / 1000.0
        chunks = [Chunk(first + k * (0.011 + seed / 1000), 1) for k in range(8)]
        out.append(RequestRecord(i, f"p{i}", 100, 8, send_time=1.0 + i * 0.3,
                                 first_token_time=first, end_time=chunks[-1].time, chunks=chunks,
                                 completion_tokens=8, success=i != 3,
                                 error="" if i != 3 else "boom"))  # fmt: skip
    return out


def _result(name: str, seed: int) -> LayoutResult:
    records = _records(seed)
    summary = summarize(records, time_scale=40.0, percentiles=[50, 90, 95, 97.5],
                        goodput_limits_ms={"ttft": 40000.0, "tpot": 600.0})  # fmt: skip
    slos = [parse_slo("ttft_p95", "30s", "test"), parse_slo("goodput", "0.01", "test")]
    return LayoutResult(name, name.upper(), summary, [evaluate(s, summary) for s in slos],
                        notes=["a note"], records=records)  # fmt: skip


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_summary_round_trips_exactly_through_json() -> None:
    summary = _result("wide", 1).summary
    assert summary is not None
    back = Summary.from_dict(json.loads(json.dumps(summary.to_dict())))
    for name in summary.metric_names():
        assert _same(back.metric(name), summary.metric(name)), name
    assert back.goodput_limits_ms == summary.goodput_limits_ms
    assert back.percentiles == summary.percentiles and not math.isnan(back.goodput)


def test_read_back_gives_the_live_comparison_byte_for_byte(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "run")
    live = [_result("wide", 1), _result("deep", 2)]
    for result in live:
        folder.write_records(result.name, result.records)
        folder.write_summary(result, "mock", 40.0)
    stored = [folder.read_layout("wide"), folder.read_layout("deep")]
    a = build_comparison(live, run_id="r", backend="mock", time_scale=40.0)
    b = build_comparison(stored, run_id="r", backend="mock", time_scale=40.0)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    goodput = next(r for r in b["rows"] if r["metric"] == "goodput")
    assert goodput["values"]["wide"] is not None  # stored, not recomputed without its limits


def test_an_unmeasured_layout_reads_back_without_figures(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "run")
    failed = LayoutResult("wide", "W", error="run interrupted after 3 of 12 requests finished",
                          records=_records(1)[:4])  # fmt: skip
    folder.write_records("wide", failed.records)
    folder.write_summary(failed, "mock", 40.0)
    back = folder.read_layout("wide")
    assert back.summary is None and back.error == failed.error and len(back.records) == 4
    saved = json.loads((tmp_path / "run" / "wide" / "summary.json").read_text())
    assert saved["complete"] is False


def test_a_folder_without_summary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SavedRunError, match=r"summary\.json: not a saved layout result"):
        load_layout(tmp_path)
