"""``--kimi-preflight-only`` and the pre-flight at bring-up on the local mock cluster, whose
"nodes" answer through the stand-in nvidia-smi."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_kimi.config.options import DEFAULT_CLUSTER
from pytest_kimi.testing.processes import pytest_argv

ROOT = Path(__file__).resolve().parents[2]


def _cluster(tmp_path: Path) -> Path:
    """The embedded cluster with its GPU state (work_dir) under ``tmp_path``."""
    text = DEFAULT_CLUSTER.read_text() + f"\nwork_dir: {tmp_path / 'work'}\n"
    path = tmp_path / "local.yaml"
    path.write_text(text)
    return path


def _pytest(tmp_path: Path, cluster: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [*pytest_argv(), str(ROOT / "tests" / "perf"), f"--cluster={cluster}",
            f"--kimi-report-dir={tmp_path / 'out'}", "-p", "no:cacheprovider", "-q",
            f"--rootdir={ROOT}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_preflight_only_lists_every_node_and_exits_0(tmp_path):
    done = _pytest(tmp_path, _cluster(tmp_path), "--kimi-preflight-only")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("node60")]
    assert [r[0] for r in rows] == [f"node60{i}" for i in range(1, 9)]
    assert all(r[2] == "8/8" for r in rows)
    assert not (tmp_path / "out").exists()  # no run folder, no test ran


def test_preflight_only_names_a_held_gpu_and_exits_1(tmp_path):
    cluster = _cluster(tmp_path)
    state = tmp_path / "work" / "mock-gpus" / "preflight" / "node604"
    hold = subprocess.Popen(
        [sys.executable, "-m", "pytest_kimi.mock.nvidia_smi", "--node", "node604",
         "--state-dir", str(state), "hold", "--gpus", "5", "--mib", "1234"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert hold.stdout.readline().startswith("holding")
        done = _pytest(tmp_path, cluster, "--kimi-preflight-only")
    finally:
        hold.terminate()
        hold.wait(timeout=10)
    assert done.returncode == 1, done.stdout[-3000:]
    assert (
        f"PROBLEM node node604 (127.0.0.1): GPU 5 busy: pid {hold.pid} (python3) holds 1234 MiB"
        in done.stdout
    )
