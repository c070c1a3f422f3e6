"""Run a plan's processes on remote nodes over SSH (fabric / paramiko).

Each process starts detached in its own session, the way DESIGN.md's trials showed works:
``setsid nohup sh -c '<cmd> >LOG 2>&1; echo $? >EXIT' & echo $!``; the printed pid is the
process-group id, so stopping the group stops everything the process started; each runs for
at most ``max_s`` (the cluster's ``deployment_max_s``: a dead man's switch, coreutils
``timeout`` on the node). Logs and exit codes live in ``<work_dir>/<run>/`` on the node and
are fetched at teardown. The shell each
step runs is built (and quoted) in :mod:`pytest_kimi.deploy.remote` (and, for a process in a
container, wrapped by :mod:`pytest_kimi.deploy.container` so it runs inside); this module
runs it and turns failures into :class:`~pytest_kimi.deploy.sshconnections.NodeError`.

Connecting, reconnecting and moving files (host keys, time-outs, keepalives, the key's
passphrase) are :mod:`pytest_kimi.deploy.sshconnections`'s job; where a process lives on its
node (run folder, container, its environment file) and what a run leaves there besides its
processes are :mod:`pytest_kimi.deploy.sshplaces`'s. Every value is shell-quoted.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import fabric
import paramiko

from pytest_kimi.config import Node
from pytest_kimi.deploy import container, logs, remote
from pytest_kimi.deploy.executor import Handle
from pytest_kimi.deploy.logs import Cut
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.sshconnections import Connections, NodeError, NodeUnreachable
from pytest_kimi.deploy.sshplaces import Places


class SSHExecutor:
    """The :class:`~pytest_kimi.deploy.executor.Executor` for real clusters."""

    poll_s = 0.5

    def __init__(
        self,
        work_dir: str,
        run_tag: str,
        environ: Mapping[str, str] | None = None,
        *,
        max_s: float = remote.DEFAULT_MAX_S,
    ) -> None:
        self.work_dir = work_dir.rstrip("/") or "/"
        self.remote_dir = f"{work_dir.rstrip('/')}/{run_tag}"
        self.max_s = max_s  # every process's maximum lifetime on its node (dead man's switch)
        self.run_tag = run_tag
        self.connections = Connections(os.environ if environ is None else environ)
        self.places = Places(self.connections, self.remote_dir, run_tag)

    def begin_teardown(self) -> None:
        """From now on a node that stops answering is retried for
        ``ssh.teardown_reconnect_s``: one lost during the run gets that chance again."""
        self.connections.begin_teardown()

    def connection(self, node: Node) -> fabric.Connection:
        """An open connection to ``node`` (:meth:`Connections.connection`)."""
        return self.connections.connection(node)

    def run(
        self, node: Node, command: str, timeout: float | None = None, *, repeat: bool = True
    ) -> tuple[int, str]:
        """A shell command on ``node``; ``repeat``: safe to run again after a reconnect
        (:meth:`Connections.run`)."""
        return self.connections.run(node, command, timeout, repeat=repeat)

    # -- the Executor interface (the shell each step runs: pytest_kimi.deploy.remote) -------
    def run_as(
        self, spec: ProcessSpec, command: str, timeout: float | None = None
    ) -> tuple[int, str]:
        """``command`` as ``spec``'s process would run: its environment (from a 0600 file the
        shell sources and removes, never the command line), its setup lines, in its container.
        For probes (versions) after bring-up."""
        self.places.make_folder(spec.node)
        env_file = self.places.files(spec).env + ".probe" if spec.launch_env else None
        if env_file:
            self.places.write_env(spec, env_file)
        box = self.places.box(spec)
        script = remote.probe_script(spec, command, None if box else env_file)
        if box is None:
            return self.run(spec.node, f"sh -c {shlex.quote(script)}", timeout)
        inside = container.exec_in(box, f"sh -c {shlex.quote(script)}", spec.launch_env)
        wrapped = container.with_env_file(env_file, inside) if env_file else inside
        return self.run(spec.node, wrapped, timeout)

    def put_file(self, node: Node, path: str, data: bytes) -> None:
        """``data`` to ``path`` on ``node`` over SFTP, 0600 (:meth:`Connections.put_file`)."""
        self.connections.put_file(node, path, data)

    def start(self, spec: ProcessSpec, log_path: Path) -> Handle:
        files = self.places.files(spec)
        self.places.make_folder(spec.node)
        env_file = files.env if spec.launch_env else None
        if env_file:
            self.places.write_env(spec, env_file)
        box = self.places.box(spec)
        if box is None:
            # the node records the group id itself: if we are interrupted before reading it,
            # teardown still finds the process (adopt)
            command = remote.start(spec, files, env_file, self.max_s)
        else:
            self.places.enter(spec, box)
            start = remote.start(spec, files, max_s=self.max_s)
            inside = container.exec_in(box, start, spec.launch_env)
            command = container.with_env_file(env_file, inside) if env_file else inside
        try:  # never repeated: a second start would be a second server
            code, out = self.run(spec.node, command, repeat=False)
        except NodeUnreachable as exc:  # dropped under the start: did it start? its pid file
            handle = self.adopt(spec, log_path)  # (reconnects with the node's patience)
            if handle is None:
                raise NodeError(
                    f"node {spec.node.name}: the connection dropped while starting {spec.name} "
                    f"and no pid file was written ({exc}); check the node"
                ) from None
            return handle
        pid = remote.parse_pid(out)
        if code != 0 or pid is None:
            raise NodeError(f"node {spec.node.name}: could not start {spec.name}: {out.strip()}")
        return Handle(spec, pid, Path(files.log))

    def adopt(self, spec: ProcessSpec, log_path: Path) -> Handle | None:
        """The handle of a process whose ``start`` was interrupted: from its pid file."""
        files = self.places.files(spec)
        _, out = self.places.run_for(spec, remote.read_pid_file(files))
        pid = out.strip()
        return Handle(spec, int(pid), Path(files.log)) if pid.isdigit() else None

    def exit_code(self, handle: Handle) -> int | None:
        spec = handle.spec
        files = self.places.files(spec)
        code, out = self.places.run_for(spec, remote.exit_code(files, handle.pgid))
        if code != 0 and spec.container is not None and container.says_gone(out):
            return -9  # its container is gone, and the process with it
        return remote.parse_exit_code(out)

    def alive(self, handle: Handle) -> bool:
        """Whether the group has a live process. In a container: asked inside it; a container
        that is gone has no processes, a runtime that cannot answer is a :class:`NodeError`
        (the process is then unverifiable, never "gone")."""
        spec = handle.spec
        code, out = self.places.run_for(spec, remote.group_stats(handle.pgid))
        if code != 0 and spec.container is not None:
            if container.says_gone(out):
                return False
            raise NodeError(
                f"node {spec.node.name}: the container runtime did not answer: {out.strip()}"
            )
        return remote.any_alive(out)

    def signal(self, handle: Handle, name: str) -> None:
        """Send ``SIG<name>`` (TERM, KILL) to the process group on its node (in a container:
        from inside it, where the group lives; the runtime's client forwards nothing)."""
        self.places.run_for(handle.spec, remote.signal_group(handle.pgid, name))

    def port_in_use(self, node: Node, port: int) -> bool:
        """A listening TCP socket on ``port`` on the node (``ss`` from iproute2; if the node
        has no ``ss`` the check is skipped and a bind failure shows in the process's log)."""
        code, out = self.run(node, remote.port_listening(port))
        return code == 0 and bool(out.strip())

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        log = self.places.files(handle.spec).log
        try:
            _, out = self.places.run_for(handle.spec, remote.tail(log, lines))
        except NodeError as exc:
            return f"(log unavailable: {exc})"
        return out

    def log_size(self, handle: Handle) -> int | None:
        log = self.places.files(handle.spec).log
        try:
            _, out = self.places.run_for(handle.spec, remote.size(log))
        except NodeError:
            return None
        return int(out.strip()) if out.strip().isdigit() else None

    def fetch_log(self, handle: Handle, dest: Path, max_bytes: int | None = None) -> Cut | None:
        """The log, capped on the node (head, marker, tail: :mod:`pytest_kimi.deploy.logs`) and
        gzipped there, fetched over SFTP and unpacked into ``dest``; inside a container it is
        read capped through the runtime. A node that cannot give it leaves a note in ``dest``."""
        log = self.places.files(handle.spec).log
        cap = max_bytes if max_bytes is not None else 1 << 62
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            if handle.spec.container is not None:  # the log is inside the container
                code, out = self.places.run_for(handle.spec, logs.capped_cat_command(log, cap))
                if code != 0:
                    raise OSError(out.strip())
                dest.write_text(out)
                return None
            gz = log + ".fetch.gz"
            code, out = self.run(handle.spec.node, logs.capped_gzip_command(log, gz, cap))
            size = out.strip().splitlines()[-1] if out.strip() else ""
            if code != 0 or not size.isdigit():
                raise OSError(out.strip() or f"exit {code}")
            local_gz = dest.with_name(dest.name + ".gz")
            try:
                self.connections.get_file(handle.spec.node, gz, str(local_gz))
                logs.unzip_to(local_gz, dest)
            finally:
                local_gz.unlink(missing_ok=True)
                self.run(handle.spec.node, remote.remove_files([gz]))
            return logs.Cut.plan(int(size), cap)
        except (NodeError, OSError, EOFError, paramiko.SSHException) as exc:
            dest.write_text(f"(could not fetch {log} from {handle.spec.node.name}: {exc})\n")
            return None

    def prune_runs(self, node: Node, keep: int) -> list[str]:
        """At start: this user's run folders in ``work_dir`` on ``node`` beyond the newest
        ``keep`` are removed, never the current run's; returns those removed. Also creates
        ``work_dir`` (sticky, shared like /var/tmp) if it is not there."""
        current = self.run_tag.split("/", 1)[0]
        code, out = self.run(node, logs.prune_command(self.work_dir, keep, current))
        if code != 0:
            raise NodeError(f"node {node.name}: cannot prune {self.work_dir}: {out.strip()}")
        return logs.parse_pruned(out)

    def cleanup(self, handles: list[Handle]) -> list[str]:
        """Environment files not yet read and containers we started (:meth:`Places.cleanup`)."""
        return self.places.cleanup()

    def close(self) -> None:
        """Every node's connection, then the jump hosts' (:meth:`Connections.close`)."""
        self.connections.close()
