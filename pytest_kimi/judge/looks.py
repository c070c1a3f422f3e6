"""SLO verdicts at a look of ``--kimi-until-decided`` (:mod:`pytest_kimi.run.untildecided`
sends the batches): the plan of looks a point's requests allow, and each SLO judged at a look's
spent levels (:mod:`pytest_kimi.results.sequential`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kimi.results import slo as slo_mod
from pytest_kimi.results.sequential import Look, LookPlan, batch_size, batches_for, looks_for

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.results.summary import Summary


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
    inputs: Inputs, layout: str, records: list[RequestRecord], looks: Mapping[str, int],
    whole: Summary | None = None, extra: tuple[slo_mod.Slo, ...] = (),
) -> list[slo_mod.Verdict]:  # fmt: skip
    """The layout's SLOs (and ``extra`` ones), each at its look in ``looks`` (the look it was
    decided at; one not named there, at the last) on the requests sent by then. An SLO
    without bounds (a whole-run figure) is compared on ``whole``, the run's summary, where
    given."""
    from pytest_kimi.results.metrics import per_request_ms, summarize

    assert inputs.confidence is not None and inputs.options.until_decided is not None
    planned = sum(1 for r in records if not r.warmup and r.batch == 0)
    plan = look_plan(planned, inputs.options.until_decided, inputs.confidence)
    last = max(looks.values(), default=0)
    cache: dict[int, tuple[Summary, dict[str, list[float]]]] = {}

    def at(look: int) -> tuple[Summary, dict[str, list[float]]]:
        if look not in cache:
            sent = [r for r in records if r.warmup or (r.batch is not None and r.batch <= look)]
            cache[look] = (summarize(sent, time_scale=inputs.time_scale,
                                     percentiles=inputs.percentiles(layout)),
                           per_request_ms(sent, time_scale=inputs.time_scale))  # fmt: skip
        return cache[look]

    out = []
    for slo in {**inputs.slos[layout], **{s.name: s for s in extra}}.values():
        if whole is not None and not slo_mod.has_bounds(slo):
            out.append(slo_mod.evaluate(slo, whole, None, inputs.confidence))
            continue
        look = looks.get(slo.name, last)
        summary, samples = at(look)
        out.append(slo_mod.evaluate(slo, summary, samples, inputs.confidence,
                                    slo_look(plan, slo, look)))  # fmt: skip
    return out
