"""Slurm's client commands here, and our jobs as Slurm lists them: who owns each, which to cancel.

Every Slurm command (``squeue``, ``scancel``, ``scontrol``, ``sacct``) runs on this machine,
the submit host, with a time-out, never raising on its exit code (:func:`slurm_command`), in
our environment without a surrounding job's variables (:func:`job_env`). Each allocation
carries an owner comment (:func:`owner_comment`: host, pid, start time), so before bring-up a
later run can tell a job a run that died left on its nodes (in the way for good, cancelled with
``--kimi-reap``) from one a live run holds (:func:`earlier_jobs`, :func:`cancel`).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.config import ClusterConfig

COMMAND_TIMEOUT_S = 120.0


def slurm_command(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """A Slurm client command here (squeue, scancel, scontrol, sacct); never raises on its
    exit code."""
    return subprocess.run(argv, capture_output=True, text=True, env=dict(env),
                          timeout=COMMAND_TIMEOUT_S, check=False)  # fmt: skip


class SlurmError(RuntimeError):
    """Slurm said no (an allocation not granted, a command that failed): the message says
    which command and what Slurm answered."""


def job_env(environ: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` without a Slurm job's own variables (pytest itself may run in a job: its
    SLURM_JOB_ID and task counts must not shape our steps), plus ``extra``."""
    env = {k: v for k, v in environ.items()
           if not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_"))
           or k == "SLURM_CONF"}  # fmt: skip
    return {**env, **(extra or {})}


def owner_comment() -> str:
    """``pytest-kimi:<host>:<pid>:<start>``: which process asked for a job (``--comment``), so
    a later run can tell one left by a run that died from one a live run holds."""
    return f"pytest-kimi:{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rpartition(")")[2].split()[19]


def owner_dead(comment: str) -> bool:
    """The job's owner was a process on this machine that is gone (or another now holds its
    pid). Jobs from other machines, or without our comment, are not known to be dead."""
    parts = comment.split(":")
    if len(parts) != 4 or parts[0] != "pytest-kimi" or parts[1] != socket.gethostname():
        return False
    return not parts[2].isdigit() or _start_time(int(parts[2])) != parts[3]


@dataclass(frozen=True)
class EarlierJob:
    """A job of ours on some of a layout's nodes: its squeue line and whether its owner died."""

    job: str
    line: str
    dead: bool


def earlier_jobs(
    cluster: ClusterConfig, nodes: Sequence[str], this_run: str,
    environ: Mapping[str, str] | None = None,
) -> list[EarlierJob]:  # fmt: skip
    """Our jobs (``squeue --me``, named ``<job_name>/...``, not of this run) that hold or ask
    for any of ``nodes``: a dead run's are in the way for good, a live run's until it ends."""
    env = os.environ if environ is None else environ

    def client(argv: list[str]) -> subprocess.CompletedProcess:
        return slurm_command(argv, env)

    done = client(["squeue", "--me", "--noheader", "--format=%i|%j|%T|%N|%n|%k"])
    prefix, ours = cluster.slurm.job_name + "/", f"{cluster.slurm.job_name}/{this_run}/"
    wanted, found = set(nodes), []
    for line in done.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        job, name, state, held, asked, comment = fields
        if not name.startswith(prefix) or name.startswith(ours) or state == "COMPLETING":
            continue
        listed = " ".join(x for x in (held, asked) if x and x != "(null)")
        names = client(["scontrol", "show", "hostnames", listed]).stdout.split() if listed else []
        if wanted & set(names):
            found.append(EarlierJob(job, f"{job} {name} {state} {held or asked}",
                                    owner_dead(comment)))  # fmt: skip
    return found


def cancel(jobs: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """``scancel`` these jobs (``--kimi-reap`` of what an earlier run left)."""
    if jobs:
        slurm_command(["scancel", *jobs], os.environ if environ is None else environ)
