"""The mission's command on real SGLang: ``pytest tests/perf --cluster clusters/cpu-sglang.yaml
--layout=tp1,tp2``, every API, for each version.

pytest-kimi brings up two real replicas per layout (TP1 on one node; TP2 spanning two nodes,
``--nnodes 2``) behind the real router, measures, compares and tears down. Each check takes its
truth from outside the product: the servers' own counters, the records' token counts against
the servers' usage, the kernel's process table, the servers' logs.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from pytest_kimi.testing.processes import pytest_argv
from pytest_kimi.testing.realsglang import (
    ROOT,
    assert_no_standin_calls,
    installed_release,
    pids_with_env,
    run_child,
    venv_dir,
)

pytestmark = pytest.mark.slow

LAYOUTS = ("tp1", "tp2")
APIS = ("generate", "completions", "chat")
REQUESTS, OUTPUT_LEN = 16, 32  # clusters/cpu-sglang.yaml's workload
RUN_MARK = "KIMI_TEST_RUN"


@pytest.fixture(scope="module")
def mission(sglang_version: str, sglang_python: Path, router, tmp_path_factory) -> dict:
    """One run of the mission's command on this version, behind its router (router.package:
    auto finds it in the interpreter given): its exit code, output, run folder, and what the
    kernel still lists of it afterwards."""
    out = tmp_path_factory.mktemp(f"mission-{sglang_version}")
    mark = uuid.uuid4().hex
    env = {**os.environ, "KIMI_SGLANG_VENV": str(venv_dir(sglang_version)), RUN_MARK: mark,
           "KIMI_ROUTER_PYTHON": str(router.python)}  # fmt: skip
    argv = pytest_argv(
        "tests/perf", "--cluster", "clusters/cpu-sglang.yaml", f"--layout={','.join(LAYOUTS)}",
        f"--kimi-api={','.join(APIS)}", f"--kimi-report-dir={out}", "-p", "no:cacheprovider",
        f"--junitxml={out / 'junit.xml'}",
    )  # fmt: skip
    done = run_child(argv, cwd=ROOT, env=env, timeout_s=1800)
    [run] = [p for p in out.iterdir() if p.is_dir()]
    return {"done": done, "run": run, "left": pids_with_env(RUN_MARK, mark)}


def _records(run: Path, layout: str, api: str) -> list[dict]:
    lines = (run / layout / api / "records.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if not r["warmup"]]


def test_the_mission_passes_and_writes_the_comparison(mission: dict) -> None:
    done = mission["done"]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    run = mission["run"]
    comparison = json.loads((run / "comparison.json").read_text())
    assert comparison["complete"] is True, comparison["incomplete"]
    assert list(comparison["setup"]["layouts"]) == list(LAYOUTS)
    for point in comparison["points"]:  # one table per API, each with both layouts
        assert [layout["name"] for layout in point["layouts"]] == list(LAYOUTS), point["id"]
    assert (run / "comparison.md").is_file() and (run / "report.html").is_file()
    assert "tp2 vs tp1" in (run / "comparison.md").read_text()


def test_each_manifest_names_the_version_the_servers_state(
    mission: dict, sglang_version: str, router
) -> None:
    for layout in LAYOUTS:
        manifest = json.loads((mission["run"] / layout / "manifest.json").read_text())
        stated = {n["node"]: n.get("sglang_server_version") for n in manifest["nodes"]
                  if "sglang_server_version" in n}  # fmt: skip
        assert len(stated) == 2 and set(stated.values()) == {sglang_version}, stated
        installed = {n["software"]["sglang"] for n in manifest["nodes"]}
        assert installed == {sglang_version}
        # the releases bring-up asked the nodes for, and built the command lines for
        versions = manifest["versions"]
        assert (versions["sglang"], versions["sglang_source"]) == (sglang_version,
                                                                   "asked of the nodes")
        assert versions["router_package"] == router.package.name
        assert versions["router_version"] == installed_release(router.python, router.package.name)
        [command] = [p["command"] for p in manifest["processes"] if p["role"] == "router"]
        assert f" -m {router.package.module} " in command
    md = (mission["run"] / "comparison.md").read_text()
    assert f"sglang (servers) {sglang_version}" in md
    version = installed_release(router.python, router.package.name)
    assert f"router (router node) {router.package.name} {version}" in md


def test_the_replica_split_sums_to_the_requests(mission: dict) -> None:
    # the servers' own /metrics counters, read before and after each measured run
    for layout in LAYOUTS:
        for api in APIS:
            summary = json.loads((mission["run"] / layout / api / "summary.json").read_text())
            split = {name: c["requests"] for name, c in summary["replica_counters"].items()}
            assert sorted(split) == ["replica0", "replica1"], split
            assert sum(split.values()) == summary["completed"] == REQUESTS, (layout, api, split)
            assert min(split.values()) > 0, split  # round robin: both served


def _itl_checked(records: list[dict], where: tuple) -> int:
    """Every token in exactly one chunk; ITL samples are the tokens after the first chunk
    (whose delay is TTFT). The first chunk holds one token unless the model's first token
    decoded to no text (a special token: random weights emit them), which then arrives with
    the next. Returns how many first chunks held more than one."""
    later_first = 0
    for r in records:
        tokens = [c["tokens"] for c in r["chunks"]]
        at = (*where, r["prompt_id"], tokens)
        assert r["success"] and r["completion_tokens"] == OUTPUT_LEN, at
        assert sum(tokens) == r["completion_tokens"], at
        assert sum(max(t, 1) for t in tokens[1:]) == r["completion_tokens"] - tokens[0], at
        later_first += tokens[0] > 1
    return later_first


def test_generate_places_every_token_and_each_gap_is_an_itl_sample(mission: dict) -> None:
    # /generate counts tokens in every chunk (meta_info), whatever the router does
    for layout in LAYOUTS:
        _itl_checked(_records(mission["run"], layout, "generate"), (layout, "generate"))


def test_openai_streams_without_counts_per_chunk_say_how_many_tokens_were_not_placed(
    mission: dict, router
) -> None:
    # sglang-router 0.3.2 drops stream_options.continuous_usage_stats on the way to the
    # servers, so behind it a chunk's token count is unknown; the summary must say how many
    # tokens could not be placed: exactly the records' shortfall. smg passes it on: behind it
    # every token is placed, as /generate's are (tests/realsglang/test_attach shows both)
    for layout in LAYOUTS:
        for api in ("completions", "chat"):
            records = _records(mission["run"], layout, api)
            missing = sum(r["completion_tokens"] - sum(c["tokens"] for c in r["chunks"])
                          for r in records)  # fmt: skip
            summary = json.loads((mission["run"] / layout / api / "summary.json").read_text())
            notes = [n for n in summary["notes"] if n.startswith("ITL: ")]
            if router.package.name == "smg":
                assert missing == 0, (layout, api)
                _itl_checked(records, (layout, api))
            if missing:
                assert notes and notes[0].startswith(f"ITL: {missing} of {16 * OUTPUT_LEN} "), (
                    layout, api, notes)  # fmt: skip
            else:
                assert notes == [], (layout, api, notes)


def test_nothing_is_left_running_and_no_stand_in_was_called(mission: dict) -> None:
    assert mission["left"] == [], f"still running after the run: {mission['left']}"
    logs = list(mission["run"].glob("*/logs/*.log"))
    assert len(logs) == (2 + 1) + (4 + 1), logs  # every server's and each router's, to check
    assert_no_standin_calls(logs)
