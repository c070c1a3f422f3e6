"""A request's output and where it stands, as the API modules render it on the wire.

:class:`State` is what one answer (a chunk, or a whole request's) is rendered from: the
output text so far and its token ids, the tokens this chunk adds, and the ``meta_info`` of
the mock's wire version (:mod:`pytest_kimi.mock.wire.meta`).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from pytest_kimi.mock.tokenizer_files import SPECIAL_TOKENS, vocabulary
from pytest_kimi.mock.wire.meta import Progress, Times, meta_info


class Words:
    """A request's whole output text, built once, with each token's start offset and id."""

    def __init__(self, words: list[str], ids: list[int]) -> None:
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]  # as detokenized
        self.text = "".join(pieces)
        self.offsets = [0, *accumulate(len(p) for p in pieces)]
        self.ids = ids


def output_words(rid: str, count: int) -> Words:
    """Deterministic output: ``count`` vocabulary words chosen from the request id, with
    their token ids (the mock tokenizer's: the special tokens first, then the words)."""
    vocab = vocabulary()
    seed = sum(rid.encode()) if rid else 0
    picks = [(seed + 7 * i) % len(vocab) for i in range(count)]
    return Words([vocab[i] for i in picks], [len(SPECIAL_TOKENS) + i for i in picks])


class State:
    """One answer's view of a request (see the module docstring). ``before``: tokens sent
    before this chunk (one fewer, or several under speculative decoding); ``replica`` is set
    only under ``--mock-replica-header`` (SGLang's ``meta_info`` has no such key)."""

    def __init__(
        self, progress: Progress, times: Times, words: Words, *, version: str, metrics: bool,
        before: int | None = None, replica: str | None = None, cache_report: bool = False,
    ) -> None:  # fmt: skip
        self.progress, self.times, self.words = progress, times, words
        self.version, self.metrics, self.replica = version, metrics, replica
        self.before = progress.generated - 1 if before is None else before
        self.cache_report = cache_report

    @property
    def cached(self) -> int | None:
        """Prompt tokens found cached, for the OpenAI usage's ``prompt_tokens_details``:
        only under ``--enable-cache-report`` (None: the usage has no details)."""
        return self.progress.cached if self.cache_report else None

    @property
    def rid(self) -> str:
        return self.progress.rid

    @property
    def prompt(self) -> int:
        return self.progress.prompt

    @property
    def generated(self) -> int:
        return self.progress.generated

    @property
    def done(self) -> bool:
        return self.progress.finish is not None

    @property
    def finish(self) -> str | None:
        """The OpenAI ``finish_reason``: ``None``, ``"length"`` or ``"abort"``."""
        return self.progress.finish

    def text(self, start: int = 0) -> str:
        """Tokens ``start`` .. generated as text: a slice, not a rebuild (O(1) per chunk)."""
        return self.span(start, self.generated)

    def new_text(self) -> str:
        """The tokens this chunk adds (an OpenAI delta)."""
        return self.text(self.before)

    def span(self, start: int, end: int) -> str:
        """Tokens ``start`` .. ``end`` as text."""
        return self.words.text[self.words.offsets[start] : self.words.offsets[end]]

    def output_ids(self) -> list[int]:
        """The output's token ids so far (``/generate`` sends them all on every chunk)."""
        return self.words.ids[: self.generated]

    def meta(self) -> dict[str, Any]:
        """The wire version's ``meta_info`` for this answer."""
        meta = meta_info(self.version, self.progress, self.times, self.metrics)
        if self.replica is not None:
            meta["kimi_replica"] = self.replica
        return meta
