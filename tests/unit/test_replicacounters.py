"""Per-replica requests and tokens from the servers' and the router's own counters."""

from __future__ import annotations

from pathlib import Path

from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.replicacounters import (
    ReplicaCounters,
    Snapshot,
    deltas,
    router_worker_totals,
    server_totals,
)
from pytest_kimi.results.store import RunFolder, load_layout

# As prometheus_client renders SGLang 0.5.9's TokenizerMetricsCollector: counters keep their
# ``_total`` name, carry ``model_name`` (plus custom labels: two label sets here), and have
# ``_created`` samples beside them.
SERVER = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="kimi",tenant="a"} 1000.0
sglang:prompt_tokens_total{model_name="kimi",tenant="b"} 24.0
sglang:prompt_tokens_created{model_name="kimi",tenant="a"} 1.7e9
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="kimi",tenant="a"} 300.0
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="kimi",tenant="a"} 3.0
sglang:num_requests_total{model_name="kimi",tenant="b"} 1.0
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="kimi",engine_type="unified",tp_rank="0",pp_rank="0"} 2.0
"""

# What sglang-router 0.3.2 exported in front of two mock workers after four requests.
ROUTER = """\
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31801",outcome="success"} 2
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31802",outcome="success"} 2
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31802",outcome="failure"} 1
# TYPE smg_worker_health gauge
smg_worker_health{worker="http://127.0.0.1:31801"} 1
"""

URLS = {"replica0": "http://127.0.0.1:31801", "replica1": "http://127.0.0.1:31802"}


def test_server_totals_sum_label_sets_and_ignore_other_samples():
    assert server_totals(SERVER) == {
        "sglang:prompt_tokens_total": 1024.0,
        "sglang:generation_tokens_total": 300.0,
        "sglang:num_requests_total": 4.0,
    }
    assert server_totals("# nothing yet\n") == {}


def test_router_worker_totals_sum_outcomes_per_worker():
    assert router_worker_totals(ROUTER) == {
        "http://127.0.0.1:31801": 2.0,
        "http://127.0.0.1:31802": 3.0,
    }
    assert router_worker_totals("smg_worker_health 1\n") is None  # not exported (yet)


def test_deltas_are_after_minus_before_per_replica():
    before = Snapshot(
        {"replica0": server_totals(SERVER), "replica1": {}},
        router_worker_totals(ROUTER),
        router_read=True,
    )
    after_text = SERVER.replace("} 3.0", "} 13.0").replace("} 1000.0", "} 9000.0")
    after = Snapshot(
        {"replica0": server_totals(after_text), "replica1": server_totals(SERVER)},
        router_worker_totals(ROUTER.replace("} 2\n", "} 12\n", 1)),
        router_read=True,
    )
    got = deltas(URLS, before, after)
    assert got["replica0"] == ReplicaCounters(URLS["replica0"], 10, 8000, 0, 10, cached_tokens=0)
    # replica1 had finished nothing before: its counters had no sample yet, so 0
    assert got["replica1"] == ReplicaCounters(URLS["replica1"], 4, 1024, 300, 0, cached_tokens=0)


def test_unreadable_or_reset_counters_are_unknown_not_zero():
    before = Snapshot({"replica0": None, "replica1": {"sglang:num_requests_total": 9.0}})
    after = Snapshot(
        {"replica0": server_totals(SERVER), "replica1": server_totals(SERVER)},
        router_worker_totals(ROUTER),
        router_read=True,
    )
    got = deltas(URLS, before, after)
    assert got["replica0"].requests is None  # no first read
    assert got["replica1"].requests is None  # 9 -> 4: restarted, the delta means nothing
    assert got["replica1"].prompt_tokens == 1024
    assert got["replica0"].router_requests is None  # the router was not read before


def test_replica_counters_survive_summary_json(tmp_path: Path):
    folder = RunFolder.create(tmp_path, "run")
    result = LayoutResult("tp32", "TP32", error="stopped")
    result.replica_counters = {
        "replica0": ReplicaCounters(URLS["replica0"], 20, 327680, 10240, 21),
        "replica1": ReplicaCounters(URLS["replica1"], None, None, None, None),
    }
    folder.write_summary(result, "mock", 40.0)
    back, saved = load_layout(folder.path / "tp32")
    assert back.replica_counters == result.replica_counters
    assert saved["replica_counters"]["replica0"]["requests"] == 20


def test_the_accept_length_gauge_is_the_mean_of_the_replicas_that_speculate():
    from pytest_kimi.results.replicacounters import Snapshot, server_accept_length, server_totals

    def text(*values: float) -> str:
        lines = ["# TYPE sglang:spec_accept_length gauge"]
        lines += [f'sglang:spec_accept_length{{tp_rank="{i}"}} {v}' for i, v in enumerate(values)]
        return "\n".join(lines) + "\n"

    assert server_totals(text(0.0, 2.5))["sglang:spec_accept_length"] == 2.5  # ranks: highest
    snap = Snapshot({"replica0": server_totals(text(2.5)), "replica1": server_totals(text(3.5)),
                     "replica2": None})  # fmt: skip
    assert server_accept_length(snap) == 3.0
    assert server_accept_length(Snapshot({"replica0": server_totals(text(0.0))})) is None


def test_cached_tokens_are_summed_over_their_sources_and_absent_means_none_cached() -> None:
    """``sglang:cached_tokens_total`` carries a cache_source label (device, host, ...), and
    has no sample until a request hits the cache (SGLang 0.5.9's collector)."""
    cached = SERVER + """\
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="kimi",cache_source="device"} 700.0
sglang:cached_tokens_total{model_name="kimi",cache_source="host"} 50.0
"""
    assert server_totals(cached)["sglang:cached_tokens_total"] == 750.0
    before = Snapshot({"r0": server_totals(SERVER), "r1": server_totals(SERVER)})
    after = Snapshot({"r0": server_totals(cached), "r1": server_totals(SERVER)})
    out = deltas({"r0": "http://a", "r1": "http://b"}, before, after)
    assert (out["r0"].cached_tokens, out["r1"].cached_tokens) == (750, 0)
    unread = deltas({"r0": "http://a"}, Snapshot({"r0": None}), after)
    assert unread["r0"].cached_tokens is None
    assert ReplicaCounters.from_dict(out["r0"].to_dict()) == out["r0"]
