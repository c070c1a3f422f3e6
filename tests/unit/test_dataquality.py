"""Log scanning and replica split (pure functions over text and records)."""

from __future__ import annotations

from pathlib import Path

from pytest_kimi.deploy.secrets import REDACTED, redact_env
from pytest_kimi.mock.faults import LOG_LINES
from pytest_kimi.report.dataquality import notes, replica_split, scan_logs, scan_text
from pytest_kimi.workload.records import RequestRecord


def test_each_mock_fault_line_is_found_by_its_kind():
    expected = {"oom": "OOM", "nccl": "NCCL error", "traceback": "Traceback",
                "engine_dead": "EngineDeadError"}  # fmt: skip
    for knob, kind in expected.items():
        kinds = {f.kind for f in scan_text("n.log", "[t] ok\n" + LOG_LINES[knob] + "\n")}
        assert kind in kinds, (knob, kinds)


def test_clean_log_has_no_findings_and_the_note_says_so():
    text = "[2026] The server is fired up and ready to roll!\n[2026] Decode batch. #running-req: 4"
    assert scan_text("a.log", text) == []
    assert notes([], {})[0].startswith("log check: no OOM, NCCL error, Traceback")


# sglang-router 0.3.2's own lines (ANSI colours as on its stdout)
ROUTER_TIMEOUT = (
    "2026-12-03 09:59:04 \x1b[33m WARN\x1b[0m smg::core::worker: src/core/worker.rs:948: HTTP "
    "health check failed for http://127.0.0.1:47039/health: reqwest::Error { kind: Request, url: "
    '"http://127.0.0.1:47039/health", source: TimedOut }\n'
)
ROUTER_503 = (
    "2026-12-03 09:59:03  WARN smg::core::worker: src/core/worker.rs:939: HTTP health check "
    "returned non-success status for http://127.0.0.1:43535/health: 503 Service Unavailable\n"
)


def test_router_health_failures_only_count_in_the_router_log(tmp_path: Path):
    (tmp_path / "router.log").write_text(ROUTER_TIMEOUT * 2 + ROUTER_503)
    (tmp_path / "replica0-node0.log").write_text(ROUTER_TIMEOUT)
    findings = scan_logs(tmp_path)
    assert [(f.kind, f.log, f.count) for f in findings] == [
        ("router health-check failure", "router.log", 3)
    ]
    assert "\x1b" not in findings[0].first


def test_replica_split_counts_measured_requests_only():
    records = [
        RequestRecord(0, "a", 1, 1, replica="r0"),
        RequestRecord(1, "b", 1, 1, replica="r1"),
        RequestRecord(2, "c", 1, 1, replica="r0"),
        RequestRecord(-1, "w", 1, 1, replica="r1", warmup=True),
        RequestRecord(3, "d", 1, 1),
    ]
    split = replica_split(records)
    assert split == {"r0": 2, "r1": 1, "?": 1}
    text = notes([], split, replicas=2)
    assert "requests per replica: ?: 1, r0: 2, r1: 1" in text


def test_one_replica_serving_everything_is_noted():
    assert any("only 1 of 2 replicas" in n for n in notes([], {"r0": 40}, replicas=2))


def test_secret_looking_env_values_are_redacted():
    env = {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_abc", "API_KEY": "k", "DB_PASSWORD": "p"}
    assert redact_env(env) == {
        "NCCL_DEBUG": "WARN", "HF_TOKEN": REDACTED, "API_KEY": REDACTED, "DB_PASSWORD": REDACTED,
    }  # fmt: skip


def test_log_check_stops_where_teardown_began(tmp_path: Path):
    run = "[2026-12-03 10:35:54] [TP0 PP0 node1] Dummy health server on http://127.0.0.1:1\n"
    ours = "[2026-12-03 10:36:02] [TP0 PP0 node1] NCCL error: lost rank 0; exiting\n"
    (tmp_path / "replica0-node1.log").write_text(run + ours)
    assert [f.kind for f in scan_logs(tmp_path)] == ["NCCL error"]  # the whole log: flagged
    mark = {"replica0-node1.log": len(run.encode())}
    assert scan_logs(tmp_path, mark) == []  # stopping rank 0 is not the run's fault
    (tmp_path / "replica0-node1.log").write_text(ours + run + ours)  # during the run: kept
    assert [f.kind for f in scan_logs(tmp_path, {"replica0-node1.log": len(ours + run)})] == [
        "NCCL error"
    ]
