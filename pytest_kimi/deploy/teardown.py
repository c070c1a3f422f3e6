"""The steps of a teardown around signalling every process group, and what it says after.

:meth:`~pytest_kimi.deploy.deployment.Deployment.stop` signals every group at once
(:func:`~pytest_kimi.deploy.procgroup.stop_all`); these are the steps around that: a process
whose start a Ctrl-C interrupted found again, each log's length marked before anything is
stopped, every log fetched once everything is, what the executor made besides processes
removed, and every process still running (or whose node could not tell us) named. A node that
cannot be asked never stops a teardown: what it holds is named as unverifiable instead.
"""

from __future__ import annotations

from pathlib import Path

from pytest_kimi.deploy.executor import Executor, Handle
from pytest_kimi.deploy.logs import Cut, fetch_all
from pytest_kimi.deploy.plan import ProcessSpec


def adopt(
    executor: Executor, spec: ProcessSpec, log_dir: Path, handles: dict[str, Handle]
) -> list[str]:
    """Ctrl-C can land after a process started but before its handle came back (on SSH
    that window is a round trip): find it from what the executor left on the node and add it
    to ``handles``. Returns the process named as unverifiable if its node cannot be asked."""
    try:
        handle = executor.adopt(spec, log_dir / f"{spec.name}.log")
    except Exception as exc:
        return [f"{spec.name} on {spec.node.name}: unverifiable ({exc})"]
    if handle is None:  # cannot tell whether it started: say so rather than assume
        return [
            f"{spec.name} on {spec.node.name}: its start was interrupted and no process was "
            "found; check the node"
        ]
    handles[spec.name] = handle
    return []


def log_sizes(executor: Executor, handles: list[Handle]) -> dict[str, int]:
    """How long each log was before we stopped anything (log file name -> size): stopping rank
    0 makes the other ranks log NCCL errors, which are ours, not the run's (log checks stop
    here)."""
    marks: dict[str, int] = {}
    for handle in handles:
        try:
            size = executor.log_size(handle)
        except Exception:  # an unreachable node: its whole log is checked
            size = None
        if size is not None:
            marks[f"{handle.spec.name}.log"] = size
    return marks


def alive(executor: Executor, handle: Handle, unreachable: dict[str, str]) -> bool:
    """A group whose node cannot be asked goes to ``unreachable`` (it cannot be proved
    gone) and counts as not alive, so it is not asked again."""
    try:
        return executor.alive(handle)
    except Exception as exc:
        unreachable[handle.spec.name] = str(exc)
        return False


def fetch_logs(
    executor: Executor,
    handles: list[Handle],
    log_dir: Path,
    max_bytes: int | None,
    marks: dict[str, int],
) -> None:
    """Every log, nodes in parallel, capped at ``max_bytes`` (head and tail kept); the
    teardown ``marks`` move to where the same bytes sit in the capped copies."""

    def fetch(handle: Handle) -> Cut | None:
        dest = log_dir / f"{handle.spec.name}.log"
        return executor.fetch_log(handle, dest, max_bytes)

    cuts = fetch_all(handles, fetch, lambda handle: handle.spec.node.name)
    for handle, cut in zip(handles, cuts, strict=True):
        name = f"{handle.spec.name}.log"
        if cut is not None and name in marks:
            marks[name] = cut.map(marks[name])


def cleanup(executor: Executor, handles: list[Handle]) -> list[str]:
    """What the executor made besides processes (containers it started, environment files
    not yet read) goes last, once the logs are fetched; what it could not remove is a
    leftover. An executor without ``cleanup`` made nothing else."""
    clean = getattr(executor, "cleanup", None)
    if clean is None:
        return []
    try:
        return list(clean(handles))
    except Exception as exc:
        return [f"cleanup failed: unverifiable ({exc})"]


def leftovers(
    handles: list[Handle], alive: list[Handle], unreachable: dict[str, str]
) -> list[str]:
    """Name every process still running, or whose node could not tell us."""
    out = []
    for h in handles:
        where = f"{h.spec.name} on {h.spec.node.name}"
        if h.spec.name in unreachable:
            out.append(f"{where}: unverifiable ({unreachable[h.spec.name]})")
        elif h in alive:
            out.append(f"{where} (pgid {h.pgid})")
    return out


def killed_note(names: list[str], grace_s: float) -> str:
    """Processes that outlived SIGTERM: SGLang drains its requests before it exits, and a
    request that can never finish (a decode server waiting for KV that never comes) keeps it
    draining for ever; after ``grace_s`` teardown killed them, with their children."""
    return (
        f"teardown: {', '.join(names)} still running {grace_s:g} s after SIGTERM (SGLang "
        "drains its requests before exiting): killed with SIGKILL"
    )
