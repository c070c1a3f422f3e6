"""pytest glue: when each step of a :class:`~pytest_kimi.run.session.Run` happens.

Options (:mod:`pytest_kimi.plugin.options`), fixtures (:mod:`pytest_kimi.plugin.fixtures`) and
hooks (:mod:`pytest_kimi.plugin.hookspecs`) are declared here, and the session's run is kept by
:mod:`pytest_kimi.plugin.state`; the work is in :mod:`pytest_kimi.run.session`. Importing this
module pulls in pytest and the standard library only: a pytest session that runs no pytest-kimi
test loads none of the heavy modules (numpy, httpx, fabric, matplotlib).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_kimi.plugin import options
from pytest_kimi.plugin.fixtures import (  # noqa: F401  (fixtures are found on the plugin module)
    kimi_benchmark,
    kimi_endpoint,
    kimi_layout,
    kimi_max_concurrency,
    kimi_point,
    kimi_regression,
    kimi_result,
    kimi_session,
    kimi_slo,
    kimi_slos,
    kimi_undecided,
    kimi_verdict,
    marker_slos,
    speedbench,
)
from pytest_kimi.plugin.state import RUN_KEY, is_worker, run_of

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.points import Point
    from pytest_kimi.run.session import Run


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_kimi.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kimi: a pytest-kimi benchmark test")
    config.addinivalue_line(
        "markers", "slo(**limits): SLOs for this test, e.g. slo(ttft_p95='20s', tpot_mean='120ms')"
    )
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(config), "kimi-xdist")
        if getattr(config.option, "dist", "no") == "load":
            config.option.dist = "loadgroup"  # a layout's items must share one worker
    if options.explicit(config):
        run = run_of(config)  # validate now: bad input is a usage error up front
        if config.getoption("kimi_dry_run"):
            from pytest_kimi.deploy.listing import describe

            for layout in run.layouts:
                print(describe(run.plan(layout)), end="\n\n")
            if run.inputs.swept:
                print("workload points, served in this order by each layout:")
                for point in run.points:
                    settings = ", ".join(f"{k} {v}" for k, v in point.describe().items())
                    print(f"  {point.id}: {settings}")
            pytest.exit("dry run: nothing was started", returncode=0)
        if config.getoption("kimi_preflight_only"):
            _preflight_only(run)


def _preflight_only(run: Run) -> None:
    """``--kimi-preflight-only``: every node's GPUs, a table, and out (0: clean, 1: not)."""
    from pytest_kimi.deploy.preflight import table, whole_cluster

    reports = whole_cluster(run.inputs.cluster)
    print(table(reports))
    problems = sum(len(r.problems) for r in reports)
    if problems:
        pytest.exit(f"GPU pre-flight: {problems} problem(s); nothing was started", returncode=1)
    pytest.exit("GPU pre-flight: clean; nothing was started", returncode=0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kimi_layout" not in metafunc.fixturenames:
        return
    run = run_of(metafunc.config)
    with_point = "kimi_point" in metafunc.fixturenames
    cases = [(layout, point) for layout in run.layouts
             for point in (run.points if with_point else (None,))]  # fmt: skip
    if "kimi_regression_metric" in metafunc.fixturenames:
        # one item per layout, point and gated metric; none at all without a gate
        metrics = sorted(run.inputs.thresholds) if run.inputs.gate is not None else []
        named = [(case, m) for case in cases for m in metrics]
        _parametrize_named(metafunc, "kimi_regression_metric", named)
    elif "kimi_slo_name" in metafunc.fixturenames:
        # one test item per layout, point and SLO, so JUnit shows every verdict on its own
        marked = marker_slos(metafunc.definition)
        named = [
            ((layout, point), name)
            for layout, point in cases
            for name in {**run.inputs.slos[layout.name], **marked}
        ]
        _parametrize_named(metafunc, "kimi_slo_name", named)
    else:
        _parametrize_named(metafunc, None, [(case, None) for case in cases])


Case = tuple["Layout", "Point | None"]


def _parametrize_named(
    metafunc: pytest.Metafunc, argname: str | None, named: list[tuple[Case, str | None]]
) -> None:
    """Items per layout, workload point and name (SLO, gated metric), ids like
    ``tp32-c8-ttft_p95`` (``tp32-ttft_p95`` without a sweep); layout and point stay
    session-scoped, so a layout's deployment serves all its points."""
    with_point = "kimi_point" in metafunc.fixturenames
    argnames = ["kimi_layout", *(["kimi_point"] if with_point else [])]
    argnames += [argname] if argname else []
    values, ids = [], []
    for (layout, point), name in named:
        row = [layout, *([point] if with_point else []), *([name] if argname else [])]
        values.append(tuple(row) if len(row) > 1 else row[0])
        parts = (layout.name, point.id if point is not None else "", name or "")
        ids.append("-".join(part for part in parts if part))
    metafunc.parametrize(
        argnames if len(argnames) > 1 else argnames[0],
        values,
        indirect=[n for n in argnames if n in ("kimi_layout", "kimi_point")],
        scope="session",
        ids=ids,
    )


def _layout_of(item: pytest.Item) -> Layout | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("kimi_layout") if callspec is not None else None


def _point_of(item: pytest.Item) -> Point | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("kimi_point") if callspec is not None else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each layout's items together, in ``--layout`` order and its workload points in
    order, so its deployment is brought up once and serves every point; without a gate
    (--kimi-baseline, --kimi-gate) the gate's items are deselected (nothing to judge), and
    without --kimi-find-max-concurrency the search's."""
    gate = config.getoption("kimi_baseline") or config.getoption("kimi_gate")
    for asked, fixture in ((gate, "kimi_regression_metric"),
                           (config.getoption("kimi_find_max_concurrency"),
                            "kimi_max_concurrency")):  # fmt: skip
        if not asked:
            unasked = [i for i in items if fixture in getattr(i, "fixturenames", ())]
            if unasked:
                config.hook.pytest_deselected(items=unasked)
                items[:] = [i for i in items if i not in unasked]
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    order = {layout.name: n for n, layout in enumerate(run.layouts)}
    point_order = {point.id: n for n, point in enumerate(run.points)}

    def key(item: pytest.Item) -> tuple[int, int, int]:
        layout, point = _layout_of(item), _point_of(item)
        rank = -1
        if layout is not None:
            item.add_marker(pytest.mark.xdist_group(f"kimi-{layout.name}"))  # one worker each
            rank = order.get(layout.name, len(order))
        at = point_order.get(point.id, len(point_order)) if point is not None else -1
        if "kimi_max_concurrency" in getattr(item, "fixturenames", ()):
            at = len(point_order)  # the search after the layout's points: it reuses them
        # the benchmark item first: its timing must cover the workload's one real run
        return rank, at, 0 if "benchmark" in getattr(item, "fixturenames", ()) else 1

    items.sort(key=key)  # stable: the order inside a layout is otherwise kept


class XdistHooks:
    """``-n N``: the controller picks the run folder and hands it to every worker; workers
    measure their layouts into it; the controller writes the one comparison from the folder."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_configure_node(self, node) -> None:
        if RUN_KEY in self.config.stash or options.explicit(self.config):
            node.workerinput["kimi_run_dir"] = str(run_of(self.config).run_dir)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember which layouts have tests selected (after ``-k``/``-m``): only those can be
    "not run" when the session stops early."""
    run = session.config.stash.get(RUN_KEY, None)
    if run is None:
        return
    selected = {layout.name for item in session.items if (layout := _layout_of(item))}
    run.select(frozenset(selected) if session.items else None)  # xdist controller: None


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Write the comparison, report.html and baseline after every other finisher, so that a
    deployment still up (Ctrl-C, ``-x``) is torn down first and its notes reach the report."""
    run = session.config.stash.get(RUN_KEY, None)
    if run is not None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:  # Ctrl-C, or SIGTERM turned into it
            run.stop_early("interrupted (Ctrl-C or SIGTERM)")
        elif session.shouldfail or session.shouldstop:
            run.stop_early(str(session.shouldfail or session.shouldstop))
    try:
        return (yield)
    finally:
        if run is not None and not is_worker(session.config):  # workers' layouts are on disk
            run.finish()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    lines = run.terminal_lines() if run is not None else []
    if not lines:
        return
    terminalreporter.write_sep("=", "pytest-kimi layout comparison")
    for line in lines:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"report: {run.run_dir / 'comparison.md'}")
