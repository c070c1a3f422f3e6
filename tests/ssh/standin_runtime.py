"""A stand-in container runtime for the SSH tests: behaves like ``docker`` where it matters.

- ``run -d --name N [flags] IMAGE [cmd...]`` starts the container: an init in a new PID and
  mount namespace (``unshare --pid --fork --mount-proc``: pids inside differ from outside, its
  own /proc) with a daemon that listens on ``<state>/<hash of N>.sock``. Flags are ignored.
- ``exec [-e NAME[=V]]... [-i] [-t] N argv...`` asks the daemon to spawn argv inside; output and
  exit code are relayed. As with docker, the process is the daemon's child, not the client's:
  it is in neither the client's process group nor its session, and signals to the client are
  not forwarded. Killing the client's group leaves it running (what the tests catch).
  ``-e NAME`` takes the value from the client's environment, as docker does.
- ``rm -f N`` kills the container's init (the kernel then kills everything inside).
- ``inspect N`` / ``ps``: whether N exists; ``top N``: the pids inside besides init and daemon.
- A container that does not exist: ``Error response from daemon: No such container: N``, exit 1.

State lives in ``--state DIR`` (first argument) so each test has its own containers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def _sock(state: Path, name: str) -> Path:
    """A unix socket path must fit 108 bytes: a hash of the name, not the name."""
    return state / (hashlib.sha1(name.encode()).hexdigest()[:12] + ".sock")


def _no_such(name: str) -> int:
    print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
    return 1


def _info(state: Path, name: str) -> dict | None:
    """The container's record if its init still runs."""
    try:
        info = json.loads((state / f"{name}.json").read_text())
        os.kill(info["init_pid"], 0)
    except (OSError, ValueError, KeyError):
        return None
    return info


# -- inside the container ---------------------------------------------------------------------
def _init(state: Path, name: str) -> None:
    """pid 1: runs the daemon, reaps every orphan, ends (and so ends the namespace) with it."""
    daemon = subprocess.Popen([sys.executable, __file__, str(state), "_daemon", name])
    while True:
        pid, _ = os.wait()
        if pid == daemon.pid:
            return


def _daemon(state: Path, name: str) -> None:
    sock_path = _sock(state, name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        sock_path.unlink()
    server.bind(str(sock_path))
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


def _serve(conn: socket.socket) -> None:
    with conn, conn.makefile("rb") as reader:
        request = json.loads(reader.readline())
        if request["op"] == "top":
            skip = {1, os.getpid(), os.getppid()}
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in skip]
            conn.sendall(json.dumps({"pids": pids}).encode() + b"\n")
            return
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **request["env"]}
        try:
            proc = subprocess.Popen(request["argv"], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        except OSError as exc:
            conn.sendall(json.dumps({"out": f"exec failed: {exc}\n", "code": 126}).encode())
            return
        out = proc.stdout.read() if proc.stdout else b""
        code = proc.wait()
        conn.sendall(json.dumps({"out": out.decode(errors="replace"), "code": code}).encode())


# -- the client --------------------------------------------------------------------------------
def _ask(state: Path, name: str, request: dict) -> dict | None:
    if _info(state, name) is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(_sock(state, name)))
        except OSError:
            return None
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b"".join(iter(lambda: sock.recv(65536), b""))
    return json.loads(data)


def _run(state: Path, args: list[str]) -> int:
    name = args[args.index("--name") + 1]
    if _info(state, name) is not None:
        print(f"Error: the container name {name!r} is already in use", file=sys.stderr)
        return 125
    argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    argv += [sys.executable, __file__, str(state), "_init", name]
    outer = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = children.read_text().split() if children.exists() else []
        if kids and (_sock(state, name)).exists():
            record = {"init_pid": int(kids[0]), "unshare_pid": outer.pid, "args": args}
            (state / f"{name}.json").write_text(json.dumps(record))
            print(f"{name}-id")
            return 0
        time.sleep(0.01)
    print("Error: the container did not start", file=sys.stderr)
    return 125


def _exec(state: Path, args: list[str]) -> int:
    env: dict[str, str] = {}
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag in ("-e", "--env"):
            key, eq, value = args.pop(0).partition("=")
            if eq:
                env[key] = value
            elif key in os.environ:
                env[key] = os.environ[key]
    name, argv = args[0], args[1:]
    answer = _ask(state, name, {"op": "exec", "argv": argv, "env": env})
    if answer is None:
        return _no_such(name)
    sys.stdout.write(answer["out"])
    return answer["code"]


def _rm(state: Path, args: list[str]) -> int:
    name = args[-1]
    info = _info(state, name)
    if info is None:
        return _no_such(name)
    with contextlib.suppress(ProcessLookupError):
        os.kill(info["init_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _info(state, name) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    (state / f"{name}.json").unlink(missing_ok=True)
    _sock(state, name).unlink(missing_ok=True)
    print(name)
    return 0


def main(argv: list[str]) -> int:
    state, command, args = Path(argv[0]), argv[1], argv[2:]
    state.mkdir(parents=True, exist_ok=True)
    if command == "_init":
        _init(state, args[0])
        return 0
    if command == "_daemon":
        _daemon(state, args[0])
        return 0
    if command == "run":
        return _run(state, args)
    if command == "exec":
        return _exec(state, args)
    if command == "rm":
        return _rm(state, args)
    if command == "inspect":
        name = args[-1]
        if _info(state, name) is None:
            print(f"Error: No such object: {name}", file=sys.stderr)
            return 1
        print("true")
        return 0
    if command == "ps":
        names = [p.stem for p in state.glob("*.json") if _info(state, p.stem)]
        print("\n".join(sorted(names)))
        return 0
    if command == "top":
        answer = _ask(state, args[0], {"op": "top"})
        if answer is None:
            return _no_such(args[0])
        print(" ".join(str(p) for p in answer["pids"]))
        return 0
    print(f"standin: unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
