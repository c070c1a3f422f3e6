"""SPEED-Bench workloads: read, validate, select, fingerprint.

Why this module is strict: a benchmark number is only as good as its prompts. A row that holds
NVIDIA's placeholder text instead of a real prompt, or an empty prompt, would still produce
latencies, just meaningless ones; so every problem is refused with a message that names the
file, the 1-based line (row for parquet) and the field, the way a compiler would. Why
checksums: two runs can only be compared if they sent the same prompts, so a :class:`Workload`
carries the sha256 of every file read and of the selected prompts, for the run manifest.

A dataset is a JSONL file, a parquet file, or a local snapshot directory of
``nvidia/SPEED-Bench`` (:mod:`.speedbench` chooses its files by config). Rows are checked by
:mod:`.rows`; how a first turn becomes the text sent (raw or in the chat template) is
:mod:`.prompts`. Standard library only for JSONL; pyarrow is imported for parquet only.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_kimi.workload import prompts as prompts_mod
from pytest_kimi.workload.prompts import ChatTemplate, PromptConstruction
from pytest_kimi.workload.rows import (
    PLACEHOLDER_MARKERS,
    UNCATEGORIZED,
    DatasetError,
    Prompt,
    fail,
    row_prompt,
    type_name,
)
from pytest_kimi.workload.sessions import Session
from pytest_kimi.workload.specs import RequestSpec
from pytest_kimi.workload.speedbench import DataFile, parquet_rows, sha256_file, snapshot_files

__all__ = [
    "BUILTIN_DATASETS",
    "BUNDLED_DATASET",
    "DEFAULT_CONFIG",
    "PLACEHOLDER_MARKERS",
    "UNCATEGORIZED",
    "DatasetError",
    "Prompt",
    "Workload",
    "load_workload",
    "read_rows",
    "read_source",
    "resolve_dataset",
]

BUNDLED_DATASET: Path = (
    Path(__file__).resolve().parent.parent / "data" / "speedbench_synthetic_16k.jsonl"
)
"""The synthetic SPEED-Bench-shaped file shipped with the package (see ``data/README.md``)."""

BUILTIN_DATASETS: dict[str, Path] = {"speedbench16k": BUNDLED_DATASET}
"""Names accepted after ``builtin:`` by :func:`resolve_dataset`."""

BUILTIN_PREFIX = "builtin:"
DEFAULT_CONFIG = "throughput_16k"
"""The SPEED-Bench config read from a snapshot directory unless another is named."""


@dataclass(frozen=True)
class Workload:
    """The prompts of one run, in request order, with what is needed to reproduce them.

    ``file_sha256`` is the sha256 of the file's bytes when the rows came from one file; from a
    snapshot directory it is the sha256 of the ``sha256sum``-style listing of its files
    (``"<sha256>  <path relative to the directory>\n"`` each, in read order), and ``files``
    holds each file's own. ``prompts_sha256`` is the sha256 of the concatenation, in request
    order, of each selected prompt's text (as sent) encoded as UTF-8 followed by one
    ``b"\n"``: it changes if the data, the seed, the category, the request count or the prompt
    construction changes which texts are sent or in what order, and only then.
    """

    path: Path
    file_sha256: str
    prompts: tuple[Prompt, ...]
    prompts_sha256: str
    category: str | None
    seed: int
    files: tuple[DataFile, ...] = ()
    config: str | None = None  # the SPEED-Bench config of a snapshot directory; None for a file
    construction: PromptConstruction = field(
        default_factory=lambda: PromptConstruction(prompts_mod.RAW, prompts_mod.RAW)
    )
    # a session workload's sessions, in order (warm-up ones first, as prompts); their
    # conversations become /generate text in this template (sessionset.load_sessions)
    sessions: tuple[Session, ...] = ()
    chat_template: ChatTemplate | None = None
    # a replayed trace's requests, each with its answer length and arrival (trace.load_trace)
    requests: tuple[RequestSpec, ...] = ()
    trace_speed: float | None = None
    # a recorded arrival list's offsets (seconds after the first, sped up) for the prompts or
    # sessions, in order, warm-up ones first (trace.read_arrivals); empty: none
    arrivals_s: tuple[float, ...] = ()

    def __len__(self) -> int:
        """Number of selected prompts (the number of requests), of sessions, or of a trace's
        requests."""
        return len(self.sessions or self.requests or self.prompts)

    def manifest(self) -> dict[str, Any]:
        """JSON-ready description for a run manifest: enough to check a rerun used the same data."""
        return {
            "path": str(self.path),
            "file_sha256": self.file_sha256,
            "files": [f.manifest() for f in self.files],
            "speedbench_config": self.config,
            "prompts_sha256": self.prompts_sha256,
            "num_prompts": len(self.prompts),
            "category": self.category,
            "seed": self.seed,
            "prompt": self.construction.manifest(),
            "prompt_ids": [p.id for p in self.prompts],
            **({"session_ids": [s.id for s in self.sessions],
                "turns": sum(len(s.turns) for s in self.sessions)} if self.sessions else {}),
            **({"trace_requests": len(self.requests), "trace_speed": self.trace_speed}
               if self.requests else {}),
            **({"arrivals": len(self.arrivals_s), "trace_speed": self.trace_speed}
               if self.arrivals_s else {}),
        }  # fmt: skip


def _fail(path: Path, line: int, problem: str, field: str | None = None) -> DatasetError:
    """A JSONL error: ``path:line: field 'f': problem``."""
    return fail(f"{path}:{line}:", problem, field)


def _parse_row(path: Path, line: int, raw: str) -> Prompt:
    """Validate one non-blank JSONL line and turn it into a :class:`Prompt`."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _fail(path, line, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise _fail(
            path,
            line,
            f"row is a JSON {type_name(row)}, expected an object with 'turns' or 'messages'",
        )
    return row_prompt(f"{path}:{line}:", row, line)


