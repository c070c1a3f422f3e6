"""Multi-turn sessions: a conversation sent turn by turn, each request carrying all before it.

Why: agents and chat users do not send one prompt; they send a growing conversation. Each
request of a session sends the system prompt, every earlier user turn followed by the answer
the server actually returned to it, and then the next turn, after a think time (a user
reading, an agent's tool running). So each request's prompt begins with the whole of the
previous one and its answer: the prefix SGLang's radix cache reuses, and the router's
``cache_aware`` policy steers by. The sources of sessions are :mod:`.conversations` (files)
and :mod:`.agentic` (a seeded generator); the client sends them
(:mod:`pytest_kimi.workload.sessionsend`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimi.workload.rows import UNCATEGORIZED

THINK_KINDS: tuple[str, ...] = ("fixed", "exponential")
"""``fixed``: every pause is the given seconds; ``exponential``: drawn with that mean, seeded."""

Message = dict[str, str]


@dataclass(frozen=True)
class Session:
    """One conversation: an optional system prompt and its user turns, in order."""

    id: str
    turns: tuple[str, ...]
    system: str = ""
    category: str = UNCATEGORIZED
    start_s: float | None = None  # an arrival list's: when it starts, after the first's

    def messages(self, turn: int, answers: Sequence[str]) -> list[Message]:
        """The chat messages of the session's request ``turn`` (0-based): the system prompt,
        each earlier user turn followed by the answer the server returned to it (``answers``,
        one per earlier turn), then this turn."""
        if len(answers) < turn:
            raise ValueError(f"turn {turn} of session {self.id} needs {turn} answers, "
                             f"got {len(answers)}")  # fmt: skip
        out = [{"role": "system", "content": self.system}] if self.system else []
        for k in range(turn):
            out.append({"role": "user", "content": self.turns[k]})
            out.append({"role": "assistant", "content": answers[k]})
        out.append({"role": "user", "content": self.turns[turn]})
        return out


@dataclass(frozen=True)
class ThinkTime:
    """The pause between an answer and the session's next turn."""

    seconds: float = 0.0
    kind: str = "fixed"

    def __post_init__(self) -> None:
        if self.kind not in THINK_KINDS:
            raise ValueError(f"think time kind {self.kind!r}: expected one of "
                             f"{', '.join(THINK_KINDS)}")  # fmt: skip
        if not self.seconds >= 0:
            raise ValueError(f"think time {self.seconds!r}: expected seconds >= 0")

    def draw(self, rng: random.Random) -> float:
        """One pause, in seconds."""
        if self.kind == "exponential" and self.seconds > 0:
            return rng.expovariate(1.0 / self.seconds)
        return self.seconds


def raw_text(messages: Sequence[Message]) -> str:
    """A conversation as plain text, for a server sent no chat template: the contents, a
    blank line apart. Each request's text begins with the previous request's and its answer."""
    return "\n\n".join(m["content"] for m in messages)


def words(text: str) -> int:
    """Whitespace-separated words: a session request's nominal length in tokens (one word is
    one token to the mock's and the tiny model's tokenizers; the server's count is kept too)."""
    return len(text.split())
