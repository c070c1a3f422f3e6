"""GPU pre-flight over SSH on the 8 test hosts, with the mock's stand-in nvidia-smi.

A foreign job holding a GPU (``nvidia_smi hold`` started on a host, outside any run) and a
node listing fewer GPUs than the cluster file says must each stop the run before anything
starts, with one error naming node, GPU and holder; ``--kimi-preflight-only`` checks every
node and starts nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub


def _cluster(ssh_hosts, tmp_path: Path) -> tuple[Path, Path]:
    """The deploy tests' cluster with a work dir of its own (GPU state persists per node)."""
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["work_dir"] = str(tmp_path / "remote")
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    return cluster, tmp_path / "remote"


def _hold(ssh_hosts, host, state_dir: Path, gpus: str, mib: int) -> int:
    """Start a holder on ``host`` as a foreign job would be: detached, outside our runs;
    returns its pid on the host."""
    command = (
        f"setsid nohup {sys.executable} -m pytest_kimi.mock.nvidia_smi --node {host.name} "
        f"--state-dir {state_dir} hold --gpus {gpus} --mib {mib} >/dev/null 2>&1 </dev/null & "
        f"pid=$!; for i in $(seq 400); do [ -f {state_dir}/$pid.json ] && break; sleep 0.05; "
        "done; echo $pid"
    )  # waits until the holder has registered (its state file exists)
    done = ssh_hosts.run_in_hub(ssh_hosts.ssh_argv(host, command), timeout=30)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[0])


def _on_host(ssh_hosts, host, command: str) -> str:
    done = ssh_hosts.run_in_hub(ssh_hosts.ssh_argv(host, command), timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _stop(ssh_hosts, host, pid: int) -> None:
    """Stop the holder and wait until it is gone."""
    _on_host(ssh_hosts, host, f"kill {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.05; done")


def _nothing_started(remote: Path) -> None:
    """No run folder on any node: no server was launched (only the GPU state and the node
    locks, taken before the pre-flight, exist)."""
    assert sorted(p.name for p in remote.iterdir()) == ["locks", "mock-gpus"]


def test_busy_gpu_is_refused_before_launch_naming_node_gpu_and_pid(ssh_hosts, tmp_path):
    cluster, remote = _cluster(ssh_hosts, tmp_path)
    victim = ssh_hosts.host("node603")
    pid = _hold(ssh_hosts, victim, remote / "mock-gpus" / "node603", "3", 40960)
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
        on_hosts = {h.name: ssh_hosts.pids(h) for h in ssh_hosts.hosts}
    finally:
        _stop(ssh_hosts, victim, pid)
    assert done.returncode == 1, done.stdout[-3000:]
    expected = f"node node603 ({victim.address}): GPU 3 busy: pid {pid} (python3) holds 40960 MiB"
    assert expected in done.stdout
    assert "GPU pre-flight found 1 problem; nothing was started" in done.stdout
    # while the run failed, only the holder ran anywhere: no mock server was started
    assert {n: len(p) for n, p in on_hosts.items() if p} == {"node603": 1}
    _nothing_started(remote)
    _assert_no_processes(ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["complete"] is False and "GPU 3 busy" in summary["error"]


def test_gpu_count_mismatch_is_refused(ssh_hosts, tmp_path):
    cluster, remote = _cluster(ssh_hosts, tmp_path)
    state = remote / "mock-gpus" / "node605"
    state.mkdir(parents=True)
    (state / "gpu_count").write_text("4\n")  # the stand-in lists 4 GPUs on node605
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=pp8")
    assert done.returncode == 1, done.stdout[-3000:]
    address = ssh_hosts.host("node605").address
    assert (
        f"node node605 ({address}): nvidia-smi lists 4 GPUs, the cluster file says gpus: 8"
        in done.stdout
    )
    _nothing_started(remote)
    _assert_no_processes(ssh_hosts)


def test_preflight_only_checks_all_8_hosts_and_starts_nothing(ssh_hosts, tmp_path):
    cluster, remote = _cluster(ssh_hosts, tmp_path)
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--kimi-preflight-only")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("node60")]
    assert sorted(r[0] for r in rows) == [f"node60{i}" for i in range(1, 9)]
    assert all(r[2] == "8/8" for r in rows)
    assert "all GPUs present and idle" in done.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert not remote.exists() or sorted(p.name for p in remote.iterdir()) in ([], ["mock-gpus"])
    _assert_no_processes(ssh_hosts)


def test_preflight_only_with_a_busy_gpu_exits_non_zero_listing_it(ssh_hosts, tmp_path):
    cluster, remote = _cluster(ssh_hosts, tmp_path)
    victim = ssh_hosts.host("node608")  # not in the first layout's replicas' heads: all nodes count
    pid = _hold(ssh_hosts, victim, remote / "mock-gpus" / "node608", "0,1", 8192)
    try:
        done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--kimi-preflight-only")
    finally:
        _stop(ssh_hosts, victim, pid)
    assert done.returncode == 1, done.stdout[-3000:]
    assert f"PROBLEM node node608 ({victim.address}): GPU 0 busy: pid {pid}" in done.stdout
    assert f"GPU 1 busy: pid {pid} (python3) holds 8192 MiB" in done.stdout
    _assert_no_processes(ssh_hosts)
