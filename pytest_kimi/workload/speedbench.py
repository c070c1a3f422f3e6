"""SPEED-Bench as users have it: parquet files and local snapshots of ``nvidia/SPEED-Bench``.

Why: the dataset is published on the Hugging Face Hub as parquet, one *config* per use
(``qualitative``, ``throughput_1k`` .. ``throughput_32k``), and users download a snapshot
directory (``huggingface-cli download nvidia/SPEED-Bench --repo-type dataset --local-dir D``).
Which files belong to which config is written in the dataset card's YAML front matter
(``README.md``)::

    configs:
    - config_name: throughput_16k
      data_files:
      - split: test
        path: throughput_16k/test-*

We read that, the way the ``datasets`` library does, instead of guessing from file names. A
directory without a card (e.g. what NVIDIA's ``prepare_data.py`` writes: ``<dir>/<config>/``) is
read from its ``<config>/`` subdirectory, else from the data files directly in it.

pyarrow is imported only when a parquet file is read, so the plugin loads without it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimi.workload.rows import DatasetError

CARD = "README.md"
DATA_SUFFIXES: tuple[str, ...] = (".parquet", ".jsonl")
"""File types a config's ``data_files`` may name; anything else is refused by name."""
PROMPT_COLUMNS: tuple[str, ...] = ("turns", "messages")
THROUGHPUT_LENGTHS: dict[int, str] = {
    1024 * k: f"throughput_{k}k" for k in (1, 2, 8, 16, 32)
}
"""Prompt length in tokens -> the throughput config whose prompts have it (the dataset card)."""


@dataclass(frozen=True)
class DataFile:
    """One file a workload's rows came from, with the checksum a rerun must match."""

    path: Path
    sha256: str
    split: str | None = None

    def manifest(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "split": self.split}


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks (SPEED-Bench files are tens of MB)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def front_matter(card: Path) -> dict[str, Any]:
    """The YAML block between the leading ``---`` lines of a dataset card ({} if none)."""
    import yaml

    text = card.read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        raise DatasetError(f"{card}: front matter opened with '---' is never closed")
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise DatasetError(f"{card}: front matter is not valid YAML: {exc}") from None
    return data if isinstance(data, dict) else {}


def _split_patterns(card: Path, name: str, data_files: object) -> list[tuple[str, list[str]]]:
    """``data_files`` in the forms the Hub documents: a path, a list of paths, a list of
    ``{split, path}`` (path: a string or a list), or a mapping split -> path(s)."""
    where = f"{card}: configs[{name}].data_files"

    def paths(value: object) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise DatasetError(f"{where}: expected a path or a list of paths, got {value!r}")

    if isinstance(data_files, dict):
        return [(str(split), paths(value)) for split, value in data_files.items()]
    if isinstance(data_files, list) and all(isinstance(v, dict) for v in data_files):
        out = []
        for entry in data_files:
            if "path" not in entry:
                raise DatasetError(f"{where}: entry {entry!r} has no 'path'")
            out.append((str(entry.get("split", "train")), paths(entry["path"])))
        return out
    return [("train", paths(data_files))]


def card_configs(card: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Config name -> [(split, path globs)] from a dataset card's ``configs:``."""
    configs = front_matter(card).get("configs")
    if not isinstance(configs, list):
        raise DatasetError(f"{card}: the front matter has no 'configs:' list")
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for entry in configs:
        if not isinstance(entry, dict) or "config_name" not in entry:
            raise DatasetError(f"{card}: configs: entry without 'config_name': {entry!r}")
        name = str(entry["config_name"])
        out[name] = _split_patterns(card, name, entry.get("data_files", []))
    return out


def _data_files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in DATA_SUFFIXES)


def _matches(root: Path, pattern: str) -> list[Path]:
    """Files under ``root`` a ``data_files`` pattern names (``*`` within a folder, ``**`` across
    folders, as the Hub's fsspec globs)."""
    pattern = pattern.lstrip("/")
    if not any(ch in pattern for ch in "*?["):
        return [root / pattern] if (root / pattern).is_file() else []
    return sorted(p for p in root.glob(pattern) if p.is_file())


def snapshot_files(snapshot: Path, config: str) -> tuple[list[tuple[Path, str | None]], bool]:
    """The data files of ``config`` in a snapshot directory, with their split, and whether a
    dataset card chose them.

    A missing config is an error that lists the configs the directory has.
    """
    card = snapshot / CARD
    if card.is_file() and "configs" in front_matter(card):
        configs = card_configs(card)
        if config not in configs:
            raise DatasetError(
                f"{snapshot}: no config {config!r} in the dataset card ({card.name}); "
                f"configs: {', '.join(configs) or 'none'} (choose one with "
                "--kimi-speedbench-config or workload.speedbench_config)"
            )
        found: list[tuple[Path, str | None]] = []
        for split, patterns in configs[config]:
            for pattern in patterns:
                hits = _matches(snapshot, pattern)
                if not hits:
                    raise DatasetError(
                        f"{snapshot}: config {config!r} split {split!r}: no file matches "
                        f"{pattern!r} (an incomplete download? fetch the whole snapshot)"
                    )
                found.extend((p, split) for p in hits if all(p != f for f, _ in found))
        return found, True
    sub = snapshot / config
    if sub.is_dir() and _data_files_in(sub):
        return [(p, None) for p in _data_files_in(sub)], False
    direct = _data_files_in(snapshot)
    if direct:
        return [(p, None) for p in direct], False
    subdirs = sorted(p.name for p in snapshot.iterdir() if p.is_dir() and _data_files_in(p))
    raise DatasetError(
        f"{snapshot}: no config {config!r}: no dataset card with 'configs:' ({CARD}), no "
        f"{config}/ folder and no {' or '.join(DATA_SUFFIXES)} files; folders with data "
        f"files: {', '.join(subdirs) or 'none'}"
    )


def parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of a parquet file; a file without a prompt column is refused
    naming the columns it has."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        raise DatasetError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ... for a bad file
        raise DatasetError(f"{path}: not a readable parquet file: {exc}") from None
    columns = list(parquet.schema_arrow.names)
    if not any(c in columns for c in PROMPT_COLUMNS):
        raise DatasetError(
            f"{path}: field 'turns': missing: no column 'turns' (SPEED-Bench) or 'messages'; "
            f"columns: {', '.join(columns) or 'none'}"
        )
    number = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield number, row
