"""Planned looks for ``--kimi-until-decided`` (:mod:`pytest_kimi.results.sequential`): the
error spent per look adds up to no more than promised, a side without a bound at a look
passes its share on, and over many seeded runs the chance of a wrong verdict at any look stays
under the stated rate where recomputing a fixed interval at each look exceeds it."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kimi.results.intervals import quantile_ranks
from pytest_kimi.results.sequential import LookPlan


def test_the_looks_are_the_planned_requests_then_a_batch_at_a_time_up_to_the_most():
    assert LookPlan(40, 60, 400, 0.05).sizes() == [40, 100, 160, 220, 280, 340, 400]
    assert LookPlan(40, 40, 400, 0.05).sizes() == [40, 80, 120, 160, 200, 240, 280, 320, 360, 400]
    assert LookPlan(400, 40, 400, 0.05).sizes() == [400]


def test_a_side_spends_at_most_alpha_and_the_power_family_front_loads_it():
    plan = LookPlan(40, 60, 400, 0.05)
    levels = plan.levels()
    assert sum(levels) == pytest.approx(0.05) and all(a > 0 for a in levels)
    assert plan.spent(100) == pytest.approx(0.05 * 0.25**0.2)  # three quarters by a quarter
    even = LookPlan(40, 60, 400, 0.05, power=1).levels()
    assert even[0] == pytest.approx(0.005) and levels[0] > even[0]


def test_a_look_without_a_bound_passes_its_share_on():
    plan = LookPlan(40, 60, 400, 0.05)
    upper = plan.levels(lambda n, a: quantile_ranks(n, 0.95, 1 - a)[1] is not None)
    assert upper[0] == 0  # 40 requests bound no p95 from above
    assert upper[1] == pytest.approx(plan.spent(100))  # look two spends both looks' share
    assert sum(upper) == pytest.approx(0.05)


@pytest.mark.parametrize("bad", [dict(first=0), dict(batch=0), dict(alpha=0.6), dict(most=10)])
def test_a_plan_that_cannot_be_followed_is_refused(bad):
    with pytest.raises(ValueError, match="a look plan needs"):
        LookPlan(**{**dict(first=40, batch=60, most=400, alpha=0.05), **bad})


def _fails(values: np.ndarray, limit: float, looks: list[tuple[int, int | None]]) -> bool:
    """Whether any look (requests, the lower bound's rank) fails ``limit``."""
    return any(lo is not None and np.partition(values[:n], lo - 1)[lo - 1] > limit
               for n, lo in looks)  # fmt: skip


def _looks(sizes: list[int], levels: list[float]) -> list[tuple[int, int | None]]:
    return [(n, quantile_ranks(n, 0.95, 1 - a)[0] if a > 0 else None)
            for n, a in zip(sizes, levels, strict=True)]  # fmt: skip


def test_over_repeated_looks_a_limit_at_the_truth_is_failed_no_more_often_than_promised():
    # the p95 of a uniform (0, 1) is 0.95: a limit there holds, and any fail is wrong
    plan = LookPlan(40, 60, 400, 0.05)
    sizes, spent = plan.sizes(), plan.levels()
    naive = [0.05] * len(sizes)  # a fixed 95% interval recomputed at every look
    rng = np.random.default_rng(11)
    runs = [rng.random(400) for _ in range(2000)]
    spent_looks, naive_looks = _looks(sizes, spent), _looks(sizes, naive)
    planned = sum(_fails(v, 0.95, spent_looks) for v in runs) / len(runs)
    repeated = sum(_fails(v, 0.95, naive_looks) for v in runs) / len(runs)
    assert planned <= 0.05 + 0.01  # within three standard errors of 2,000 runs
    assert repeated > 0.05 + 0.01  # the looks add up: what the plan exists to prevent
