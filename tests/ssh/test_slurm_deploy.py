"""``executor: slurm`` proven on a real Slurm (slurmctld, one slurmd per SSH test host): the
mission's DP2 tp32 + pp8 as steps of one allocation per layout, a node that fails at start-up,
Ctrl-C during the run, an allocation that waits in the queue past its timeout. After each,
nothing of ours is left: no job in the queue, no process on any host.

The product runs inside the hub namespace (the submit host), with ``SLURM_CONF`` naming the
test cluster's controller, as a login node's environment would.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import yaml
from slurmhosts import SlurmCluster
from test_ssh_deploy import _cluster_yaml as ssh_cluster_yaml
from testhosts import TestCluster

from pytest_kimi.testing.processes import pytest_argv, signal_when

ROOT = Path(__file__).resolve().parents[2]
PERF = ROOT / "tests" / "perf"


def _cluster_yaml(hosts: TestCluster, path: Path, **changes) -> Path:
    """The SSH tests' mission file (test_ssh_deploy), run through Slurm instead: no ssh
    block, a slurm one; ``changes`` replace top-level fields (``slurm`` adds to its block)."""
    ssh_file = ssh_cluster_yaml(hosts, path, node_env=changes.pop("node_env", None))
    cluster = yaml.safe_load(ssh_file.read_text())
    del cluster["ssh"]
    cluster.update(name="slurmhosts", executor="slurm",
                   slurm={"partition": "gpu", "time": "00:30:00", "gres": "gpu:8",
                          "queue_timeout_s": 60, **changes.pop("slurm", {})})  # fmt: skip
    cluster.update(changes)
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


def _argv(slurm: SlurmCluster, tmp_path: Path, cluster: Path, *args: str) -> list[str]:
    """pytest on the perf tests in the hub, with the test cluster's SLURM_CONF (``env`` and
    ``ip netns exec`` exec: the pid is pytest's)."""
    return slurm.hosts.in_hub([
        "env", f"SLURM_CONF={slurm.conf}", *pytest_argv(), str(PERF), f"--cluster={cluster}",
        f"--kimi-report-dir={tmp_path / 'out'}", "-p", "no:cacheprovider", f"--rootdir={ROOT}",
        "-q", *args,
    ])  # fmt: skip


def _run(slurm: SlurmCluster, tmp_path: Path, cluster: Path, *args: str):
    import subprocess

    return subprocess.run(_argv(slurm, tmp_path, cluster, *args), capture_output=True,
                          text=True, timeout=600, cwd=ROOT)  # fmt: skip


