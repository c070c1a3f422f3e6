"""Logs: capped keeping head and tail with a marker, the same cut on the node as here, marks
moved onto the capped copy, scanned as a stream, and old run folders pruned."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pytest_kimi.deploy import logs
from pytest_kimi.deploy.logs import Cut, cap_file, fetch_all, marker
from pytest_kimi.report import dataquality


def _sh(command: str, cwd: Path) -> str:
    done = subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _log(path: Path, lines: int) -> bytes:
    data = b"".join(b"line %06d of the log\n" % i for i in range(lines))
    path.write_bytes(data)
    return data


def test_a_log_over_the_cap_keeps_head_and_tail_with_a_marker(tmp_path):
    path = tmp_path / "a.log"
    data = _log(path, 10_000)
    cut = cap_file(path, 4096)
    kept = path.read_bytes()
    mark = marker(len(data) - 4096).encode()
    assert kept == data[:2048] + mark + data[-2048:]
    assert f"{len(data) - 4096} bytes cut here".encode() in kept
    assert cut == Cut(len(data), 2048, len(data) - 4096)


def test_a_log_under_the_cap_is_untouched(tmp_path):
    path = tmp_path / "a.log"
    data = _log(path, 10)
    assert cap_file(path, 4096).cut == 0 and path.read_bytes() == data


def test_offsets_map_onto_the_capped_copy(tmp_path):
    path = tmp_path / "a.log"
    data = _log(path, 10_000)
    cut = cap_file(path, 4096)
    kept = path.read_bytes()
    assert cut.map(100) == 100  # in the head
    offset = len(data) - 500  # in the tail: the same bytes follow
    assert kept[cut.map(offset) :] == data[offset:]
    inside = cut.map(5000)  # in the cut: right after the marker
    assert kept[:inside].endswith(marker(cut.cut).encode())


def test_the_node_side_command_cuts_exactly_as_here(tmp_path):
    path = tmp_path / "a.log"
    data = _log(path, 10_000)
    out = _sh(logs.capped_gzip_command(str(path), str(tmp_path / "a.gz"), 4096), tmp_path)
    assert int(out.strip()) == len(data)
    logs.unzip_to(tmp_path / "a.gz", tmp_path / "fetched.log")
    assert oct((tmp_path / "a.gz").stat().st_mode & 0o777) == "0o600"
    cap_file(path, 4096)
    assert (tmp_path / "fetched.log").read_bytes() == path.read_bytes()
    plain = _sh(logs.capped_cat_command(str(path), 1 << 30), tmp_path)
    assert plain.encode() == path.read_bytes()


def test_fetch_all_runs_every_handle_and_keeps_order_when_one_fails():
    seen: list[str] = []

    def fetch(name: str) -> Cut | None:
        seen.append(name)
        if name == "b1":
            raise OSError("node b down")
        return Cut(len(name))

    cuts = fetch_all(["a1", "b1", "a2", "c1"], fetch, lambda name: name[0])
    assert sorted(seen) == ["a1", "a2", "b1", "c1"]
    assert cuts == [Cut(2), None, Cut(2), Cut(2)]


def test_scan_logs_streams_and_stops_at_the_teardown_mark(tmp_path, monkeypatch):
    log = tmp_path / "replica0.log"
    head = b"ok\nTraceback (most recent call last)\n  x\nRuntimeError: CUDA out of memory\n"
    log.write_bytes(head + b"NCCL error after teardown began\n")
    monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(
        Path, "read_text", lambda self, *a, **k: (_ for _ in ()).throw(AssertionError)
    )
    findings = dataquality.scan_logs(tmp_path, {"replica0.log": len(head)})
    assert {f.kind: f.count for f in findings} == {"OOM": 1, "Traceback": 1}
    whole = dataquality.scan_logs(tmp_path)
    assert {f.kind for f in whole} == {"OOM", "Traceback", "NCCL error"}


def test_prune_keeps_the_newest_runs_and_never_the_current_one(tmp_path):
    work = tmp_path / "work"
    runs = [f"2026010{d}-120000-pro6000-dp2" for d in range(1, 8)]
    for run in runs:
        (work / run / "tp32").mkdir(parents=True)
    (work / "mock-gpus").mkdir()  # not a run folder: never touched
    (work / "notes").write_text("x")
    current = runs[0]  # oldest name, but the run starting now: kept
    out = _sh(logs.prune_command(str(work), 3, current), tmp_path)
    left = sorted(p.name for p in work.iterdir())
    assert left == sorted([current, *runs[-3:], "mock-gpus", "notes"])
    assert sorted(logs.parse_pruned(out)) == sorted(runs[1:4])


def test_prune_makes_a_missing_work_dir_shared_and_sticky(tmp_path):
    work = tmp_path / "fresh" / "pytest-kimi"
    _sh(logs.prune_command(str(work), 10, "x"), tmp_path)
    assert work.is_dir() and (os.stat(work).st_mode & 0o7777) == 0o1777
