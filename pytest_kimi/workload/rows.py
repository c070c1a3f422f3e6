"""One SPEED-Bench row (a mapping, from JSONL or parquet) checked and turned into a prompt.

Why a module of its own: JSONL lines and parquet rows hold the same fields and must be refused
for the same reasons with the same words, so both readers (:mod:`.dataset` for JSONL,
:mod:`.speedbench` for parquet) share this code. Every message starts with where the row is
(``file:line:`` for JSONL, ``file: row N:`` for parquet) and names the field, the way a
compiler would.

Two row formats exist in the wild and both are read:

* SPEED-Bench itself and SGLang's loader: ``{"question_id", "category", "turns": ["text", ...]}``
  (the parquet files also carry ``sub_category, source, src_id, difficulty, multiturn``);
* NeMo's prepare script and AIPerf: ``{"question_id", "category",
  "messages": [{"role": "user", "content": "text"}, ...]}``.

The prompt is the first user turn (a throughput benchmark sends one turn per request).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PLACEHOLDER_MARKERS: tuple[str, ...] = ("FULL BENCHMARK DATA SHOULD BE FETCHED",)
"""Text found in published SPEED-Bench rows that stand in for data not redistributed.

A prompt containing any of these (case-insensitive) is refused: benchmarking it would measure
a short placeholder instead of the intended 16K-token prompt.
"""

REBUILD_HINT = (
    "SPEED-Bench publishes rows whose source licence forbids redistribution with this "
    "placeholder instead of the text (see the dataset card of nvidia/SPEED-Bench); rebuild the "
    "full rows with NVIDIA's script (github.com/NVIDIA/Model-Optimizer, "
    "examples/specdec_bench: python prepare_data.py --dataset speed --config <config> "
    "--output_dir <dir>) and point --kimi-dataset (or workload.dataset) at what it writes"
)
"""Said with every placeholder refusal: what the user has to do, not just what is wrong."""

UNCATEGORIZED = "uncategorized"
"""Category given to rows that have none, so category filters and reports stay total."""


class DatasetError(ValueError):
    """A dataset cannot be used; the message says where (``file:line: field 'x': ...``)."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt, traceable to the row it came from."""

    id: str
    """``question_id`` of the row, else ``"line-<n>"``."""
    category: str
    """The row's category, else ``"uncategorized"``."""
    text: str
    """What is sent to the server: the first user turn, or it in the chat template."""
    line: int
    """1-based line number in a JSONL file, or 1-based row number in a parquet file."""


def fail(where: str, problem: str, field: str | None = None) -> DatasetError:
    """Build the error in one format everywhere: ``<where> field 'f': problem``."""
    if field is not None:
        where += f" field '{field}':"
    return DatasetError(f"{where} {problem}")


def type_name(value: object) -> str:
    """JSON-flavoured type name for messages (users write JSON, not Python)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    if isinstance(value, tuple):
        return "array"
    return names.get(type(value), "number" if isinstance(value, (int, float)) else "value")


def check_text(where: str, field: str, text: str) -> str:
    """Refuse empty and placeholder prompts; return the text unchanged otherwise."""
    if not text.strip():
        raise fail(where, "empty prompt", field)
    upper = text.upper()
    for marker in PLACEHOLDER_MARKERS:
        if marker.upper() in upper:
            problem = f"placeholder text ({marker!r}), not a real prompt: {REBUILD_HINT}"
            raise fail(where, problem, field)
    return text


def _from_turns(where: str, turns: object) -> str:
    """First turn of the ``turns`` list."""
    if not isinstance(turns, (list, tuple)):
        raise fail(where, f"expected an array of strings, got {type_name(turns)}", "turns")
    if not turns:
        raise fail(where, "empty prompt (no turns)", "turns")
    first = turns[0]
    if not isinstance(first, str):
        raise fail(where, f"expected a string, got {type_name(first)}", "turns[0]")
    return check_text(where, "turns", first)


def _content_text(where: str, field: str, content: object) -> str:
    """Message content as text: a string, or OpenAI-style parts whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for k, part in enumerate(content):
            if not isinstance(part, dict):
                raise fail(where, f"expected an object, got {type_name(part)}", f"{field}[{k}]")
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise fail(where, "expected a string", f"{field}[{k}].text")
                texts.append(part["text"])
        return "".join(texts)
    raise fail(where, f"expected a string or an array of parts, got {type_name(content)}", field)


def _from_messages(where: str, messages: object) -> str:
    """Content of the first ``user`` message of NeMo/AIPerf's ``messages`` list."""
    if not isinstance(messages, list):
        raise fail(where, f"expected an array of objects, got {type_name(messages)}", "messages")
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            raise fail(where, f"expected an object, got {type_name(message)}", f"messages[{k}]")
        if message.get("role") != "user":
            continue
        if "content" not in message:
            raise fail(where, "missing", f"messages[{k}].content")
        field = f"messages[{k}].content"
        return check_text(where, field, _content_text(where, field, message["content"]))
    raise fail(where, "empty prompt (no message with role 'user')", "messages")


def row_prompt(where: str, row: Mapping[str, object], number: int) -> Prompt:
    """Validate one row and turn it into a :class:`Prompt`; ``number`` is its line/row number."""
    if "turns" in row:  # SGLang's loader reads 'turns' even when 'messages' is also present
        text = _from_turns(where, row["turns"])
    elif "messages" in row:
        text = _from_messages(where, row["messages"])
    else:
        raise fail(
            where,
            "missing: a row needs 'turns' (SGLang format) or 'messages' (NeMo/AIPerf format)",
            "turns",
        )

    category = row.get("category", UNCATEGORIZED)
    if not isinstance(category, str) or not category.strip():
        raise fail(where, f"expected a non-empty string, got {category!r}", "category")

    qid = row.get("question_id")
    if qid is None or qid == "":
        qid = f"line-{number}"
    elif isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise fail(where, f"expected a string or integer, got {type_name(qid)}", "question_id")
    return Prompt(id=str(qid), category=category, text=text, line=number)


def text_lines(path: Path) -> list[str]:
    """A JSONL file's lines; an unreadable file is a :class:`DatasetError` naming it."""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from None


def json_object(where: str, line: str) -> dict[str, object]:
    """One JSONL line as an object; anything else is refused where it is."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type_name(row)}")
    return row
