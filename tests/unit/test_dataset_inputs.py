"""Where a run's data comes from: YAML workload fields, the command line over them, the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow  # noqa: F401  (a dependency: its absence must fail, not skip)
import pytest

from pytest_kimi.config import ConfigError, load_cluster
from pytest_kimi.config.inputs import UsageProblem, load_inputs
from pytest_kimi.config.options import Options
from pytest_kimi.config.pointdata import tokenizer_dir
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR
from pytest_kimi.run.manifest import manifest
from pytest_kimi.testing.speedbench_snapshot import speedbench_row, write_snapshot

CLUSTER = """\
name: t
nodes:
  - {{name: n1, host: 127.0.0.1, gpus: 8}}
deployment: {{replicas: 1, nodes_per_replica: 1}}
layouts:
  tp8: {{tp: 8}}
server:
  model_path: builtin:mock-tokenizer
router: {{}}
workload:
  dataset: {dataset}
  num_requests: 2
  input_len: 16
  output_len: 8
  concurrency: 1
  warmup_requests: 0
{extra}"""


def cluster_file(tmp_path: Path, dataset: str = "snap", extra: str = "") -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER.format(dataset=dataset, extra=extra))
    return path


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    def rows(prefix: str) -> list[dict]:
        cats = ("low_entropy", "mixed")
        return [speedbench_row(f"{prefix}{i}", cats[i % 2], f"{prefix} {i}") for i in range(6)]

    return write_snapshot(
        tmp_path / "snap", {"throughput_16k": rows("t"), "throughput_1k": rows("k")}
    )


def options(path: Path, **kw: object) -> Options:
    return Options(path, (), path.parent / "reports", **kw)  # type: ignore[arg-type]


def test_yaml_fields_default_and_load(tmp_path: Path) -> None:
    wl = load_cluster(cluster_file(tmp_path)).workload
    assert (wl.speedbench_config, wl.prompt) == ("throughput_16k", "raw")
    extra = "  speedbench_config: throughput_1k\n  prompt: chat_template\n"
    wl = load_cluster(cluster_file(tmp_path, extra=extra)).workload
    assert (wl.speedbench_config, wl.prompt) == ("throughput_1k", "chat_template")


def test_bad_prompt_mode_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_cluster(cluster_file(tmp_path, extra="  prompt: templated\n"))
    msg = str(exc.value)
    assert "workload.prompt" in msg and "raw, chat_template, chat_template_or_raw" in msg


def test_yaml_snapshot_config_and_category(tmp_path: Path, snapshot: Path) -> None:
    extra = "  speedbench_config: throughput_1k\n  category: mixed\n"
    inputs = load_inputs(options(cluster_file(tmp_path, extra=extra)))
    assert inputs.workload is not None
    assert inputs.workload.config == "throughput_1k"
    assert {p.id[0] for p in inputs.workload.prompts} == {"k"}
    assert {p.category for p in inputs.workload.prompts} == {"mixed"}


def test_command_line_overrides_yaml(tmp_path: Path, snapshot: Path) -> None:
    other = tmp_path / "elsewhere"
    write_snapshot(other, {"throughput_16k": [speedbench_row(f"o{i}", "x", "o") for i in range(3)]})
    opts = options(
        cluster_file(tmp_path, dataset="missing.jsonl", extra="  category: mixed\n"),
        dataset=str(other),
        category="x",
        prompt="chat_template",
    )
    inputs = load_inputs(opts)
    assert inputs.workload is not None and inputs.workload.path == other
    assert {p.id[0] for p in inputs.workload.prompts} == {"o"}
    data = manifest(inputs, inputs.layouts[0], "run", None)
    assert data["workload"]["category"] == "x" == data["workload"]["dataset"]["category"]
    assert data["workload"]["prompt"] == "chat_template"
    assert data["workload"]["speedbench_config"] == "throughput_16k"
    assert data["workload"]["dataset"]["prompt"]["tokenizer_dir"] == str(TOKENIZER_DIR)
    json.dumps(data)  # the manifest stays JSON


def test_dataset_problems_are_usage_errors(tmp_path: Path, snapshot: Path) -> None:
    with pytest.raises(UsageProblem, match=r"no config 'throughput_8k'.*throughput_16k"):
        load_inputs(options(cluster_file(tmp_path), speedbench_config="throughput_8k"))
    with pytest.raises(UsageProblem, match=r"categories present: low_entropy \(3\), mixed \(3\)"):
        load_inputs(options(cluster_file(tmp_path), category="coding"))
    with pytest.raises(UsageProblem, match=r"tokenizer directory not found.*--kimi-tokenizer"):
        load_inputs(
            options(cluster_file(tmp_path), prompt="chat_template", tokenizer=str(tmp_path / "t"))
        )


def test_tokenizer_dir_resolution(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    cluster = load_cluster(path)
    assert tokenizer_dir(options(path), cluster) == TOKENIZER_DIR
    assert tokenizer_dir(options(path, tokenizer="/x/tok"), cluster) == Path("/x/tok")
    text = path.read_text().replace(
        "model_path: builtin:mock-tokenizer",
        "model_path: /models/m\n  args: {tokenizer-path: /models/tok}",
    )
    path.write_text(text)
    assert tokenizer_dir(options(path), load_cluster(path)) == Path("/models/tok")


# ----------------------------------------------------------------------------- workload points


def test_input_len_points_read_the_throughput_config_of_their_length(
    tmp_path: Path, snapshot: Path
) -> None:
    inputs = load_inputs(options(cluster_file(tmp_path), input_len="1024,16384"))
    assert [p.id for p in inputs.points] == ["in1k", "in16k"]
    short, long = inputs.prompts["in1k"], inputs.prompts["in16k"]
    assert (short.config, long.config) == ("throughput_1k", "throughput_16k")
    assert {p.id[0] for p in short.prompts} == {"k"} and {p.id[0] for p in long.prompts} == {"t"}
    assert inputs.workload_of(inputs.points[0]).input_len == 1024
    written = manifest(inputs, inputs.layouts[0], "run-1", None)["points"]
    assert [(p["id"], p["speedbench_config"]) for p in written] == [
        ("in1k", "throughput_1k"),
        ("in16k", "throughput_16k"),
    ]
    assert written[0]["dataset"]["prompt_ids"] == [p.id for p in short.prompts]


def test_a_length_no_throughput_config_holds_is_a_usage_error(
    tmp_path: Path, snapshot: Path
) -> None:
    with pytest.raises(UsageProblem, match=r"--kimi-input-len: 1000 tokens: SPEED-Bench's "
                       r"throughput configs hold prompts of 1024, 2048, 8192, 16384, 32768"):
        load_inputs(options(cluster_file(tmp_path), input_len="1000"))  # fmt: skip


def test_a_length_and_a_config_given_together_is_a_usage_error(
    tmp_path: Path, snapshot: Path
) -> None:
    opts = options(cluster_file(tmp_path), input_len="1024", speedbench_config="qualitative")
    with pytest.raises(UsageProblem, match="leave out --kimi-speedbench-config qualitative"):
        load_inputs(opts)


def test_other_lengths_from_one_file_are_a_usage_error(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, dataset="builtin:speedbench16k")
    with pytest.raises(UsageProblem, match=r"--kimi-input-len 1024: .* is one file of prompts"):
        load_inputs(options(path, input_len="1024,16"))


def test_the_command_line_replaces_the_files_sweep(tmp_path: Path, snapshot: Path) -> None:
    path = cluster_file(tmp_path, extra="  api: [generate, chat]\n")
    path.write_text(path.read_text().replace("  concurrency: 1\n", "  concurrency: [1, 2]\n"))
    swept = load_inputs(options(path))
    assert [p.id for p in swept.points] == ["c1-generate", "c2-generate", "c1-chat", "c2-chat"]
    given = load_inputs(options(path, concurrency="4", api="chat"))
    assert [(p.id, p.describe()) for p in given.points] == [
        ("", {"concurrency": 4, "api": "chat"})
    ]


def test_a_category_list_is_a_point_per_category(tmp_path: Path, snapshot: Path) -> None:
    inputs = load_inputs(options(cluster_file(tmp_path), category="low_entropy,mixed"))
    assert [p.id for p in inputs.points] == ["low_entropy", "mixed"]
    assert {p.category for p in inputs.prompts["mixed"].prompts} == {"mixed"}
    assert {p.category for p in inputs.prompts["low_entropy"].prompts} == {"low_entropy"}


def test_an_unknown_api_names_the_option(tmp_path: Path, snapshot: Path) -> None:
    with pytest.raises(UsageProblem, match="--kimi-api: 'grpc' is not one of generate, "):
        load_inputs(options(cluster_file(tmp_path), api="chat,grpc"))


def test_a_bad_list_in_the_file_names_file_line_and_field(tmp_path: Path) -> None:
    path = cluster_file(tmp_path)
    path.write_text(path.read_text().replace("  concurrency: 1\n", "  concurrency: [1, two]\n"))
    with pytest.raises(ConfigError) as info:
        load_cluster(path)
    assert str(info.value).startswith(f"{path}:15: field 'workload.concurrency[1]': expected an ")
