"""The history store: runs and their results go in whole, come back as written, and writers
that finish at the same moment all land."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from pytest_kimi.history import History, HistoryError, RunRecord
from pytest_kimi.history.__main__ import main
from pytest_kimi.history.store import ResultRecord


def run(n: int, *, complete: bool = True, commit: str = "") -> RunRecord:
    return RunRecord(
        run_id=f"2026120{n}-010000-local-dp2", finished_at=f"2026-12-0{n}T01:00:00+00:00",
        cluster="local", cluster_sha256="ab" * 32, backend="mock", time_scale=40.0,
        git_commit=commit or f"c0ffee{n}", sglang="0.5.9", router="0.3.2", pytest_kimi="0.1.0",
        complete=complete, incomplete=() if complete else ("tp32: not run: interrupted",),
    )  # fmt: skip


def result(layout: str, point: str, tpot: float, error: str = "") -> ResultRecord:
    return ResultRecord(layout, point, {"concurrency": 8, "request_rate": "inf"},
                        {"tpot_mean": tpot, "ttft_p95": None}, {"tpot": [tpot - 1, tpot + 1]},
                        error)  # fmt: skip


@pytest.fixture
def history(tmp_path: Path) -> History:
    store = History(tmp_path / "sub" / "history.sqlite")
    store.append(run(1), [result("tp32", "", 60.0), result("pp8", "", 110.0)])
    store.append(run(2, complete=False), [result("tp32", "", 99.0)])
    store.append(run(3), [result("tp32", "", 61.0), result("pp8", "", 0, error="BringUpError")])
    return store


def test_runs_and_results_come_back_as_written(history: History) -> None:
    assert [r.run_id for r in history.runs()] == [run(n).run_id for n in (1, 2, 3)]
    assert history.runs()[1] == run(2, complete=False)
    [tp32, pp8] = history.results(run(1).run_id)
    assert tp32 == result("tp32", "", 60.0) and pp8.metrics["tpot_mean"] == 110.0


def test_a_series_holds_only_complete_runs_and_measured_results(history: History) -> None:
    tp32 = history.series("local", "tp32", "", "tpot_mean")
    assert [(e.run.git_commit, e.value, list(e.samples)) for e in tp32] == [
        ("c0ffee1", 60.0, [59.0, 61.0]),
        ("c0ffee3", 61.0, [60.0, 62.0]),
    ]
    assert [e.value for e in history.series("local", "pp8", "", "tpot_mean")] == [110.0]
    assert history.series("other-cluster", "tp32", "", "tpot_mean") == []


def test_a_run_is_kept_once(history: History) -> None:
    with pytest.raises(HistoryError, match="is already in the history"):
        history.append(run(1), [])
    assert len(history.runs()) == 3


def _append(path: str, n: int, start) -> None:
    start.wait()  # every writer begins at the same moment
    History(Path(path)).append(
        RunRecord(f"run-{n}", "2026-12-05T00:00:00+00:00", "local", "ab" * 32, "mock", 40.0),
        [ResultRecord("tp32", f"c{k}", {}, {"tpot_mean": float(k)}) for k in range(20)],
    )


def test_concurrent_writers_all_land(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(6)
    writers = [context.Process(target=_append, args=(str(path), n, start)) for n in range(6)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(120)
    assert [w.exitcode for w in writers] == [0] * 6
    store = History(path)
    assert sorted(r.run_id for r in store.runs()) == [f"run-{n}" for n in range(6)]
    assert all(len(store.results(f"run-{n}")) == 20 for n in range(6))


def test_a_file_that_is_not_a_history_is_named(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database, long enough to have a header " * 20)
    with pytest.raises(HistoryError, match=rf"{text}: not a usable history file"):
        History(text).runs()
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(HistoryError, match=rf"{other}: not a pytest-kimi history file"):
        History(other).runs()
    with pytest.raises(HistoryError, match="no history file here"):
        History(tmp_path / "missing.sqlite").runs()


def test_the_command_line_lists_shows_and_follows_a_metric(
    history: History, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(history.path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "commit c0ffee1" in lines[0] and "INCOMPLETE" in lines[1]
    assert main([str(history.path), "show", run(3).run_id]) == 0
    out = capsys.readouterr().out
    assert "tp32: ttft_p95 n/a  tpot_mean 61" in out and "pp8: not measured: BringUpError" in out
    assert main([str(history.path), "--json", "series", "tp32", "tpot_mean"]) == 0
    assert [e["value"] for e in json.loads(capsys.readouterr().out)] == [60.0, 61.0]
    assert main([str(history.path), "series", "tp9", "tpot_mean"]) == 2
    assert "no layout in 'tp9'" in capsys.readouterr().err
