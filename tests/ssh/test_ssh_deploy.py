"""Real-cluster deployment over SSH (fabric), proven on 8 SSH test hosts in namespaces.

The product runs inside the hub namespace, as an engineer's laptop would sit on the cluster
network; every node is a real sshd in its own network, UTS and PID namespace, and runs the mock
server under the command line real SGLang would get. Nothing may be left on any host.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from pytest_kimi.testing.processes import pytest_argv, signal_when

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "tests" / "perf"


def _cluster_yaml(ssh_hosts, path: Path, *, node_env: dict[str, dict[str, str]] | None = None):
    nodes = []
    for host in ssh_hosts.hosts:
        node = {"name": host.name, "host": host.address, "gpus": 8}
        if node_env and host.name in node_env:
            node["env"] = node_env[host.name]
        nodes.append(node)
    fixed = {
        "chunked-prefill-size": 8192,
        "disable-radix-cache": True,
        "kv-cache-dtype": "bf16",
        "moe-runner-backend": "flashinfer_mxfp4",
        "moe-a2a-backend": "none",
        "enable-metrics": True,
    }
    cluster = {
        "name": "nshosts",
        "executor": "ssh",
        "work_dir": str(path.parent / "remote"),
        "ssh": {
            "user": ssh_hosts.user,
            "key": str(ssh_hosts.key_path),
            "known_hosts": str(ssh_hosts.known_hosts_path),
            "connect_timeout_s": 3,
            "command_timeout_s": 30,
            "reconnect_s": 5,  # a host stopped for good is lost in seconds, not a minute
            "teardown_reconnect_s": 10,
        },
        "nodes": nodes,
        "deployment": {"replicas": 2, "nodes_per_replica": 4},
        "layouts": {"tp32": {"tp": 32, "pp": 1, "ep": 4}, "pp8": {"tp": 4, "pp": 8, "ep": 4}},
        "server": {
            "python": sys.executable,
            "module": "pytest_kimi.mock.launch_server",
            "model_path": "builtin:mock-tokenizer",
            "port": 30001,
            "dist_init_port": 5757,
            "args": fixed,
            "env": {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_secret_value_123"},
        },
        "router": {
            "python": sys.executable,
            "node": "node601",
            "port": 30000,
            "prometheus_port": 29000,
            "env": {"HF_ENDPOINT": "http://127.0.0.1:9"},
        },
        "workload": {
            "dataset": "builtin:speedbench16k",
            "num_requests": 8,
            "input_len": 16384,
            "output_len": 16,
            "concurrency": 4,
            "warmup_requests": 1,
        },
        "slo": {"ttft_p95": "120s", "tpot_p95": "2s", "tpot_mean": "2s"},
        "startup_timeout_s": 60,
        "mock": {"time_scale": 100, "seed": 1},
    }
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


def _run_in_hub(ssh_hosts, tmp_path: Path, cluster: Path, *args: str, env=None):
    argv = [
        *pytest_argv(), str(PERF), f"--cluster={cluster}",
        f"--kimi-report-dir={tmp_path / 'out'}", "-p", "no:cacheprovider",
        f"--rootdir={ROOT}", "-q", *args,
    ]  # fmt: skip
    return ssh_hosts.run_in_hub(argv, timeout=600, cwd=ROOT, env=env)


def _assert_no_processes(ssh_hosts) -> None:
    left = {host.name: ssh_hosts.pids(host) for host in ssh_hosts.hosts if host.running}
    assert not any(left.values()), f"processes left on test hosts: {_described(left)}"


def _described(left: dict[str, list[int]]) -> dict[str, list[str]]:
    """Each leftover pid with its command line, so a failure says what was left."""
    out = {}
    for name, pids in left.items():
        for pid in pids:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                what = " ".join(a.decode(errors="replace") for a in argv if a)[:300]
            except OSError:
                what = "(exited)"
            out.setdefault(name, []).append(f"{pid}: {what}")
    return out


def test_dp2_tp32_and_pp8_over_ssh_bring_up_run_and_leave_nothing(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())  # the key needs its passphrase, from the env
    data["ssh"].update(key=str(ssh_hosts.passphrase_key_path), passphrase_env="KIMI_TEST_KEY_PASS")
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "KIMI_TEST_KEY_PASS": ssh_hosts.passphrase}
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32,pp8", env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "10 passed" in done.stdout
    _assert_no_processes(ssh_hosts)

    [run] = list((tmp_path / "out").iterdir())
    comparison = json.loads((run / "comparison.json").read_text())
    assert [lay["name"] for lay in comparison["layouts"]] == ["tp32", "pp8"]
    for layout in ("tp32", "pp8"):
        folder = run / layout
        manifest = json.loads((folder / "manifest.json").read_text())
        hostnames = sorted(n["hostname"] for n in manifest["nodes"])
        assert hostnames == [f"node60{i}" for i in range(1, 9)]  # each ran on its own host
        assert all(n["software"]["pytest_kimi"] for n in manifest["nodes"])
        commands = [p["command"] for p in manifest["processes"]]
        assert any(f"--dist-init-addr {ssh_hosts.hosts[4].address}:5757" in c for c in commands)
        logs = sorted(p.name for p in (folder / "logs").iterdir())
        assert len(logs) == 9 and "router.log" in logs  # fetched from the nodes
        node_log = (folder / "logs" / "replica1-node0-node605.log").read_text()
        assert "ready to roll" in node_log
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["completed"] == 8 and summary["complete"] is True
        assert any(n.startswith("requests per replica:") for n in summary["notes"])
        assert any(n.startswith("log check:") for n in summary["notes"])
    # neither the API token (a server env value) nor the key passphrase lands in anything we
    # wrote: reports, manifests, fetched logs, the nodes' own files, or the terminal
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != cluster]  # not the input
    assert any(p.name == "router.log" for p in written)
    assert any("remote" in p.parts for p in written)  # the nodes' logs, where they ran
    for secret in ("hf_secret_value_123", ssh_hosts.passphrase):
        assert secret not in done.stdout + done.stderr
        for path in written:
            assert secret not in path.read_text(errors="replace"), path


def test_unreachable_host_is_a_bring_up_error_naming_it(ssh_hosts, tmp_path):
    victim = ssh_hosts.hosts[2]  # node603
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    ssh_hosts.stop_host(victim)
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    finally:
        ssh_hosts.start_host(victim)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "node node603" in done.stdout and "unreachable" in done.stdout
    _assert_no_processes(ssh_hosts)  # what started on node601/602 was stopped


def test_server_exiting_during_start_up_names_the_node_and_shows_its_log(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(
        ssh_hosts, tmp_path / "cluster.yaml",
        node_env={"node606": {"PYTHONHOME": "/nonexistent"}},  # a broken Python on one node
    )  # fmt: skip
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=pp8")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "replica1-node1-node606 (replica 1 node node606" in done.stdout
    assert "during start-up; last lines of its log" in done.stdout
    assert "Fatal Python error" in done.stdout or "No module named" in done.stdout
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "pp8" / "summary.json").read_text())
    assert summary["complete"] is False and "node606" in summary["error"]


@pytest.mark.parametrize("wrong", ["known_hosts", "key"])
def test_wrong_host_key_or_refused_auth_names_host_and_cause(ssh_hosts, tmp_path, wrong):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    if wrong == "known_hosts":
        data["ssh"]["known_hosts"] = str(ssh_hosts.wrong_known_hosts_path)
        expected = "host key mismatch"
    else:
        data["ssh"]["key"] = str(ssh_hosts.passphrase_key_path)  # passphrase not provided
        expected = "is encrypted and no passphrase was given"
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "node node601" in done.stdout and expected in done.stdout
    _assert_no_processes(ssh_hosts)


def _interrupt_in_hub(ssh_hosts, tmp_path: Path, cluster: Path, ready, sig) -> tuple[int, str]:
    """Run the perf tests in the hub; send ``sig`` to pytest once ``ready(log_text)``."""
    argv = [
        *pytest_argv(), str(PERF), f"--cluster={cluster}",
        f"--kimi-report-dir={tmp_path / 'out'}", "-p", "no:cacheprovider",
        f"--rootdir={ROOT}", "-v", "--layout=tp32,pp8",
    ]  # fmt: skip
    # `ip netns exec` execs: the pid signalled is pytest's
    return signal_when(ssh_hosts.in_hub(argv), tmp_path / "pytest.log", ready, sig, cwd=ROOT,
                       timeout_s=120)  # fmt: skip


def test_ctrl_c_during_bring_up_over_ssh_stops_every_host(ssh_hosts, tmp_path):
    # replica 1's head never turns healthy, so bring-up is surely still waiting
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                            node_env={"node605": {"KIMI_MOCK_FAULT": "health=fail"}})  # fmt: skip
    code, text = _interrupt_in_hub(
        ssh_hosts, tmp_path, cluster, lambda log: " healthy after " in log, signal.SIGINT
    )
    assert code == 2, text[-4000:]  # pytest's "interrupted"
    _assert_no_processes(ssh_hosts)  # all 8 server processes on 8 hosts, and nothing else
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["complete"] is False and "KeyboardInterrupt" in summary["error"]
    assert len(list((run / "tp32" / "logs").glob("replica*.log"))) == 8  # fetched from the hosts
    assert "**INCOMPLETE RUN**" in (run / "comparison.md").read_text()


def test_sigterm_during_the_run_over_ssh_keeps_partial_records_and_stops_every_host(
    ssh_hosts, tmp_path
):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["mock"]["time_scale"] = 4  # a measured run of ~6 s wall to land in
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))

    def measured(log: str) -> bool:
        """A measured request is on disk and the run is not over yet (its end line not
        printed): the signal lands in the run, not in the teardown after it."""
        if "[kimi tp32] measured " in log:
            raise AssertionError("the measured run ended before a record was seen:\n" + log)
        partial = list((tmp_path / "out").glob("*/tp32/records.partial.jsonl"))
        lines = partial[0].read_text().splitlines() if partial else []
        return any(x.endswith("}") and json.loads(x)["index"] >= 0 for x in lines)

    code, text = _interrupt_in_hub(ssh_hosts, tmp_path, cluster, measured, signal.SIGTERM)
    assert code == 2, text[-4000:]
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    records = [json.loads(x) for x in (run / "tp32" / "records.jsonl").read_text().splitlines()]
    measured_records = [r for r in records if not r["warmup"]]
    assert any(r["success"] for r in measured_records)
    assert any(r["error"].startswith("interrupted before completion") for r in measured_records)
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["error"].startswith("run interrupted after")
    assert (run / "tp32" / "logs" / "router.log").exists()
    assert "**INCOMPLETE RUN**" in (run / "comparison.md").read_text()
