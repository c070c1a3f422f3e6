"""The real Slurm the Slurm executor's tests run against (tests/ssh/slurmhosts.py): slurmctld
in the hub, a slurmd on each SSH test host, allocations and steps where they belong, and
nothing left after them."""

from __future__ import annotations

import os
import subprocess
import time

from slurmhosts import SlurmCluster
from testhosts import TestCluster


def _allocate(slurm: SlurmCluster, *flags: str) -> str:
    done = slurm.run(["salloc", "--no-shell", "--job-name=kimi-test", *flags])
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "Granted job allocation" in x]
    return line.rsplit(" ", 1)[1]


def test_every_node_is_idle_with_its_gpus(slurm: SlurmCluster, ssh_hosts: TestCluster):
    names = [h.name for h in ssh_hosts.hosts]
    assert slurm.node_states() == dict.fromkeys(names, "idle")
    gres = slurm.run(["sinfo", "-h", "-N", "-o", "%N %G"]).stdout.split("\n")
    assert all(line.endswith("gpu:8") for line in gres if line)


def test_a_step_runs_on_the_node_it_names_and_scancel_leaves_nothing(
    slurm: SlurmCluster, ssh_hosts: TestCluster
):
    job = _allocate(slurm, "--nodes=2", "--nodelist=node601,node605", "--gres=gpu:8",
                    "--time=5")  # fmt: skip
    step = slurm.run(["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1",
                      "--nodelist=node605", "sh", "-c",
                      "hostname; ip -4 -o addr show eth0; echo $SLURM_JOB_ID"])  # fmt: skip
    assert step.returncode == 0, step.stderr
    name, addr, job_id = step.stdout.splitlines()
    assert name == "node605" and f"{ssh_hosts.host('node605').address}/" in addr
    assert job_id == job
    # a step left running, then the allocation cancelled: nothing of it survives anywhere
    sleeper = slurm.hosts.in_hub(["srun", f"--jobid={job}", "--overlap", "-N1", "-n1",
                                  "-w", "node601", "sleep", "600"])  # fmt: skip
    proc = subprocess.Popen(sleeper, env={**os.environ, **slurm.env()},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    host = ssh_hosts.host("node601")
    deadline = time.monotonic() + 20
    while not any(_comm(pid) == "sleep" for pid in ssh_hosts.pids(host)):
        assert time.monotonic() < deadline, "the step never started on node601"
        time.sleep(0.05)
    assert slurm.run(["scancel", job]).returncode == 0
    proc.wait(30)  # srun ends with its step
    deadline = time.monotonic() + 30
    while slurm.jobs() or any(_comm(pid) == "sleep" for pid in ssh_hosts.pids(host)):
        assert time.monotonic() < deadline, (slurm.jobs(), ssh_hosts.pids(host))
        time.sleep(0.1)


def test_a_job_that_cannot_start_waits_in_the_queue(slurm: SlurmCluster):
    """Every node held by one job (--exclusive): the next cannot start, and salloc
    --immediate gives up and leaves no job behind."""
    holder = _allocate(slurm, "--nodes=8", "--exclusive", "--time=5")
    try:
        done = slurm.run(["salloc", "--no-shell", "--immediate=2", "--nodes=1",
                          "--job-name=kimi-waiter"], timeout=30)  # fmt: skip
        assert done.returncode != 0
        assert "Unable to allocate resources" in done.stderr, done.stderr
        assert [j for j in slurm.jobs() if "kimi-waiter" in j] == []  # salloc cancelled it
    finally:
        slurm.run(["scancel", holder])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
