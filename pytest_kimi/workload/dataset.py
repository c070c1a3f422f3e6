"""SPEED-Bench workload files: parse, validate, select, fingerprint.

Why this module is strict: a benchmark number is only as good as its prompts. A row that holds
NVIDIA's placeholder text instead of a real prompt, or an empty prompt, would still produce
latencies, just meaningless ones; so every problem is refused with a message that names the
file, the 1-based line and the field, the way a compiler would. Why checksums: two runs can only
be compared if they sent the same prompts, so a :class:`Workload` carries the sha256 of the file
and of the selected prompts, for the run manifest.

Two row formats exist in the wild and both are read:

* SGLang's loader: ``{"question_id": ..., "category": ..., "turns": ["text", ...]}``;
* NeMo's prepare script and AIPerf: ``{"question_id": ..., "category": ...,
  "messages": [{"role": "user", "content": "text"}, ...]}``.

The prompt is the first user turn (a throughput benchmark sends one turn per request).
Standard library only, so the loader works wherever the plugin is installed.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PLACEHOLDER_MARKERS: tuple[str, ...] = ("FULL BENCHMARK DATA SHOULD BE FETCHED",)
"""Text found in published SPEED-Bench rows that stand in for data not redistributed.

A prompt containing any of these (case-insensitive) is refused: benchmarking it would measure
a short placeholder instead of the intended 16K-token prompt.
"""

BUNDLED_DATASET: Path = (
    Path(__file__).resolve().parent.parent / "data" / "speedbench_synthetic_16k.jsonl"
)
"""The synthetic SPEED-Bench-shaped file shipped with the package (see ``data/README.md``)."""

BUILTIN_DATASETS: dict[str, Path] = {"speedbench16k": BUNDLED_DATASET}
"""Names accepted after ``builtin:`` by :func:`resolve_dataset`."""

BUILTIN_PREFIX = "builtin:"
UNCATEGORIZED = "uncategorized"
"""Category given to rows that have none, so category filters and reports stay total."""


class DatasetError(ValueError):
    """A dataset file cannot be used; the message says where (``file:line: field 'x': ...``)."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt, traceable to the line it came from."""

    id: str
    """``question_id`` of the row, else ``"line-<n>"``."""
    category: str
    """The row's category, else ``"uncategorized"``."""
    text: str
    """The first user turn: what is sent to the server."""
    line: int
    """1-based line number in the file."""


@dataclass(frozen=True)
class Workload:
    """The prompts of one run, in request order, with what is needed to reproduce them.

    ``file_sha256`` is the sha256 of the file's bytes. ``prompts_sha256`` is the sha256 of the
    concatenation, in request order, of each selected prompt's text encoded as UTF-8 followed by
    one ``b"\\n"``: it changes if the file, the seed, the category or the request count changes
    which prompts are sent or in what order, and only then.
    """

    path: Path
    file_sha256: str
    prompts: tuple[Prompt, ...]
    prompts_sha256: str
    category: str | None
    seed: int

    def __len__(self) -> int:
        """Number of selected prompts (the number of requests)."""
        return len(self.prompts)

    def manifest(self) -> dict[str, Any]:
        """JSON-ready description for a run manifest: enough to check a rerun used the same data."""
        return {
            "path": str(self.path),
            "file_sha256": self.file_sha256,
            "prompts_sha256": self.prompts_sha256,
            "num_prompts": len(self.prompts),
            "category": self.category,
            "seed": self.seed,
            "prompt_ids": [p.id for p in self.prompts],
        }


def _fail(path: Path, line: int, problem: str, field: str | None = None) -> DatasetError:
    """Build the error in one format everywhere: ``path:line: field 'f': problem``."""
    where = f"{path}:{line}:"
    if field is not None:
        where += f" field '{field}':"
    return DatasetError(f"{where} {problem}")


def _type_name(value: object) -> str:
    """JSON-flavoured type name for messages (users write JSON, not Python)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, (int, float)) else "value")


def _check_text(path: Path, line: int, field: str, text: str) -> str:
    """Refuse empty and placeholder prompts; return the text unchanged otherwise."""
    if not text.strip():
        raise _fail(path, line, "empty prompt", field)
    upper = text.upper()
    for marker in PLACEHOLDER_MARKERS:
        if marker.upper() in upper:
            raise _fail(
                path,
                line,
                f"placeholder text ({marker!r}), not a real prompt: fetch the full SPEED-Bench "
                "data and point the workload at it",
                field,
            )
    return text


def _from_turns(path: Path, line: int, turns: object) -> str:
    """First turn of SGLang's ``turns`` list."""
    if not isinstance(turns, list):
        raise _fail(path, line, f"expected an array of strings, got {_type_name(turns)}", "turns")
    if not turns:
        raise _fail(path, line, "empty prompt (no turns)", "turns")
    first = turns[0]
    if not isinstance(first, str):
        raise _fail(path, line, f"expected a string, got {_type_name(first)}", "turns[0]")
    return _check_text(path, line, "turns", first)


