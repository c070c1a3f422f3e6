"""``kill -9`` of the harness mid-run: every process of the local deployment dies with it.

No ``finally`` runs in a SIGKILLed pytest; only the kernel closing the executor's lifeline
(:class:`pytest_kimi.deploy.procgroup.Lifeline`) can stop the 8 mock servers and the router.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pytest_kimi.config.options import DEFAULT_CLUSTER
from pytest_kimi.testing.processes import pytest_argv

ROOT = Path(__file__).parents[2]
PERF = ROOT / "tests" / "perf"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _descendants(root: int) -> dict[int, str]:
    """Every live process below ``root``: pid -> its start time (so a reused pid is not it)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
            starts[int(entry)] = fields[19]
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = starts[pid]
        todo += children.get(pid, [])
    return found


def _alive(pid: int, start: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and fields[19] == start


def _measured(out: Path) -> bool:
    partial = list(out.glob("*/tp32/records.partial.jsonl"))
    lines = partial[0].read_text().splitlines() if partial else []
    return any(x.endswith("}") and json.loads(x)["index"] >= 0 for x in lines)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_kill_9_of_pytest_mid_run_leaves_no_mock_server_or_router(tmp_path: Path):
    slow = DEFAULT_CLUSTER.read_text().replace("time_scale: 40", "time_scale: 4")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(slow.replace("num_requests: 40", "num_requests: 24"))
    out = tmp_path / "out"
    argv = [*pytest_argv(), str(PERF), f"--cluster={cluster}", "--layout=tp32",
            f"--kimi-report-dir={out}", "-p", "no:cacheprovider", f"--rootdir={ROOT}",
            "-q"]  # fmt: skip
    log = tmp_path / "pytest.log"
    with log.open("wb") as sink:
        harness = subprocess.Popen(argv, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not _measured(out):
            assert harness.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "never measuring:\n" + log.read_text()[-4000:]
            time.sleep(0.05)
        ours = _descendants(harness.pid)
        servers = [
            p
            for p in ours
            if _cmdline(p).startswith(f"{sys.executable} -m pytest_kimi.mock.launch_server")
        ]  # not the stand-in nvidia-smi, which the telemetry sampler may be running right now
        assert len(servers) == 8  # the deployment is up: DP2 x 4 nodes (each with a watcher)
        assert any("smg.launch_router" in _cmdline(p) for p in ours)
        harness.send_signal(signal.SIGKILL)
        harness.wait(timeout=30)
    finally:
        if harness.poll() is None:
            harness.kill()
    deadline = time.monotonic() + 30
    while (left := [p for p, start in ours.items() if _alive(p, start)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert left == [], [(p, _cmdline(p)) for p in left]
