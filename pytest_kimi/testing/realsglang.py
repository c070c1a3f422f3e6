"""Real SGLang servers on a CPU, for the tests that hold the product and the mock against them.

SGLang 0.5.9 and 0.5.23 serve ``pytest_kimi/data/tiny-model`` (a 2-layer Llama, random weights
through ``--load-format dummy``) on a CPU, each from its own venv built by
``scripts/install_real_sglang.sh VERSION`` (``.venv-sglang-VERSION`` at the checkout's root;
``KIMI_SGLANG_VENV_<VERSION with _>`` names another one, e.g. ``KIMI_SGLANG_VENV_0_5_23``).
A test that needs one installs it on first use (a file lock keeps xdist workers to one
install). Where it cannot be installed the test is skipped with the reason, unless
``KIMI_REAL_SGLANG_REQUIRED=1`` (CI), which makes that a failure: missing is never passing.

Two packages in those venvs are import-only stand-ins (``scripts/real_sglang/standins``): a
call writes :data:`STANDIN_MARKER` and the function's name to the server's log and raises.
:func:`standin_calls` finds such lines; every real-server test checks its logs with it.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from pytest_kimi.mock.wire import VERSIONS as WIRE_VERSIONS
from pytest_kimi.testing.peer import offline_env
from pytest_kimi.testing.processes import Proc

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install_real_sglang.sh"
MODEL_DIR = ROOT / "pytest_kimi" / "data" / "tiny-model"
VERSIONS = WIRE_VERSIONS  # the versions the mock records are the versions tested live
REQUIRED_ENV_VAR = "KIMI_REAL_SGLANG_REQUIRED"
STANDIN_MARKER = "KIMI-STANDIN-CALLED"
INSTALL_TIMEOUT_S = 1200.0
START_TIMEOUT_S = 240.0  # 18-44 s alone on 2 cores; more while other servers start beside it

# What a CPU needs (docs/real-sglang.md): torch operators for attention (no FlashInfer), random
# weights (nothing downloaded), a small KV pool (the default sizes it from free memory: 16 M
# tokens and 44 s of allocation), and a scheduler that sleeps when idle (else each one spins a
# core at 100% and two idle servers take a 2-core machine). torch_native attention turns CUDA
# graphs off in both versions, so neither version's CUDA-graph flag is needed.
CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--load-format", "dummy",
    "--enable-metrics",
    "--sleep-on-idle",
    "--max-total-tokens", "32768",
    "--context-length", "4096",
)  # fmt: skip
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
# What the mock is held against (tests/conformance/test_mock_vs_sglang.py, and the wire files
# scripts/capture_sglang_wire.py records): a server without a prefix cache, as the mock models
# one. With it, a repeated prompt prefix turns 0.5.23's ``cached_tokens_details`` from null
# into an object and adds ``sglang:cached_tokens_total``: answers that depend on what earlier
# requests shared, not on the wire.
CONFORMANCE_FLAGS = ("--disable-radix-cache",)


def venv_var(version: str) -> str:
    """The variable that names another venv for ``version``: ``KIMI_SGLANG_VENV_0_5_23``."""
    return "KIMI_SGLANG_VENV_" + version.replace(".", "_")


def venv_dir(version: str) -> Path:
    given = os.environ.get(venv_var(version))
    return Path(given) if given else ROOT / f".venv-sglang-{version}"


def required() -> bool:
    return os.environ.get(REQUIRED_ENV_VAR, "") not in ("", "0")


def unavailable(message: str) -> None:
    """Skip with ``message``, or fail where real SGLang must run (:data:`REQUIRED_ENV_VAR`)."""
    if required():
        pytest.fail(f"{message} ({REQUIRED_ENV_VAR} is set)", pytrace=False)
    pytest.skip(message)


def _installed(what: str, argv: list[str], lock_path: Path, env: dict[str, str] | None) -> None:
    """Run an install script under a lock (parallel test processes wait for one install);
    fails or skips with the script's output when it cannot be done."""
    try:
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                done = subprocess.run(argv, capture_output=True, text=True,
                                      timeout=INSTALL_TIMEOUT_S, env=env)  # fmt: skip
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    except subprocess.TimeoutExpired:
        unavailable(f"installing {what} did not finish in {INSTALL_TIMEOUT_S:g}s")
    except OSError as exc:
        unavailable(f"cannot install {what}: {exc}")
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-4000:]
        unavailable(f"installing {what} failed (exit {done.returncode}):\n{output}")


def install(version: str) -> Path:
    """The venv of ``version``, installed now if it is not complete (the script returns at
    once when it is). Returns the venv's ``python``; fails or skips, with the script's output,
    when that cannot be done."""
    venv = venv_dir(version)
    _installed(f"SGLang {version}", ["bash", str(INSTALL_SCRIPT), version, str(venv)],
               ROOT / f".venv-sglang-{version}.lock", offline_env())  # fmt: skip
    return venv / "bin" / "python"


