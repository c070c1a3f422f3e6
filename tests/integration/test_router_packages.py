"""The mission's command behind each router generation: smg (the project's own, the default)
and sglang-router 0.3.2 (``router.package: sglang-router``, from its own venv: beside smg its
``smg`` script would shadow smg's).

``pytest tests/perf --layout=tp32,pp8`` on the mock passes behind each, and each run's
manifest names the router package and its true release, as the router's own interpreter has
it (package metadata, read here again); the launch line is that package's, with its
benchmarking settings; round robin holds (the servers' own counters split every layout's
requests evenly). Behind smg the shipped mission is run once for the suite, by
tests/integration/test_twin_live.py, which holds it to :func:`assert_routed_by` too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.testing.processes import pytest_argv
from pytest_kimi.testing.realsglang import ROOT, installed_release, router_python, run_child

pytestmark = pytest.mark.slow

LOCAL = ROOT / "clusters" / "local.yaml"



def test_the_mission_passes_behind_sglang_router_and_names_it(tmp_path: Path) -> None:
    package = "sglang-router"
    python = router_python(package, "0.3.2")
    text = LOCAL.read_text(encoding="utf-8")
    old = "router:\n  python: current\n  package: auto"
    assert old in text
    text = text.replace(old, f"router:\n  python: {python}\n  package: {package}")
    cluster = tmp_path / "local.yaml"
    cluster.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    argv = pytest_argv("tests/perf", f"--cluster={cluster}", "--layout=tp32,pp8",
                       f"--kimi-report-dir={out}", "-p", "no:cacheprovider")  # fmt: skip
    done = run_child(argv, cwd=ROOT, timeout_s=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    [run] = list(out.iterdir())
    assert_routed_by(run, ("tp32", "pp8"), python, package)


def assert_routed_by(run: Path, layouts: tuple[str, ...], python: Path, package: str) -> None:
    """Each layout of ``run`` names ``package`` and the release ``python`` has of it, launched
    it with its own benchmarking settings, and split the 40 requests evenly by round robin."""
    version = installed_release(python, package)
    module = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router"}[package]
    for layout in layouts:
        manifest = json.loads((run / layout / "manifest.json").read_text())
        versions = manifest["versions"]
        assert (versions["router_package"], versions["router_version"]) == (package, version)
        [command] = [p["command"] for p in manifest["processes"] if p["role"] == "router"]
        assert f"{python} -m {module} " in command  # the interpreter that has the package
        assert "--disable-retries" in command
        assert ("--disable-worker-overload-protection" in command) is (package == "smg")
        summary = json.loads((run / layout / "summary.json").read_text())
        split = [c["requests"] for c in summary["replica_counters"].values()]
        assert split == [20, 20], split  # round robin, by the servers' own counters
    assert f"router (router node) {package} {version}" in (run / "comparison.md").read_text()
