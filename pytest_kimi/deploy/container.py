"""The container runtime's commands: exec into a container, run one, remove it, ask for it.

Pure string building, like :mod:`pytest_kimi.deploy.remote`, whose commands these wrap. A
process in a container is started, watched and stopped *inside* it: every command the SSH
executor runs for it becomes ``<runtime> exec <container> sh -c '<command>'``. That is the
point: ``docker exec`` does not forward signals and the process it starts is not in the exec
client's process group, so signalling the client (what a ``wrapper: [docker, exec, c]`` did)
stops nothing, while ``kill`` run inside the container reaches the server's own group.

Environment values never travel on a command line: the host's shell sources the 0600
environment file and runs ``docker exec -e NAME ...`` with names only (docker and podman then
take each value from the client's environment; apptainer passes the host's environment into
the instance by default).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_kimi.config import ContainerConfig

APPTAINER = ("apptainer", "singularity")
# what a runtime says when the container is not there (or not running): its processes are gone
GONE = (
    "no such container",  # docker, podman
    "is not running",  # docker
    "no container with name",  # podman
    "state improper",  # podman: stopped
    "no instance found",  # apptainer / singularity
)


class RuntimeUnanswered(RuntimeError):
    """The runtime failed for another reason than "no such container": nothing is known."""


@dataclass(frozen=True)
class Box:
    """A container as our commands need it: its settings and its resolved name."""

    config: ContainerConfig
    name: str

    @property
    def cli(self) -> str:
        return shlex.quote(self.config.cli)

    @property
    def apptainer(self) -> bool:
        return self.config.runtime in APPTAINER

    @property
    def ours(self) -> bool:
        """Started by us (run mode), so removed by us at teardown."""
        return self.config.mode == "run"


def box_for(config: ContainerConfig, run_tag: str, process: str) -> Box:
    """Exec mode: the named container. Run mode: ``name`` or ``kimi-<run>-<process>``."""
    if config.name:
        return Box(config, config.name)
    tag = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"kimi-{run_tag}-{process}").strip("-.")
    return Box(config, tag)


def exec_in(box: Box, command: str, env_names: Iterable[str] = ()) -> str:
    """``command`` run by ``sh`` inside the container; ``env_names`` passed in by name."""
    inner = f"sh -c {shlex.quote(command)}"
    if box.apptainer:
        return f"{box.cli} exec instance://{shlex.quote(box.name)} {inner}"
    flags = "".join(f" -e {name}" for name in env_names)  # validated names: no quoting needed
    return f"{box.cli} exec{flags} {shlex.quote(box.name)} {inner}"


def with_env_file(env_file: str, command: str) -> str:
    """``command`` run by a subshell that exported ``env_file``'s variables and removed it."""
    q = shlex.quote(env_file)
    return f"( set -a; . {q}; set +a; rm -f {q}; {command} )"


def _gpus(config: ContainerConfig) -> list[str]:
    if config.gpus == "none":
        return []
    if config.runtime in APPTAINER:
        return ["--nv"]
    if config.gpus == "all":
        return ["--gpus", "all"]
    return ["--gpus", "device=" + ",".join(str(i) for i in config.gpus)]


def run_container(box: Box, remote_dir: str) -> str:
    """Start the container of run mode, idle (``sleep infinity``), the run folder mounted at
    the same path; the process is then exec'd into it like in exec mode. Host network and
    IPC, as SGLang's multi-node NCCL needs; ``--init`` reaps the orphans of our processes."""
    cfg = box.config
    assert cfg.image is not None, "run mode needs an image (checked at load)"
    if box.apptainer:
        argv = [cfg.cli, "instance", "start", *_gpus(cfg)]
        for mount in (*cfg.mounts, remote_dir):
            argv += ["-B", mount]
        return shlex.join([*argv, *cfg.args, cfg.image, box.name])
    argv = [cfg.cli, "run", "-d", "--name", box.name, "--network", "host", "--ipc", "host"]
    argv += ["--init", *_gpus(cfg)]
    for mount in (*cfg.mounts, f"{remote_dir}:{remote_dir}"):
        argv += ["-v", mount]
    argv += [*cfg.args, "--entrypoint", "sleep", cfg.image, "infinity"]
    return shlex.join(argv)


def remove_container(box: Box) -> str:
    if box.apptainer:
        return f"{box.cli} instance stop {shlex.quote(box.name)}"
    return f"{box.cli} rm -f {shlex.quote(box.name)}"


def inspect_container(box: Box) -> str:
    """Prints ``present`` / ``absent``, or the runtime's own error (exit != 0)."""
    name = shlex.quote(box.name)
    if box.apptainer:
        # `instance list NAME` lists it (a header line otherwise)
        return (
            f'out=$({box.cli} instance list {name} 2>&1) || {{ echo "$out"; exit 1; }}; '
            f'echo "$out" | grep -qw -- {name} && echo present || echo absent'
        )
    return (
        f"out=$({box.cli} inspect --format '{{{{.State.Running}}}}' {name} 2>&1); c=$?; "
        "if [ $c -eq 0 ]; then echo present; "
        'else case "$out" in *"o such"*|*"no container"*) echo absent;; '
        '*) echo "$out"; exit $c;; esac; fi'
    )


def says_gone(output: str) -> bool:
    """Whether the runtime's error says the container does not exist or is stopped."""
    text = output.lower()
    return any(marker in text for marker in GONE)


def parse_inspect(code: int, output: str) -> bool:
    """Whether the container exists, from :func:`inspect_container`'s answer; raises
    :class:`RuntimeUnanswered` when the runtime did not tell."""
    last = output.strip().splitlines()[-1] if output.strip() else ""
    if code == 0 and last in ("present", "absent"):
        return last == "present"
    raise RuntimeUnanswered(f"the container runtime did not answer (exit {code}): {output.strip()}")
