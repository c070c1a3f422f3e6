"""SPEED-Bench as published: parquet files and snapshot directories chosen by the dataset card."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow  # noqa: F401  (a dependency: its absence must fail, not skip)
import pytest

from pytest_kimi.testing.speedbench_snapshot import (
    speedbench_row,
    write_parquet,
    write_snapshot,
)
from pytest_kimi.workload.dataset import (
    PLACEHOLDER_MARKERS,
    DatasetError,
    load_workload,
    read_rows,
    read_source,
)
from pytest_kimi.workload.speedbench import card_configs

PLACEHOLDER = PLACEHOLDER_MARKERS[0] + " FROM THE SOURCE USING SPECDEC_BENCH"


def rows(prefix: str, n: int, cats: tuple[str, ...] = ("low_entropy", "mixed")) -> list[dict]:
    return [
        speedbench_row(f"{prefix}{i}", cats[i % len(cats)], f"{prefix} text {i}") for i in range(n)
    ]


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    return write_snapshot(
        tmp_path / "SPEED-Bench",
        {"qualitative": rows("q", 4, ("coding", "math")), "throughput_16k": rows("t", 6)},
    )


def test_card_configs_read_from_front_matter(snapshot: Path) -> None:
    assert card_configs(snapshot / "README.md") == {
        "qualitative": [("test", ["qualitative/test-*"])],
        "throughput_16k": [("test", ["throughput_16k/test-*"])],
    }


def test_snapshot_reads_the_config_the_card_names(snapshot: Path) -> None:
    prompts, files, config = read_source(snapshot, "throughput_16k")
    assert config == "throughput_16k"
    assert [p.id for p in prompts] == [f"t{i}" for i in range(6)]
    assert prompts[1].text == "t text 1" and prompts[1].category == "mixed"
    assert prompts[1].line == 2  # the row number in its parquet file
    parquet = snapshot / "throughput_16k" / "test-00000-of-00001.parquet"
    assert [(f.path, f.split) for f in files] == [(parquet, "test")]
    assert files[0].sha256 == hashlib.sha256(parquet.read_bytes()).hexdigest()
    prompts, _, config = read_source(snapshot, "qualitative")
    assert config == "qualitative" and {p.category for p in prompts} == {"coding", "math"}


def test_manifest_names_files_sha256_config_category_and_prompt(snapshot: Path) -> None:
    wl = load_workload(snapshot, num_requests=2, seed=1, category="mixed")
    data = wl.manifest()
    parquet = snapshot / "throughput_16k" / "test-00000-of-00001.parquet"
    digest = hashlib.sha256(parquet.read_bytes()).hexdigest()
    assert data["files"] == [{"path": str(parquet), "sha256": digest, "split": "test"}]
    assert data["speedbench_config"] == "throughput_16k"
    assert data["category"] == "mixed"
    assert data["prompt"]["requested"] == data["prompt"]["applied"] == "raw"
    listing = f"{digest}  throughput_16k/test-00000-of-00001.parquet\n"
    assert data["file_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    assert all(p.category == "mixed" for p in wl.prompts)


def test_several_files_and_card_forms(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    write_parquet(root / "data" / "a-0.parquet", rows("a", 2))
    write_parquet(root / "data" / "a-1.parquet", rows("b", 3))
    write_parquet(root / "other.parquet", rows("c", 1))
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: many\n  data_files:\n  - split: test\n"
        "    path: [data/a-*.parquet]\n- config_name: plain\n  data_files: other.parquet\n"
        "- config_name: mapping\n  data_files: {test: 'data/a-1.parquet'}\n---\ntext\n"
    )
    prompts, files, _ = read_source(root, "many")
    assert [p.id for p in prompts] == ["a0", "a1", "b0", "b1", "b2"]
    assert [f.path.name for f in files] == ["a-0.parquet", "a-1.parquet"]
    assert [p.id for p in read_source(root, "plain")[0]] == ["c0"]
    assert read_source(root, "plain")[1][0].split == "train"  # the Hub's default split name
    assert [p.id for p in read_source(root, "mapping")[0]] == ["b0", "b1", "b2"]


def test_duplicate_id_across_files_names_both(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    write_parquet(root / "d" / "x-0.parquet", rows("a", 2))
    write_parquet(root / "d" / "x-1.parquet", rows("a", 1))
    (root / "README.md").write_text("---\nconfigs:\n- config_name: c\n  data_files: d/x-*\n---\n")
    with pytest.raises(DatasetError, match=r"x-1\.parquet: row 1: field 'question_id'") as exc:
        read_source(root, "c")
    assert "x-0.parquet row 1" in str(exc.value)


def test_directory_without_card_uses_config_folder_then_files(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared"  # what NVIDIA's prepare_data.py writes: <dir>/<config>/
    write_parquet(prepared / "throughput_16k" / "test.parquet", rows("p", 3))
    assert [p.id for p in read_source(prepared, "throughput_16k")[0]] == ["p0", "p1", "p2"]
    flat = tmp_path / "flat"
    write_parquet(flat / "rows.parquet", rows("f", 2))
    assert [p.id for p in read_source(flat, "throughput_16k")[0]] == ["f0", "f1"]


def test_single_parquet_file(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", rows("s", 5))
    assert [p.id for p in read_rows(path)] == [f"s{i}" for i in range(5)]
    wl = load_workload(path, num_requests=3, seed=2)
    assert wl.config is None and wl.file_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert wl.manifest()["files"][0]["path"] == str(path)


# --- errors ------------------------------------------------------------------------------------


def test_snapshot_without_the_config_lists_its_configs(snapshot: Path) -> None:
    with pytest.raises(DatasetError) as exc:
        load_workload(snapshot, num_requests=1, config="throughput_64k")
    msg = str(exc.value)
    assert msg.startswith(f"{snapshot}: no config 'throughput_64k'")
    assert "configs: qualitative, throughput_16k" in msg


def test_snapshot_missing_the_configs_files(snapshot: Path) -> None:
    (snapshot / "qualitative" / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(DatasetError, match=r"config 'qualitative' split 'test': no file matches"):
        read_source(snapshot, "qualitative")


def test_directory_without_card_or_data(tmp_path: Path) -> None:
    write_parquet(tmp_path / "d" / "qualitative" / "x.parquet", rows("x", 1))
    with pytest.raises(DatasetError) as exc:
        read_source(tmp_path / "d", "throughput_16k")
    assert "no config 'throughput_16k'" in str(exc.value)
    assert "folders with data files: qualitative" in str(exc.value)


def test_parquet_without_turns_names_file_and_columns(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "bad.parquet", [{"question_id": "a", "prompt": "x"}])
    with pytest.raises(DatasetError) as exc:
        read_rows(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: field 'turns': missing")
    assert "columns: question_id, prompt" in msg


def test_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "junk.parquet"
    path.write_text("not parquet")
    with pytest.raises(DatasetError, match=r"junk\.parquet: not a readable parquet file"):
        read_rows(path)


def test_category_with_no_rows_lists_categories_with_counts(snapshot: Path) -> None:
    with pytest.raises(DatasetError) as exc:
        load_workload(snapshot, num_requests=1, category="high_entropy")
    assert "no rows with category 'high_entropy'" in str(exc.value)
    assert "categories present: low_entropy (3), mixed (3)" in str(exc.value)


def test_placeholder_row_is_refused_with_how_to_rebuild(tmp_path: Path) -> None:
    bad = [*rows("t", 2), speedbench_row("t9", "mixed", PLACEHOLDER)]
    snapshot = write_snapshot(tmp_path / "snap", {"throughput_16k": bad})
    with pytest.raises(DatasetError) as exc:
        load_workload(snapshot, num_requests=1)
    msg = str(exc.value)
    parquet = snapshot / "throughput_16k" / "test-00000-of-00001.parquet"
    assert msg.startswith(f"{parquet}: row 3: field 'turns': placeholder text")
    assert "prepare_data.py --dataset speed --config" in msg
    assert "--kimi-dataset" in msg


def test_bad_parquet_rows_name_row_and_field(tmp_path: Path) -> None:
    empty = [*rows("t", 1), speedbench_row("t1", "mixed", "", turns=[])]
    path = write_parquet(tmp_path / "e.parquet", empty)
    with pytest.raises(DatasetError, match=r"e\.parquet: row 2: field 'turns': empty prompt"):
        read_rows(path)
    dup = write_parquet(tmp_path / "d.parquet", [*rows("t", 2), *rows("t", 1)])
    with pytest.raises(DatasetError, match=r"d\.parquet: row 3: field 'question_id'.*row 1"):
        read_rows(dup)


def test_front_matter_errors(tmp_path: Path) -> None:
    root = tmp_path / "snap"
    root.mkdir()
    (root / "README.md").write_text("---\nconfigs: [\n---\n")
    with pytest.raises(DatasetError, match=r"README\.md: front matter is not valid YAML"):
        read_source(root, "throughput_16k")
    (root / "README.md").write_text("---\nconfigs:\n- data_files: x\n---\n")
    with pytest.raises(DatasetError, match=r"README\.md: configs: entry without 'config_name'"):
        read_source(root, "throughput_16k")
