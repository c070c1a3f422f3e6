"""The plugin end to end on a small mock cluster: options, JUnit, reports, no orphans."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SMALL_CLUSTER = (Path(__file__).parent / "small_cluster.yaml").read_text()

PERF_TEST = (Path(__file__).parents[2] / "tests" / "perf" / "test_speedbench.py").read_text()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    return pytester


def test_full_run_writes_junit_reports_and_leaves_nothing(project: pytest.Pytester, leftovers):
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml",
        "--layout=wide,deep",
        "--kimi-report-dir=out",
        "--junitxml=junit.xml",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=10)
    assert result.stdout.str().count("] bringing up ") == 2  # one deployment per layout
    result.stdout.fnmatch_lines(
        [
            "*pytest-kimi layout comparison*",
            "*deep vs wide*",
            "*TPOT p95*",
            "*report: *comparison.md",
        ]
    )
    cases = ET.parse(project.path / "junit.xml").getroot().iter("testcase")
    by_name = {c.get("name"): c for c in cases}
    assert set(by_name) == {
        name
        for lay in ("wide", "deep")
        for name in (
            f"test_workload[{lay}]",
            f"test_every_request_succeeded[{lay}]",
            f"test_slo[{lay}-ttft_p95]",
            f"test_slo[{lay}-tpot_p95]",
            f"test_slo[{lay}-tpot_mean]",
        )
    }
    props = {
        p.get("name"): p.get("value") for p in by_name["test_slo[deep-ttft_p95]"].iter("property")
    }
    assert props["layout"] == "deep" and props["completed"] == "6"
    assert float(props["ttft_p95"]) > 0 and "tpot_mean" in props  # catalogue names, as in ids
    assert not [name for name in props if name.endswith("_ms")]  # one name per figure

    [run] = list((project.path / "out").iterdir())
    comparison = json.loads((run / "comparison.json").read_text())
    assert [lay["name"] for lay in comparison["layouts"]] == ["wide", "deep"]
    assert comparison["backend"] == "mock" and comparison["time_scale"] == 400
    assert comparison["complete"] is True and comparison["incomplete"] == []
    assert (
        "| metric | wide (TP8/PP1/EP2) | deep (TP2/PP4/EP2) | deep vs wide |"
        in (run / "comparison.md").read_text()
    )
    for layout in ("wide", "deep"):
        folder = run / layout
        lines = (folder / "records.jsonl").read_text().splitlines()
        assert len(lines) == 7  # 6 measured + 1 warmup, one line each
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["completed"] == 6 and summary["complete"] is True
        # a clean run raises no false alarm: not the router's gRPC probe, not our teardown
        assert any(n.startswith("log check: no OOM") for n in summary["notes"]), summary["notes"]
        assert not [n for n in summary["notes"] if n.startswith("router ")], summary["notes"]
        assert not (folder / "records.partial.jsonl").exists()
        manifest = json.loads((folder / "manifest.json").read_text())
        commands = [p["command"] for p in manifest["processes"]]
        assert len(commands) == 5 and "--policy round_robin" in commands[-1]
        assert len(manifest["workload"]["dataset"]["file_sha256"]) == 64
        logs = sorted(p.name for p in (folder / "logs").iterdir())
        assert "router.log" in logs and len(logs) == 5
        assert "ready to roll" in (folder / "logs" / "replica0-node0-n1.log").read_text()
    assert leftovers(project.path) == []


def test_failed_slo_fails_its_test_and_still_reports(project: pytest.Pytester, leftovers):
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml",
        "--layout=deep",
        "--kimi-report-dir=out",
        "--kimi-slo",
        "tpot_mean=1ms",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*SLO tpot_mean <= 1.0 ms VIOLATED: measured*"])
    [run] = list((project.path / "out").iterdir())
    assert "FAIL" in (run / "comparison.md").read_text()
    # the failure is one readable line naming where to look, not an assertion's repr dump
    lines = [x for x in result.stdout.lines if x.startswith("deep: SLO tpot_mean <= 1.0 ms VIOL")]
    failure = [x for x in lines if "; see " in x]  # the rest is the terminal summary's verdict
    assert failure and failure[0].endswith(f"{run.name}/deep"), lines
    assert "Verdict(" not in result.stdout.str() and "where False" not in result.stdout.str()
    assert leftovers(project.path) == []


def test_unknown_layout_is_a_usage_error(project: pytest.Pytester):
    result = project.runpytest_subprocess("--cluster=cluster.yaml", "--layout=wide,tp64")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cluster.yaml*layouts*unknown layout 'tp64'*wide, deep*"])


def test_malformed_cluster_file_is_a_usage_error_naming_line_and_field(
    project: pytest.Pytester,
):
    bad = SMALL_CLUSTER.replace("deep: {tp: 2, pp: 4, ep: 2}", "deep: {tp: 2, pp: 2, ep: 2}")
    project.makefile(".yaml", bad=bad)
    result = project.runpytest_subprocess("--cluster=bad.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.yaml:11: field 'layouts.deep.tp': TP x PP = 2 x 2 = 4*"])


def test_bad_slo_override_is_a_usage_error(project: pytest.Pytester):
    result = project.runpytest_subprocess("--cluster=cluster.yaml", "--kimi-slo", "ttft_p95=fast")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kimi-slo*ttft_p95*expected a duration*"])


def test_dry_run_prints_commands_and_starts_nothing(project: pytest.Pytester):
    result = project.runpytest_subprocess("--cluster=cluster.yaml", "--kimi-dry-run")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "# layout wide (TP8/PP1/EP2) on small",
            "*pytest_kimi.mock.launch_server*--tp-size 8 --pp-size 1*--node-rank 0*",
            "*smg.launch_router --worker-urls*--policy round_robin*",
        ]
    )
    assert not (project.path / "reports").exists()


def test_help_documents_every_option(pytester: pytest.Pytester):
    result = pytester.runpytest_subprocess("--help")
    for option in (
        "--layout",
        "--cluster",
        "--kimi-report-dir",
        "--kimi-slo",
        "--kimi-endpoint",
        "--kimi-dry-run",
        "--kimi-save-baseline",
        "--kimi-baseline",
        "--kimi-fail",
        "--kimi-dataset",
        "--kimi-speedbench-config",
        "--kimi-category",
        "--kimi-prompt",
        "--kimi-tokenizer",
        "--kimi-confidence",
        "--kimi-undecided",
        "--kimi-until-decided",
    ):
        result.stdout.fnmatch_lines([f"*{option}*"])


def test_attach_to_running_endpoint_runs_without_bring_up(project: pytest.Pytester, mock_server):
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml",
        "--layout=wide",
        f"--kimi-endpoint={mock_server}",
        "--kimi-report-dir=out",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=5)
    [run] = list((project.path / "out").iterdir())
    manifest = json.loads((run / "wide" / "manifest.json").read_text())
    assert manifest["endpoint"] == mock_server and "processes" not in manifest
    assert json.loads((run / "comparison.json").read_text())["backend"] == "attached"


def test_a_dead_endpoint_is_one_line_and_a_usage_error(project: pytest.Pytester):
    from pytest_kimi.deploy.ports import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide", f"--kimi-endpoint={dead}",
        "--kimi-report-dir=out", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [x for x in result.stderr.lines if dead in x]
    assert "does not answer: ConnectError" in line
    assert not (project.path / "out").exists()  # nothing was "measured"


def test_a_failing_warm_up_stops_the_run_before_measuring(project: pytest.Pytester, mock_server):
    import httpx

    httpx.post(f"{mock_server}/kimi/faults", json={"error_rate": 1.0}, trust_env=False)
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide", f"--kimi-endpoint={mock_server}",
        "--kimi-report-dir=out", "-p", "no:cacheprovider",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*warm-up request failed before measuring (1 of 1): HTTP 500*"])
    [run] = list((project.path / "out").iterdir())
    summary = json.loads((run / "wide" / "summary.json").read_text())
    assert summary["complete"] is False and "warm-up request failed" in summary["error"]
    records = (run / "wide" / "records.jsonl").read_text().splitlines()
    assert [json.loads(x)["warmup"] for x in records] == [True]  # no measured request was sent


def test_ini_keys_set_defaults(project: pytest.Pytester):
    project.makeini("[pytest]\nkimi_cluster = cluster.yaml\nkimi_layout = deep\n")
    result = project.runpytest_subprocess("--kimi-dry-run")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["# layout deep (TP2/PP4/EP2) on small"])
    result.stdout.no_fnmatch_line("# layout wide*")


def test_dry_run_prints_the_seed_cluster_commands_without_contacting_it(pytester):
    root = Path(__file__).parents[2]
    result = pytester.runpytest_subprocess(
        f"--cluster={root / 'clusters' / 'pro6000.yaml'}", "--layout=pp8", "--kimi-dry-run"
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "# layout pp8 (TP4/PP8/EP4) on pro6000",
            "# command lines for SGLang 0.5.23 (the newest profile); router smg "
            "(router.package: auto, smg assumed)",
            "# replica1-node3-node608 on node608 (ssh node608, addr 10.0.0.8)",
            "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 SGLANG_HOST_IP=10.0.0.8 "
            "NCCL_IB_DISABLE=0 NCCL_DEBUG=WARN /opt/sglang/venv/bin/python -m sglang.launch_server "
            "--model-path /models/Kimi-K3 --tp-size 4 --pp-size 8 --ep-size 4 --nnodes 4 "
            "--node-rank 3 --dist-init-addr 10.0.0.5:5757 --host 10.0.0.8 --port 30001 "
            "--trust-remote-code --chunked-prefill-size 8192 --disable-radix-cache "
            "--kv-cache-dtype bf16 --moe-runner-backend flashinfer_mxfp4 --moe-a2a-backend none "
            "--enable-metrics",
            "# router on node601 (ssh node601, addr 10.0.0.1)",
            "/opt/sglang/venv/bin/python -m smg.launch_router --worker-urls "
            "http://10.0.0.1:30001 http://10.0.0.5:30001 --policy round_robin --host 10.0.0.1 "
            "--port 30000 --prometheus-host 10.0.0.1 --prometheus-port 29000 --disable-retries "
            "--disable-circuit-breaker --health-check-timeout-secs 60 "
            "--health-failure-threshold 10 --max-concurrent-requests 0 "
            "--worker-startup-check-interval 1 --shutdown-grace-period-secs 5 "
            "--disable-worker-overload-protection --worker-wedge-secs 0 "
            "--worker-stall-secs 86400 --pd-admission-wait-secs 1800 --worker-stale-secs 0 "
            "--idle-connection-timeout-secs 0 --sse-keepalive-secs 0",
        ]
    )


def test_dry_run_shows_each_layouts_own_flags_and_only_its_own(pytester):
    root = Path(__file__).parents[2]
    result = pytester.runpytest_subprocess(
        f"--cluster={root / 'clusters' / 'local.yaml'}", "--layout=tp32,tp32-cp4k",
        "--kimi-dry-run",
    )  # fmt: skip
    assert result.ret == 0
    text = result.stdout.str()
    sections = {
        block.split(" ", 1)[0]: block for block in text.split("# layout ")[1:]
    }  # layout name -> its commands
    servers = {name: [line for line in block.splitlines() if "launch_server" in line]
               for name, block in sections.items()}  # fmt: skip
    assert len(servers["tp32"]) == len(servers["tp32-cp4k"]) == 8
    assert all("--chunked-prefill-size 4096" in line for line in servers["tp32-cp4k"])
    assert not any("--chunked-prefill-size 8192" in line for line in servers["tp32-cp4k"])
    assert all("--chunked-prefill-size 8192" in line for line in servers["tp32"])
    assert not any("--chunked-prefill-size 4096" in line for line in servers["tp32"])


def test_layout_slos_cli_layout_overrides_and_marker_make_their_own_items(
    project: pytest.Pytester,
):
    cluster = SMALL_CLUSTER.replace(
        "deep: {tp: 2, pp: 4, ep: 2}", "deep: {tp: 2, pp: 4, ep: 2, slo: {e2e_p99: 10min}}"
    )
    project.makefile(".yaml", cluster=cluster)
    project.makepyfile(
        test_marked="""
