"""The tiny tokenizer shipped with the package, and what the mock needs to know about it.

The directory is what a mock worker reports as its ``model_path``: the SGLang router and peer
clients (``sglang.bench_serving``, AIPerf, guidellm) load a tokenizer from there, and a local
directory keeps them off the network. ``scripts/build_mock_tokenizer.py`` writes it.

This module reads the files with ``json`` only, so the mock server and the workload code can
count tokens and pick output words without importing ``tokenizers`` or ``transformers``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pytest_kimi.config.serverargs import MOCK_TOKENIZER_DIR

TOKENIZER_DIR: Path = MOCK_TOKENIZER_DIR
"""Directory with tokenizer.json, tokenizer_config.json, special_tokens_map.json, config.json."""

SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "</s>", "<unk>", "<pad>")
"""Ids 0-3 of the vocabulary; every other id is a plain word."""

_WORDS: tuple[str, ...] | None = None
_IDS: dict[str, int] | None = None
UNK_ID = SPECIAL_TOKENS.index("<unk>")


def vocabulary() -> list[str]:
    """Return the plain words of the vocabulary in id order, without the special tokens.

    Read from ``tokenizer.json`` (not a copy of the word list) so the mock can never generate a
    word the tokenizer would map to ``<unk>``. Cached after the first call; a fresh list is
    returned each time so callers may change it.
    """
    global _WORDS
    if _WORDS is None:
        data = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
        vocab: dict[str, int] = data["model"]["vocab"]
        _WORDS = tuple(
            word
            for word, _ in sorted(vocab.items(), key=lambda item: item[1])
            if word not in SPECIAL_TOKENS
        )
    return list(_WORDS)


def count_tokens(text: str) -> int:
    """Return the number of tokens the bundled tokenizer gives ``text``.

    The tokenizer splits on whitespace and adds no BOS/EOS, so this equals
    ``len(text.split())`` for the texts this project produces (it may differ from the Rust
    tokenizer only for exotic separators such as U+001C..U+001F, which Python treats as
    whitespace and Rust does not).
    """
    return len(text.split())


def token_ids(text: str) -> tuple[int, ...]:
    """The ids the bundled tokenizer gives ``text`` (a word it lacks is ``<unk>``): what the
    mock's prefix cache matches, as SGLang's matches the tokenizer's ids."""
    global _IDS
    if _IDS is None:
        offset = len(SPECIAL_TOKENS)
        _IDS = {word: offset + i for i, word in enumerate(vocabulary())}
    ids = _IDS
    return tuple(ids.get(word, UNK_ID) for word in text.split())
