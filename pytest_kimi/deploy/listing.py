"""A deployment plan as people read it, as ``--kimi-dry-run`` prints it. Per process the SSH target
and the address it binds, or, under ``executor: slurm``, the allocation and each process as the
step the Slurm executor runs (this module reads the plan and the executor; the plan knows no
executor)."""

from __future__ import annotations

import shlex

from pytest_kimi.config.cluster import SUBMIT_HOST
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec
from pytest_kimi.deploy.slurmargv import job_name, owned, salloc_argv, srun_argv, step_script


def describe(plan: DeploymentPlan) -> str:
    """Human-readable listing for ``--kimi-dry-run``: per process, the SSH target and the
    data-network address it binds (and peers use)."""
    lines = [f"# layout {plan.layout.name} ({plan.layout.label}) on {plan.cluster.name}"]
    if plan.versions is not None:
        lines.append(f"# command lines for {plan.versions.describe()}")
    if plan.cluster.executor == "slurm":
        return "\n".join([*lines, *_slurm_lines(plan)])
    for proc in plan.processes:
        lines.append(f"# {proc.name} on {proc.node.name} ({_where(plan, proc)})")
        lines.extend(proc.describe())
    return "\n".join(lines)


def _slurm_lines(plan: DeploymentPlan) -> list[str]:
    """The allocation (salloc), then each process as its step (srun ... sh -c SCRIPT;
    environment first, secret values redacted), as executor: slurm runs them; a router on
    the submit host as a local command."""
    config = plan.cluster.slurm
    nodes = [n.name for n in plan.cluster.deployment_nodes(plan.layout)
             if n.name != SUBMIT_HOST]  # fmt: skip
    job = "$JOB"  # the id salloc grants
    salloc = owned(salloc_argv(config, job_name(config, f"<run>/{plan.layout.name}"),
                               nodes), "pytest-kimi:<host>:<pid>:<start>")  # fmt: skip
    lines = ["# the allocation (its job id is $JOB below)", shlex.join(salloc)]
    for proc in plan.processes:
        where = "here, the submit host" if proc.node.name == SUBMIT_HOST else proc.node.name
        lines.append(f"# {proc.name} on {where} (addr {proc.bind_addr})")
        if proc.node.name == SUBMIT_HOST:
            lines += proc.describe()
            continue
        env = proc.command_line().removesuffix(shlex.join(proc.argv)).strip()
        env = f"{env} PYTHONUNBUFFERED=1".strip()  # as the executor adds it
        names = [*proc.launch_env, "PYTHONUNBUFFERED"]
        srun = srun_argv(config, job, proc.node.name, proc.name,
                         resources=proc.role == "server", export=names)  # fmt: skip
        step = shlex.join([*srun, "--input=none", "sh", "-c", step_script(proc)])
        # the job id comes from salloc: left for the shell to fill in
        lines.append(f"{env} {step}".strip().replace("'--jobid=$JOB'", '--jobid="$JOB"'))
    return lines


def _where(plan: DeploymentPlan, proc: ProcessSpec) -> str:
    node = proc.node
    if plan.cluster.executor != "ssh":
        return node.host
    where = f"ssh {node.host}, addr {proc.bind_addr}"
    if not proc.addr:
        where += ": no addr set, resolved on the node at bring-up"
    return where
