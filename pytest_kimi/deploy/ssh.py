"""Run a plan's processes on remote nodes over SSH (fabric / paramiko).

Each process starts detached in its own session, the way DESIGN.md's trials showed works:
``setsid nohup sh -c '<cmd> >LOG 2>&1; echo $? >EXIT' & echo $!``; the printed pid is the
process-group id, so stopping the group stops everything the process started; each runs for
at most ``max_s`` (the cluster's ``deployment_max_s``: a dead man's switch, coreutils
``timeout`` on the node). Logs and exit codes live in ``<work_dir>/<run>/`` on the node and
are fetched at teardown. The shell each
step runs is built (and quoted) in :mod:`pytest_kimi.deploy.remote` (and, for a process in a
container, wrapped by :mod:`pytest_kimi.deploy.container` so it runs inside); this module
connects, runs it and turns failures into :class:`NodeError`.

A process's environment goes to ``<run>/<proc>.env`` over SFTP, made 0600 before anything
is written to it; the process's shell reads and removes it. No value is on a command line.

Care taken: host keys are checked against the cluster's known_hosts (``RejectPolicy``) unless
the YAML opts out; connect, banner, auth and channel timeouts are set so a dead host fails in
seconds, not hours; keepalives notice a host that dies mid-run; every value is shell-quoted;
a key passphrase is read from the environment variable the YAML names and goes nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import fabric
import invoke
import paramiko

from pytest_kimi.config import Node
from pytest_kimi.deploy import container, logs, remote
from pytest_kimi.deploy.backoff import Patience
from pytest_kimi.deploy.executor import Handle, answer
from pytest_kimi.deploy.logs import Cut
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.secrets import env_file_text

T = TypeVar("T")


class NodeError(RuntimeError):
    """A node could not be reached or did not do what was asked; names node and cause."""


class NodeUnreachable(NodeError):
    """No connection, or one that dropped: worth another try after a pause (a refused key or
    a wrong host key is a plain :class:`NodeError`: waiting cannot fix it)."""


def _transient(exc: BaseException) -> bool:
    """Whether a failed connect may succeed later (network), not a refusal (keys, auth)."""
    if isinstance(exc, paramiko.BadHostKeyException | paramiko.AuthenticationException):
        return False
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return False
    return isinstance(exc, OSError | EOFError | paramiko.SSHException)


def _cause(exc: BaseException, node: Node, known_hosts: str) -> str:
    ssh = node.ssh
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"host key mismatch: the key offered is not the one in {known_hosts} "
            "(reinstalled host, or someone in the middle); refusing to connect"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = ssh.key or "default keys"
        return f"SSH authentication refused for user {ssh.user!r} with {key}"
    if isinstance(exc, paramiko.SSHException) and "known_hosts" in str(exc):
        return f"host key not found in {known_hosts}; add it, or set check_host_keys: false"
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"unreachable: no answer on port {ssh.port} within {ssh.connect_timeout_s:g}s"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | OSError):
        return f"unreachable: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _host_key_policy(client: paramiko.SSHClient, check: bool, known_hosts: str) -> None:
    """Checked: only the cluster's known_hosts (not ~/.ssh), an unknown key refused."""
    if check:
        client._host_keys = paramiko.HostKeys()  # only the cluster's file, not ~/.ssh
        if os.path.exists(known_hosts):
            client.load_host_keys(known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())


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
        self.environ = os.environ if environ is None else environ
        self._started_boxes: dict[str, tuple[Node, container.Box]] = {}  # run mode: ours
        self._env_files: dict[str, tuple[str, Node]] = {}  # path -> (process, node): maybe unread
        self._conns: dict[str, fabric.Connection] = {}
        self._keys: dict[str, paramiko.PKey] = {}
        self.patience = Patience(NodeUnreachable)  # reconnects: pytest_kimi.deploy.backoff
        self._gateways: dict[str, fabric.Connection] = {}  # jump_host -> its open connection

    def begin_teardown(self) -> None:
        """From now on a node that stops answering is retried for
        ``ssh.teardown_reconnect_s``: one lost during the run gets that chance again."""
        self.patience.begin_teardown()

    def _patiently(self, node: Node, attempt: Callable[[], T]) -> T:
        """``attempt()``, retried with back-off while it raises :class:`NodeUnreachable`."""
        ssh = node.ssh
        return self.patience.call(node.name, attempt, run_s=ssh.reconnect_s,
                                  teardown_s=ssh.teardown_reconnect_s)  # fmt: skip

    def _drop(self, node: Node) -> None:
        """Forget (and close) a connection that failed under a command."""
        conn = self._conns.pop(node.name, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- connections -------------------------------------------------------------------------
    def connection(self, node: Node) -> fabric.Connection:
        """An open connection to ``node`` (reconnecting with back-off for the node's
        patience); :class:`NodeError` says why there is none."""
        return self._patiently(node, lambda: self._connect(node))

    def _connect(self, node: Node) -> fabric.Connection:
        """The cached connection, or one attempt at a new one (one thread at a time)."""
        with self.patience.lock(node.name):
            conn = self._conns.get(node.name)
            if conn is not None and conn.is_connected:
                return conn
            return self._open(node)

    def _open(self, node: Node) -> fabric.Connection:
        """One attempt to connect; :class:`NodeUnreachable` when it may work later."""
        ssh = node.ssh
        known_hosts = os.path.expanduser(ssh.known_hosts or "~/.ssh/known_hosts")
        kwargs: dict = {
            "banner_timeout": ssh.connect_timeout_s,
            "auth_timeout": ssh.connect_timeout_s,
            "allow_agent": False,
            "look_for_keys": ssh.key is None,
        }
        if ssh.key:
            kwargs["pkey"] = self._key(node)
        gateway = self._gateway(node, kwargs, known_hosts) if ssh.jump_host else None
        conn = fabric.Connection(
            node.host,
            user=ssh.user,
            port=ssh.port,
            connect_timeout=ssh.connect_timeout_s,
            connect_kwargs=kwargs,
            gateway=gateway,
        )
        _host_key_policy(conn.client, ssh.check_host_keys, known_hosts)
        try:
            conn.open()
        except Exception as exc:
            conn.close()
            cause = _cause(exc, node, known_hosts)
            kind = NodeUnreachable if _transient(exc) else NodeError
            raise kind(f"node {node.name} ({node.host}): {cause}") from None
        transport = conn.transport
        transport.set_keepalive(5)
        # opening a channel is not covered by command timeouts (DESIGN.md, fabric trials)
        transport.channel_timeout = ssh.connect_timeout_s  # type: ignore[attr-defined]
        self._conns[node.name] = conn
        return conn

    def _gateway(self, node: Node, kwargs: dict, known_hosts: str) -> fabric.Connection:
        """The jump host's connection, open, shared by every node behind it: its host key
        checked like a node's (same known_hosts, ``RejectPolicy``), closed in :meth:`close`.
        A jump host that cannot be reached is named as such, not as the node."""
        ssh = node.ssh
        spec = ssh.jump_host
        assert spec is not None
        gateway = self._gateways.get(spec)
        if gateway is not None and gateway.is_connected:
            return gateway
        user, _, hostport = spec.rpartition("@")
        host, _, port = hostport.partition(":")
        gateway = fabric.Connection(
            host, user=user or ssh.user, port=int(port or 22),
            connect_timeout=ssh.connect_timeout_s, connect_kwargs=dict(kwargs),
        )  # fmt: skip
        _host_key_policy(gateway.client, ssh.check_host_keys, known_hosts)
        try:
            gateway.open()
        except Exception as exc:
            gateway.close()
            cause = _cause(exc, node, known_hosts).replace(f"port {ssh.port}", f"port {port or 22}")
            kind = NodeUnreachable if _transient(exc) else NodeError  # a blip is retried
            raise kind(f"node {node.name} ({node.host}): jump host {spec}: {cause}") from None
        gateway.transport.set_keepalive(5)
        self._gateways[spec] = gateway
        return gateway

    def _key(self, node: Node) -> paramiko.PKey:
        """The node's private key, decrypted once per deployment: handing paramiko a file name
        makes it run the passphrase KDF once per key type it tries, on every connection."""
        ssh = node.ssh
        assert ssh.key is not None
        path = os.path.expanduser(ssh.key)
        cache_key = f"{path}\0{ssh.passphrase_env or ''}"
        if cache_key in self._keys:
            return self._keys[cache_key]
        passphrase = None
        if ssh.passphrase_env:
            if ssh.passphrase_env not in self.environ:
                raise NodeError(
                    f"node {node.name} ({node.host}): the key passphrase variable "
                    f"{ssh.passphrase_env} is not set in the environment"
                )
            passphrase = self.environ[ssh.passphrase_env]
        where = f"node {node.name} ({node.host}): SSH key {path}"
        try:
            key = paramiko.PKey.from_path(path, None if passphrase is None else passphrase.encode())
        except (TypeError, paramiko.PasswordRequiredException):
            raise NodeError(
                f"{where} is encrypted and no passphrase was given (name the variable "
                "holding it in ssh.passphrase_env)"
            ) from None
        except OSError as exc:
            raise NodeError(f"{where} cannot be read: {exc.strerror}") from None
        except Exception as exc:  # paramiko / cryptography: bad format, unknown key type
            hint = "wrong passphrase, or not a private key" if passphrase else "not a private key"
            # the library's message names the problem, never the passphrase
            raise NodeError(f"{where} cannot be loaded ({hint}): {exc}") from None
        self._keys[cache_key] = key
        return key

    def run(
        self, node: Node, command: str, timeout: float | None = None, *, repeat: bool = True
    ) -> tuple[int, str]:
        """Run a shell command on ``node``; returns (exit code, :func:`~.executor.answer`).
        A command safe to repeat (``repeat``: status, sizes, probes) is run again on a new
        connection if its connection dropped, for the node's patience; one that is not (a
        start) is not: its :class:`NodeUnreachable` says the caller must find out what
        happened."""
        if not repeat:
            conn = self.connection(node)  # connecting is always safe to retry
            return self._run_once(node, command, timeout, conn)
        return self._patiently(node, lambda: self._run_once(node, command, timeout))

    def _run_once(
        self,
        node: Node,
        command: str,
        timeout: float | None,
        conn: fabric.Connection | None = None,
    ) -> tuple[int, str]:
        conn = conn or self._connect(node)
        try:
            result = conn.run(
                command,
                hide=True,
                warn=True,
                pty=False,
                in_stream=False,
                timeout=timeout or node.ssh.command_timeout_s,
            )
        except invoke.exceptions.CommandTimedOut:
            if self._answers(node, conn):  # the command is slow, not the connection dead
                raise NodeError(f"node {node.name} ({node.host}): command timed out") from None
            self._drop(node)
            raise NodeUnreachable(
                f"node {node.name} ({node.host}): stopped answering (a command timed out and "
                "the connection no longer opens channels)"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._drop(node)
            raise NodeUnreachable(
                f"node {node.name} ({node.host}): stopped answering: {type(exc).__name__}: {exc}"
            ) from None
        return result.exited, answer(result.exited, result.stdout, result.stderr)

    @staticmethod
    def _answers(node: Node, conn: fabric.Connection) -> bool:
        """Whether the connection still opens a channel within the connect time-out."""
        try:
            conn.transport.open_session(timeout=node.ssh.connect_timeout_s).close()
        except Exception:
            return False
        return True

    # -- the Executor interface (the shell each step runs: pytest_kimi.deploy.remote) -------
    def _files(self, spec: ProcessSpec) -> remote.RemoteFiles:
        return remote.RemoteFiles.of(self.remote_dir, spec)

    def _box(self, spec: ProcessSpec) -> container.Box | None:
        if spec.container is None:
            return None
        return container.box_for(spec.container, self.run_tag, spec.name)

    def _run_for(self, spec: ProcessSpec, command: str) -> tuple[int, str]:
        """``command`` where the process lives: on its node, or inside its container."""
        box = self._box(spec)
        return self.run(spec.node, command if box is None else container.exec_in(box, command))

    def run_as(
        self, spec: ProcessSpec, command: str, timeout: float | None = None
    ) -> tuple[int, str]:
        """``command`` as ``spec``'s process would run: its environment (from a 0600 file the
        shell sources and removes, never the command line), its setup lines, in its container.
        For probes (versions) after bring-up."""
        code, out = self.run(spec.node, remote.mkdir(self.remote_dir))
        if code != 0:
            raise NodeError(f"node {spec.node.name}: cannot create {self.remote_dir}: {out}")
        env_file = self._files(spec).env + ".probe" if spec.launch_env else None
        if env_file:
            self._write_env(spec, env_file)
        box = self._box(spec)
        script = remote.probe_script(spec, command, None if box else env_file)
        if box is None:
            return self.run(spec.node, f"sh -c {shlex.quote(script)}", timeout)
        inside = container.exec_in(box, f"sh -c {shlex.quote(script)}", spec.launch_env)
        wrapped = container.with_env_file(env_file, inside) if env_file else inside
        return self.run(spec.node, wrapped, timeout)

    def _write_env(self, spec: ProcessSpec, path: str) -> None:
        """The process's environment, in a file only its owner can read: made 0600 before a
        byte of it is written (the run folder is 0700 too)."""
        self._env_files[path] = (spec.name, spec.node)
        self.put_file(spec.node, path, env_file_text(spec.launch_env).encode())

    def put_file(self, node: Node, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` on ``node`` over SFTP, 0600 before a byte is written;
        the whole file each time, so it is safe to repeat after a reconnect. Its folder
        must exist (the run folder, made by ``start`` or :func:`remote.mkdir`)."""

        def write() -> None:
            try:
                # an SFTP channel of its own, closed at once: fabric's memoized one stays open
                # for the connection's life, and a link outage strands its sftp-server on the
                # node until sshd's keepalive notices, hours later
                conn = self._connect(node)
                with conn.client.open_sftp() as sftp, sftp.open(path, "w") as fh:
                    fh.chmod(0o600)
                    fh.write(data)
            except (EOFError, paramiko.SSHException, ConnectionError, TimeoutError) as exc:
                self._drop(node)
                raise NodeUnreachable(f"node {node.name}: cannot write {path}: {exc}") from None
            except OSError as exc:  # the node said no (permissions, disk full)
                raise NodeError(f"node {node.name}: cannot write {path} (sftp): {exc}") from None

        self._patiently(node, write)

    def start(self, spec: ProcessSpec, log_path: Path) -> Handle:
        files = self._files(spec)
        code, out = self.run(spec.node, remote.mkdir(self.remote_dir))
        if code != 0:
            raise NodeError(f"node {spec.node.name}: cannot create {self.remote_dir}: {out}")
        env_file = files.env if spec.launch_env else None
        if env_file:
            self._write_env(spec, env_file)
        box = self._box(spec)
        if box is None:
            # the node records the group id itself: if we are interrupted before reading it,
            # teardown still finds the process (adopt)
            command = remote.start(spec, files, env_file, self.max_s)
        else:
            self._enter(spec, box)
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

    def _enter(self, spec: ProcessSpec, box: container.Box) -> None:
        """Run mode: start the container (remembered first, so teardown removes it even if
        we are interrupted); then the run folder must exist inside it."""
        where = f"node {spec.node.name}: container {box.name}"
        if box.ours:
            self._started_boxes[spec.name] = (spec.node, box)
            command = container.run_container(box, self.remote_dir)
            code, out = self.run(spec.node, command, repeat=False)  # a second would clash
            if code != 0:
                raise NodeError(f"{where} did not start: {out.strip()}")
        code, out = self._run_for(spec, remote.mkdir(self.remote_dir))
        if code != 0:
            raise NodeError(f"{where}: cannot create {self.remote_dir} inside it: {out.strip()}")

    def adopt(self, spec: ProcessSpec, log_path: Path) -> Handle | None:
        """The handle of a process whose ``start`` was interrupted: from its pid file."""
        files = self._files(spec)
        _, out = self._run_for(spec, remote.read_pid_file(files))
        pid = out.strip()
        return Handle(spec, int(pid), Path(files.log)) if pid.isdigit() else None

    def exit_code(self, handle: Handle) -> int | None:
        spec = handle.spec
        code, out = self._run_for(spec, remote.exit_code(self._files(spec), handle.pgid))
        if code != 0 and spec.container is not None and container.says_gone(out):
            return -9  # its container is gone, and the process with it
        return remote.parse_exit_code(out)

    def alive(self, handle: Handle) -> bool:
        """Whether the group has a live process. In a container: asked inside it; a container
        that is gone has no processes, a runtime that cannot answer is a :class:`NodeError`
        (the process is then unverifiable, never "gone")."""
        spec = handle.spec
        code, out = self._run_for(spec, remote.group_stats(handle.pgid))
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
        self._run_for(handle.spec, remote.signal_group(handle.pgid, name))

    def port_in_use(self, node: Node, port: int) -> bool:
        """A listening TCP socket on ``port`` on the node (``ss`` from iproute2; if the node
        has no ``ss`` the check is skipped and a bind failure shows in the process's log)."""
        code, out = self.run(node, remote.port_listening(port))
        return code == 0 and bool(out.strip())

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        try:
            _, out = self._run_for(handle.spec, remote.tail(self._files(handle.spec).log, lines))
        except NodeError as exc:
            return f"(log unavailable: {exc})"
        return out

    def log_size(self, handle: Handle) -> int | None:
        try:
            _, out = self._run_for(handle.spec, remote.size(self._files(handle.spec).log))
        except NodeError:
            return None
        return int(out.strip()) if out.strip().isdigit() else None

    def fetch_log(self, handle: Handle, dest: Path, max_bytes: int | None = None) -> Cut | None:
        """The log, capped on the node (head, marker, tail: :mod:`pytest_kimi.deploy.logs`) and
        gzipped there, fetched over SFTP and unpacked into ``dest``; inside a container it is
        read capped through the runtime. A node that cannot give it leaves a note in ``dest``."""
        log = self._files(handle.spec).log
        cap = max_bytes if max_bytes is not None else 1 << 62
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            if handle.spec.container is not None:  # the log is inside the container
                code, out = self._run_for(handle.spec, logs.capped_cat_command(log, cap))
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
                with self.connection(handle.spec.node).client.open_sftp() as sftp:
                    sftp.get(gz, str(local_gz))  # a channel of its own, closed (see _write_env)
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
        """After the processes are stopped: remove environment files not yet read and the
        containers we started; name whatever is left, or could not be checked."""
        left: list[str] = []
        for path, (name, node) in self._env_files.items():
            try:
                code, out = self.run(node, remote.remove_files([path]))
            except NodeError as exc:
                code, out = 1, str(exc)
            if code != 0:
                left.append(f"{name} on {node.name}: environment file {path} not removed ({out})")
        for name, (node, box) in self._started_boxes.items():
            where = f"container {box.name} of {name} on {node.name}"
            try:
                self.run(node, container.remove_container(box))
                present = container.parse_inspect(*self.run(node, container.inspect_container(box)))
            except (NodeError, container.RuntimeUnanswered) as exc:
                left.append(f"{where}: unverifiable ({exc})")
                continue
            if present:
                left.append(f"{where}: still exists after removal")
        return left

    def close(self) -> None:
        """Every node's connection, then the jump hosts' (the nodes' channels run over them)."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        for gateway in self._gateways.values():
            gateway.close()
        self._gateways.clear()
