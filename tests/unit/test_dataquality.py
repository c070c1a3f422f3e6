"""Log scanning and replica split (pure functions over text and per-replica counters)."""

from __future__ import annotations

from pathlib import Path

from pytest_kimi.deploy.secrets import REDACTED, redact_env
from pytest_kimi.mock.faults import LOG_LINES
from pytest_kimi.report.dataquality import notes, replica_split, scan_logs, scan_text
from pytest_kimi.results.replicacounters import ReplicaCounters


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


def _counters(*requests, routed=None) -> dict[str, ReplicaCounters]:
    return {
        f"replica{i}": ReplicaCounters(f"http://h:{i}", n, None if n is None else 100 * n,
                                       None if n is None else 10 * n, routed)
        for i, n in enumerate(requests)
    }  # fmt: skip


def test_replica_split_comes_from_the_counters_and_says_so():
    counters = _counters(20, 20, routed=21)
    assert replica_split(counters) == {"replica0": 20, "replica1": 20}
    text = notes([], counters, replicas=2, succeeded=40)
    assert (
        "requests per replica: replica0: 20, replica1: 20 (by each replica's /metrics counters "
        "over the measured run: attribution is by counters, not per request)"
    ) in text
    assert "tokens per replica (same counters): replica0: 2000 prompt / 200 generated, " \
        "replica1: 2000 prompt / 200 generated" in text  # fmt: skip
    assert any(n.startswith("router's attempts per worker") and "replica1: 21" in n for n in text)
    assert not any("only" in n or "total" in n for n in text)


def test_one_replica_serving_everything_is_noted():
    assert any("only 1 of 2 replicas" in n for n in notes([], _counters(40, 0), replicas=2))


def test_counters_that_disagree_with_the_client_are_noted():
    text = notes([], _counters(20, 25), replicas=2, succeeded=40)
    assert any("counters total 45 finished requests but the client saw 40" in n for n in text)


def test_unreadable_counters_are_unknown_not_a_false_alarm():
    text = notes([], _counters(40, None), replicas=2, succeeded=40)
    assert any(n.startswith("requests per replica: replica0: 40 (by each") for n in text)
    assert any(n.startswith("requests per replica unknown for replica1") for n in text)
    assert not any("only" in n or "counters total" in n for n in text)
    assert notes([], {}, replicas=2) == notes([], {})  # attached: nothing to say


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


def test_the_replicas_cache_hits_are_held_to_what_the_responses_said():
    def counters(a: int | None, b: int | None) -> dict[str, ReplicaCounters]:
        return {"replica0": ReplicaCounters("u0", 4, 100, 10, cached_tokens=a),
                "replica1": ReplicaCounters("u1", 4, 100, 10, cached_tokens=b)}  # fmt: skip

    agree = notes([], counters(600, 200), 2, 8, cached=800)
    assert "prefix cache hits per replica (sglang:cached_tokens_total over the run): " \
           "replica0: 600, replica1: 200" in agree
    assert "the replicas' cache counters agree with the responses' cached_tokens " \
           "(800 tokens)" in agree
    differ = notes([], counters(600, 200), 2, 8, cached=500)
    assert any("total 800 cached tokens but the responses said 500" in n for n in differ)
    partly = notes([], counters(600, None), 2, 8, cached=600)  # one unread: no verdict
    assert not any("agree" in n or "but the responses" in n for n in partly)
    assert not any("prefix cache" in n for n in notes([], counters(0, 0), 2, 8))  # no cache
