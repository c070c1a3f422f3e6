"""A layout's Slurm allocation: asked for, withdrawn if interrupted, given back and checked.

The allocation is exactly the layout's nodes (``salloc --no-shell``, waiting at most
``slurm.queue_timeout_s`` in the queue: ``--immediate``). From the request on, whatever
happens to us (``kill -9`` in the queue included) a reaper tied to the executor's lifeline
cancels the job by its name, unique to the run and layout; interrupted while queued, salloc
is told to withdraw its request. Teardown cancels the whole allocation and checks with
``squeue`` (and ``sacct`` where accounting is on) that nothing of it is left. The
allocation's ``--time`` limit is the last resort.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_kimi.config import Node
from pytest_kimi.config.cluster import SUBMIT_HOST
from pytest_kimi.config.topology import SlurmConfig
from pytest_kimi.deploy.procgroup import Lifeline
from pytest_kimi.deploy.slurmargv import owned, salloc_argv
from pytest_kimi.deploy.slurmjobs import (
    COMMAND_TIMEOUT_S,
    SlurmError,
    job_env,
    owner_comment,
    slurm_command,
)

GRANTED = re.compile(r"Granted job allocation (\d+)")
QUEUED = re.compile(r"Pending job allocation (\d+)")
CANCEL_WAIT_S = 60.0  # after scancel: how long the job may take to leave the queue
WITHDRAW_S = 5.0  # an interrupted salloc's time to withdraw its request


@dataclass(frozen=True)
class Allocation:
    """A granted allocation: its job id, nodes and how long it waited in the queue."""

    job: str
    nodes: tuple[str, ...]
    queue_wait_s: float


class Allocator:
    """Gets a layout's allocation (:meth:`allocate`), names its job to the steps
    (:meth:`job`), and gives it back (:meth:`release`)."""

    poll_s = 0.5  # how often squeue / sacct are asked while the job leaves

    def __init__(
        self, config: SlurmConfig, job_name: str, environ: Mapping[str, str], lifeline: Lifeline
    ) -> None:
        self.config = config
        self.job_name = job_name
        self.environ = environ  # filtered for every command (job_env)
        self.lifeline = lifeline  # the reaper's: it cancels the job once this process dies
        self.allocation: Allocation | None = None
        self._reaper: subprocess.Popen | None = None

    def allocate(self, nodes: Sequence[Node]) -> Allocation:
        """Get the allocation of ``nodes`` (not the submit host); raises :class:`SlurmError`
        saying how long it waited and what salloc said."""
        names = [n.name for n in nodes if n.name != SUBMIT_HOST]
        argv = owned(salloc_argv(self.config, self.job_name, names), owner_comment())
        # from the request on, whatever happens to us (kill -9 in the queue included), the
        # reaper cancels the job by its name (unique to this run and layout)
        self._start_reaper()
        start = time.monotonic()
        try:
            salloc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, env=self._env(),
                                      start_new_session=True)  # fmt: skip
        except FileNotFoundError:
            raise SlurmError("salloc not found: executor: slurm needs Slurm's client commands "
                             "on this machine (the submit host)") from None  # fmt: skip
        try:
            out, err = salloc.communicate(timeout=self.config.queue_timeout_s + 60)
        except BaseException as exc:  # Ctrl-C, SIGTERM (as KeyboardInterrupt), or no answer
            self._withdraw(salloc)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise SlurmError(f"salloc did not return within "
                                 f"{self.config.queue_timeout_s:g} s (+60): "
                                 f"{shlex.join(argv)}") from None  # fmt: skip
            raise
        waited = time.monotonic() - start
        granted = GRANTED.search(err + out)
        if salloc.returncode != 0 or granted is None:
            self._cancel_by_name()  # granted but not said so (salloc -Q), or half-done
            said = (err + out).strip().splitlines()[-3:]
            queued = QUEUED.search(err)
            where = f" (job {queued[1]} waited {waited:.0f} s in the queue)" if queued else ""
            raise SlurmError(f"no allocation of {len(names)} nodes ({','.join(names)}){where}; "
                             f"salloc exited {salloc.returncode}: {' / '.join(said)}")  # fmt: skip
        job = granted[1]
        self.allocation = Allocation(job, self._granted_nodes(job) or tuple(names), waited)
        return self.allocation

    def _withdraw(self, salloc: subprocess.Popen) -> None:
        """Interrupted while queued: SIGINT makes salloc withdraw its request (as at a
        terminal); what is still there after a few seconds is cancelled by name."""
        with contextlib.suppress(ProcessLookupError):
            salloc.send_signal(signal.SIGINT)
        try:
            salloc.wait(WITHDRAW_S)
        except subprocess.TimeoutExpired:
            salloc.kill()
            salloc.wait()
        self._cancel_by_name()

    def _granted_nodes(self, job: str) -> tuple[str, ...]:
        """The nodes Slurm gave the job (``squeue %N``, expanded by ``scontrol``)."""
        listed = self._client(["squeue", f"--jobs={job}", "--noheader", "--format=%N"])
        if listed.returncode != 0 or not listed.stdout.strip():
            return ()
        names = self._client(["scontrol", "show", "hostnames", listed.stdout.strip()])
        return tuple(names.stdout.split()) if names.returncode == 0 else ()

    def _env(self) -> dict[str, str]:
        return job_env(self.environ)

    def _client(self, argv: list[str]) -> subprocess.CompletedProcess:
        return slurm_command(argv, self._env())

    def _start_reaper(self) -> None:
        """A process that cancels our job once this one dies (its lifeline closes)."""
        cancel = shlex.join(["scancel", "--me", f"--jobname={self.job_name}"])
        script = f"cat >/dev/null; exec {cancel}"
        self._reaper = self.lifeline.start_reaper(["sh", "-c", script], env=self._env())

    def _cancel_by_name(self) -> None:
        """Our request or job, if any is left: cancel it by its name."""
        self._client(["scancel", "--me", f"--jobname={self.job_name}"])

    def job(self) -> str:
        """The allocation's job id; :class:`SlurmError` before :meth:`allocate`."""
        if self.allocation is None:
            raise SlurmError("no Slurm allocation yet (allocate() comes first)")
        return self.allocation.job

    # -- giving it back ------------------------------------------------------------------
    def release(self) -> list[str]:
        """Cancel the allocation and check Slurm has nothing of it left: each leftover is a
        line naming the job and what Slurm says of it (none without an allocation)."""
        if self.allocation is None:
            return []
        job = self.allocation.job
        self._client(["scancel", job])
        deadline = time.monotonic() + CANCEL_WAIT_S
        queued = self.queued(job)
        while queued and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            queued = self.queued(job)
        left = [f"slurm job {job} after scancel: {line}" for line in queued]
        accounted = self._accounted(job)
        while accounted and time.monotonic() < deadline:  # the accounting lags the queue
            time.sleep(self.poll_s)
            accounted = self._accounted(job)
        left += [f"slurm job {job}: sacct says {state}" for state in accounted]
        return left

    def queued(self, job: str) -> list[str]:
        """What ``squeue`` lists of ``job`` and its steps (nothing: it is gone); a line
        saying so when squeue could not answer (nothing is then known to be gone)."""
        whole = self._client(["squeue", f"--jobs={job}", "--noheader", "--format=%i %j %T"])
        if whole.returncode != 0 and "Invalid job id" not in whole.stderr:
            return [f"could not be checked: squeue exited {whole.returncode}: "
                    f"{whole.stderr.strip()[-200:]}"]  # fmt: skip
        steps = self._client(["squeue", "--steps", f"--jobs={job}", "--noheader",
                              "--format=%i %j %T %N"])  # fmt: skip
        lines = whole.stdout.splitlines() + steps.stdout.splitlines()
        return [line.strip() for line in lines if line.strip()]

    def _accounted(self, job: str) -> list[str]:
        """Job or step states sacct still calls running; none where accounting is off (sacct
        then says so and lists nothing)."""
        done = self._client(["sacct", "--jobs", job, "--noheader", "--parsable2",
                             "--format=JobID,State"])  # fmt: skip
        if done.returncode != 0:
            return []
        live = ("RUNNING", "PENDING", "REQUEUED")
        return [line for line in done.stdout.splitlines()
                if line.partition("|")[2].startswith(live)]  # fmt: skip

    def wait_reaper(self) -> None:
        """After the lifeline is cut: the reaper's scancel runs to its end (killed if it
        hangs)."""
        if self._reaper is not None:
            try:
                self._reaper.wait(COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
