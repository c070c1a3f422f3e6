"""A run on a local SPEED-Bench snapshot directory, chosen by --kimi-dataset: passes, and the
manifest names every file read with its SHA-256, the config, the category and the prompt
construction."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow  # noqa: F401  (a dependency: its absence must fail, not skip)
import pytest

from pytest_kimi.testing.speedbench_snapshot import speedbench_row, write_snapshot
from pytest_kimi.workload.dataset import BUNDLED_DATASET, read_rows

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
SMALL_CLUSTER = (HERE / "small_cluster.yaml").read_text()
PERF_TEST = (HERE.parents[1] / "tests" / "perf" / "test_speedbench.py").read_text()


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """Two configs; throughput_16k holds 16K-word rows of the bundled file, renamed, so the
    mock serves them like the real thing."""
    bundled = read_rows(BUNDLED_DATASET)
    rows = [speedbench_row(f"sb-{p.id}", p.category, p.text) for p in bundled[:24]]
    short = [speedbench_row(f"ql-{i}", "coding", f"write code {i}") for i in range(3)]
    return write_snapshot(tmp_path / "SPEED-Bench", {"qualitative": short, "throughput_16k": rows})


def test_run_on_snapshot_directory_records_files_and_sha256(
    pytester: pytest.Pytester, snapshot: Path, leftovers
) -> None:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml",
        "--layout=deep",
        f"--kimi-dataset={snapshot}",
        "--kimi-speedbench-config=throughput_16k",
        "--kimi-category=mixed",
        "--kimi-prompt=chat_template",
        "--kimi-report-dir=out",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=5)
    [run] = list((pytester.path / "out").iterdir())
    manifest = json.loads((run / "deep" / "manifest.json").read_text())
    dataset = manifest["workload"]["dataset"]
    parquet = snapshot / "throughput_16k" / "test-00000-of-00001.parquet"
    assert dataset["files"] == [
        {
            "path": str(parquet),
            "sha256": hashlib.sha256(parquet.read_bytes()).hexdigest(),
            "split": "test",
        }
    ]
    assert dataset["path"] == str(snapshot)
    assert dataset["speedbench_config"] == "throughput_16k"
    assert dataset["category"] == "mixed" == manifest["workload"]["category"]
    assert dataset["prompt"]["applied"] == "chat_template"
    assert dataset["prompt"]["template_file"].endswith("tokenizer_config.json")
    assert manifest["workload"]["prompt"] == "chat_template"
    assert len(dataset["prompt_ids"]) == 7  # 6 measured + 1 warmup
    assert all(i.startswith("sb-") for i in dataset["prompt_ids"])
    records = [
        json.loads(line) for line in (run / "deep" / "records.jsonl").read_text().splitlines()
    ]
    assert {r["prompt_id"] for r in records} == set(dataset["prompt_ids"])
    assert leftovers(pytester.path) == []


def test_snapshot_without_the_config_is_a_usage_error(
    pytester: pytest.Pytester, snapshot: Path
) -> None:
    pytester.makefile(".yaml", cluster=SMALL_CLUSTER)
    pytester.makepyfile(test_speedbench=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--cluster=cluster.yaml",
        "--layout=deep",
        f"--kimi-dataset={snapshot}",
        "--kimi-speedbench-config=throughput_64k",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*no config 'throughput_64k'*configs: qualitative, throughput_16k*"]
    )
