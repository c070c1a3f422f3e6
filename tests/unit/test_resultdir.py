"""The result directory: run ids, run folders, atomic writes, and records round trips."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from pytest_kimi.results.records import (
    Chunk,
    RecordJournal,
    RequestRecord,
    read_records,
    write_records,
)
from pytest_kimi.results.store import (
    client_environment,
    make_run_dir,
    new_run_id,
    package_versions,
    write_json,
    write_text,
)
from pytest_kimi.workload.client import close_unfinished


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


# ----------------------------------------------------------------------------- run ids


def test_run_id_format() -> None:
    now = datetime(2026, 9, 2, 12, 30, 51)
    assert new_run_id("pro6000", 2, now) == "20260902-123051-pro6000-dp2"


def test_run_id_zero_pads() -> None:
    now = datetime(2027, 1, 5, 3, 4, 5)
    assert new_run_id("local", 1, now) == "20270105-030405-local-dp1"


def test_run_id_sorts_by_time() -> None:
    ids = [
        new_run_id("c", 2, datetime(2026, 12, 31, 23, 59, 59)),
        new_run_id("c", 2, datetime(2026, 1, 1, 0, 0, 0)),
        new_run_id("c", 2, datetime(2026, 9, 2, 9, 0, 0)),
    ]
    assert sorted(ids) == [ids[1], ids[2], ids[0]]


def test_run_id_default_clock_shape() -> None:
    # Only the shape: the value depends on the clock.
    assert re.fullmatch(r"\d{8}-\d{6}-local-dp2", new_run_id("local", 2))


# ----------------------------------------------------------------------------- run dirs


def test_make_run_dir_creates_base(tmp_path: Path) -> None:
    base = tmp_path / "reports" / "nested"
    run = make_run_dir(base, "20260902-123051-local-dp2")
    assert run == base / "20260902-123051-local-dp2"
    assert run.is_dir()
    assert listing(run) == []


def test_make_run_dir_suffixes_on_collision(tmp_path: Path) -> None:
    run_id = "20260902-123051-local-dp2"
    first = make_run_dir(tmp_path, run_id)
    second = make_run_dir(tmp_path, run_id)
    third = make_run_dir(tmp_path, run_id)
    assert first.name == run_id
    assert second.name == f"{run_id}.1"
    assert third.name == f"{run_id}.2"
    assert listing(tmp_path) == [run_id, f"{run_id}.1", f"{run_id}.2"]


def test_make_run_dir_skips_taken_suffixes(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r.1").mkdir()
    (tmp_path / "r.2").write_text("a file, not a folder")
    assert make_run_dir(tmp_path, "r").name == "r.3"


def test_make_run_dir_other_ids_do_not_collide(tmp_path: Path) -> None:
    make_run_dir(tmp_path, "a")
    assert make_run_dir(tmp_path, "b").name == "b"


# ----------------------------------------------------------------------------- atomic writes


def test_write_json(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    data = {"completed": 40, "ttft_p95": 20800.5, "none": None, "list": [1, 2.5], "name": "tp32"}
    write_json(path, data)
    text = path.read_text(encoding="utf-8")
    assert json.loads(text) == data
    assert text.endswith("}\n")
    assert '\n  "completed": 40,' in text  # indented
    assert listing(tmp_path) == ["summary.json"]  # no temporary file left behind


def test_write_json_creates_parents_and_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "run" / "tp32" / "manifest.json"
    write_json(path, {"v": 1})
    write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 2}
    assert listing(path.parent) == ["manifest.json"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_write_json_rejects_non_finite(tmp_path: Path, bad: float) -> None:
    path = tmp_path / "summary.json"
    with pytest.raises(ValueError):
        write_json(path, {"ttft_p95": bad})
    assert listing(tmp_path) == []  # neither the file nor a temporary


def test_write_json_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "comparison.json"
    write_json(path, {"ok": True})
    with pytest.raises(ValueError):
        write_json(path, {"nested": [{"x": float("nan")}]})
    assert json.loads(path.read_text()) == {"ok": True}
    assert listing(tmp_path) == ["comparison.json"]


def test_write_json_stringifies_unknown_objects(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_json(path, {"dir": Path("/a/b"), "when": datetime(2026, 9, 2, 12, 0, 0)})
    assert json.loads(path.read_text()) == {"dir": "/a/b", "when": "2026-09-02 12:00:00"}


def test_write_text(tmp_path: Path) -> None:
    path = tmp_path / "comparison.md"
    write_text(path, "# Layout comparison\nünïcödé\n")
    write_text(path, "# second\n")
    assert path.read_text(encoding="utf-8") == "# second\n"
    assert listing(tmp_path) == ["comparison.md"]


# ----------------------------------------------------------------------------- records


def sample_records() -> list[RequestRecord]:
    return [
        RequestRecord(
            index=0,
            prompt_id="speedbench-16k-0001",
            nominal_input_tokens=16384,
            max_output_tokens=512,
            send_time=100.25,
            first_token_time=105.5,
            end_time=150.125,
            chunks=[Chunk(time=105.5, tokens=1), Chunk(time=105.625, tokens=3)],
            prompt_tokens=16390,
            completion_tokens=512,
            replica="replica1",
            status=200,
            success=True,
        ),
        RequestRecord(
            index=1,
            prompt_id="speedbench-16k-0002",
            nominal_input_tokens=16384,
            max_output_tokens=512,
            send_time=101.0,
            end_time=101.5,
            status=503,
            success=False,
            error='HTTP 503: {"detail": "no healthy worker"}\nretry 1 failed — ünïcödé',
        ),
        RequestRecord(
            index=2,
            prompt_id="warm",
            nominal_input_tokens=8,
            max_output_tokens=4,
            warmup=True,
        ),
    ]


def test_records_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    recs = sample_records()
    write_records(path, recs)
    assert read_records(path) == recs
    assert listing(tmp_path) == ["records.jsonl"]  # the .tmp was renamed away
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    assert json.loads(lines[1])["error"] == recs[1].error


def test_records_round_trip_keeps_derived_values(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    write_records(path, sample_records())
    first, failed, warm = read_records(path)
    assert isinstance(first.chunks[0], Chunk)
    assert first.output_tokens == 512 and first.input_tokens == 16390
    assert failed.output_tokens == 0 and failed.input_tokens == 16384
    assert failed.first_token_time is None and failed.chunks == []
    assert warm.warmup is True


def test_records_empty(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    write_records(path, [])
    assert path.read_text() == ""
    assert read_records(path) == []


def test_records_accept_a_generator_and_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    write_records(path, sample_records())
    write_records(path, (r for r in sample_records()[:1]))
    assert read_records(path) == sample_records()[:1]
    assert listing(tmp_path) == ["records.jsonl"]


def test_read_records_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    rec = sample_records()[0]
    path.write_text("\n" + rec.to_json() + "\n\n  \n", encoding="utf-8")
    assert read_records(path) == [rec]


def test_records_writer_failing_mid_way_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    write_records(path, sample_records())
    before = path.read_bytes()

    def broken():
        yield from sample_records()[:2]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_records(path, broken())
    assert path.read_bytes() == before
    assert listing(tmp_path) == ["records.jsonl"]  # the temporary is removed


KILLED_WRITER = """
import sys, time
from pathlib import Path
from pytest_kimi.results.records import RequestRecord, write_records

