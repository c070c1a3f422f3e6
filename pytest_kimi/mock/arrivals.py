"""Requests on their way into an engine's model, in the order the model takes them in.

The engine (:class:`pytest_kimi.mock.engine.Engine`) stamps each request with the cluster time
the model takes it in (its arrival, or a decode server's KV landing) and keeps it here until
the model reaches that time; requests stamped alike keep the order they came in.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from pytest_kimi.mock.simrequest import NO_IDS, TokenIds
from pytest_kimi.mock.speculative import Drafts


@dataclass(frozen=True, order=True)
class Arrival:
    """A request the model takes in at cluster time ``at``: a new prompt, or (a decode
    server's) one whose KV cache lands then (``prebuilt``)."""

    at: float
    seq: int  # equal times keep the order they came in
    rid: str = field(compare=False)
    prompt: int = field(compare=False)
    max_new: int = field(compare=False)
    prebuilt: bool = field(default=False, compare=False)
    drafts: Drafts | None = field(default=None, compare=False)
    ids: TokenIds = field(default=NO_IDS, compare=False)


class Arrivals:
    """The requests the model has not taken in yet, in time order."""

    def __init__(self) -> None:
        self._queue: list[Arrival] = []  # in time order
        self._seq = 0

    def add(
        self, at: float, rid: str, prompt: int, max_new: int, prebuilt: bool,
        drafts: Drafts | None, ids: TokenIds = NO_IDS,
    ) -> None:  # fmt: skip
        self._seq += 1
        arrival = Arrival(at, self._seq, rid, prompt, max_new, prebuilt, drafts, ids)
        bisect.insort(self._queue, arrival)

    def drop(self, rid: str) -> None:
        """Forget a request (aborted before the model took it in)."""
        self._queue = [a for a in self._queue if a.rid != rid]

    def first(self) -> float | None:
        """When the model takes the next one in (cluster time); None: there is none."""
        return self._queue[0].at if self._queue else None

    def due(self, until: float) -> Iterator[Arrival]:
        """Those the model takes in by cluster time ``until``, in order, each gone from here
        as it is taken."""
        while self._queue and self._queue[0].at <= until:
            yield self._queue.pop(0)

    def prompts(self) -> int:
        """How many are new prompts (not a decode server's landing KV)."""
        return sum(not a.prebuilt for a in self._queue)
