"""``--kimi-until-decided``: after a point's planned requests, more batches on the same
deployment until every SLO of the point is decided or the most requests were sent.

Each batch is the planned run again with new prompts (:func:`pytest_kimi.config.pointdata.
batch_prompts`), half as many again (the first look after the planned one then comes at 2.5x
the planned requests: :func:`pytest_kimi.results.sequential.batch_size`), at the same
concurrency from its start. After each batch the SLOs are judged
at that look's spent levels (:mod:`pytest_kimi.results.sequential`), never at the fixed
confidence again: the error rate holds over every look. Records keep their batch (0: the
planned requests).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_kimi.judge.looks import verdicts_at

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.points import Point
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.workload.client import RequestSpec
    from pytest_kimi.workload.dataset import Workload


def send_until_decided(
    inputs: Inputs,
    layout: str,
    point: Point,
    records: list[RequestRecord],
    send: Callable[[list[RequestSpec]], list[RequestRecord]],
) -> tuple[list[RequestRecord], dict[str, int], str]:
    """``records`` (the warm-up and the planned requests) with the batches sent after them;
    the look each SLO was decided at (its first decisive one: a later look, at its smaller
    level, never takes a verdict back; one still undecided, the last), and a note saying how
    it ended."""
    from pytest_kimi.workload.client import RequestSpec

    for record in records:
        if not record.warmup:
            record.batch = 0
    batches: list[Workload] = inputs.batches_of(point)
    wl = inputs.workload_of(point)
    decided: dict[str, int] = {}
    look = 0
    while True:
        pending = {name: look for name in inputs.slos[layout] if name not in decided}
        for verdict in verdicts_at(inputs, layout, records, pending):
            if verdict.outcome != "undecided" and verdict.slo.name in pending:
                decided[verdict.slo.name] = look
        undecided = [name for name in inputs.slos[layout] if name not in decided]
        sent = sum(1 for r in records if not r.warmup)
        if not undecided or look == len(batches):
            return records, {**decided, **dict.fromkeys(undecided, look)}, _ending(
                undecided, sent, look, _repeats(records))  # fmt: skip
        batch = look + 1
        specs = [RequestSpec(f"{p.id}#b{batch}", p.text, wl.input_len, p.category)
                 for p in batches[look].prompts]  # fmt: skip
        more = send(specs)
        for i, record in enumerate(more):
            record.batch, record.index = batch, len(records) + i
        records = records + more
        look = batch


def _repeats(records: list[RequestRecord]) -> int:
    """Measured requests whose prompt an earlier one of the run already sent."""
    ids = [r.prompt_id.split("#b")[0] for r in records if not r.warmup]
    return len(ids) - len(set(ids))


def _ending(undecided: list[str], sent: int, look: int, repeats: int) -> str:
    """The note: how the batches ended, and how many prompts they repeated."""
    text = (f"until decided: {', '.join(undecided)} still undecided after the most "
            f"requests, {sent}" if undecided else
            f"until decided: every SLO decided after {sent} requests (look {look + 1}, "
            f"batch {look})")  # fmt: skip
    if repeats:
        text += (f"; {repeats} of the {sent} prompts repeated earlier ones (the dataset has "
                 "too few rows for new ones: with a prefix cache on, a repeat is served "
                 "from it)")  # fmt: skip
    return text
