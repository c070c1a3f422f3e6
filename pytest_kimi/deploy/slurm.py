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
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.config import ClusterConfig, Node
from pytest_kimi.config.cluster import SUBMIT_HOST, SlurmConfig
from pytest_kimi.deploy.executor import Handle, LocalExecutor, answer
from pytest_kimi.deploy.logs import Cut
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.procgroup import Lifeline, signal_group

GRANTED = re.compile(r"Granted job allocation (\d+)")
QUEUED = re.compile(r"Pending job allocation (\d+)")
CANCEL_WAIT_S = 60.0  # after scancel: how long the job may take to leave the queue
WITHDRAW_S = 5.0  # an interrupted salloc's time to withdraw its request
STEPS_FRESH_S = 1.0  # how long one squeue of our steps serves signals
COMMAND_TIMEOUT_S = 120.0


def slurm_command(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """A Slurm client command here (squeue, scancel, scontrol, sacct); never raises on its
    exit code."""
    return subprocess.run(argv, capture_output=True, text=True, env=dict(env),
                          timeout=COMMAND_TIMEOUT_S, check=False)  # fmt: skip


class SlurmError(RuntimeError):
    """Slurm said no (an allocation not granted, a command that failed): the message says
    which command and what Slurm answered."""


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
    """``argv`` (salloc) with our owner comment (:func:`owner_comment`) after its command."""
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


@dataclass(frozen=True)
class Allocation:
    """A granted allocation: its job id, nodes and how long it waited in the queue."""

    job: str
    nodes: tuple[str, ...]
    queue_wait_s: float


class SlurmExecutor:
    """The :class:`~pytest_kimi.deploy.executor.Executor` for ``executor: slurm``."""

    poll_s = 0.5

    def __init__(
        self, cluster: ClusterConfig, run_tag: str, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = cluster.slurm
        self.job_name = job_name(cluster.slurm, run_tag)
        self.environ = dict(os.environ if environ is None else environ)
        self.allocation: Allocation | None = None
        self.lifeline = Lifeline()  # local srun processes die with us; the reaper cancels
        self.local = LocalExecutor()  # a router on the submit host
        self._srun: dict[str, subprocess.Popen] = {}
        self._reaper: subprocess.Popen | None = None
        self._steps_read: tuple[float, dict[str, str]] | None = None

    # -- the allocation ------------------------------------------------------------------
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

    def _job(self) -> str:
        if self.allocation is None:
            raise SlurmError("no Slurm allocation yet (allocate() comes first)")
        return self.allocation.job

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Our environment without a Slurm job's own variables (pytest itself may run in a
        job: its SLURM_JOB_ID and task counts must not shape our steps), plus ``extra``."""
        env = {k: v for k, v in self.environ.items()
               if not k.startswith(("SLURM_", "SRUN_", "SALLOC_", "SBATCH_"))
               or k == "SLURM_CONF"}  # fmt: skip
        return {**env, **(extra or {})}

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
        if self.allocation is None:
            return left
        job = self.allocation.job
        self._client(["scancel", job])
        deadline = time.monotonic() + CANCEL_WAIT_S
        queued = self.queued(job)
        while queued and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            queued = self.queued(job)
        left += [f"slurm job {job} after scancel: {line}" for line in queued]
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

    def close(self) -> None:
        """Cut the lifeline: local sruns still alive are killed, the reaper cancels the job."""
        self.lifeline.close()
        self.local.close()
        if self._reaper is not None:
            try:
                self._reaper.wait(COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()


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
