"""Where each process of a run lives on its node, and what the run leaves there besides it.

A process's files (pid, exit code, log, environment) are in the run folder
``<work_dir>/<run>/`` on its node (:class:`pytest_kimi.deploy.remote.RemoteFiles`); a process
in a container lives inside it, so every command about the process runs there
(:meth:`Places.run_for`, through :mod:`pytest_kimi.deploy.container`). Besides its processes a
run leaves environment files a process may not have read yet and, in run mode, the containers
it started: both are remembered the moment they exist, so teardown removes them even if we
are interrupted, and names whatever it could not (:meth:`Places.cleanup`).

A process's environment goes to ``<run>/<proc>.env`` over SFTP, made 0600 before anything
is written to it; the process's shell reads and removes it. No value is on a command line.
"""

from __future__ import annotations

from pytest_kimi.config import Node
from pytest_kimi.deploy import container, remote
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.secrets import env_file_text
from pytest_kimi.deploy.sshconnections import Connections, NodeError


class Places:
    """A run's folder on every node, its processes' containers, and what it left in both."""

    def __init__(self, connections: Connections, remote_dir: str, run_tag: str) -> None:
        self.connections = connections
        self.remote_dir = remote_dir  # <work_dir>/<run>, on every node (and in its containers)
        self.run_tag = run_tag
        self._started_boxes: dict[str, tuple[Node, container.Box]] = {}  # run mode: ours
        self._env_files: dict[str, tuple[str, Node]] = {}  # path -> (process, node): maybe unread

    def files(self, spec: ProcessSpec) -> remote.RemoteFiles:
        return remote.RemoteFiles.of(self.remote_dir, spec)

    def box(self, spec: ProcessSpec) -> container.Box | None:
        if spec.container is None:
            return None
        return container.box_for(spec.container, self.run_tag, spec.name)

    def run_for(self, spec: ProcessSpec, command: str) -> tuple[int, str]:
        """``command`` where the process lives: on its node, or inside its container."""
        box = self.box(spec)
        command = command if box is None else container.exec_in(box, command)
        return self.connections.run(spec.node, command)

    def make_folder(self, node: Node) -> None:
        """The run folder on ``node`` (0700), made if it is not there."""
        code, out = self.connections.run(node, remote.mkdir(self.remote_dir))
        if code != 0:
            raise NodeError(f"node {node.name}: cannot create {self.remote_dir}: {out}")

    def write_env(self, spec: ProcessSpec, path: str) -> None:
        """The process's environment, in a file only its owner can read: made 0600 before a
        byte of it is written (the run folder is 0700 too)."""
        self._env_files[path] = (spec.name, spec.node)
        self.connections.put_file(spec.node, path, env_file_text(spec.launch_env).encode())

    def enter(self, spec: ProcessSpec, box: container.Box) -> None:
        """Run mode: start the container (remembered first, so teardown removes it even if
        we are interrupted); then the run folder must exist inside it."""
        where = f"node {spec.node.name}: container {box.name}"
        if box.ours:
            self._started_boxes[spec.name] = (spec.node, box)
            command = container.run_container(box, self.remote_dir)
            # not repeated: a second would clash
            code, out = self.connections.run(spec.node, command, repeat=False)
            if code != 0:
                raise NodeError(f"{where} did not start: {out.strip()}")
        code, out = self.run_for(spec, remote.mkdir(self.remote_dir))
        if code != 0:
            raise NodeError(f"{where}: cannot create {self.remote_dir} inside it: {out.strip()}")

    def cleanup(self) -> list[str]:
        """After the processes are stopped: remove environment files not yet read and the
        containers we started; name whatever is left, or could not be checked."""
        left: list[str] = []
        run = self.connections.run
        for path, (name, node) in self._env_files.items():
            try:
                code, out = run(node, remote.remove_files([path]))
            except NodeError as exc:
                code, out = 1, str(exc)
            if code != 0:
                left.append(f"{name} on {node.name}: environment file {path} not removed ({out})")
        for name, (node, box) in self._started_boxes.items():
            where = f"container {box.name} of {name} on {node.name}"
            try:
                run(node, container.remove_container(box))
                present = container.parse_inspect(*run(node, container.inspect_container(box)))
            except (NodeError, container.RuntimeUnanswered) as exc:
                left.append(f"{where}: unverifiable ({exc})")
                continue
            if present:
                left.append(f"{where}: still exists after removal")
        return left
