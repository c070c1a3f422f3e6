"""A session workload's sessions, chosen and described as the single-turn prompts are.

``sessions``: read from a JSONL file of sessions (:mod:`.conversations`), filtered by
category, then ``count`` chosen with ``random.Random(seed).sample`` in file order, as
:func:`~pytest_kimi.workload.dataset.load_workload` chooses prompts. ``agentic``: generated
(:mod:`.agentic`), the same for the same settings. Either way the manifest records what was
sent: the file's SHA-256 (or the generator's settings'), the session ids, and the SHA-256 of
every turn's text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from pathlib import Path

from pytest_kimi.workload import prompts as prompts_mod
from pytest_kimi.workload.agentic import Agentic, agentic_sessions
from pytest_kimi.workload.conversations import read_sessions
from pytest_kimi.workload.dataset import Workload
from pytest_kimi.workload.rows import DatasetError
from pytest_kimi.workload.sessions import Session
from pytest_kimi.workload.speedbench import DataFile, sha256_file


def load_sessions(
    kind: str,
    path: Path | None,
    *,
    count: int,
    seed: int = 0,
    category: str | None = None,
    agentic: Agentic | None = None,
    prompt: str = prompts_mod.RAW,
    api: str = "generate",
    tokenizer_dir: Path | None = None,
) -> Workload:
    """``count`` sessions (``kind``: ``sessions`` from ``path``, or ``agentic``), with the
    chat template their conversations are sent in (``prompt``, as for single turns)."""
    if kind == "agentic":
        spec = dataclasses.replace(agentic or Agentic(), sessions=count, seed=seed)
        chosen = agentic_sessions(spec)
        settings = json.dumps(dataclasses.asdict(spec), sort_keys=True).encode()
        where, digest, files = Path("agentic"), hashlib.sha256(settings).hexdigest(), ()
    elif path is None:
        raise DatasetError("a sessions workload needs a dataset: a JSONL file of sessions")
    else:
        chosen = _choose(path, read_sessions(path), count, seed, category)
        digest = sha256_file(path)
        where, files = path, (DataFile(path, digest),)
    _, construction = prompts_mod.construct([], prompt, api, tokenizer_dir)
    template = None
    if construction.applied == prompts_mod.CHAT_TEMPLATE and tokenizer_dir is not None:
        template = prompts_mod.load_chat_template(tokenizer_dir)
    return Workload(
        path=where, file_sha256=digest, prompts=(), prompts_sha256=_sha256_turns(chosen),
        category=category, seed=seed, files=files, construction=construction,
        sessions=tuple(chosen), chat_template=template,
    )  # fmt: skip


def _choose(
    path: Path, sessions: list[Session], count: int, seed: int, category: str | None
) -> list[Session]:
    pool = [s for s in sessions if category is None or s.category == category]
    if not pool:
        present = ", ".join(sorted({s.category for s in sessions}))
        raise DatasetError(f"{path}: no sessions with category {category!r}; "
                           f"categories present: {present}")  # fmt: skip
    if len(pool) < count:
        raise DatasetError(f"{path}: has {len(pool)} sessions, {count} requested "
                           "(num_requests counts sessions, warm-up ones included)")  # fmt: skip
    return random.Random(seed).sample(pool, count)


def _sha256_turns(sessions: list[Session]) -> str:
    """Every session's system prompt and turns, in order, each followed by a newline."""
    digest = hashlib.sha256()
    for session in sessions:
        for text in (session.system, *session.turns):
            digest.update(text.encode() + b"\n")
    return digest.hexdigest()