def _content_text(path: Path, line: int, field: str, content: object) -> str:
    """Message content as text: a string, or OpenAI-style parts whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for k, part in enumerate(content):
            if not isinstance(part, dict):
                raise _fail(
                    path, line, f"expected an object, got {_type_name(part)}", f"{field}[{k}]"
                )
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise _fail(path, line, "expected a string", f"{field}[{k}].text")
                texts.append(part["text"])
        return "".join(texts)
    raise _fail(
        path, line, f"expected a string or an array of parts, got {_type_name(content)}", field
    )


def _from_messages(path: Path, line: int, messages: object) -> str:
    """Content of the first ``user`` message of NeMo/AIPerf's ``messages`` list."""
    if not isinstance(messages, list):
        raise _fail(
            path, line, f"expected an array of objects, got {_type_name(messages)}", "messages"
        )
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _fail(
                path, line, f"expected an object, got {_type_name(message)}", f"messages[{k}]"
            )
        if message.get("role") != "user":
            continue
        if "content" not in message:
            raise _fail(path, line, "missing", f"messages[{k}].content")
        field = f"messages[{k}].content"
        return _check_text(path, line, field, _content_text(path, line, field, message["content"]))
    raise _fail(path, line, "empty prompt (no message with role 'user')", "messages")


def _parse_row(path: Path, line: int, raw: str) -> Prompt:
    """Validate one non-blank line and turn it into a :class:`Prompt`."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _fail(path, line, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise _fail(
            path,
            line,
            f"row is a JSON {_type_name(row)}, expected an object with 'turns' or 'messages'",
        )
    if "turns" in row:  # SGLang's loader reads 'turns' even when 'messages' is also present
        text = _from_turns(path, line, row["turns"])
    elif "messages" in row:
        text = _from_messages(path, line, row["messages"])
    else:
        raise _fail(
            path,
            line,
            "missing: a row needs 'turns' (SGLang format) or 'messages' (NeMo/AIPerf format)",
            "turns",
        )

    category = row.get("category", UNCATEGORIZED)
    if not isinstance(category, str) or not category.strip():
        raise _fail(path, line, f"expected a non-empty string, got {category!r}", "category")

    qid = row.get("question_id")
    if qid is None or qid == "":
        qid = f"line-{line}"
    elif isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise _fail(
            path, line, f"expected a string or integer, got {_type_name(qid)}", "question_id"
        )
    return Prompt(id=str(qid), category=category, text=text, line=line)


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


def read_rows(path: Path) -> list[Prompt]:
    """Parse and validate every row of a SPEED-Bench ``.jsonl`` file, in file order.

    Blank lines are skipped. Raises :class:`DatasetError` (``file:line: field 'x': problem``)
    for malformed JSON, a row that is not an object, a row with neither ``turns`` nor
    ``messages``, wrong types, an empty or placeholder prompt, a duplicate ``question_id`` and a
    file without rows: all at load time, before any server is started.
    """
    path = Path(path)
    return _parse(path, _read_bytes(path))


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
    path: Path, *, num_requests: int, seed: int = 0, category: str | None = None
) -> Workload:
    """Load a file and select the prompts of one run.

    Rows are filtered by ``category`` (``None`` keeps all), then ``num_requests`` of them are
    chosen with ``random.Random(seed).sample`` over the filtered rows in file order: the same
    file, seed, category and count always give the same prompts in the same order, so two
    layouts are measured on identical requests. Sampling is without replacement, so asking for
    more prompts than the filtered rows hold is an error rather than silent repetition.
    """
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive integer, got {num_requests!r}")
    path = Path(path)
    data = _read_bytes(path)
    rows = _parse(path, data)
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
    prompts = tuple(random.Random(seed).sample(selected_rows, num_requests))
    return Workload(
        path=path,
        file_sha256=hashlib.sha256(data).hexdigest(),
        prompts=prompts,
        prompts_sha256=_sha256_texts(prompts),
        category=category,
        seed=seed,
    )


def resolve_dataset(spec: str | Path, base_dir: Path | None = None) -> Path:
    """Turn a workload's ``dataset`` setting into an existing file path.

    ``builtin:speedbench16k`` names the bundled synthetic file. A relative path is taken
    relative to ``base_dir`` (the folder of the YAML file that named it, so a config works from
    any working directory), else to the current directory; ``~`` is expanded. A missing file is
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
    if not path.is_file():
        what = "is not a file" if path.exists() else "not found"
        raise DatasetError(f"{path}: dataset file {what} (from {str(spec)!r})")
    return path
