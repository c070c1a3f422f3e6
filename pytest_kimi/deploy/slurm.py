"""``executor: slurm``: a layout's nodes are one Slurm allocation, each process a step in it.

Many GPU clusters give no SSH to compute nodes outside a job. So a layout first gets an
allocation of exactly its nodes (``salloc --no-shell``, waiting at most
``slurm.queue_timeout_s`` in the queue: ``--immediate``), and then each node's server runs as
a step of that job::

    srun --jobid=JOB --overlap --nodes=1 --ntasks=1 --nodelist=NODE --job-name=NAME
         --unbuffered [--gres ...] sh -c 'SETUP; exec ARGV'

``srun`` itself runs here, on the submit host, for as long as its step: its exit code is the
server's, and the server's output, which it forwards, is the process's log here (nothing to
fetch). The environment (secrets included) reaches the step through Slurm, never a command
line. A command on a node (``run``: address lookups, probes, ``nvidia-smi``) is a short step
the same way; a file goes through a step's stdin (``put_file``).

Signals go to the step (``scancel --signal=TERM JOB.STEP``), so the server's own handlers run
as under SSH; the deployment's grace period then ends in ``KILL``. Teardown cancels the whole
allocation and checks with ``squeue`` (and ``sacct`` where accounting is on) that nothing of
it is left. If this process dies (``kill -9`` included) a reaper tied to its lifeline cancels
the allocation; the allocation's ``--time`` limit is the last resort.

The router runs as a step on its node, or here (``slurm.router: submit_host``), outside the
allocation, as a local process.

This module runs the steps; the command lines are built in :mod:`pytest_kimi.deploy.slurmargv`,
the allocation is got and given back by :mod:`pytest_kimi.deploy.slurmalloc`, and Slurm's client
commands and the jobs of earlier runs are :mod:`pytest_kimi.deploy.slurmjobs`'s.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_kimi.config import ClusterConfig, Node
from pytest_kimi.config.cluster import SUBMIT_HOST
from pytest_kimi.deploy.executor import Handle, LocalExecutor, answer
from pytest_kimi.deploy.logs import Cut
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.procgroup import Lifeline, signal_group
from pytest_kimi.deploy.slurmalloc import Allocation, Allocator
from pytest_kimi.deploy.slurmargv import job_name, srun_argv, step_script
from pytest_kimi.deploy.slurmjobs import COMMAND_TIMEOUT_S, SlurmError, job_env, slurm_command

STEPS_FRESH_S = 1.0  # how long one squeue of our steps serves signals


class SlurmExecutor:
    """The :class:`~pytest_kimi.deploy.executor.Executor` for ``executor: slurm``."""

    poll_s = 0.5

    def __init__(
        self, cluster: ClusterConfig, run_tag: str, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = cluster.slurm
        self.job_name = job_name(cluster.slurm, run_tag)
        self.environ = dict(os.environ if environ is None else environ)
        self.lifeline = Lifeline()  # local srun processes die with us; the reaper cancels
        self.allocator = Allocator(self.config, self.job_name, self.environ, self.lifeline)
        self.local = LocalExecutor()  # a router on the submit host
        self._srun: dict[str, subprocess.Popen] = {}
        self._steps_read: tuple[float, dict[str, str]] | None = None

    # -- the allocation ------------------------------------------------------------------
    def allocate(self, nodes: Sequence[Node]) -> Allocation:
        """Get the allocation of ``nodes`` (not the submit host): :meth:`Allocator.allocate`."""
        return self.allocator.allocate(nodes)

    def _client(self, argv: list[str]) -> subprocess.CompletedProcess:
        return slurm_command(argv, self._env())

    def _job(self) -> str:
        return self.allocator.job()

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Our environment without a Slurm job's own variables (pytest itself may run in a
        job: its SLURM_JOB_ID and task counts must not shape our steps), plus ``extra``."""
        return job_env(self.environ, extra)

    # -- commands on a node --------------------------------------------------------------
    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        """``command`` (sh) on ``node`` as a short step: (exit code, :func:`answer`); 124 if
        it ran out of time."""
        if node.name == SUBMIT_HOST:
            return self.local.run(node, command, timeout)
        return self._step(node, command, timeout)

    def _step(
        self, node: Node, command: str, timeout: float | None,
        env: Mapping[str, str] | None = None, data: bytes | None = None,
    ) -> tuple[int, str]:  # fmt: skip
        argv = srun_argv(self.config, self._job(), node.name, "pytest-kimi-cmd",
                         resources=False, export=list(env or {}))  # fmt: skip
        if data is None:
            argv.append("--input=none")
        try:
            done = subprocess.run([*argv, "sh", "-c", command], capture_output=True,
                                  input=data, env=self._env(env),
                                  timeout=timeout or COMMAND_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            return 124, f"timed out on {node.name}: {command}"
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        return done.returncode, answer(done.returncode, out, err)

    def run_as(
        self, spec: ProcessSpec, command: str, timeout: float | None = None
    ) -> tuple[int, str]:
        """``command`` as ``spec``'s process would run: its environment and setup lines."""
        from pytest_kimi.deploy.remote import probe_script

        if spec.node.name == SUBMIT_HOST:
            return self.local.run_as(spec, command, timeout)
        return self._step(spec.node, probe_script(spec, command, None), timeout, spec.launch_env)

    def port_in_use(self, node: Node, port: int) -> bool:
        """A listening TCP socket on ``port`` on the node (``ss``; without it, unchecked)."""
        from pytest_kimi.deploy.remote import port_listening

        if node.name == SUBMIT_HOST:
            return self.local.port_in_use(node, port)
        code, out = self.run(node, port_listening(port))
        return code == 0 and bool(out.strip())

    def put_file(self, node: Node, path: str, data: bytes) -> None:
        """``data`` to ``path`` on ``node`` through a step's stdin, 0600 from the start."""
        if node.name == SUBMIT_HOST:
            self.local.put_file(node, path, data)
            return
        q = shlex.quote(path)
        folder = shlex.quote(os.path.dirname(path) or ".")
        code, out = self._step(node, f"umask 077 && mkdir -p {folder} && cat > {q}", None,
                               data=data)  # fmt: skip
        if code != 0:
            raise SlurmError(f"node {node.name}: cannot write {path}: {out.strip()}")

    # -- processes -----------------------------------------------------------------------
    def start(self, spec: ProcessSpec, log_path: Path) -> Handle:
        if spec.node.name == SUBMIT_HOST:
            return self.local.start(spec, log_path)
        env = {**spec.launch_env, "PYTHONUNBUFFERED": "1"}
        argv = srun_argv(self.config, self._job(), spec.node.name, spec.name,
                         resources=spec.role == "server", export=list(env))  # fmt: skip
        argv += ["--input=none", "sh", "-c", step_script(spec)]
        env = self._env(env)
        popen = self.lifeline.start(argv, log_path, env=env, append=True)
        self._srun[spec.name] = popen
        return Handle(spec, popen.pid, log_path, popen)

    def adopt(self, spec: ProcessSpec, log_path: Path) -> Handle | None:
        if spec.node.name == SUBMIT_HOST:
            return self.local.adopt(spec, log_path)
        popen = self._srun.get(spec.name)
        return None if popen is None else Handle(spec, popen.pid, log_path, popen)

    def exit_code(self, handle: Handle) -> int | None:
        """The step's exit code (srun's), None while it runs."""
        assert handle.popen is not None
        return handle.popen.poll()

    def alive(self, handle: Handle) -> bool:
        """While the step runs (srun lives as long as it)."""
        if handle.spec.node.name == SUBMIT_HOST:
            return self.local.alive(handle)
        assert handle.popen is not None
        return handle.popen.poll() is None

    def signal(self, handle: Handle, name: str) -> None:
        """``SIG<name>`` to the step's task on its node (``scancel --signal``), so the server
        shuts down as it would under SSH; a step Slurm no longer lists (not started, or gone)
        gets it through its srun here."""
        if handle.spec.node.name == SUBMIT_HOST:
            self.local.signal(handle, name)
            return
        step = self._step_ids().get(handle.spec.name)
        if step is not None:
            self._client(["scancel", f"--signal={name}", step])
        if step is None or name == "KILL":
            signal_group(handle.pgid, name)
        if handle.popen is not None:
            handle.popen.poll()

    def _step_ids(self) -> dict[str, str]:
        """Step name -> ``JOB.STEP`` of our job as Slurm lists it; one squeue serves every
        signal of a teardown phase (a second old at most)."""
        now = time.monotonic()
        if self._steps_read is None or now - self._steps_read[0] > STEPS_FRESH_S:
            done = self._client(["squeue", "--steps", f"--jobs={self._job()}", "--noheader",
                                 "--format=%i %j"])  # fmt: skip
            steps = {}
            for line in done.stdout.splitlines():
                step, _, step_name = line.strip().partition(" ")
                steps[step_name] = step
            self._steps_read = (now, steps)
        return self._steps_read[1]

    # the log is a file here (srun forwards the step's output), as a local process's is
    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        return self.local.log_tail(handle, lines)

    def log_size(self, handle: Handle) -> int | None:
        return self.local.log_size(handle)

    def fetch_log(self, handle: Handle, dest: Path, max_bytes: int | None = None) -> Cut | None:
        """srun wrote the step's output here already: copy it to ``dest``, then cap it."""
        return self.local.fetch_log(handle, dest, max_bytes)

    # -- teardown ------------------------------------------------------------------------
    def cleanup(self, handles: list[Handle]) -> list[str]:
        """Cancel the allocation and check Slurm has nothing of it left: each leftover is a
        line naming the job and what Slurm says of it."""
        left = self.local.cleanup([h for h in handles if h.spec.node.name == SUBMIT_HOST])
        return left + self.allocator.release()

    def close(self) -> None:
        """Cut the lifeline: local sruns still alive are killed, the reaper cancels the job."""
        self.lifeline.close()
        self.local.close()
        self.allocator.wait_reaper()

