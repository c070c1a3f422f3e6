"""Version probes and the router answer shapes a bring-up accepts (smg 1.x, sglang-router 0.3.x)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy.envinfo import (
    interpreter,
    probe_command,
    router_version,
    software,
)
from pytest_kimi.deploy.executor import LocalExecutor
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.readiness import (
    FormatError,
    metric_families,
    readiness_count,
)

NODE = Node(name="n1", host="127.0.0.1", gpus=1)

# What sglang-router 0.3.2 answered in front of two mock replicas (recorded live).
READY = b'{"status":"ready","healthy_workers":2,"total_workers":2}'
NOT_READY = b'{"status":"not ready","reason":"insufficient healthy workers"}'
METRICS = (
    "# TYPE smg_http_requests_total counter\n"
    'smg_http_requests_total{method="GET",path="/readiness"} 1\n'
    "# TYPE smg_worker_health gauge\n"
    'smg_worker_health{worker="http://127.0.0.1:31001"} 1\n'
)


def test_a_local_command_answers_with_stdout_and_adds_stderr_only_when_it_fails():
    ex = LocalExecutor()
    assert ex.run(NODE, "echo 'GPU 0'; echo 'login noise' >&2") == (0, "GPU 0\n")
    code, text = ex.run(NODE, "echo partial; echo 'no such GPU' >&2; exit 3")
    assert code == 3 and text == "partial\nno such GPU\n"


def test_the_router_answers_we_know_are_read():
    assert readiness_count(200, READY) == 2
    assert readiness_count(503, NOT_READY) is None
    assert readiness_count(502, b"<html>bad gateway</html>") is None  # a proxy: wait
    assert metric_families(METRICS) == ["smg_http_requests", "smg_worker_health"]


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (200, b'{"ready": true}', '"ready": true'),
        (200, b'{"healthy_workers": "2"}', '"healthy_workers": "2"'),
        (200, b"OK", "not JSON: b'OK'"),
        (503, b'{"healthy": 0}', '"healthy": 0'),
        (404, b"", "no such endpoint"),
    ],
)
def test_readiness_answers_in_another_shape_are_format_errors(status, body, said):
    with pytest.raises(FormatError, match="/readiness answered HTTP") as caught:
        readiness_count(status, body)
    assert said in str(caught.value)


def test_metrics_named_another_way_or_not_prometheus_are_format_errors():
    with pytest.raises(FormatError, match="it has: sgl_router_requests"):
        metric_families("# TYPE sgl_router_requests_total counter\nsgl_router_requests_total 1\n")
    with pytest.raises(FormatError, match="no metrics at all"):
        metric_families("")
    with pytest.raises(FormatError, match="not Prometheus text"):
        metric_families("{not prometheus\n")


def _fake_package(tmp_path: Path, version: str, name: str = "sglang_router") -> Path:
    """A router package on a PYTHONPATH, installed as pip would leave it (dist-info with its
    release) but with a stale ``__version__``, as smg 1.13.0's says 1.1.0: metadata wins."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "0.0.1"\n')
    dist = {"sglang_router": "sglang_router", "smg": "smg"}[name]
    info = tmp_path / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
    )
    return tmp_path


def test_versions_are_those_the_process_own_interpreter_and_environment_import(tmp_path):
    env = {"PYTHONPATH": str(_fake_package(tmp_path, "7.7.7")), "HF_TOKEN": "hunter2"}
    command = probe_command([sys.executable], ["sglang_router"])
    assert "hunter2" not in command and "PYTHONPATH" not in command  # no value on a command line
    spec = ProcessSpec(
        "router", NODE, ("nice", sys.executable, "-m", "sglang_router.launch_router"), env
    )
    found = software(LocalExecutor(), spec, [sys.executable])
    assert isinstance(found, dict)
    assert found["sglang_router"] == "7.7.7"  # the package's metadata, not its __version__
    assert found["python"] == f"{sys.version_info.major}.{sys.version_info.minor}." + str(
        sys.version_info.micro
    )
    assert interpreter(spec) == ("nice", sys.executable)
    (tmp_path / "other").mkdir()
    smg = _fake_package(tmp_path / "other", "7.7.8", "smg")
    spec = ProcessSpec("router", NODE, (sys.executable, "-m", "smg.launch_router"),
                       {"PYTHONPATH": str(smg)})  # fmt: skip
    assert router_version(LocalExecutor(), spec) == "smg 7.7.8"


def test_versions_are_probed_after_the_process_setup_lines(tmp_path):
    """A venv activated by a setup line decides what the process imports: probe after it."""
    package_dir = _fake_package(tmp_path, "8.8.8", "smg")
    spec = ProcessSpec(
        "router", NODE, (sys.executable, "-m", "smg.launch_router"),
        setup=(f"export PYTHONPATH={package_dir}",),
    )  # fmt: skip
    assert router_version(LocalExecutor(), spec) == "smg 8.8.8"


def test_a_release_its_files_state_is_read_without_importing_the_package(tmp_path):
    """SGLang's ``_version.py`` assigns its release a literal (``__version__ = version =
    '0.5.23'``): read from the package found on the process's path, never imported (importing
    SGLang 0.5.23 takes 5 s of CPU); a package whose ``__version__`` is computed is imported."""
    found_only = tmp_path / "sglang"
    found_only.mkdir()
    (found_only / "__init__.py").write_text("raise SystemExit('imported')\n")
    (found_only / "_version.py").write_text("__version__: str\n__version__ = version = '9.9.9'\n")
    computed = tmp_path / "torch"
    computed.mkdir()
    (computed / "__init__.py").write_text("__version__ = '.'.join(['1', '2', '3'])\n")
    spec = ProcessSpec("server", NODE, (sys.executable, "-m", "sglang.launch_server"),
                       {"PYTHONPATH": str(tmp_path)})  # fmt: skip
    found = software(LocalExecutor(), spec, [sys.executable], packages=("sglang", "torch"))
    assert isinstance(found, dict), found
    assert found["sglang"] == "9.9.9" and found["torch"] == "1.2.3"


def test_a_failed_version_probe_says_why_and_never_raises():
    spec = ProcessSpec("router", NODE, ("/nonexistent/python", "-m", "smg.launch_router"))
    said = router_version(LocalExecutor(), spec)
    assert said.startswith("router version unknown (probe failed, exit 127")


def test_the_package_pins_the_newest_router_read_within_the_supported_range():
    from packaging.version import Version

    from pytest_kimi.config.versions import SMG

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    newest = Version(SMG.newest)
    pin = f"smg>={newest.major}.{newest.minor},<{newest.major + 1}"
    assert json.dumps(pin) in pyproject  # local runs get the release whose settings we read
    assert SMG.supported.endswith(f",<{newest.major + 1}")  # the same upper bound
    assert '"sglang-router' not in pyproject  # its own venv: its `smg` script would clash