def _assert_nothing_left(slurm: SlurmCluster, hosts: TestCluster) -> None:
    """No job in the queue, and on every host nothing but the test cluster's own slurmd (and
    the nsenter that started it). The product waits for its own jobs to leave the queue; a
    step's slurmstepd ends a moment after its job: the hosts get a few seconds to show that."""
    assert [j for j in slurm.jobs() if "pytest-kimi" in j] == []  # the product waited
    deadline = time.monotonic() + 15
    while True:
        jobs = slurm.jobs()  # a job the test itself cancelled may still be completing
        left = {h.name: [f"{p} {_comm(p)}" for p in hosts.pids(h)
                         if _comm(p) not in ("slurmd", "nsenter")]
                for h in hosts.hosts if h.running}  # fmt: skip
        if (not jobs and not any(left.values())) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert jobs == [], jobs
    assert not any(left.values()), f"processes left on test hosts: {left}"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_dp2_tp32_and_pp8_through_slurm_leave_nothing(slurm, ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    done = _run(slurm, tmp_path, cluster, "--layout=tp32,pp8")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "10 passed" in done.stdout
    _assert_nothing_left(slurm, ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    jobs = set()
    for layout in ("tp32", "pp8"):
        folder = run / layout
        manifest = json.loads((folder / "manifest.json").read_text())
        allocation = manifest["slurm"]
        assert allocation["nodes"] == [f"node60{i}" for i in range(1, 9)]
        assert allocation["job_name"].endswith(f"/{layout}") and allocation["queue_wait_s"] >= 0
        jobs.add(allocation["job"])
        assert sorted(n["hostname"] for n in manifest["nodes"]) == [f"node60{i}" for i in
                                                                    range(1, 9)]  # fmt: skip
        commands = [p["command"] for p in manifest["processes"]]
        assert any(f"--dist-init-addr {ssh_hosts.hosts[4].address}:5757" in c for c in commands)
        logs = sorted(p.name for p in (folder / "logs").iterdir())
        assert len(logs) == 9 and "router.log" in logs
        assert "ready to roll" in (folder / "logs" / "replica1-node0-node605.log").read_text()
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["completed"] == 8 and summary["complete"] is True
        assert any(n.startswith(f"slurm: job {allocation['job']} on node601") and
                   "in the queue" in n for n in summary["notes"])  # fmt: skip
    assert len(jobs) == 2  # one allocation per layout
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != cluster]
    for path in written:  # the API token reached the servers through Slurm, nothing wrote it
        assert "hf_secret_value_123" not in path.read_text(errors="replace"), path
    assert "hf_secret_value_123" not in done.stdout + done.stderr


def test_the_router_on_the_submit_host_runs_here_outside_the_allocation(
    slurm, ssh_hosts, tmp_path
):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                            slurm={"router": "submit_host"})  # fmt: skip
    done = _run(slurm, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    _assert_nothing_left(slurm, ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    manifest = json.loads((run / "tp32" / "manifest.json").read_text())
    router = next(p for p in manifest["processes"] if p["role"] == "router")
    assert router["node"] == "submit-host" and "--host 127.0.0.1" in router["command"]
    assert manifest["slurm"]["nodes"] == [f"node60{i}" for i in range(1, 9)]  # servers only


def test_a_node_failing_at_start_up_is_named_and_the_job_cancelled(slurm, ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                            node_env={"node606": {"PYTHONHOME": "/nonexistent"}})  # fmt: skip
    done = _run(slurm, tmp_path, cluster, "--layout=pp8")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "replica1-node1-node606 (replica 1 node node606" in done.stdout
    assert "during start-up; last lines of its log" in done.stdout
    assert "Fatal Python error" in done.stdout or "No module named" in done.stdout
    _assert_nothing_left(slurm, ssh_hosts)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_during_the_run_cancels_the_allocation(slurm, ssh_hosts, tmp_path, sig):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml", mock={"time_scale": 10,
                                                                        "seed": 1})  # fmt: skip

    def measured(log: str) -> bool:
        partial = list((tmp_path / "out").glob("*/tp32/records.partial.jsonl"))
        lines = partial[0].read_text().splitlines() if partial else []
        return any(x.endswith("}") and json.loads(x)["index"] >= 0 for x in lines)

    code, text = signal_when(_argv(slurm, tmp_path, cluster, "--layout=tp32,pp8"),
                             tmp_path / "pytest.log", measured, sig, cwd=ROOT,
                             timeout_s=120)  # fmt: skip
    assert code == 2, text[-4000:]
    _assert_nothing_left(slurm, ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["error"].startswith("run interrupted after")
    assert (run / "tp32" / "logs" / "router.log").exists()


def test_an_allocation_waiting_past_its_timeout_fails_naming_the_wait(
    slurm, ssh_hosts, tmp_path
):
    """Someone else's job holds every node: the layout's allocation waits in the queue for
    slurm.queue_timeout_s, then the layout fails saying so, and leaves no job behind."""
    held = slurm.run(["salloc", "--no-shell", "--nodes=8", "--exclusive", "--job-name=other",
                      "--time=5"])  # fmt: skip
    assert held.returncode == 0, held.stderr
    try:
        cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                                slurm={"queue_timeout_s": 3})  # fmt: skip
        done = _run(slurm, tmp_path, cluster, "--layout=tp32")
        assert done.returncode == 1, done.stdout[-3000:]
        assert "no allocation of 8 nodes (node601" in done.stdout, done.stdout[-3000:]
        assert [j for j in slurm.jobs() if "pytest-kimi" in j] == []
    finally:
        slurm.run(["scancel", "--jobname=other"])
    _assert_nothing_left(slurm, ssh_hosts)
    [run] = list((tmp_path / "out").iterdir())
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["complete"] is False and "no allocation" in summary["error"]


