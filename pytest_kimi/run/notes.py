"""What a measured run's own records say about how it was measured, as notes for its result:
prompts the server counted far off their nominal length, the client's turnaround between a
freed slot and the next send (in a closed loop it is cluster time in which no request
arrives), an open loop's requests sent late against their schedule, and what the mock's
shared cluster clock kept out of cluster time.

Pure functions of the records (and the shared clock's counters); :mod:`pytest_kimi.run.measure`
adds what they return to the result.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.workload.sharedclock import Stats


def prompt_length_notes(
    records: list[RequestRecord], nominal: int, tolerance: float = 0.10
) -> list[str]:
    """Warn where the server counted a prompt more than ``tolerance`` off its nominal length.

    SPEED-Bench pads prompts with tiktoken's o200k_base, so "16K" is nominal for the served
    model's tokenizer; a large gap means the workload is not the one the table claims.
    """
    off = [
        r
        for r in records
        if not r.warmup
        and r.prompt_tokens is not None
        and abs(r.prompt_tokens - nominal) > tolerance * nominal
    ]
    if not off:
        return []
    worst = max(off, key=lambda r: abs(r.prompt_tokens - nominal))
    return [
        f"{len(off)} of {sum(not r.warmup for r in records)} prompts differ from the nominal "
        f"{nominal} input tokens by more than {tolerance:.0%} as counted by the server "
        f"(worst: {worst.prompt_id} with {worst.prompt_tokens})"
    ]


def client_turnaround(records: list[RequestRecord], concurrency: int) -> list[float]:
    """Wall seconds from each freed slot (a measured request's last token) to the next
    request's send, in a closed loop at ``concurrency``: the ``k``-th send after the first
    ``concurrency`` is the one the ``k``-th end made room for. Failed requests count (their
    end frees the slot too); a record without an end or a send ends the pairing."""
    measured = [r for r in records if not r.warmup]
    sends = sorted(r.latency_start for r in measured)
    ends = sorted(r.end_time for r in measured if r.end_time is not None)
    follow = sends[concurrency:]
    return [max(0.0, s - e) for s, e in zip(follow, ends, strict=False)]


def clock_notes(before: Stats, after: Stats, time_scale: float) -> list[str]:
    """What the shared cluster clock kept out of cluster time during the measured run, from
    its own counters: the wall time it stood still for messages on their way (client,
    router, HTTP) and at an engine's next event (a mock process waking late). Holds nobody
    let go are counted: each cost wall time, not accuracy, but a run that has them lost a
    request on its way or a process died."""
    held = after.held_wall_s - before.held_wall_s
    caught_up = after.bound_wall_s - before.bound_wall_s
    notes = [
        f"one clock: the mock and the client shared one cluster clock (time scale "
        f"1:{time_scale:g}); during the measured run it stood still for {held:.2f} s of wall "
        f"time while requests and first/last tokens were on their way (client, router, HTTP) "
        f"and {caught_up:.2f} s while a mock process caught up: none of it is in the figures "
        f"(longest single hold {after.longest_hold_s * 1e3:.1f} ms)"
    ]
    if after.stalls > before.stalls:
        from pytest_kimi.workload.sharedclock import HOLD_STALL_S

        notes.append(
            f"one clock: {after.stalls - before.stalls} hold(s) nobody let go were dropped "
            f"after {HOLD_STALL_S:g} s (more on a loaded machine) of wall time each (a request "
            "lost on its way, or a process that died): the figures around them may be off"
        )
    return notes


def turnaround_notes(
    records: list[RequestRecord], concurrency: int, time_scale: float
) -> list[str]:
    """The client's own turnaround, measured, in wall time and (on the mock) in cluster time:
    the mock's model takes a request's arrival when it reaches the server, so every wall
    millisecond the client spends between a last token and the next send is ``time_scale``
    milliseconds of cluster time in which no request arrives (docs/mock.md, "One clock")."""
    gaps = sorted(client_turnaround(records, concurrency))
    if not gaps:
        return []
    median, p95 = gaps[len(gaps) // 2], gaps[min(len(gaps) - 1, math.ceil(0.95 * len(gaps)) - 1)]
    text = (
        f"client turnaround (a request's last token to the next request sent, closed loop): "
        f"median {median * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms wall over {len(gaps)} sends"
    )
    if time_scale != 1:
        text += (
            f"; at time scale 1:{time_scale:g} that is {median * time_scale:.2f} s of cluster "
            "time before each follow-up is even sent"
        )
    return [text]


DISPATCH_LIMIT_MS = 5.0
"""An open loop's p99 dispatch delay above this: the client, not the server, set the pace."""


def dispatch_notes(
    records: list[RequestRecord], concurrency: int, time_scale: float,
    limit_ms: float = DISPATCH_LIMIT_MS,
) -> list[str]:  # fmt: skip
    """Say so when an open loop's p99 dispatch delay (a request's send less its scheduled
    instant, over measured requests) exceeds ``limit_ms``, and why: a request due while
    ``concurrency`` others were in flight waited for a slot (the cap, not the server's speed,
    held it back); any other was late because the client's own loop was."""
    late = [r for r in records if not r.warmup and r.dispatch_delay is not None]
    if not late:
        return []
    delays_ms = np.array([r.dispatch_delay for r in late]) * 1e3 * time_scale
    p99 = float(np.percentile(delays_ms, 99))
    if p99 <= limit_ms:
        return []
    over = [r for r, ms in zip(late, delays_ms, strict=True) if ms > limit_ms]
    slots = _Occupancy(records)
    capped = sum(slots.full_while_waiting(r, concurrency) for r in over)
    return [
        f"the client, not the server, set the pace: p99 dispatch delay {p99:.1f} ms (over "
        f"{limit_ms:g} ms; max {delays_ms.max():.1f} ms): {len(over)} of {len(late)} requests "
        f"left more than {limit_ms:g} ms after their scheduled time, {capped} of them because "
        f"every one of the {concurrency} concurrency slots was taken when they were due "
        f"(raise concurrency to measure the schedule) and {len(over) - capped} because the "
        "client itself was late; TTFT and E2E from the schedule count that wait"
    ]


class _Occupancy:
    """When the concurrency slots were taken: by each measured request from its send to its
    end, or, for sessions (where concurrency counts sessions), by each session from its first
    turn's send to its last turn's end."""

    def __init__(self, records: list[RequestRecord]) -> None:
        spans: dict[object, tuple[float, float]] = {}
        for r in records:
            if r.warmup:
                continue
            key = r.session_id if r.session_id is not None else id(r)
            end = math.inf if r.end_time is None else r.end_time
            start, stop = spans.get(key, (r.latency_start, end))
            spans[key] = (min(start, r.latency_start), max(stop, end))
        self.owner = {id(r): (r.session_id if r.session_id is not None else id(r))
                      for r in records}  # fmt: skip
        self.spans = spans
        self.starts = sorted(s for s, _ in spans.values())
        self.ends = sorted(e for _, e in spans.values())

    def busy(self, t: float) -> int:
        """Slots taken at ``t``."""
        return bisect.bisect_right(self.starts, t) - bisect.bisect_right(self.ends, t)

    def full_while_waiting(self, record: RequestRecord, concurrency: int) -> bool:
        """Whether every slot was taken at some instant between ``record``'s due time and its
        send, by others (a session's later turn holds its own slot: never capped)."""
        if record.session_id is not None and record.turn:
            return False
        due, sent = record.intended_time, record.latency_start
        if due is None:
            return False
        own = self.spans[self.owner[id(record)]]
        lo, hi = bisect.bisect_left(self.starts, due), bisect.bisect_left(self.starts, sent)
        for t in (due, *self.starts[lo:hi]):  # the count only rises where a span starts
            mine = 1 if own[0] <= t < own[1] else 0
            if self.busy(t) - mine >= concurrency:
                return True
        return False


def prefix_cache_notes(server_args: Mapping[str, Any], sessions: bool) -> list[str]:
    """A multi-turn workload measured with SGLang's prefix cache off says so: each turn then
    prefills its whole conversation again, which no deployment serving agents would do."""
    if not sessions or not server_args.get("disable-radix-cache"):
        return []
    return ["prefix cache off (--disable-radix-cache) on a multi-turn workload: every turn "
            "prefilled its whole conversation again, so later turns' TTFT and the hit rate are "
            "not what a deployment with the cache would give; remove the flag (args: "
            "{disable-radix-cache: null}) to measure that"]  # fmt: skip


def unsent_turn_notes(planned: int, records: list[RequestRecord]) -> list[str]:
    """Turns a session never sent because an earlier one failed: counted, not silently lost
    (the summary counts only the requests that were sent)."""
    sent = sum(not r.warmup for r in records)
    if sent >= planned:
        return []
    return [f"{planned - sent} of {planned} session turns were not sent: a session ends at its "
            "first failed turn (the next would need its answer)"]  # fmt: skip
