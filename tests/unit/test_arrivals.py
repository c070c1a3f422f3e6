"""The Poisson arrival schedule (pure; the client sleeps these gaps between sends)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kimi.workload.specs import arrival_gaps


def test_infinite_rate_sends_everything_at_once():
    assert arrival_gaps(5, float("inf"), 0) == [0.0] * 5


def test_gaps_are_exponential_with_the_requested_rate_and_seeded():
    gaps = np.array(arrival_gaps(20001, 4.0, seed=7)[:-1])
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # mean gap = 1 / rate
    assert np.median(gaps) == pytest.approx(0.25 * np.log(2), rel=0.05)  # exponential median
    assert arrival_gaps(50, 4.0, seed=7) == arrival_gaps(50, 4.0, seed=7)
    assert arrival_gaps(50, 4.0, seed=7) != arrival_gaps(50, 4.0, seed=8)
    assert arrival_gaps(3, 4.0, seed=7)[-1] == 0.0  # nothing to wait for after the last


def test_bad_rate_is_refused():
    with pytest.raises(ValueError, match="request rate"):
        arrival_gaps(3, 0.0, 0)