import pytest
from pytest_kimi.results.slo import evaluate

@pytest.mark.slo(ttft_mean="1ms")
def test_strict(speedbench, kimi_slos, kimi_slo_name):
    assert evaluate(kimi_slos[kimi_slo_name], speedbench.summary).passed
"""
    )
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--kimi-report-dir=out", "--kimi-slo", "wide:tpot_p95=1ms",
        "-p", "no:cacheprovider", "-v", "test_marked.py",
    )  # fmt: skip
    for line in (
        "*test_strict?wide-tpot_p95? FAILED*",  # layout-scoped CLI override
        "*test_strict?wide-ttft_mean? FAILED*",  # the marker's SLO, on every layout
        "*test_strict?deep-ttft_mean? FAILED*",
        "*test_strict?deep-e2e_p99? PASSED*",  # deep's own SLO from the YAML
        "*test_strict?deep-tpot_p95? PASSED*",
    ):
        result.stdout.fnmatch_lines([line])
    result.stdout.no_fnmatch_line("*test_strict?wide-e2e_p99*")


def test_layout_scoped_override_for_an_unknown_layout_is_a_usage_error(project: pytest.Pytester):
    result = project.runpytest_subprocess("--cluster=cluster.yaml", "--kimi-slo", "tp9:ttft_p95=1s")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown layout 'tp9'*"])


def test_baseline_gate_passes_against_itself_and_fails_on_a_forced_regression(
    project: pytest.Pytester,
):
    # 12 x 32 tokens: the bootstrap has samples to work with. The mock's one clock keeps the
    # client's and the OS's wall time out of cluster time (docs/mock.md, "One clock"), so a
    # rerun of the same command gives the same figures and lands inside the default
    # thresholds (ttft_p95 10 %, tpot_mean 5 %, output_throughput 5 %) at any time scale
    steady = SMALL_CLUSTER.replace("num_requests: 6", "num_requests: 12").replace(
        "output_len: 8", "output_len: 32"
    )
    project.makefile(".yaml", cluster=steady)
    common = ["--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out",
              "-p", "no:cacheprovider", "-v"]  # fmt: skip
    saved = project.runpytest_subprocess(*common, "--kimi-save-baseline=base.json")
    saved.assert_outcomes(passed=5)  # no gate items without --kimi-baseline
    assert json.loads((project.path / "base.json").read_text())["layouts"]["deep"]["samples"]

    same = project.runpytest_subprocess(*common, "--kimi-baseline=base.json")
    same.assert_outcomes(passed=8)  # 5 + ttft_p95, tpot_mean, output_throughput
    same.stdout.fnmatch_lines(["*test_no_regression?deep-tpot_mean? PASSED*"])

    slower = steady.replace(
        "mock: {time_scale: 400, seed: 3}",
        "mock: {time_scale: 400, seed: 3, profile: {step_overhead_ms: 40}}",
    )  # every step of the model 30 ms slower: a real TPOT regression
    project.makefile(".yaml", cluster=slower)
    # at a confidence: the change's bounds, each one-sided at 95%, all over the threshold
    regressed = project.runpytest_subprocess(*common, "--kimi-baseline=base.json",
                                             "--kimi-fail=tpot_mean:5%", "--kimi-confidence=0.95",
                                             "--junitxml=gate.xml")  # fmt: skip
    regressed.stdout.fnmatch_lines(["*test_no_regression?deep-tpot_mean? FAILED*"])
    regressed.stdout.fnmatch_lines(["*REGRESSION: deep tpot_mean*worse; threshold 5%, 95% "
                                    "bounds of the change [[]+*"])  # fmt: skip
    assert regressed.ret == pytest.ExitCode.TESTS_FAILED
    [case] = [c for c in ET.parse(project.path / "gate.xml").iter("testcase")
              if c.get("name") == "test_no_regression[deep-tpot_mean]"]  # fmt: skip
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["gate_outcome"] == "failed" and props["gate_confidence"] == "0.95"
    assert float(props["gate_lower"]) > 0.05  # the whole interval over the 5% threshold

    # a baseline timed from the send (as before workload.clock_start) is not compared with a
    # run timed from the request: the gate says so instead of judging unlike numbers
    base = json.loads((project.path / "base.json").read_text())
    assert base["clock_start"] == "request"
    del base["clock_start"]
    (project.path / "base.json").write_text(json.dumps(base))
    project.makefile(".yaml", cluster=steady)
    unlike = project.runpytest_subprocess(*common, "--kimi-baseline=base.json")
    unlike.stdout.fnmatch_lines(["*latencies were timed from the send, this run's from the "
                                 "request (workload.clock_start*"])  # fmt: skip
    assert unlike.ret == pytest.ExitCode.TESTS_FAILED


def test_a_sweep_is_gated_per_point_and_only_against_the_same_workload(
    project: pytest.Pytester,
):
    common = ["--cluster=cluster.yaml", "--layout=deep", "--kimi-concurrency", "1,2",
              "--kimi-report-dir=out", "-p", "no:cacheprovider", "-v"]  # fmt: skip
    saved = project.runpytest_subprocess(*common, "--kimi-save-baseline=base.json")
    saved.assert_outcomes(passed=10)
    kept = json.loads((project.path / "base.json").read_text())["layouts"]
    assert sorted(kept) == ["deep-c1", "deep-c2"]
    assert kept["deep-c2"]["workload"]["concurrency"] == 2
    assert kept["deep-c2"]["workload"]["output_len"] == 8
    # the same points with longer outputs: another experiment, not a regression to judge
    longer = project.runpytest_subprocess(*common, "--kimi-output-len", "16",
                                          "--kimi-baseline=base.json")  # fmt: skip
    longer.stdout.fnmatch_lines([
        "*test_no_regression?deep-c2-tpot_mean? FAILED*",
        "*the baseline's deep-c1 ran another workload (output_len 8 -> 16)*",
    ])  # fmt: skip
    assert longer.ret == pytest.ExitCode.TESTS_FAILED


def test_unreadable_baseline_is_a_usage_error(project: pytest.Pytester):
    result = project.runpytest_subprocess("--cluster=cluster.yaml", "--kimi-baseline=nope.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*nope.json: cannot read baseline*"])


CLI = "import sys; from pytest_benchmark.cli import main; sys.exit(main())"


def test_pytest_benchmark_records_each_layout_run(project: pytest.Pytester):
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide,deep", "--kimi-report-dir=out",
        "--benchmark-autosave", f"--benchmark-storage=file://{project.path / 'bench'}",
        "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    [saved] = list((project.path / "bench").rglob("*.json"))
    benchmarks = {b["name"]: b for b in json.loads(saved.read_text())["benchmarks"]}
    assert set(benchmarks) == {"test_workload[wide]", "test_workload[deep]"}
    extra = benchmarks["test_workload[deep]"]["extra_info"]
    assert extra["layout"] == "deep" and extra["completed"] == 6 and extra["ttft_p95"] > 0
    assert benchmarks["test_workload[deep]"]["stats"]["rounds"] == 1
    import subprocess
    import sys

    listed = subprocess.run(  # the `pytest-benchmark list` console command, from this venv
        [sys.executable, "-c", CLI, "--storage", f"file://{project.path / 'bench'}", "list"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert saved.stem in listed.stdout


def test_xdist_runs_layouts_in_parallel_and_writes_one_comparison(
    project: pytest.Pytester, leftovers
):
    with_goodput = SMALL_CLUSTER.replace(
        "  warmup_requests: 1\n", "  warmup_requests: 1\n  goodput: {ttft: 60s, tpot: 1s}\n"
    )
    project.makefile(".yaml", cluster=with_goodput)
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=wide,deep", "--kimi-report-dir=out",
        "-n", "2", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    [run] = list((project.path / "out").iterdir())  # one run folder, shared by both workers
    comparison = json.loads((run / "comparison.json").read_text())
    assert [lay["name"] for lay in comparison["layouts"]] == ["wide", "deep"]
    assert all(lay["summary"]["completed"] == 6 for lay in comparison["layouts"])
    assert (run / "report.html").exists() and (run / "comparison.md").exists()
    result.stdout.fnmatch_lines(["*pytest-kimi layout comparison*", "*deep vs wide*"])
    assert leftovers(project.path) == []

    # the controller's goodput row is what each worker measured, not n/a
    [goodput] = [row for row in comparison["rows"] if row["metric"] == "goodput"]
    for name in ("wide", "deep"):
        measured = json.loads((run / name / "summary.json").read_text())["goodput"]
        assert measured is not None and goodput["values"][name] == measured

    # re-rendering the saved folders reproduces every figure, byte for byte
    from pytest_kimi.report.__main__ import main

    assert main([str(run / "wide"), str(run / "deep"), "--out", str(project.path / "again")]) == 0
    again = json.loads((project.path / "again" / "comparison.json").read_text())
    assert json.dumps(again["rows"]) == json.dumps(comparison["rows"])
    for mine, theirs in zip(again["layouts"], comparison["layouts"], strict=True):
        for key in ("summary", "slo", "notes", "error"):
            assert json.dumps(mine[key]) == json.dumps(theirs[key]), key


def test_at_a_confidence_an_undecided_slo_fails_by_default_or_is_what_the_user_chose(
    project: pytest.Pytester,
):
    """Six requests bound no p95 from above at 95% (that takes 59): the p95 SLOs are
    undecided however far their limits; the mean's t bounds decide tpot_mean."""
    project.makeini("[pytest]\nkimi_confidence = 0.95\n")
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out", "-p",
        "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*SLO ttft_p95 <= 600.00 s UNDECIDED*needs 59*"])
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out2",
        "--kimi-undecided=xfail", "--junitxml=junit.xml", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=3, xfailed=2)
    cases = {
        c.get("name"): c for c in ET.parse(project.path / "junit.xml").getroot().iter("testcase")
    }
    props = {
        p.get("name"): p.get("value") for p in cases["test_slo[deep-ttft_p95]"].iter("property")
    }
    assert (props["slo_outcome"], props["slo_upper"], props["slo_confidence"]) == (
        "undecided", "none", "0.95")  # fmt: skip
    assert props["slo_requests_needed"] == "59"
    mean = {
        p.get("name"): p.get("value") for p in cases["test_slo[deep-tpot_mean]"].iter("property")
    }
    assert mean["slo_outcome"] == "passed" and float(mean["slo_upper"]) < 10_000
    [run] = list((project.path / "out2").iterdir())
    saved = json.loads((run / "comparison.json").read_text())
    slos = {s["name"]: s for s in saved["layouts"][0]["slo"]}
    assert slos["ttft_p95"]["outcome"] == "undecided" and slos["ttft_p95"]["requests_needed"] == 59
    assert slos["tpot_mean"]["interval"]["method"] == "t"
    assert "UNDECIDED" in (run / "comparison.md").read_text()
    assert 'class="undecided"' in (run / "report.html").read_text()


