"""The Slurm command lines of ``executor: slurm``: the allocation, its steps, what a step runs.

Pure argv building, so ``--kimi-dry-run`` (:mod:`pytest_kimi.deploy.listing`) prints exactly
what :class:`~pytest_kimi.deploy.slurm.SlurmExecutor` runs, and both can be read (and tested)
without Slurm. A layout's nodes are one allocation (``salloc --no-shell``, exactly its nodes,
``--immediate`` so the queue wait is bounded); each process is a step of it::

    srun --jobid=JOB --overlap --nodes=1 --ntasks=1 --nodelist=NODE --job-name=NAME
         --unbuffered [--gres ...] sh -c 'SETUP; exec ARGV'

Values from YAML only ever become separate argv elements; the environment travels in srun's
own environment (``--export=`` names the variables), never on a command line.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pytest_kimi.config.topology import SlurmConfig
from pytest_kimi.deploy.plan import ProcessSpec


def salloc_argv(config: SlurmConfig, job_name: str, nodes: Sequence[str]) -> list[str]:
    """The allocation of exactly ``nodes`` (the layout's, in order), with the cluster's
    flags. ``--immediate`` makes salloc give up, and cancel its request, after the queue
    wait the cluster file allows."""
    argv = ["salloc", "--no-shell", f"--job-name={job_name}", f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}", f"--time={config.time}",
            f"--immediate={max(1, round(config.queue_timeout_s))}"]  # fmt: skip
    argv += _resource_flags(config)
    named = (("partition", config.partition), ("account", config.account),
             ("constraint", config.constraint), ("reservation", config.reservation))  # fmt: skip
    for flag, value in named:
        if value:
            argv.append(f"--{flag}={value}")
    if config.exclusive:
        argv.append("--exclusive")
    return [*argv, *config.salloc_args]


def owned(argv: list[str], comment: str) -> list[str]:
    """``argv`` (salloc) with our owner comment
    (:func:`~pytest_kimi.deploy.slurmjobs.owner_comment`) after its command."""
    return [argv[0], f"--comment={comment}", *argv[1:]]


def _resource_flags(config: SlurmConfig) -> list[str]:
    flags = []
    if config.gres:
        flags.append(f"--gres={config.gres}")
    if config.gpus_per_node:
        flags.append(f"--gpus-per-node={config.gpus_per_node}")
    return flags


# what every step gets of this machine's environment besides its own variables: enough for a
# shell and its setup lines; nothing else of a login node's (its venv, tokens) reaches a node
BASE_EXPORT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR")


def export_flag(names: Sequence[str]) -> str:
    """``--export=`` of exactly these variables (their values travel in srun's environment,
    never on a command line; Slurm adds its own SLURM_* ones)."""
    return "--export=" + ",".join(dict.fromkeys([*BASE_EXPORT, *sorted(names)]))


def srun_argv(
    config: SlurmConfig, job: str, node: str, name: str, *, resources: bool,
    export: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    """A step of ``job`` on ``node``: one task, with :data:`BASE_EXPORT` and ``export`` of
    the environment. ``resources``: a server's step, which asks for the node's GPUs as the
    allocation did; a helper command's shares them (``--overlap`` lets both run beside the
    servers)."""
    argv = ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", f"--job-name={name}", "--unbuffered",
            export_flag(export)]  # fmt: skip
    if resources:
        argv += _resource_flags(config)
    return [*argv, *config.srun_args]


def step_script(spec: ProcessSpec) -> str:
    """What a server's step runs: its setup lines, then ``exec`` its argv."""
    from pytest_kimi.deploy.remote import setup_lines

    parts = []
    if spec.setup:
        parts.append(setup_lines(spec.setup, "router.setup" if spec.role == "router"
                                 else "server.setup"))  # fmt: skip
    parts.append("exec " + shlex.join(spec.argv))
    return "\n".join(parts)


def job_name(config: SlurmConfig, run_tag: str) -> str:
    """``pytest-kimi/<run>/<layout>``: what ``squeue`` shows, and how a later run knows ours."""
    return f"{config.job_name}/{run_tag}"