def _hold_every_node(slurm: SlurmCluster, name: str = "other", comment: str = "") -> None:
    flags = [f"--comment={comment}"] if comment else []
    held = slurm.run(["salloc", "--no-shell", "--nodes=8", "--exclusive", f"--job-name={name}",
                      "--time=5", *flags])  # fmt: skip
    assert held.returncode == 0, held.stderr


def test_an_interrupt_while_queued_withdraws_the_request(slurm, ssh_hosts, tmp_path):
    """SIGTERM while the allocation waits in the queue: salloc withdraws the request (or it
    is cancelled by name), so the job cannot start later and hold the nodes for hours."""
    _hold_every_node(slurm)
    try:
        cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                                slurm={"queue_timeout_s": 120})  # fmt: skip

        def queued(log: str) -> bool:
            return any("pytest-kimi/" in j and "PENDING" in j for j in slurm.jobs())

        code, text = signal_when(_argv(slurm, tmp_path, cluster, "--layout=tp32"),
                                 tmp_path / "pytest.log", queued, signal.SIGTERM, cwd=ROOT,
                                 timeout_s=60)  # fmt: skip
        assert code == 2, text[-3000:]
        assert [j for j in slurm.jobs() if "pytest-kimi" in j] == []
    finally:
        slurm.run(["scancel", "--jobname=other"])
    _assert_nothing_left(slurm, ssh_hosts)


def test_kill_9_of_pytest_mid_run_leaves_no_job_and_no_process(slurm, ssh_hosts, tmp_path):
    """pytest killed outright: its lifeline closes, the reaper cancels the job (every step
    with it) and each local srun's watcher kills it: nothing is left, here or on a node."""
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml",
                            mock={"time_scale": 10, "seed": 1})  # fmt: skip

    def measuring(log: str) -> bool:
        return "[kimi tp32] measuring" in log or "requests done" in log

    code, text = signal_when(_argv(slurm, tmp_path, cluster, "--layout=tp32", "-s"),
                             tmp_path / "pytest.log", measuring, signal.SIGKILL, cwd=ROOT,
                             timeout_s=120)  # fmt: skip
    assert code == -signal.SIGKILL, text[-3000:]
    deadline = time.monotonic() + 30
    while any("pytest-kimi" in j for j in slurm.jobs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    _assert_nothing_left(slurm, ssh_hosts)
    here = [p for p in slurm.ours() if _comm(p) in ("srun", "salloc", "sh", "python3",
                                                      "python")]  # fmt: skip
    assert here == [], [(p, _comm(p)) for p in here]


def test_a_dead_runs_job_on_the_nodes_is_named_and_reaped_on_request(slurm, ssh_hosts, tmp_path):
    """A job an earlier run left (its owner, a process on this machine, is gone) holds the
    layout's nodes: bring-up fails at once naming it; with --kimi-reap it is cancelled and
    the run goes on."""
    import socket

    dead = f"pytest-kimi:{socket.gethostname()}:999999:0"  # no such process here
    _hold_every_node(slurm, name="pytest-kimi/20260101-000000-old/tp32", comment=dead)
    try:
        cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
        done = _run(slurm, tmp_path / "refused", cluster, "--layout=tp32")
        assert done.returncode == 1, done.stdout[-3000:]
        assert "a run of yours that died left" in done.stdout
        assert "pytest-kimi/20260101-000000-old/tp32" in done.stdout
        reaped = _run(slurm, tmp_path / "reaped", cluster, "--layout=tp32", "--kimi-reap")
        assert reaped.returncode == 0, reaped.stdout[-3000:]
        assert "cancelled Slurm jobs a run that died left" in reaped.stdout
    finally:
        slurm.run(["scancel", "--jobname=pytest-kimi/20260101-000000-old/tp32"])
    _assert_nothing_left(slurm, ssh_hosts)
