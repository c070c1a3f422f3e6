"""A request as the mock's scheduler sees it, and the tokens it gives out.

:class:`SimRequest` is one request's model-side state and ground truth (cluster seconds),
shared by the scheduler (:mod:`pytest_kimi.mock.scheduler`), the batches that carry it
(:mod:`pytest_kimi.mock.pipeline`), the live engine and the offline twin; :class:`TokenEvent`
is what a finished batch step gives a request's stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_kimi.mock.speculative import Drafts


@dataclass(frozen=True)
class TokenEvent:
    """``count`` new tokens for ``rid`` at cluster time ``time``; ``aborted``: no tokens, the
    request was aborted (``/abort_request``) and ends here."""

    rid: str
    time: float
    count: int
    generated: int
    finished: bool
    aborted: bool = False


@dataclass(frozen=True)
class TokenIds:
    """A request's prompt and answer as token ids, for the prefix cache (empty: unknown)."""

    prompt: tuple[int, ...] = ()
    answer: tuple[int, ...] = ()


NO_IDS = TokenIds()


@dataclass
class SimRequest:
    """Model-side state and ground truth of one request (cluster seconds)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    arrival: float
    prefilled: int = 0
    generated: int = 0
    in_flight: bool = False
    admitted_at: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per token
    finished_at: float | None = None
    drafts: Drafts | None = None  # speculative decoding: this request's acceptance and counts
    # the prefix cache (pytest_kimi.mock.prefixreuse): the prompt's and the answer's token
    # ids (empty: not known, nothing cached), prompt tokens found cached when admitted, and
    # the tree node its computed tokens end at while it runs (locked)
    tokens: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    cached: int = 0
    cache_node: object | None = None
    in_tree: int = 0  # of its tokens, how many the tree holds (the rest are its own)

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def ground_truth(self) -> dict:
        return {
            "rid": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "arrival": self.arrival,
            "admitted": self.admitted_at,
            "first_token": self.first_token_at,
            "token_times": list(self.token_times),
            "finished": self.finished_at,
        }

    def can_decode(self) -> bool:
        return not self.in_flight and self.generated > 0 and self.finished_at is None

    def can_prefill(self) -> bool:
        return (
            not self.in_flight and self.prefilled < self.prompt_tokens and self.finished_at is None
        )

    def emit(self, at: float, n: int = 1) -> TokenEvent:
        """``n`` tokens at once (speculative decoding's accepted drafts plus the target's
        own), never past ``max_new_tokens`` (SGLang stops a request there)."""
        n = min(n, self.max_new_tokens - self.generated)
        self.generated += n
        self.token_times.extend([at] * n)
        finished = self.generated >= self.max_new_tokens
        if finished:
            self.finished_at = at
        return TokenEvent(self.rid, at, n, self.generated, finished)
