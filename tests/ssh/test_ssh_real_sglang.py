"""The mission on real SGLang over SSH: every node its own host (an SSH test host in its own
network namespace), servers started by fabric, each TP2 replica spanning two hosts.

What the local CPU cluster cannot show: a replica's two ranks on two machines meeting at the
``--dist-init-addr`` of the head's data address, their Gloo traffic on the interface the
cluster file names (``network.interface`` -> ``GLOO_SOCKET_IFNAME``), and nothing left on any
host afterwards. One version (0.5.23, what users run today); tests/realsglang covers both
locally. A one-host replica over SSH adds nothing a real server would show: TP1 runs on real
SGLang locally (tests/realsglang/test_mission.py) and over SSH on the mock
(tests/ssh/test_ssh_deploy.py), and each real server start costs ~20 s of CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub

from pytest_kimi.testing.realsglang import (
    CPU_ENV,
    CPU_FLAGS,
    MODEL_DIR,
    ROOT,
    assert_no_standin_calls,
    install,
)

pytestmark = pytest.mark.slow

VERSION = "0.5.23"


def _flags() -> dict[str, object]:
    """:data:`CPU_FLAGS` as the cluster file's ``server.args``."""
    args: dict[str, object] = {}
    items = list(CPU_FLAGS)
    while items:
        name = items.pop(0).removeprefix("--")
        args[name] = items.pop(0) if items and not items[0].startswith("--") else True
    return args


def test_tp2_replicas_span_two_hosts_on_real_sglang_over_ssh_and_leave_nothing(
    ssh_hosts, tmp_path: Path
) -> None:
    python = install(VERSION)
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    for node in data["nodes"]:
        node["gpus"] = 1  # a rank's slot per host
    data["deployment"] = {"replicas": 2, "nodes_per_replica": 1}
    data["layouts"] = {
        "tp2": {"tp": 2, "nodes_per_replica": 2,
                "nodes": [n["name"] for n in data["nodes"][4:8]],
                "env": {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}},
    }  # fmt: skip
    data["server"].update(
        python=str(python), module="sglang.launch_server", model_path=str(MODEL_DIR),
        args=_flags(), env={**CPU_ENV, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )  # fmt: skip
    data["router"]["node"] = data["nodes"][4]["name"]
    data["network"] = {"interface": "eth0"}  # Gloo between the hosts on their data network
    data["workload"] = {
        "dataset": str(ROOT / "clusters" / "cpu-sglang-prompts.jsonl"), "num_requests": 8,
        "input_len": 512, "output_len": 16, "concurrency": 4, "warmup_requests": 1,
    }  # fmt: skip
    data["slo"] = {"ttft_p95": "30s", "tpot_p95": "2s"}
    data.pop("mock")
    data["startup_timeout_s"] = 600
    data["telemetry"] = {"enabled": False}
    data["preflight"] = {"enabled": False}
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))

    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp2")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    tp2 = json.loads((run / "tp2" / "manifest.json").read_text())
    commands = {p["name"]: p["command"] for p in tp2["processes"]}
    hosts = ssh_hosts.hosts[4:8]
    for replica in (0, 1):
        head, other = hosts[2 * replica], hosts[2 * replica + 1]
        for rank, host in enumerate((head, other)):
            command = commands[f"replica{replica}-node{rank}-{host.name}"]
            assert f"--dist-init-addr {head.address}:" in command, command
            assert "GLOO_SOCKET_IFNAME=eth0" in command and "--nnodes 2" in command
    assert {n.get("sglang_server_version") for n in tp2["nodes"]} >= {VERSION}
    summary = json.loads((run / "tp2" / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["failed"] == 0
    split = [c["requests"] for c in summary["replica_counters"].values()]
    assert sum(split) == 8 and min(split) > 0, split
    assert_no_standin_calls(run.glob("*/logs/*.log"))
