"""SLO verdicts at a look of ``--kimi-until-decided`` (:mod:`pytest_kimi.run.untildecided`
sends the batches): the plan of looks a point's requests allow, and each SLO judged at a look's
spent levels (:mod:`pytest_kimi.results.sequential`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kimi.results import slo as slo_mod
from pytest_kimi.results.sequential import Look, LookPlan, batch_size, batches_for, looks_for

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.results.records import RequestRecord


def look_plan(planned: int, most: int, confidence: float) -> LookPlan:
    """Looks after the planned requests and after each batch (:func:`batch_size`), up to
    ``most`` rounded up to a whole batch."""
    batch = batch_size(planned)
    whole = planned + batch * batches_for(planned, most)
    return LookPlan(first=planned, batch=batch, most=whole, alpha=1 - confidence)


def slo_look(plan: LookPlan, slo: slo_mod.Slo, index: int) -> Look:
    """Look ``index`` of ``plan`` as ``slo``'s bounds are spent (a percentile's upper bound
    has none before enough requests)."""
    return looks_for(plan, slo_mod.bounded_percentile(slo))[index]


def verdicts_at(
    inputs: Inputs, layout: str, records: list[RequestRecord], look: int,
    extra: tuple[slo_mod.Slo, ...] = (),
) -> list[slo_mod.Verdict]:  # fmt: skip
    """The layout's SLOs (and ``extra`` ones) on ``records`` at look ``look``."""
    from pytest_kimi.results.metrics import per_request_ms, summarize

    assert inputs.confidence is not None and inputs.options.until_decided is not None
    measured = [r for r in records if not r.warmup]
    planned = sum(1 for r in measured if r.batch == 0)
    plan = look_plan(planned, inputs.options.until_decided, inputs.confidence)
    summary = summarize(records, time_scale=inputs.time_scale,
                        percentiles=inputs.percentiles(layout))  # fmt: skip
    samples = per_request_ms(records, time_scale=inputs.time_scale)
    slos = {**inputs.slos[layout], **{s.name: s for s in extra}}
    return [slo_mod.evaluate(s, summary, samples, inputs.confidence, slo_look(plan, s, look))
            for s in slos.values()]  # fmt: skip