def records():
    for i in range(3):
        yield RequestRecord(i, f"new{i}", 8, 4)
    Path(sys.argv[2]).write_text("half-way")  # the parent kills us now
    time.sleep(60)
    yield RequestRecord(9, "never", 8, 4)

write_records(Path(sys.argv[1]), records())
"""


def test_a_writer_killed_half_way_leaves_the_old_file_whole(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "summary-records.jsonl"
    write_records(path, sample_records())
    before = path.read_bytes()
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path), str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert path.read_bytes() == before  # old content, whole: never a mix
    assert read_records(path) == sample_records()


def test_journal_keeps_each_finished_record_at_once_and_is_discarded(tmp_path: Path) -> None:
    path = tmp_path / "records.partial.jsonl"
    journal = RecordJournal(path)
    first, second, _ = sample_records()
    journal.add(first)
    assert read_records(path) == [first]  # on disk before the run ends: flushed per record
    journal.add(second)
    assert read_records(path) == [first, second]
    journal.discard()
    assert not path.exists()
    journal.add(first)  # after discard: a no-op, not a crash
    assert not path.exists()


def test_close_unfinished_marks_requests_in_flight_and_keeps_what_arrived(tmp_path: Path) -> None:
    flying = RequestRecord(7, "p7", 16384, 512, send_time=1.0, first_token_time=2.0,
                           chunks=[Chunk(2.0, 1), Chunk(2.1, 1)])  # fmt: skip
    cancelled_late = RequestRecord(8, "p8", 16384, 512, send_time=1.0, end_time=3.0)
    close_unfinished([flying, cancelled_late], "interrupted before completion (X)")
    for record in (flying, cancelled_late):
        assert record.success is False and record.error == "interrupted before completion (X)"
    assert flying.end_time is not None and len(flying.chunks) == 2  # what arrived is kept
    assert cancelled_late.end_time == 3.0  # a time it already had is not moved


# ----------------------------------------------------------------------------- environment


def test_package_versions() -> None:
    versions = package_versions(("pytest", "pytest-kimi", "no-such-package-pytest-kimi-test"))
    assert isinstance(versions["pytest"], str) and versions["pytest"]
    assert versions["pytest-kimi"] == "0.1.0"
    assert versions["no-such-package-pytest-kimi-test"] is None


def test_client_environment_is_json() -> None:
    env = client_environment()
    assert set(env) == {"hostname", "platform", "python", "packages"}
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", env["python"])
    assert "pytest-kimi" in env["packages"]
    json.dumps(env, allow_nan=False)
