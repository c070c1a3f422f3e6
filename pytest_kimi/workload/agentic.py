"""A seeded synthetic agentic workload: sessions of a task, then tool results, one system prompt.

Why: an agent's traffic has a shape that decides what a layout delivers. Every session begins
with the same long system prompt (the agent's instructions and tool schemas), then a task;
each later turn sends a tool's result back, after the tool ran (the think time). Each request
resends the whole conversation, so most of its prompt is a prefix the server has seen: the
system prompt across sessions, the conversation so far within one. Real agent traces are
private; this generator gives the same structure at sizes a user chooses, the same for the
same seed.

Text is words of the tiny model's vocabulary (``pytest_kimi/data/tiny-model``), which the
mock's tokenizer shares: one word is one token there, so the sizes are exact on the mock and
on the tiny real model, and near for any other tokenizer (the server's counts are kept).
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimi.workload.sessions import Session

VOCABULARY_FILE = Path(__file__).resolve().parents[1] / "data" / "tiny-model" / "tokenizer.json"
CATEGORY = "agentic"


@dataclass(frozen=True)
class Agentic:
    """The generator's settings (the cluster file's ``kind: agentic`` workload)."""

    sessions: int = 16
    turns: int = 6  # per session: the task, then turns - 1 tool results
    system_prompt_tokens: int = 2048  # shared by every session
    task_tokens: int = 256  # the first user turn
    tool_result_tokens: int = 512  # each later turn (the answers' length is the workload's)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sessions", "turns", "task_tokens", "tool_result_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"agentic workload: {name} must be >= 1, got "
                                 f"{getattr(self, name)}")  # fmt: skip
        if self.system_prompt_tokens < 0:
            raise ValueError("agentic workload: system_prompt_tokens must be >= 0")


def agentic_sessions(spec: Agentic, vocabulary: Sequence[str] | None = None) -> list[Session]:
    """The sessions ``spec`` describes; the same for the same settings."""
    words = list(vocabulary or tiny_vocabulary())
    rng = random.Random(spec.seed)
    system = _text(rng, words, spec.system_prompt_tokens)
    sessions = []
    for i in range(spec.sessions):
        turns = [_text(rng, words, spec.task_tokens)]
        turns += [_text(rng, words, spec.tool_result_tokens) for _ in range(spec.turns - 1)]
        sessions.append(Session(f"agent-{i:04d}", tuple(turns), system, CATEGORY))
    return sessions


@functools.cache
def tiny_vocabulary() -> tuple[str, ...]:
    """The tiny model's words (its special tokens left out)."""
    vocab = json.loads(VOCABULARY_FILE.read_text(encoding="utf-8"))["model"]["vocab"]
    return tuple(sorted(w for w in vocab if w.isalpha()))


def _text(rng: random.Random, words: Sequence[str], n: int) -> str:
    return " ".join(rng.choices(words, k=n))
