"""Cluster configuration: the shipped files load, and every error names file, line and field.

``BASE`` (in ``clusterfile.py`` beside this file) is a small but complete cluster file; the line
numbers in the tests are counted by hand from it (see the ``L_*`` constants), and edits that
replace one line with one line keep them valid.
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from clusterfile import (
    BASE,
    L_INPUT_LEN,
    L_LAYOUTS,
    L_NODE_N2,
    L_NODES_PER_REPLICA,
    L_NUM_REQUESTS,
    L_PP2,
    L_REPLICAS,
    L_ROUTER_NODE,
    L_SERVER,
    L_SLO,
    L_TP16,
    L_WORKLOAD,
    edit,
    load_error,
    write,
)

from pytest_kimi.config import ClusterConfig, ConfigError, Layout, load_cluster
from pytest_kimi.config.inputs import UsageProblem, default_layouts
from pytest_kimi.config.yamlfile import Located, read_yaml

CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"


def assert_names(message: str, path: Path, line: int | None, field: str) -> None:
    """The message has the documented shape ``file:line: field 'a.b': problem``."""
    where = f"{path}:{line}" if line is not None else f"{path}"
    assert message.startswith(f"{where}: field '{field}': "), message


# ----------------------------------------------------------------------------- shipped files


def test_base_fixture_loads(tmp_path: Path) -> None:
    cfg = load_cluster(write(tmp_path, BASE))
    assert cfg.name == "t"
    assert cfg.layouts == {
        "tp16": Layout("tp16", 16, 1, 4),
        "pp2": Layout("pp2", 8, 2, 8),
    }
    # Defaults fill in what BASE leaves out.
    assert cfg.server.module == "sglang.launch_server"
    assert cfg.server.python == "python3"
    assert cfg.server.port is None and cfg.server.dist_init_port is None
    assert cfg.router.node == "n1" and cfg.router.policy == "round_robin"
    assert cfg.workload.api == "generate"
    assert cfg.workload.warmup_requests == 1
    assert cfg.workload.request_rate == float("inf")
    assert cfg.workload.category is None
    assert cfg.mock is None and cfg.time_scale == 1.0
    assert cfg.startup_timeout_s == 900.0


def test_local_yaml_loads() -> None:
    cfg = load_cluster(CLUSTERS / "local.yaml")
    assert cfg.name == "local"
    assert cfg.executor == "local"
    assert [n.name for n in cfg.nodes] == [f"node60{i}" for i in range(1, 9)]
    assert all(n.host == "127.0.0.1" and n.gpus == 8 for n in cfg.nodes)
    assert (cfg.replicas, cfg.nodes_per_replica) == (2, 4)
    assert list(cfg.layouts) == ["tp32", "pp8", "tp32-cp4k", "pd-pp8-tp32", "tp32-eagle",
                                 "tp32-rr", "tp32-cache-aware"]  # fmt: skip
    rr, aware = cfg.layout("tp32-rr"), cfg.layout("tp32-cache-aware")
    assert cfg.server_args(rr) == cfg.server_args(aware)  # the same servers ...
    assert "disable-radix-cache" not in cfg.server_args(rr)  # with SGLang's prefix cache
    assert cfg.server_args(rr)["max-total-tokens"] == 262144
    assert "disable-radix-cache" in cfg.server_args(cfg.layout("tp32"))
    assert (cfg.router_policy(rr), cfg.router_policy(aware)) == ("round_robin", "cache_aware")
    assert not rr.default and not aware.default  # run when named: --layout=tp32-rr,...
    assert default_layouts(cfg) == ("tp32", "pp8", "tp32-cp4k", "pd-pp8-tp32", "tp32-eagle")
    eagle = cfg.server_args(cfg.layout("tp32-eagle"))
    assert (eagle["speculative-algorithm"], eagle["speculative-num-steps"]) == ("EAGLE3", 3)
    prefill, decode = cfg.layout("pd-pp8-tp32").sides
    assert (prefill.role, prefill.tp, prefill.pp, prefill.nodes_per_replica) == ("prefill", 4, 8, 4)
    assert (decode.role, decode.tp, decode.pp, decode.nodes_per_replica) == ("decode", 32, 1, 4)
    assert prefill.bootstrap_port is None  # auto on a local cluster: drawn at bring-up
    assert cfg.layouts["tp32"] == Layout("tp32", tp=32, pp=1, ep=4)
    assert cfg.layouts["pp8"] == Layout("pp8", tp=4, pp=8, ep=4)
    cp4k = cfg.layout("tp32-cp4k")
    assert cp4k == Layout("tp32-cp4k", tp=32, pp=1, ep=4, args=(("chunked-prefill-size", 4096),))
    assert cfg.server_args(cp4k)["chunked-prefill-size"] == 4096
    assert cfg.server_args(cfg.layout("tp32"))["chunked-prefill-size"] == 8192
    assert cfg.layout("tp32").label == "TP32/PP1/EP4"
    assert cfg.layout("pp8").label == "TP4/PP8/EP4"

    srv = cfg.server
    assert srv.python == sys.executable  # "current"
    assert srv.module == "pytest_kimi.mock.launch_server"
    assert srv.model_path == "builtin:mock-tokenizer"
    assert srv.port is None and srv.dist_init_port is None  # "auto"
    assert srv.args == {
        "chunked-prefill-size": 8192,
        "disable-radix-cache": True,
        "kv-cache-dtype": "bf16",
        "moe-runner-backend": "flashinfer_mxfp4",
        "moe-a2a-backend": "none",
        "enable-metrics": True,
    }
    assert srv.env == {}

    rtr = cfg.router
    assert rtr.python == sys.executable
    assert rtr.module is None and rtr.package == "auto"  # smg or sglang-router, as found
    assert rtr.node == "node601"
    assert rtr.port is None and rtr.prometheus_port is None
    assert rtr.policy == "round_robin"
    assert rtr.env == {"HF_ENDPOINT": "http://127.0.0.1:9"}

    wl = cfg.workload
    assert wl.dataset == "builtin:speedbench16k"
    assert (wl.num_requests, wl.input_len, wl.output_len) == (40, 16384, 512)
    assert (wl.concurrency, wl.warmup_requests, wl.seed) == (8, 1, 1)
    assert wl.api == "generate"
    assert wl.request_timeout_s == 1800.0

    assert cfg.slo == {"ttft_p95": "30s", "tpot_p95": "200ms", "tpot_mean": "150ms"}
    assert cfg.mock is not None
    assert cfg.mock.time_scale == 40.0 and cfg.time_scale == 40.0
    assert cfg.mock.seed == 1
    assert cfg.mock.profile["layers"] == 61
    assert cfg.startup_timeout_s == 60.0


def test_pro6000_yaml_loads() -> None:
    cfg = load_cluster(CLUSTERS / "pro6000.yaml")
    assert cfg.name == "pro6000"
    assert cfg.executor == "ssh"
    assert [(n.name, n.host, n.gpus) for n in cfg.nodes] == [
        (f"node60{i}", f"node60{i}", 8) for i in range(1, 9)
    ]
    assert (cfg.replicas, cfg.nodes_per_replica) == (2, 4)
    assert {name: cfg.layouts[name] for name in ("tp32", "pp8")} == {
        "tp32": Layout("tp32", 32, 1, 4),
        "pp8": Layout("pp8", 4, 8, 4),
    }
    # test_pd_layouts.py: pd-pp8-tp32; test_layouts.py: tp32-eagle's dry run
    assert list(cfg.layouts) == ["tp32", "pp8", "pd-pp8-tp32", "tp32-eagle"]
    srv = cfg.server
    assert srv.python == "/opt/sglang/venv/bin/python"
    assert srv.module == "sglang.launch_server"
    assert srv.model_path == "/models/Kimi-K3"
    assert (srv.port, srv.dist_init_port) == (30001, 5757)
    assert srv.args["chunked-prefill-size"] == 8192
    assert srv.args["trust-remote-code"] is True
    assert srv.args["disable-radix-cache"] is True
    assert srv.args["kv-cache-dtype"] == "bf16"
    assert srv.args["moe-runner-backend"] == "flashinfer_mxfp4"
    assert srv.args["moe-a2a-backend"] == "none"
    assert srv.env == {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}
    assert (cfg.router.port, cfg.router.prometheus_port) == (30000, 29000)
    assert cfg.router.node == "node601"
    assert cfg.workload.dataset == "/data/speedbench/speedbench16k_complete.jsonl"
    assert cfg.mock is None and cfg.time_scale == 1.0
    assert cfg.startup_timeout_s == 1800.0


def test_replica_nodes() -> None:
    cfg = load_cluster(CLUSTERS / "pro6000.yaml")
    assert [n.name for n in cfg.replica_nodes(0)] == ["node601", "node602", "node603", "node604"]
    assert [n.name for n in cfg.replica_nodes(1)] == ["node605", "node606", "node607", "node608"]
    assert cfg.replica_nodes(2) == ()
    node = cfg.node("node603")
    assert (node.name, node.host, node.gpus) == ("node603", "node603", 8)
    assert node.ssh.user == "sglang" and node.ssh.passphrase_env == "KIMI_SSH_PASSPHRASE"
    assert node.ssh.check_host_keys and cfg.router.model_mount == "/models/Kimi-K3"
    with pytest.raises(KeyError):
        cfg.node("node609")


def test_replica_nodes_leaves_spare_nodes_unused(tmp_path: Path) -> None:
    text = edit("  replicas: 2", "  replicas: 1")
    cfg = load_cluster(write(tmp_path, text))
    assert [n.name for n in cfg.replica_nodes(0)] == ["n1", "n2"]
    assert len(cfg.nodes) == 4


def test_path_accepts_str(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    cfg = load_cluster(str(path))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.path == path


# ----------------------------------------------------------------------------- layout errors


def test_layout_not_filling_replica(tmp_path: Path) -> None:
    text = edit("tp16: {tp: 16, pp: 1, ep: 4}", "tp16: {tp: 8, pp: 1, ep: 4}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_TP16, "layouts.tp16.tp")
    assert "TP x PP = 8 x 1 = 8" in msg
    assert "one replica has 16 GPUs" in msg


def test_layout_exceeding_replica(tmp_path: Path) -> None:
    text = edit("pp2: {tp: 8, pp: 2, ep: 8}", "pp2: {tp: 8, pp: 4, ep: 8}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_PP2, "layouts.pp2.tp")
    assert "TP x PP = 8 x 4 = 32" in msg and "16 GPUs" in msg


def test_unknown_layout_name(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    cfg = load_cluster(path)
    with pytest.raises(ConfigError) as info:
        cfg.layout("tp8")
    msg = str(info.value)
    assert_names(msg, path, L_LAYOUTS, "layouts")
    assert "unknown layout 'tp8'" in msg
    assert msg.endswith("this cluster defines: tp16, pp2")


def test_unknown_layout_name_in_shipped_file() -> None:
    path = CLUSTERS / "local.yaml"
    cfg = load_cluster(path)
    with pytest.raises(ConfigError) as info:
        cfg.layout("tp64")
    assert_names(str(info.value), path, 22, "layouts")  # "layouts:" is line 22 of local.yaml
    assert "tp32, pp8" in str(info.value)


def test_ep_must_divide_tp(tmp_path: Path) -> None:
    text = edit("pp2: {tp: 8, pp: 2, ep: 8}", "pp2: {tp: 8, pp: 2, ep: 3}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_PP2, "layouts.pp2.ep")
    assert "EP 3 must divide TP 8" in msg


def test_no_layouts(tmp_path: Path) -> None:
    text = edit(
        "layouts:\n  tp16: {tp: 16, pp: 1, ep: 4}\n  pp2: {tp: 8, pp: 2, ep: 8}\n", "layouts: {}\n"
    )
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_LAYOUTS, "layouts")
    assert "at least one layout" in msg


def test_layout_pp_and_ep_default_to_one(tmp_path: Path) -> None:
    text = edit("pp2: {tp: 8, pp: 2, ep: 8}", "tp16b: {tp: 16}")
    cfg = load_cluster(write(tmp_path, text))
    assert cfg.layout("tp16b") == Layout("tp16b", 16, 1, 1)


# ----------------------------------------------------------------------------- field errors


def test_unknown_top_level_key(tmp_path: Path) -> None:
    text = edit("slo:\n", "slos:\n")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_SLO, "slos")
    assert "unknown field" in msg
    # The known fields are listed so the typo is easy to spot.
    assert "slo," in msg and "workload" in msg


def test_unknown_nested_key(tmp_path: Path) -> None:
    text = edit("  node: n1", "  nodee: n1")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_ROUTER_NODE, "router.nodee")
    assert "unknown field (known fields here: " in msg
    assert "node," in msg and "policy" in msg


def test_unknown_key_in_layout(tmp_path: Path) -> None:
    text = edit("tp16: {tp: 16, pp: 1, ep: 4}", "tp16: {tp: 16, pp: 1, ep: 4, dp: 2}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_TP16, "layouts.tp16.dp")
    assert "unknown field" in msg


def test_string_for_int(tmp_path: Path) -> None:
    text = edit("  replicas: 2", '  replicas: "2"')
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_REPLICAS, "deployment.replicas")
    assert "expected an integer, got str '2'" in msg


def test_bool_for_int(tmp_path: Path) -> None:
    text = edit("  input_len: 16", "  input_len: true")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_INPUT_LEN, "workload.input_len")
    assert "expected an integer, got bool True" in msg


def test_float_for_int(tmp_path: Path) -> None:
    text = edit("  num_requests: 4", "  num_requests: 4.5")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NUM_REQUESTS, "workload.num_requests")
    assert "expected an integer, got float 4.5" in msg


def test_int_below_minimum(tmp_path: Path) -> None:
    text = edit("  num_requests: 4", "  num_requests: 0")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NUM_REQUESTS, "workload.num_requests")
    assert "must be >= 1, got 0" in msg


def test_missing_required_field(tmp_path: Path) -> None:
    text = edit("  dataset: /data/d.jsonl\n", "")
    path, msg = load_error(tmp_path, text)
    # The missing field has no line of its own: the error points at its parent section.
    assert_names(msg, path, L_WORKLOAD, "workload.dataset")
    assert "required field is missing" in msg


def test_missing_required_section(tmp_path: Path) -> None:
    text = edit("deployment:\n  replicas: 2\n  nodes_per_replica: 2\n", "")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, None, "deployment")
    assert "required field is missing" in msg


def test_section_of_wrong_kind(tmp_path: Path) -> None:
    text = edit("router:\n  node: n1\n", "router: n1\n")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 18, "router")
    assert "expected a mapping, got str 'n1'" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    text = edit("  num_requests: 4\n", "  num_requests: 4\n  num_requests: 5\n")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NUM_REQUESTS + 1, "workload.num_requests")
    assert msg.endswith("duplicate key")


def test_duplicate_key_top_level(tmp_path: Path) -> None:
    path, msg = load_error(tmp_path, BASE + "name: again\n")
    assert_names(msg, path, 28, "name")
    assert "duplicate key" in msg


def test_duplicate_node_name(tmp_path: Path) -> None:
    text = edit("{name: n2, host:", "{name: n1, host:")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NODE_N2, "nodes[1].name")
    assert "duplicate node name 'n1'" in msg


def test_node_name_not_plain(tmp_path: Path) -> None:
    text = edit("{name: n2, host:", "{name: 'n 2', host:")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NODE_N2, "nodes[1].name")
    assert "not a plain name" in msg


def test_nodes_with_different_gpus(tmp_path: Path) -> None:
    text = edit("{name: n3, host: 127.0.0.1, gpus: 8}", "{name: n3, host: 127.0.0.1, gpus: 4}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 3, "nodes")
    assert "same 'gpus'" in msg


def test_invalid_yaml_syntax(tmp_path: Path) -> None:
    text = edit("  nodes_per_replica: 2", "  nodes_per_replica: 2: 3")
    path, msg = load_error(tmp_path, text)
    assert msg.startswith(f"{path}:{L_NODES_PER_REPLICA}: invalid YAML: "), msg
    assert "mapping values are not allowed here" in msg


def test_invalid_yaml_tab(tmp_path: Path) -> None:
    text = edit("  input_len: 16", "\tinput_len: 16")
    path, msg = load_error(tmp_path, text)
    assert msg.startswith(f"{path}:{L_INPUT_LEN}: invalid YAML: "), msg


def test_router_node_not_among_nodes(tmp_path: Path) -> None:
    text = edit("  node: n1", "  node: n9")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_ROUTER_NODE, "router.node")
    assert "'n9' is not one of the nodes" in msg


def test_too_few_nodes(tmp_path: Path) -> None:
    text = edit("  replicas: 2", "  replicas: 3")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_NODES_PER_REPLICA, "deployment.nodes_per_replica")
    assert "3 replicas x 2 nodes need 6 nodes, but 'nodes' lists 4" in msg


@pytest.mark.parametrize(
    ("value", "shown"),
    [("0", "0"), ("65536", "65536"), ('"8080"', "'8080'"), ("true", "True"), ("-1", "-1")],
)
def test_bad_port(tmp_path: Path, value: str, shown: str) -> None:
    # router.node defaults to the first node, so the line can hold a port instead.
    text = edit("  node: n1", f"  port: {value}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_ROUTER_NODE, "router.port")
    assert f"expected a port 1-65535 or 'auto', got {shown}" in msg


@pytest.mark.parametrize("value", ["1", "65535", "auto"])
def test_good_port(tmp_path: Path, value: str) -> None:
    cfg = load_cluster(write(tmp_path, edit("  node: n1", f"  port: {value}")))
    assert cfg.router.port == (None if value == "auto" else int(value))


def test_ssh_executor_with_auto_port(tmp_path: Path) -> None:
    text = edit("executor: local", "executor: ssh")
    path, msg = load_error(tmp_path, text)
    # server.port is absent (defaults to auto): the error points at the server section.
    assert_names(msg, path, L_SERVER, "server.port")
    assert "an ssh cluster needs fixed ports, not 'auto'" in msg


def test_ssh_executor_with_explicit_auto_port(tmp_path: Path) -> None:
    text = edit("executor: local", "executor: ssh")
    text = edit("  model_path: /models/m\n", "  model_path: /models/m\n  port: auto\n", text)
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_SERVER + 2, "server.port")
    assert "fixed ports" in msg


def test_unknown_executor(tmp_path: Path) -> None:
    path, msg = load_error(tmp_path, edit("executor: local", "executor: k8s"))
    assert_names(msg, path, 2, "executor")
    assert "'k8s' is not one of local, ssh" in msg


def test_bad_flag_name(tmp_path: Path) -> None:
    text = edit("    chunked-prefill-size: 8192", "    --chunked-prefill-size: 8192")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 17, "server.args.--chunked-prefill-size")
    assert "flag names are lowercase words" in msg


def test_non_scalar_flag_value(tmp_path: Path) -> None:
    text = edit("    chunked-prefill-size: 8192", "    chunked-prefill-size: [1, 2]")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 17, "server.args.chunked-prefill-size")
    assert "expected a scalar value, got list [1, 2]" in msg


def test_bool_env_value(tmp_path: Path) -> None:
    text = edit("  node: n1", "  env: {HF_HUB_OFFLINE: true}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_ROUTER_NODE, "router.env.HF_HUB_OFFLINE")
    assert "expected a string, got bool True" in msg


def test_env_numbers_become_strings(tmp_path: Path) -> None:
    cfg = load_cluster(write(tmp_path, edit("  node: n1", "  env: {A: 0, B: 1.5, C: x}")))
    assert cfg.router.env == {"A": "0", "B": "1.5", "C": "x"}


@pytest.mark.parametrize("value", ["0", "-1", "fast", "true"])
def test_bad_request_rate(tmp_path: Path, value: str) -> None:
    text = edit("  concurrency: 2", f"  request_rate: {value}")
    path, msg = load_error(tmp_path, text)
    # concurrency is now missing, but request_rate is checked first.
    assert_names(msg, path, 25, "workload.request_rate")
    assert "expected requests/s > 0 or 'inf'" in msg


def test_empty_file(tmp_path: Path) -> None:
    path, msg = load_error(tmp_path, "")
    assert_names(msg, path, None, "name")
    assert "required field is missing" in msg


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    path, msg = load_error(tmp_path, "- a\n- b\n")
    assert_names(msg, path, None, "(top level)")
    assert "expected a mapping, got list" in msg


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"{path}: cannot read: ")):
        load_cluster(path)


# ----------------------------------------------------------------------------- parsed values


def test_goodput_parsed_once(tmp_path: Path) -> None:
    cfg = load_cluster(CLUSTERS / "local.yaml")
    assert cfg.workload.goodput == {"ttft": "30s", "tpot": "200ms"}  # raw, for manifests
    assert cfg.workload.goodput_ms == {"ttft": 30000.0, "tpot": 200.0}
    text = edit("  concurrency: 2", "  concurrency: 2\n  goodput: {e2e: 1.5min, tpot: 80}")
    wl = load_cluster(write(tmp_path, text)).workload
    assert wl.goodput == {"tpot": "80", "e2e": "1.5min"}
    assert wl.goodput_ms == {"tpot": 80.0, "e2e": 90000.0}
    assert load_cluster(write(tmp_path, BASE)).workload.goodput_ms == {}


def test_bad_goodput_duration(tmp_path: Path) -> None:
    text = edit("  concurrency: 2", "  concurrency: 2\n  goodput:\n    ttft: 30s\n    tpot: fast")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 28, "workload.goodput.tpot")
    assert "'fast': expected a duration like 25s or 150ms" in msg


def test_unknown_goodput_key(tmp_path: Path) -> None:
    text = edit("  concurrency: 2", "  concurrency: 2\n  goodput: {itl: 5ms}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, 26, "workload.goodput.itl")
    assert "unknown field (known fields here: e2e, tpot, ttft)" in msg


def test_regression_thresholds_parsed(tmp_path: Path) -> None:
    text = BASE + "regression:\n  ttft_p95: 10%\n  output_throughput: 0.05\n"
    cfg = load_cluster(write(tmp_path, text))
    assert cfg.regression == {"ttft_p95": "10%", "output_throughput": "0.05"}
    assert cfg.regression_thresholds == {"ttft_p95": 0.10, "output_throughput": 0.05}
    assert load_cluster(write(tmp_path, BASE)).regression_thresholds == {}


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("ttft_p95: lots", "threshold is not a number"),
        ("color: 10%", "'color' is not a metric the gate can judge"),
        ("ttft_p95: '10%,tpot_mean:5%'", "expected one threshold such as 10% or 0.1"),
    ],
)
def test_bad_regression_threshold(tmp_path: Path, entry: str, problem: str) -> None:
    path, msg = load_error(tmp_path, BASE + f"regression:\n  {entry}\n")
    assert_names(msg, path, 29, f"regression.{entry.partition(':')[0]}")
    assert problem in msg


def test_bad_slo_is_a_load_error(tmp_path: Path) -> None:
    path, msg = load_error(tmp_path, edit("  ttft_p95: 30s", "  ttft_p95: soon"))
    assert_names(msg, path, L_SLO + 1, "slo.ttft_p95")
    assert "expected a duration like 25s or 150ms" in msg
    path, msg = load_error(tmp_path, edit("  ttft_p95: 30s", "  latency_p95: 30s"))
    assert_names(msg, path, L_SLO + 1, "slo.latency_p95")
    assert "unknown SLO metric 'latency_p95'" in msg


def test_bad_layout_slo_is_a_load_error(tmp_path: Path) -> None:
    text = edit(
        "tp16: {tp: 16, pp: 1, ep: 4}", "tp16: {tp: 16, pp: 1, ep: 4, slo: {tpot_p150: 1s}}"
    )
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_TP16, "layouts.tp16.slo.tpot_p150")
    assert "percentile 150 is not in (0, 100]" in msg


def test_slo_confidence_is_the_files_not_a_metric(tmp_path: Path) -> None:
    text = edit("  ttft_p95: 30s", "  ttft_p95: 30s\n  confidence: 0.9")
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.slo_confidence == 0.9 and "confidence" not in cluster.slo
    assert load_cluster(write(tmp_path, BASE)).slo_confidence is None
    path, msg = load_error(tmp_path, edit("  ttft_p95: 30s", "  ttft_p95: 30s\n  confidence: 1"))
    assert_names(msg, path, L_SLO + 2, "slo.confidence")
    assert "expected a number over 0.5 and under 1" in msg
    text = edit("tp16: {tp: 16, pp: 1, ep: 4}", "tp16: {tp: 16, ep: 4, slo: {confidence: 0.9}}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_TP16, "layouts.tp16.slo.confidence")
    assert "the whole run's (slo.confidence)" in msg


def test_layout_slo_kept_as_text(tmp_path: Path) -> None:
    text = edit("tp16: {tp: 16, pp: 1, ep: 4}", "tp16: {tp: 16, ep: 4, slo: {success_rate: 0.9}}")
    layout = load_cluster(write(tmp_path, text)).layout("tp16")
    assert layout.slo == (("success_rate", "0.9"),)
    assert {layout: "usable as a dict key / pytest param"}  # frozen and hashable


@pytest.mark.parametrize(
    ("profile", "field", "problem"),
    [
        ("{layers: many}", "mock.profile.layers", "expected a number, got 'many'"),
        ("{gpu_tflops: 0}", "mock.profile.gpu_tflops", "must be positive, got 0"),
        ("{nvlink: 1}", "mock.profile.nvlink", "unknown profile field (known: gpu_tflops,"),
        ("[1]", "mock.profile", "expected a mapping, got list [1]"),
    ],
)
def test_bad_mock_profile(tmp_path: Path, profile: str, field: str, problem: str) -> None:
    path, msg = load_error(tmp_path, BASE + f"mock:\n  time_scale: 10\n  profile: {profile}\n")
    assert_names(msg, path, 30, field)
    assert problem in msg


def test_mock_section(tmp_path: Path) -> None:
    cfg = load_cluster(write(tmp_path, BASE + "mock: {time_scale: 4, profile: {layers: 8}}\n"))
    assert cfg.mock is not None
    assert (cfg.mock.time_scale, cfg.mock.seed, cfg.mock.profile) == (4.0, 0, {"layers": 8})
    assert cfg.time_scale == 4.0


# ----------------------------------------------------------------------------- strictness


@pytest.mark.parametrize(
    ("line", "field", "problem"),
    [
        ("startup_timeout_s: '60'", "startup_timeout_s", "expected a number, got str '60'"),
        ("startup_timeout_s: true", "startup_timeout_s", "expected a number, got bool True"),
        ("startup_timeout_s: 0", "startup_timeout_s", "must be > 0, got 0"),
        ("work_dir: ''", "work_dir", "expected a non-empty string, got str ''"),
        ("work_dir: 5", "work_dir", "expected a non-empty string, got int 5"),
        ("ssh: {check_host_keys: 1}", "ssh.check_host_keys", "expected true or false, got int 1"),
        ("ssh: {passphrase_env: hunter2!}", "ssh.passphrase_env", "the NAME of an environment"),
        ("ssh: {port: 0}", "ssh.port", "must be >= 1, got 0"),
        ("slo: {ttft_p95: [1]}", "slo.ttft_p95", "expected a string, got list [1]"),
    ],
)
def test_strict_top_level_values(tmp_path: Path, line: str, field: str, problem: str) -> None:
    text = edit("slo:\n  ttft_p95: 30s\n", line + "\n")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, L_SLO, field)
    assert problem in msg


@pytest.mark.parametrize(
    ("old", "new", "field", "problem"),
    [
        ("  concurrency: 2", "  percentiles: [50, 0]", "workload.percentiles", "0 is not a perc"),
        ("  concurrency: 2", "  percentiles: []", "workload.percentiles", "expected a list of"),
        ("  concurrency: 2", "  api: grpc", "workload.api", "'grpc' is not one of generate,"),
        ("  concurrency: 2", "  clock_start: connect", "workload.clock_start",
         "'connect' is not one of request, send"),
        ("  node: n1", "  wrapper: docker", "router.wrapper", "expected a list of command-line"),
        ("  node: n1", "  env: {1A: x}", "router.env.1A", "not a valid environment variable"),
        ("  node: n1", "  node: 'n 1'", "router.node", "'n 1' is not a plain name"),
        ("  pp2: {tp: 8", "  p p: {tp: 8", "layouts.p p", "layout names are plain words"),
        ("  replicas: 2", "  replicas: 2.0", "deployment.replicas", "expected an integer, got fl"),
    ],
)
def test_field_checks(tmp_path: Path, old: str, new: str, field: str, problem: str) -> None:
    path, msg = load_error(tmp_path, edit(old, new))
    assert msg.startswith(f"{path}:"), msg
    assert f"field '{field}': " in msg.splitlines()[0], msg
    assert problem in msg


def test_every_problem_is_listed_first_in_file_order(tmp_path: Path) -> None:
    text = edit("  replicas: 2", '  replicas: "2"')
    text = edit("  input_len: 16", "  input_len: 0", text)
    text = edit("  dataset: /data/d.jsonl\n", "", text)
    path, msg = load_error(tmp_path, text)
    first, *more = msg.splitlines()
    assert_names(first, path, L_REPLICAS, "deployment.replicas")
    assert more == [
        f"  also {path}:{L_INPUT_LEN - 1}: field 'workload.input_len': must be >= 1, got 0",
        f"  also {path}:{L_WORKLOAD}: field 'workload.dataset': required field is missing",
    ]


def test_node_ssh_overrides_cluster_defaults(tmp_path: Path) -> None:
    text = edit("executor: local", "executor: local\nssh: {user: kimi, connect_timeout_s: 3}")
    text = edit(
        "{name: n2, host: 127.0.0.1, gpus: 8}",
        "{name: n2, host: 127.0.0.1, gpus: 8, ssh: {port: 2222, user: root}}",
        text,
    )
    cfg = load_cluster(write(tmp_path, text))
    assert (cfg.node("n1").ssh.user, cfg.node("n1").ssh.port) == ("kimi", 22)
    assert (cfg.node("n2").ssh.user, cfg.node("n2").ssh.port) == ("root", 2222)
    assert cfg.node("n2").ssh.connect_timeout_s == 3.0  # not overridden: the cluster's


# ----------------------------------------------------------------------------- yamlfile


def test_read_yaml_records_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\ne: [1, 2]\n", "x.yaml")
    src = read_yaml(path)
    assert src.data == {"a": {"b": 1, "c": ["x", {"d": 2}]}, "e": [1, 2]}
    assert src.lines == {
        "a": 1,
        "a.b": 2,
        "a.c": 3,
        "a.c[0]": 4,
        "a.c[1]": 5,
        "a.c[1].d": 5,
        "e": 6,
        "e[0]": 6,
        "e[1]": 6,
    }


def test_line_of_falls_back_to_parent() -> None:
    src = Located(Path("f.yaml"), {}, {"a": 3, "a.b": 7})
    assert src.line_of("a.b") == 7
    assert src.line_of("a.b.c.d") == 7
    assert src.line_of("a.x") == 3
    assert src.line_of("zzz") is None
    assert str(src.error("a.x", "bad")) == "f.yaml:3: field 'a.x': bad"
    assert str(src.error("zzz", "bad")) == "f.yaml: field 'zzz': bad"


def test_read_yaml_empty_document(tmp_path: Path) -> None:
    src = read_yaml(write(tmp_path, "# only a comment\n", "e.yaml"))
    assert src.data == {} and src.lines == {}


def test_read_yaml_multiple_documents(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n---\nb: 2\n", "m.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2: invalid YAML: ")):
        read_yaml(path)


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------------------------- known bugs


def test_ssh_router_auto_port_names_router_port(tmp_path: Path) -> None:
    text = edit("executor: local", "executor: ssh")
    text = edit(
        "  model_path: /models/m\n",
        "  model_path: /models/m\n  port: 30001\n  dist_init_port: 5000\n",
        text,
    )
    _, msg = load_error(tmp_path, text)
    assert "field 'router.port'" in msg


def test_ssh_auto_dist_init_port_rejected(tmp_path: Path) -> None:
    text = (CLUSTERS / "pro6000.yaml").read_text(encoding="utf-8")
    text = edit("dist_init_port: 5757", "dist_init_port: auto", text)
    _, msg = load_error(tmp_path, text)
    assert "server.dist_init_port" in msg


def test_ssh_auto_prometheus_port_rejected(tmp_path: Path) -> None:
    text = (CLUSTERS / "pro6000.yaml").read_text(encoding="utf-8")
    text = edit("prometheus_port: 29000", "prometheus_port: auto", text)
    _, msg = load_error(tmp_path, text)
    assert "router.prometheus_port" in msg


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("  concurrency: 2", "  concurrency: !!int abc"),
        ("  concurrency: 2", "  concurrency: !custom 2"),
        ("  node: n1", "  <<: {node: n1}"),
    ],
)
def test_yaml_construct_errors_are_config_errors(tmp_path: Path, old: str, new: str) -> None:
    path, msg = load_error(tmp_path, edit(old, new))
    assert str(path) in msg


def test_speculative_decoding_with_pipeline_parallelism_is_refused_where_it_is_set(
    tmp_path: Path,
) -> None:
    """SGLang 0.5.9 asserts at start-up that PP > 1 runs no speculative decoding: the file
    says so first, naming the flag that turns it on (the layout's, or server.args')."""
    pp2 = "  pp2: {tp: 8, pp: 2, ep: 8}"
    line = BASE.splitlines().index(pp2) + 1
    text = edit(pp2, "  pp2: {tp: 8, pp: 2, ep: 8, args: {speculative-algorithm: EAGLE3}}")
    path, msg = load_error(tmp_path, text)
    assert_names(msg, path, line, "layouts.pp2.args.speculative-algorithm")
    assert "layouts.pp2 with PP 2" in msg and "use PP 1" in msg
    text = edit("    chunked-prefill-size: 8192",
                "    chunked-prefill-size: 8192\n    speculative-algorithm: EAGLE")  # fmt: skip
    path, msg = load_error(tmp_path, text)
    assert "field 'server.args.speculative-algorithm'" in msg and "PP 2" in msg
    # a PP1 layout speculates; a PP layout may switch the cluster-wide flag off (null)
    both = text.replace(pp2, "  pp2: {tp: 8, pp: 2, ep: 8, args: {speculative-algorithm: null}}")
    cfg = load_cluster(write(tmp_path, both))
    assert cfg.server_args(cfg.layout("tp16"))["speculative-algorithm"] == "EAGLE"


def test_a_cluster_whose_layouts_all_run_only_when_named_asks_for_layout() -> None:
    cfg = load_cluster(CLUSTERS / "local.yaml")
    quiet = {n: replace(lay, default=False) for n, lay in cfg.layouts.items()}
    with pytest.raises(UsageProblem, match="every layout is default: false: name the ones"):
        default_layouts(replace(cfg, layouts=quiet))
