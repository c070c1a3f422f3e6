"""The parts of each wire recording read from the release itself are still what it says.

``server_flags`` (what the mock takes and refuses) is the release's own parser's list, asked
again now; ``declared`` (the scheduler's families a unified server never shows: the
KV-transfer histograms of a disaggregated prefill) is its collector's source, read again now.
A recording edited by hand, or a release reinstalled differently, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from types import ModuleType

import pytest

from pytest_kimi.mock.wire import wire_file
from pytest_kimi.testing.realsglang import ROOT, VERSIONS, install, offline_env

pytestmark = pytest.mark.slow


def _capture_script() -> ModuleType:  # the script, loaded as a module
    spec = importlib.util.spec_from_file_location("capture", ROOT / "scripts" /
                                                  "capture_sglang_wire.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version", VERSIONS)
def test_the_recorded_flags_are_the_releases_parsers(version: str) -> None:
    python = install(version)
    done = subprocess.run(
        [str(python), str(ROOT / "scripts" / "real_sglang" / "parse_args.py"), "server",
         "--flags"], capture_output=True, text=True, timeout=300, env=offline_env(), check=True,
    )  # fmt: skip
    recorded = json.loads(wire_file(version).read_text(encoding="utf-8"))["server_flags"]
    assert recorded == json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", VERSIONS)
def test_the_declared_families_are_the_releases_collector(version: str) -> None:
    install(version)
    data = json.loads(wire_file(version).read_text(encoding="utf-8"))
    assert data["declared"] == _capture_script().declared_families(version, data["metrics"])
    names = {f["name"] for f in data["declared"]}
    if version != "0.5.9":  # histograms from 0.5.10: only seen once a transfer is observed
        assert {"sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_latency_ms",
                "sglang:kv_transfer_total_mb"} <= names  # fmt: skip
