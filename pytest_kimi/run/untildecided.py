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
) -> tuple[list[RequestRecord], int, str]:
    """``records`` (the warm-up and the planned requests) with the batches sent after them,
    the index of the last look, and a note saying how it ended."""
    from pytest_kimi.workload.client import RequestSpec

    for record in records:
        if not record.warmup:
            record.batch = 0
    batches: list[Workload] = inputs.batches_of(point)
    wl = inputs.workload_of(point)
    look = 0
    while True:
        undecided = [v.slo.name for v in verdicts_at(inputs, layout, records, look)
                     if v.outcome == "undecided"]  # fmt: skip
        sent = sum(1 for r in records if not r.warmup)
        if not undecided:
            return records, look, (f"until decided: every SLO decided after {sent} requests "
                                   f"(look {look + 1}, batch {look})")
        if look == len(batches):
            return records, look, (f"until decided: {', '.join(undecided)} still undecided "
                                   f"after the most requests, {sent}")  # fmt: skip
        batch = look + 1
        specs = [RequestSpec(f"{p.id}#b{batch}", p.text, wl.input_len, p.category)
                 for p in batches[look].prompts]  # fmt: skip
        more = send(specs)
        for i, record in enumerate(more):
            record.batch, record.index = batch, len(records) + i
        records = records + more
        look = batch
