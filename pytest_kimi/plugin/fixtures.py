"""The fixtures pytest-kimi gives tests (documented in ``docs/fixtures.md``).

A layout is a session-scoped parameter, so pytest runs all of one layout's tests against one
deployment, tears it down, and only then brings up the next layout. Nothing heavy is imported
here: a session that uses none of these fixtures pays nothing for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimi.plugin.state import run_of

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.points import Point
    from pytest_kimi.judge.baseline import Judgement
    from pytest_kimi.results.layout import LayoutResult
    from pytest_kimi.results.slo import Slo, Verdict
    from pytest_kimi.run.search import Search
    from pytest_kimi.run.session import Run


def marker_slos(item: pytest.Item) -> dict[str, Slo]:
    """``@pytest.mark.slo(ttft_p95="20s")``: SLOs of one test, over the configured ones."""
    from pytest_kimi.results.slo import SloError, parse_slo

    out: dict[str, Slo] = {}
    for mark in reversed(list(item.iter_markers("slo"))):
        for name, value in mark.kwargs.items():
            try:
                out[name] = parse_slo(name, value, f"@pytest.mark.slo on {item.name}")
            except SloError as exc:
                raise pytest.UsageError(str(exc)) from None
    return out


@pytest.fixture(scope="session")
def kimi_session(pytestconfig: pytest.Config) -> Run:
    """The run: validated inputs (``.inputs``), the run folder and the results so far."""
    return run_of(pytestconfig)


@pytest.fixture(scope="session")
def kimi_layout(request: pytest.FixtureRequest) -> Layout:
    """The layout under test (parametrized from ``--layout``)."""
    return request.param


@pytest.fixture(scope="session")
def kimi_point(request: pytest.FixtureRequest) -> Point:
    """The workload point under test (parametrized from the ``--kimi-concurrency`` ... lists
    and the cluster file's; one point with an empty id when nothing is swept)."""
    return request.param


@pytest.fixture(scope="session")
def kimi_endpoint(kimi_session: Run, kimi_layout: Layout) -> Iterator[str]:
    """The router URL of the layout's running deployment; torn down after its tests."""
    with kimi_session.deployment(kimi_layout) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def kimi_result(
    kimi_session: Run, kimi_layout: Layout, kimi_point: Point, kimi_endpoint: str
) -> LayoutResult:
    """The workload, run once per layout and workload point: records, summary and SLO
    verdicts."""
    return kimi_session.measure(kimi_layout, kimi_endpoint, kimi_point)


def _figures(result: LayoutResult) -> dict[str, float]:
    return result.summary.figures() if result.summary is not None else {}


@pytest.fixture
def speedbench(kimi_result: LayoutResult, record_property) -> LayoutResult:
    """The layout's result, with its figures as this test's JUnit properties (catalogue names:
    ``ttft_p95``, ``output_throughput``; ``runs`` where ``--kimi-repeat`` pooled several)."""
    record_property("layout", kimi_result.name)
    record_property("layout_label", kimi_result.label)
    if kimi_result.point:
        record_property("point", kimi_result.point)
    if kimi_result.repeats:  # --kimi-repeat: the figures pool this many runs
        record_property("runs", kimi_result.runs)
    for name, value in _figures(kimi_result).items():
        record_property(name, value)
    return kimi_result


@pytest.fixture
def kimi_benchmark(
    benchmark, kimi_session: Run, kimi_layout: Layout, kimi_point: Point, kimi_endpoint: str
):
    """Run the layout's workload through pytest-benchmark's ``benchmark`` fixture (one round),
    figures in ``extra_info``, so ``--benchmark-autosave`` / ``pytest-benchmark compare`` work
    on our runs. Timings there are wall time; the cluster-time figures are in extra_info."""
    result = benchmark.pedantic(
        kimi_session.measure, args=(kimi_layout, kimi_endpoint, kimi_point), rounds=1,
        iterations=1,
    )  # fmt: skip
    benchmark.extra_info["layout"] = kimi_layout.name
    benchmark.extra_info["point"] = kimi_point.describe()
    benchmark.extra_info["layout_label"] = kimi_layout.label
    benchmark.extra_info["time_scale"] = kimi_session.time_scale
    benchmark.extra_info.update(_figures(result))
    return result


@pytest.fixture
def kimi_slos(
    kimi_session: Run, kimi_layout: Layout, request: pytest.FixtureRequest
) -> dict[str, Slo]:
    """This layout's SLOs: cluster YAML, layout YAML, ini, ``--kimi-slo``, then the test's
    ``@pytest.mark.slo``."""
    return {**kimi_session.inputs.slos[kimi_layout.name], **marker_slos(request.node)}


@pytest.fixture
def kimi_slo(kimi_slos: dict[str, Slo]) -> Callable[[str], Slo]:
    """Look up one of this layout's SLOs by name (``kimi_slo("ttft_p95")``)."""

    def get(name: str) -> Slo:
        try:
            return kimi_slos[name]
        except KeyError:
            known = ", ".join(kimi_slos) or "none"
            pytest.fail(f"no SLO named {name!r} is configured (configured: {known})")

    return get


@pytest.fixture
def kimi_verdict(
    kimi_session: Run, kimi_result: LayoutResult, kimi_slos: dict[str, Slo], record_property
) -> Callable[[str], Verdict]:
    """One SLO's verdict on the layout's run (``kimi_verdict("ttft_p95")``), at the run's
    confidence (``--kimi-confidence``) where one is set; its outcome, bounds and the requests
    a decision would need go into this test's JUnit properties (``slo_outcome``,
    ``slo_lower``, ``slo_upper``: ms or the metric's unit, ``none`` where the data allow no
    bound; ``slo_confidence``; ``slo_requests_needed``: ``never`` at a limit on the value)."""
    from pytest_kimi.judge.verdicts import verdicts
    from pytest_kimi.results.layout import verdict_to_dict

    def get(name: str) -> Verdict:
        [verdict] = [v for v in verdicts(kimi_session.inputs, kimi_result, [kimi_slos[name]])
                     if v.slo.name == name]  # fmt: skip
        saved = verdict_to_dict(verdict)
        record_property("slo_outcome", saved["outcome"])
        for key, value in (saved.get("interval") or {}).items():
            if key in ("lower", "upper", "confidence"):
                record_property(f"slo_{key}", "none" if value is None else value)
        if "requests_needed" in saved:
            needed = saved["requests_needed"]
            record_property("slo_requests_needed", "never" if needed is None else needed)
        return verdict

    return get


@pytest.fixture
def kimi_undecided(kimi_session: Run) -> str:
    """What an undecided SLO test does: ``fail`` (default), ``pass`` or ``xfail``
    (``--kimi-undecided``)."""
    return kimi_session.inputs.options.undecided


@pytest.fixture(scope="session")
def kimi_max_concurrency(kimi_session: Run, kimi_layout: Layout, kimi_endpoint: str) -> Search:
    """``--kimi-find-max-concurrency``: the highest concurrency at which the layout meets
    every SLO (:mod:`pytest_kimi.run.search`), searched on its deployment after its points."""
    return kimi_session.find_max_concurrency(kimi_layout, kimi_endpoint)


@pytest.fixture
def kimi_regression(
    kimi_session: Run,
    kimi_layout: Layout,
    kimi_point: Point,
    kimi_result: LayoutResult,
    record_property: Callable[[str, object], None],
) -> Callable[[str], Judgement]:
    """Judge one metric of this layout against ``--kimi-baseline``, or with ``--kimi-gate
    history`` against its series in the history: ``kimi_regression(name)``. The verdict goes
    into this test's JUnit properties: ``gate_outcome`` (passed, failed, undecided) and, where
    the metric has per-request values, ``gate_lower`` / ``gate_upper`` (the bootstrap bounds of
    the change, positive is worse) and ``gate_confidence``."""
    from pytest_kimi.judge.history.store import HistoryError
    from pytest_kimi.results.baselinefile import BaselineError

    def judge(metric: str) -> Any:
        try:
            judgement = kimi_session.judge(kimi_layout, metric, kimi_point)
        except (BaselineError, HistoryError) as exc:
            pytest.fail(str(exc), pytrace=False)
        record_property("gate_outcome", judgement.outcome)
        if judgement.interval is not None:
            record_property("gate_lower", round(judgement.interval[0], 6))
            record_property("gate_upper", round(judgement.interval[1], 6))
            record_property("gate_confidence", judgement.confidence or 0.95)
        return judgement

    return judge