ROUTER_SCRIPT = ROOT / "scripts" / "install_router.sh"
ROUTER_OF: dict[str, tuple[str, str]] = {"0.5.9": ("sglang-router", "0.3.2"),
                                         "0.5.23": ("smg", "")}  # fmt: skip
"""The router each SGLang version is held against here: the one its users ran it behind
(January 2026: sglang-router 0.3.2; today: smg, the project's own dependency, "" = that one)."""


def router_python(package: str, version: str) -> Path:
    """The interpreter that has ``package`` ``version``: the project's own for smg (its
    dependency), else that release's venv (``scripts/install_router.sh``, installed now if
    needed: sglang-router 0.3 beside smg would shadow its ``smg`` script)."""
    import sys

    if package == "smg" and not version:
        return Path(sys.executable)
    venv = ROOT / f".venv-router-{package}-{version}"
    _installed(f"{package} {version}",
               ["bash", str(ROUTER_SCRIPT), f"{package}=={version}", str(venv)],
               ROOT / f".venv-router-{package}-{version}.lock", None)  # fmt: skip
    return venv / "bin" / "python"


def installed_release(python: Path, package: str) -> str:
    """``package``'s release as ``python`` has it (its metadata): a truth read apart from the
    product's own probe."""
    code = f"from importlib import metadata; print(metadata.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=True, timeout=120).stdout.strip()  # fmt: skip


def server_env(**extra: str) -> dict[str, str]:
    """A CPU server's environment: offline (no model hub), CPU engine, one OpenMP thread."""
    return {**offline_env(), **CPU_ENV, **extra}


def server_argv(python: Path, port: int, *flags: str) -> list[str]:
    """``sglang.launch_server`` of the tiny model on ``127.0.0.1:port`` with the CPU flags."""
    return [
        str(python), "-m", "sglang.launch_server",
        "--model-path", str(MODEL_DIR), "--host", "127.0.0.1", "--port", str(port),
        *CPU_FLAGS, *flags,
    ]  # fmt: skip


class RealServer(Proc):
    """One real SGLang server (its own process group) and its URL. Stop it with
    :func:`stop_servers`, which also checks its log for stand-in calls."""

    def __init__(self, version: str, python: Path, port: int, log: Path, *flags: str) -> None:
        super().__init__(server_argv(python, port, *flags), log, env=server_env())
        self.version = version
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.wait_http(self.url + "/health", timeout_s)

    def stop(self, grace_s: float = 60.0) -> None:
        """A server still draining a request takes its time to exit on SIGTERM: a long
        grace, then KILL."""
        super().stop(grace_s)


def stop_servers(*procs: Proc | None) -> None:
    """Stop every one of ``procs`` (``None``: never started) whatever the others do, then
    fail with what went wrong: a group left running, or a stand-in a real server called."""
    problems: list[str] = []
    for proc in procs:
        if proc is None:
            continue
        try:
            proc.stop()
        except Exception as exc:  # the next one is stopped all the same
            problems.append(f"{proc.log.name}: {exc}")
    found = standin_calls(p.log for p in procs if isinstance(p, RealServer))
    problems += [f"{log}: called the stand-in {', '.join(names)}" for log, names in found.items()]
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


_CALL = re.compile(re.escape(STANDIN_MARKER) + r" (\S+)")


def standin_calls(logs: Iterable[Path]) -> dict[str, list[str]]:
    """Log file name -> the stand-in functions it says were called (empty: none)."""
    found: dict[str, list[str]] = {}
    for log in logs:
        names = _CALL.findall(log.read_text(errors="replace"))
        if names:
            found[log.name] = sorted(set(names))
    return found


def assert_no_standin_calls(logs: Iterable[Path]) -> None:
    """Fail naming each function a server called on an import-only stand-in: what that server
    computed is not SGLang's own, so nothing it answered can be trusted."""
    found = standin_calls(logs)
    if found:
        where = "; ".join(f"{log}: {', '.join(names)}" for log, names in found.items())
        pytest.fail(f"a server called an import-only stand-in: {where}", pytrace=False)


def pids_with_env(name: str, value: str) -> list[int]:
    """Live processes whose environment holds ``name=value``. A run started with a marker
    variable passes it to everything it starts, down to SGLang's scheduler and detokenizer
    (whose command lines are only ``sglang::scheduler``): what is left of it, by the kernel's
    account, not by anything the run itself reports."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != "Z":
            found.append(int(entry))
    return found


def run_child(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run a child (a pytest run of the product) to its end. Past ``timeout_s`` it gets
    SIGTERM, which the product treats as Ctrl-C: it stops every server it started before it
    exits (SIGKILL, as ``subprocess.run`` sends, would leave them running); KILL only if it
    has not exited two minutes later. The output says when it was stopped."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        out += f"\n[stopped by the test: still running after {timeout_s:g} s]\n"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