def test_until_decided_sends_batches_on_the_same_deployment_until_the_slos_are_decided(
    project: pytest.Pytester, leftovers
):
    """Six planned requests cannot pass a p95 at 95% (that takes 59): batches of nine more
    follow on the same deployment until the p95 SLOs' bounds clear their far limits; the mean
    is decided at once. Each record says its batch; the note says how many requests it took."""
    result = project.runpytest_subprocess(
        "--cluster=cluster.yaml", "--layout=deep", "--kimi-report-dir=out", "-p",
        "no:cacheprovider", "--kimi-confidence=0.95", "--kimi-until-decided=100",
    )  # fmt: skip
    result.assert_outcomes(passed=5)
    assert result.stdout.str().count("] bringing up ") == 1
    [run] = list((project.path / "out").iterdir())
    summary = json.loads((run / "deep" / "summary.json").read_text())
    [note] = [n for n in summary["notes"] if n.startswith("until decided:")]
    records = [json.loads(x) for x in (run / "deep" / "records.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert f"every SLO decided after {len(measured)} requests" in note
    batches = sorted({r["batch"] for r in measured})
    assert batches == list(range(len(batches))) and len(measured) == 6 + 9 * batches[-1] >= 59
    assert summary["completed"] == len(measured)
    assert {s["outcome"] for s in summary["slo"]} == {"passed"}
    assert leftovers(project.path) == []
