"""--kimi-find-max-concurrency's search: doubling, then bisection, against a judge whose answer
the test knows (every level up to a threshold meets the SLOs)."""

from __future__ import annotations

import pytest

from pytest_kimi.run.search import NotMeasured, Search, find_max_concurrency


def judge_up_to(limit: int, tried: list[int] | None = None):
    def judge(level: int) -> list[str]:
        if tried is not None:
            tried.append(level)
        return [] if level <= limit else ["ttft_p95"]

    return judge


def test_doubling_then_bisection() -> None:
    search = find_max_concurrency(1, 64, judge_up_to(13))
    assert search.tried == [1, 2, 4, 8, 16, 12, 14, 13]
    assert (search.max_concurrency, search.first_failing, search.failed_slos) == (
        13,
        14,
        ["ttft_p95"],
    )
    assert not search.capped


@pytest.mark.parametrize(("low", "high"), [(1, 1), (1, 7), (2, 64), (3, 40), (8, 8)])
def test_finds_the_threshold_anywhere_in_the_range(low: int, high: int) -> None:
    for limit in range(0, high + 3):
        measured: list[int] = []
        search = find_max_concurrency(low, high, judge_up_to(limit, measured))
        assert measured == search.tried  # each level judged once, in the order reported
        assert len(set(measured)) == len(measured)
        assert all(low <= level <= high for level in measured)
        if limit < low:
            assert search.max_concurrency is None and search.first_failing == low
        elif limit >= high:
            assert (search.max_concurrency, search.capped, search.first_failing) == (
                high,
                True,
                None,
            )
        else:
            assert (search.max_concurrency, search.first_failing) == (limit, limit + 1)


def test_the_outcome_round_trips_through_json_data() -> None:
    search = find_max_concurrency(2, 16, judge_up_to(5))
    assert Search.from_dict(search.to_dict()) == search


@pytest.mark.parametrize(("low", "high"), [(0, 4), (5, 4)])
def test_a_range_that_is_not_one_is_refused(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="1 <= low <= high"):
        find_max_concurrency(low, high, judge_up_to(1))


def test_a_level_that_cannot_be_measured_ends_the_search_without_an_answer() -> None:
    def judge(level: int) -> list[str]:
        if level == 4:
            raise NotMeasured("the deployment was lost")
        return []

    search = find_max_concurrency(1, 16, judge)
    assert search.tried == [1, 2, 4]
    assert search.max_concurrency is None and search.first_failing is None
    assert search.incomplete == "stopped at concurrency 4: the deployment was lost"
