"""The history store: runs and their results go in whole, come back as written, and writers
that finish at the same moment all land."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kimi.judge.history import History, HistoryError, RunRecord
from pytest_kimi.judge.history.__main__ import main
from pytest_kimi.judge.history.store import ResultRecord


def run(n: int, *, complete: bool = True, commit: str = "") -> RunRecord:
    return RunRecord(
        run_id=f"2026120{n}-010000-local-dp2", finished_at=f"2026-12-0{n}T01:00:00+00:00",
        cluster="local", cluster_sha256="ab" * 32, backend="mock", time_scale=40.0,
        git_commit=commit or f"c0ffee{n}", sglang="0.5.9", router="0.3.2", pytest_kimi="0.1.0",
        complete=complete, incomplete=() if complete else ("pp8: not run: interrupted",),
        uid=f"uid{n}",
    )  # fmt: skip


def result(layout: str, point: str, tpot: float, error: str = "", exp: str = "e8") -> ResultRecord:
    return ResultRecord(layout, point, exp, {"concurrency": 8, "request_rate": "inf"},
                        {"tpot_mean": tpot, "ttft_p95": None}, {"tpot": [tpot - 1, tpot + 1]},
                        error)  # fmt: skip


@pytest.fixture
def history(tmp_path: Path) -> History:
    store = History(tmp_path / "sub" / "history.sqlite")
    store.append(run(1), [result("tp32", "", 60.0), result("pp8", "", 110.0)])
    store.append(run(2, complete=False), [result("tp32", "", 62.0)])  # stopped before pp8
    store.append(run(3), [result("tp32", "", 61.0), result("pp8", "", 0, error="BringUpError")])
    store.append(run(4), [result("tp32", "", 30.0, exp="e32")])  # another experiment
    return store


def test_runs_and_results_come_back_as_written(history: History) -> None:
    assert [r.run_id for r in history.runs()] == [run(n).run_id for n in (1, 2, 3, 4)]
    assert history.runs()[1] == run(2, complete=False)
    [tp32, pp8] = history.results(run(1).run_id)
    assert tp32 == result("tp32", "", 60.0) and pp8.metrics["tpot_mean"] == 110.0


def test_a_series_is_one_experiments_measured_results_oldest_first(history: History) -> None:
    tp32 = history.series("e8", "tp32", "", "tpot_mean", cluster="local")
    assert [(e.run.git_commit, e.value, list(e.samples)) for e in tp32] == [
        ("c0ffee1", 60.0, [59.0, 61.0]),
        ("c0ffee2", 62.0, [61.0, 63.0]),  # the run stopped later, at another layout
        ("c0ffee3", 61.0, [60.0, 62.0]),
    ]

    def values(exp: str, layout: str, cluster: str = "local") -> list[float | None]:
        return [e.value for e in history.series(exp, layout, "", "tpot_mean", cluster=cluster)]

    assert values("e8", "pp8") == [110.0] and values("e32", "tp32") == [30.0]
    assert values("e8", "tp32", cluster="other") == []  # another cluster's runs are not in it


def test_two_runs_with_one_id_are_told_apart_by_uid(history: History) -> None:
    history.append(replace(run(1), uid="other"), [result("tp32", "", 70.0)])
    with pytest.raises(HistoryError, match=r"2 runs have the id .*give one of their uids"):
        history.results(run(1).run_id)
    assert history.results("other")[0].metrics["tpot_mean"] == 70.0


def test_a_run_goes_in_whole_or_not_at_all(history: History) -> None:
    bad = ResultRecord("tp32", "", "e8", {}, {"tpot_mean": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        history.append(run(5), [result("tp32", "", 1.0), bad])
    assert len(history.runs()) == 4  # no run row without its results


def test_numbers_that_are_not_finite_are_kept_as_null(tmp_path: Path) -> None:
    store = History(tmp_path / "h.sqlite")
    figures = {"tpot_mean": float("nan"), "output_throughput": float("inf")}
    store.append(run(1), [ResultRecord("tp32", "", "e8", {}, figures)])
    assert store.results(run(1).run_id)[0].metrics == {"tpot_mean": None, "output_throughput": None}


def test_another_schema_version_is_named(history: History) -> None:
    with sqlite3.connect(history.path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(HistoryError, match="history schema '99', this pytest-kimi reads 1"):
        history.runs()
    with pytest.raises(HistoryError, match="history schema '99'"):
        history.append(run(5), [])


def _append(path: str, n: int, start) -> None:
    start.wait()  # every writer begins at the same moment
    History(Path(path)).append(
        RunRecord(f"run-{n}", "2026-12-05T00:00:00+00:00", "local", "ab" * 32, "mock", 40.0),
        [ResultRecord("tp32", f"c{k}", "e", {}, {"tpot_mean": float(k)}) for k in range(20)],
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
    assert len(lines) == 4 and "commit c0ffee1" in lines[0] and "INCOMPLETE" in lines[1]
    assert main([str(history.path), "show", run(3).run_id]) == 0
    out = capsys.readouterr().out
    assert "tp32 (experiment e8): ttft_p95 n/a  tpot_mean 61" in out
    assert "pp8: not measured: BringUpError" in out
    # the newest run measured tp32 in experiment e32; --experiment picks another
    assert main([str(history.path), "series", "tp32", "tpot_mean", "--json"]) == 0
    assert [e["value"] for e in json.loads(capsys.readouterr().out)] == [30.0]
    assert main([str(history.path), "series", "tp32", "tpot_mean", "--experiment", "e8"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [[run(n).run_id, f"c0ffee{n}", v] for n, v in ((1, "60"), (2, "62"), (3, "61"))]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["series", "tp9", "tpot_mean"], "no case 'tp9' on local (it has: pp8, tp32)"),
        (["series", "tp32", "tpot_sum"], "unknown metric 'tpot_sum'"),
        (["series", "tp32", "tpot_mean", "--cluster", "c2"], "no runs on cluster 'c2'"),
        (["show", "nope"], "no run 'nope' in the history"),
    ],
)
def test_the_command_line_names_what_is_not_there(
    history: History, capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    assert main([str(history.path), *args]) == 2
    assert problem in capsys.readouterr().err


def test_a_history_that_cannot_be_written_is_said_and_the_run_goes_on(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pytest_kimi.judge.runhistory import RunHistory

    said: list[str] = []
    folder = tmp_path / "a-folder"
    folder.mkdir()  # where the history file should be: a folder cannot take it
    inputs = SimpleNamespace(
        history_path=folder, options=SimpleNamespace(commit=None),
        cluster=SimpleNamespace(name="local", sha256="ab" * 32),
        backend="mock", time_scale=40.0,
    )  # fmt: skip
    history = RunHistory(inputs, said.append)  # type: ignore[arg-type]
    history.append("20261205-010000-local-dp2", [], {"incomplete": [], "setup": {}})
    [line] = said
    assert line.startswith(f"[kimi] history NOT written: {folder}: ")