def _parse(path: Path, data: bytes) -> list[Prompt]:
    """Parse file bytes; lines are split on ``\\n`` only (JSON strings may hold U+2028)."""
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    for line, raw_bytes in enumerate(data.split(b"\n"), start=1):
        try:
            raw = raw_bytes.decode("utf-8-sig" if line == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(path, line, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not raw.strip():
            continue
        prompt = _parse_row(path, line, raw)
        if prompt.id in first_line:
            # Records and reports key on the prompt id; duplicates would make them ambiguous.
            raise _fail(
                path,
                line,
                f"duplicate id {prompt.id!r} (first on line {first_line[prompt.id]})",
                "question_id",
            )
        first_line[prompt.id] = line
        prompts.append(prompt)
    if not prompts:
        raise _fail(path, 1, "no rows: the file is empty or holds only blank lines")
    return prompts


def _read_bytes(path: Path) -> bytes:
    """Read the file, turning OS errors into a :class:`DatasetError` that names it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file not found") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read dataset file: {exc.strerror or exc}") from None


def _parquet(path: Path) -> list[Prompt]:
    """Rows of a parquet file; errors say ``file: row N: field 'x': problem``."""
    prompts: list[Prompt] = []
    first_row: dict[str, int] = {}
    for n, row in parquet_rows(path):
        prompt = row_prompt(f"{path}: row {n}:", row, n)
        if prompt.id in first_row:
            raise fail(
                f"{path}: row {n}:",
                f"duplicate id {prompt.id!r} (first on row {first_row[prompt.id]})",
                "question_id",
            )
        first_row[prompt.id] = n
        prompts.append(prompt)
    if not prompts:
        raise DatasetError(f"{path}: no rows")
    return prompts


def _read_file(path: Path) -> tuple[list[Prompt], str]:
    """A file's prompts and sha256; ``.parquet`` by pyarrow, anything else as JSONL."""
    if path.suffix == ".parquet":
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read dataset file: {exc.strerror or exc}") from None
        return _parquet(path), digest
    data = _read_bytes(path)
    return _parse(path, data), hashlib.sha256(data).hexdigest()


def read_rows(path: Path) -> list[Prompt]:
    """Parse and validate every row of a SPEED-Bench ``.jsonl`` or ``.parquet`` file, in order.

    Blank lines are skipped. Raises :class:`DatasetError` (``file:line: field 'x': problem``)
    for malformed JSON, a row that is not an object, a row with neither ``turns`` nor
    ``messages``, wrong types, an empty or placeholder prompt, a duplicate ``question_id`` and a
    file without rows: all at load time, before any server is started.
    """
    return _read_file(Path(path))[0]


def _no_duplicates(per_file: list[tuple[Path, list[Prompt]]]) -> None:
    """Records and reports key on the prompt id: refuse an id found in two files."""
    first: dict[str, tuple[Path, int]] = {}
    for path, rows in per_file:
        for p in rows:
            if p.id in first and first[p.id][0] != path:
                other, number = first[p.id]
                raise fail(
                    f"{path}: row {p.line}:",
                    f"duplicate id {p.id!r} (first in {other} row {number})",
                    "question_id",
                )
            first.setdefault(p.id, (path, p.line))


def read_source(
    path: Path, config: str = DEFAULT_CONFIG
) -> tuple[list[Prompt], tuple[DataFile, ...], str | None]:
    """All rows of a dataset file or snapshot directory, the files read, and the config used.

    A file is read whole (``config`` does not apply: None is returned for it). A directory is a
    snapshot of ``nvidia/SPEED-Bench``: the files of ``config`` are read, in the order the
    dataset card lists them (see :func:`~pytest_kimi.workload.speedbench.snapshot_files`).
    """
    path = Path(path)
    if not path.is_dir():
        rows, digest = _read_file(path)
        return rows, (DataFile(path, digest),), None
    per_file: list[tuple[Path, list[Prompt]]] = []
    files: list[DataFile] = []
    found, _ = snapshot_files(path, config)
    for file, split in found:
        rows, digest = _read_file(file)
        per_file.append((file, rows))
        files.append(DataFile(file, digest, split))
    _no_duplicates(per_file)
    return [p for _, rows in per_file for p in rows], tuple(files), config


def _listing_sha256(root: Path, files: tuple[DataFile, ...]) -> str:
    """One fingerprint for a set of files: sha256 of their ``sha256sum``-style listing."""
    lines = "".join(f"{f.sha256}  {f.path.relative_to(root).as_posix()}\n" for f in files)
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def _sha256_texts(prompts: tuple[Prompt, ...]) -> str:
    """sha256 over each prompt text as UTF-8 plus ``b"\\n"``, in order (see :class:`Workload`)."""
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(prompt.text.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _categories_present(rows: list[Prompt]) -> str:
    """``"high_entropy (16), low_entropy (16)"``: what a user can filter on."""
    counts = Counter(p.category for p in rows)
    return ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))


def load_workload(
    path: Path,
    *,
    num_requests: int,
    seed: int = 0,
    category: str | None = None,
    config: str = DEFAULT_CONFIG,
    prompt: str = prompts_mod.RAW,
    api: str = "generate",
    tokenizer_dir: Path | None = None,
) -> Workload:
    """Load a dataset file or snapshot directory and select the prompts of one run.

    Rows are filtered by ``category`` (``None`` keeps all), then ``num_requests`` of them are
    chosen with ``random.Random(seed).sample`` over the filtered rows in file order: the same
    data, seed, category and count always give the same prompts in the same order, so two
    layouts are measured on identical requests. Sampling is without replacement, so asking for
    more prompts than the filtered rows hold is an error rather than silent repetition. Then
    each first turn is made into the text sent, as ``prompt`` says (``raw``, ``chat_template``,
    ``chat_template_or_raw``; see :mod:`~pytest_kimi.workload.prompts`), with the template of
    ``tokenizer_dir`` and knowing the ``api`` (the chat API sends the turn as is).
    """
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive integer, got {num_requests!r}")
    path = Path(path)
    rows, files, used_config = read_source(path, config)
    if category is not None:
        selected_rows = [p for p in rows if p.category == category]
        if not selected_rows:
            raise DatasetError(
                f"{path}: no rows with category {category!r}; "
                f"categories present: {_categories_present(rows)}"
            )
    else:
        selected_rows = rows
    if len(selected_rows) < num_requests:
        scope = f"category {category}" if category is not None else "all categories"
        raise DatasetError(
            f"{path}: has {len(selected_rows)} rows ({scope}), {num_requests} requested"
        )
    chosen = random.Random(seed).sample(selected_rows, num_requests)
    texts, construction = prompts_mod.construct(
        [p.text for p in chosen], prompt, api, tokenizer_dir
    )
    selected = tuple(replace(p, text=t) for p, t in zip(chosen, texts, strict=True))
    file_sha = files[0].sha256 if not path.is_dir() else _listing_sha256(path, files)
    return Workload(
        path=path,
        file_sha256=file_sha,
        prompts=selected,
        prompts_sha256=_sha256_texts(selected),
        category=category,
        seed=seed,
        files=files,
        config=used_config,
        construction=construction,
    )


def resolve_dataset(spec: str | Path, base_dir: Path | None = None) -> Path:
    """Turn a workload's ``dataset`` setting into an existing file or directory path.

    ``builtin:speedbench16k`` names the bundled synthetic file. A relative path is taken
    relative to ``base_dir`` (the folder of the YAML file that named it, so a config works from
    any working directory), else to the current directory; ``~`` is expanded. A missing path is
    reported now, naming the path that was tried, rather than after a deployment came up.
    """
    if isinstance(spec, str) and spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_DATASETS:
            known = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_DATASETS))
            raise DatasetError(f"unknown built-in dataset {spec!r}; known: {known}")
        path = BUILTIN_DATASETS[name]
    else:
        path = Path(spec).expanduser()
        if not path.is_absolute():
            path = (Path(base_dir) if base_dir is not None else Path.cwd()) / path
    if not (path.is_file() or path.is_dir()):
        what = "is not a file or directory" if path.exists() else "not found"
        raise DatasetError(f"{path}: dataset {what} (from {str(spec)!r})")
    return path
