"""Bootstrap intervals on synthetic samples with a known difference."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_kimi.results.stats import bootstrap_delta, statistic


def test_a_real_30_percent_shift_is_detected_and_bracketed():
    rng = np.random.default_rng(1)
    a = rng.normal(100, 5, 40)
    b = a * 1.3 + rng.normal(0, 1, 40)
    ci = bootstrap_delta(a, b, "mean")
    assert ci is not None
    assert ci.delta == pytest.approx(b.mean() / a.mean() - 1)
    assert ci.low < 0.3 < ci.high
    assert ci.excludes_zero and ci.low > 0.2


def test_same_distribution_interval_contains_zero():
    rng = np.random.default_rng(2)
    a, b = rng.lognormal(2, 0.5, 40), rng.lognormal(2, 0.5, 40)
    for stat in ("mean", "median", "p95"):
        ci = bootstrap_delta(a, b, stat)
        assert ci is not None and ci.low < 0 < ci.high, (stat, ci)
        assert not ci.excludes_zero


def test_p95_interval_is_wider_than_the_mean_interval_on_40_requests():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(2, 0.6, 40), rng.lognormal(2.1, 0.6, 40)
    mean, p95 = bootstrap_delta(a, b, "mean"), bootstrap_delta(a, b, "p95")
    assert (p95.high - p95.low) > (mean.high - mean.low)


def test_seeded_and_degenerate_inputs():
    a, b = [1.0, 2.0, 3.0], [2.0, 3.0, 4.0]
    assert bootstrap_delta(a, b, "mean", seed=5) == bootstrap_delta(a, b, "mean", seed=5)
    assert bootstrap_delta([1.0], b, "mean") is None
    assert bootstrap_delta([0.0, 0.0], b, "mean") is None
    with pytest.raises(ValueError, match="unknown statistic"):
        statistic(np.array(a), "avg")
