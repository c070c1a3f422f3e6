"""Mooncake-format traces: production arrivals, lengths and prefix structure, replayed.

Why: a trace says when each request came, how long its prompt and answer were, and which
parts of its prompt it shared with others, without the text. Mooncake's format (the
FAST'25 traces, also read by sglang's ``bench_serving`` and vLLM's benchmarks) is JSONL::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}

``timestamp`` is in milliseconds; ``hash_ids`` name the prompt's blocks of 512 tokens in
order (the last one partial), and two requests with the same id there share that block.
Here each id becomes the same 512 words wherever it appears (seeded by the id; words of the
tiny model's vocabulary, one token each on the mock), so a prefix the trace shares is a
prefix the server can cache. Requests are due at their timestamps (relative to the first
replayed one), divided by the replay speed; each asks for its own output length.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.workload.agentic import tiny_vocabulary
from pytest_kimi.workload.dataset import Workload
from pytest_kimi.workload.rows import DatasetError, fail, json_object, text_lines, type_name
from pytest_kimi.workload.specs import RequestSpec
from pytest_kimi.workload.speedbench import DataFile, sha256_file

BLOCK_TOKENS = 512  # Mooncake's block size
TRACE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace."""

    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def is_trace_row(row: dict[str, object]) -> bool:
    """Whether a JSONL row is a Mooncake trace's (told apart from other formats by fields)."""
    return "hash_ids" in row and "timestamp" in row


def read_trace(path: Path) -> list[TraceRow]:
    """Every row of a trace file, in file order (timestamps may not go backwards)."""
    rows: list[TraceRow] = []
    for number, line in enumerate(text_lines(path), start=1):
        if line.strip():
            rows.append(_row(f"{path}:{number}", number, line))
            if len(rows) > 1 and rows[-1].timestamp_ms < rows[-2].timestamp_ms:
                raise fail(f"{path}:{number}", f"timestamp {rows[-1].timestamp_ms:g} before the "
                           f"previous row's {rows[-2].timestamp_ms:g}", "timestamp")  # fmt: skip
    if not rows:
        raise DatasetError(f"{path}: no requests (an empty trace)")
    return rows


def trace_requests(
    rows: Sequence[TraceRow], *, speed: float = 1.0, vocabulary: Sequence[str] | None = None
) -> list[RequestSpec]:
    """The requests the rows describe: prompts built from their blocks, each with its own
    output length and its arrival in seconds after the first row's (divided by ``speed``)."""
    if not speed > 0:
        raise ValueError(f"trace speed must be > 0, got {speed!r}")
    words = list(vocabulary or tiny_vocabulary())
    blocks: dict[int, list[str]] = {}
    start = rows[0].timestamp_ms if rows else 0.0
    out = []
    for row in rows:
        text = " ".join(_prompt_words(row, blocks, words))
        offset = (row.timestamp_ms - start) / 1000.0 / speed
        out.append(RequestSpec(f"trace-{row.line}", text, row.input_length, "trace",
                               output_len=row.output_length, offset_s=offset))  # fmt: skip
    return out


def _prompt_words(row: TraceRow, blocks: dict[int, list[str]], words: list[str]) -> list[str]:
    """``input_length`` words: each block of its id's words, the last cut short."""
    out: list[str] = []
    for block in row.hash_ids:
        if block not in blocks:
            blocks[block] = random.Random(f"block:{block}").choices(words, k=BLOCK_TOKENS)
        out += blocks[block]
    return out[: row.input_length]


def _row(where: str, number: int, line: str) -> TraceRow:
    data = json_object(where, line)
    for name in TRACE_FIELDS:
        if name not in data:
            raise fail(where, "missing (a Mooncake trace row has timestamp, input_length, "
                              "output_length, hash_ids)", name)  # fmt: skip
    stamp = data["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
        raise fail(where, f"expected milliseconds >= 0, got {stamp!r}", "timestamp")
    lengths = {}
    for name in ("input_length", "output_length"):
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise fail(where, f"expected an integer >= 1, got {value!r}", name)
        lengths[name] = value
    ids = data["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in ids):  # fmt: skip
        raise fail(where, f"expected an array of integers, got {type_name(ids)}", "hash_ids")
    need = -(-lengths["input_length"] // BLOCK_TOKENS)
    if len(ids) < need:
        raise fail(where, f"{len(ids)} blocks of {BLOCK_TOKENS} tokens cannot hold "
                          f"input_length {lengths['input_length']} (needs {need})",
                   "hash_ids")  # fmt: skip
    return TraceRow(number, float(stamp), lengths["input_length"], lengths["output_length"],
                    tuple(ids))  # fmt: skip


def load_trace(path: Path, *, count: int, speed: float = 1.0) -> Workload:
    """The first ``count`` requests of the trace at ``path`` (warm-up ones included)."""
    rows = read_trace(path)
    if len(rows) < count:
        raise DatasetError(f"{path}: has {len(rows)} requests, {count} asked for "
                           "(num_requests plus warmup_requests)")  # fmt: skip
    requests = trace_requests(rows[:count], speed=speed)
    digest = hashlib.sha256()
    for request in requests:
        digest.update(request.text.encode() + b"\n")
    file_sha = sha256_file(path)
    return Workload(
        path=Path(path), file_sha256=file_sha, prompts=(), prompts_sha256=digest.hexdigest(),
        category=None, seed=0, files=(DataFile(Path(path), file_sha),),
        requests=tuple(requests), trace_speed=speed,
    )  # fmt: skip


def read_arrivals(path: Path, *, count: int, speed: float = 1.0) -> tuple[float, ...]:
    """A recorded arrival list: the first ``count`` rows' ``timestamp`` (ms) as seconds after
    the first row's, divided by ``speed``. Any JSONL with a ``timestamp`` per row will do (a
    Mooncake trace's rows, their other fields unread), so a SPEED-Bench or ShareGPT set can be
    sent on a production trace's schedule."""
    if not speed > 0:
        raise ValueError(f"arrival speed must be > 0, got {speed!r}")
    stamps: list[float] = []
    for number, line in enumerate(text_lines(path), start=1):
        if len(stamps) == count:
            break
        if not line.strip():
            continue
        where = f"{path}:{number}"
        stamp = json_object(where, line).get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
            raise fail(where, f"expected milliseconds >= 0, got {stamp!r}", "timestamp")
        if stamps and stamp < stamps[-1]:
            raise fail(where, f"timestamp {stamp:g} before the previous row's {stamps[-1]:g}",
                       "timestamp")  # fmt: skip
        stamps.append(float(stamp))
    if len(stamps) < count:
        raise DatasetError(f"{path}: has {len(stamps)} arrivals, {count} asked for "
                           "(num_requests plus warmup_requests)")  # fmt: skip
    return tuple((t - stamps[0]) / 1000.0 / speed for t in stamps)
