"""pytest glue: options, parametrization by layout, fixtures, JUnit properties, summary.

Options and ini keys only; the work happens in :mod:`pytest_kimi.session`. A layout is a
session-scoped parameter, so pytest runs all of one layout's tests against one deployment,
tears it down, and only then brings up the next layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kimi.baseline import BaselineError
from pytest_kimi.config import Layout
from pytest_kimi.report.comparison import LayoutResult, render_text
from pytest_kimi.session import KimiSession, Options, UsageProblem
from pytest_kimi.slo import Slo, SloError, parse_slo

SESSION_KEY = pytest.StashKey[KimiSession]()
OPTIONS_KEY = pytest.StashKey[Options]()
DEFAULT_CLUSTER = "clusters/local.yaml"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kimi", "pytest-kimi: LLM-serving benchmarks as tests")
    group.addoption(
        "--layout",
        dest="kimi_layout",
        default=None,
        help="comma-separated layouts to benchmark, as named in the cluster file "
        "(e.g. tp32,pp8); the first is the comparison's reference. Default: all.",
    )
    group.addoption(
        "--cluster",
        dest="kimi_cluster",
        default=None,
        help=f"cluster YAML file (default: {DEFAULT_CLUSTER}, the embedded mock backend)",
    )
    group.addoption(
        "--kimi-report-dir",
        dest="kimi_report_dir",
        default=None,
        help="where result directories are written (default: reports/)",
    )
    group.addoption(
        "--kimi-slo",
        dest="kimi_slo",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override an SLO, repeatable: ttft_p95=25s, tpot_p95=150ms, success_rate=1",
    )
    group.addoption(
        "--kimi-endpoint",
        dest="kimi_endpoint",
        default=None,
        metavar="URL",
        help="attach to an already running deployment at URL (no bring-up or teardown)",
    )
    group.addoption(
        "--kimi-dry-run",
        dest="kimi_dry_run",
        action="store_true",
        help="print the exact launch commands per layout and node, start nothing, exit",
    )
    group.addoption(
        "--kimi-save-baseline",
        dest="kimi_save_baseline",
        default=None,
        metavar="PATH",
        help="store this run (metrics and per-request samples) as a baseline JSON file",
    )
    group.addoption(
        "--kimi-baseline",
        dest="kimi_baseline",
        default=None,
        metavar="PATH",
        help="judge this run against a stored baseline: adds test_no_regression[layout-metric]",
    )
    group.addoption(
        "--kimi-fail",
        dest="kimi_fail",
        default="",
        metavar="METRIC:PCT,...",
        help="regression thresholds, e.g. ttft_p95:10%%,tpot_mean:5%% (defaults: cluster YAML "
        "'regression', else ttft_p95:10%%,tpot_mean:5%%,output_throughput:5%%)",
    )
    parser.addini("kimi_layout", "default for --layout")
    parser.addini("kimi_cluster", "default for --cluster")
    parser.addini("kimi_report_dir", "default for --kimi-report-dir")
    parser.addini("kimi_slo", "SLO overrides, one NAME=VALUE per line", type="linelist")
    parser.addini("kimi_endpoint", "default for --kimi-endpoint")


def _opt(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name)
    return value if value else (config.getini(name) or None)


def _options(config: pytest.Config) -> Options:
    root = Path(config.rootpath)
    cluster = Path(_opt(config, "kimi_cluster") or DEFAULT_CLUSTER)
    if not cluster.is_absolute() and not cluster.exists():
        cluster = root / cluster
    layouts = tuple(n.strip() for n in (_opt(config, "kimi_layout") or "").split(",") if n.strip())
    report = Path(_opt(config, "kimi_report_dir") or root / "reports")
    slos = (*config.getini("kimi_slo"), *config.getoption("kimi_slo"))
    save = config.getoption("kimi_save_baseline")
    base = config.getoption("kimi_baseline")
    return Options(
        cluster,
        layouts,
        report,
        tuple(slos),
        _opt(config, "kimi_endpoint"),
        save_baseline=Path(save) if save else None,
        baseline=Path(base) if base else None,
        fail_thresholds=config.getoption("kimi_fail"),
    )


def _explicit(config: pytest.Config) -> bool:
    return (
        any(_opt(config, n) for n in ("kimi_layout", "kimi_cluster", "kimi_endpoint"))
        or bool(config.getoption("kimi_slo"))
        or config.getoption("kimi_dry_run")
    )


def _say(config: pytest.Config):
    """Progress lines that reach the terminal even while output is captured."""

    def say(message: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        if capman is not None:
            with capman.global_and_fixture_disabled():
                reporter.write_line(message)
        else:
            reporter.write_line(message)

    return say


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kimi: a pytest-kimi benchmark test")
    config.addinivalue_line(
        "markers", "slo(**limits): SLOs for this test, e.g. slo(ttft_p95='20s', tpot_mean='120ms')"
    )
    config.stash[OPTIONS_KEY] = _options(config)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(config), "kimi-xdist")
        if getattr(config.option, "dist", "no") == "load":
            config.option.dist = "loadgroup"  # a layout's items must share one worker
    if _explicit(config):
        session = _session(config)  # validate now: bad input is a usage error up front
        if config.getoption("kimi_dry_run"):
            _dry_run(session)
            pytest.exit("dry run: nothing was started", returncode=0)


def _dry_run(session: KimiSession) -> None:
    for layout in session.layouts:
        print(session.plan(layout).describe(), end="\n\n")


def _session(config: pytest.Config) -> KimiSession:
    if SESSION_KEY not in config.stash:
        try:
            dry_run = bool(config.getoption("kimi_dry_run"))
            session = KimiSession.load(config.stash[OPTIONS_KEY], _say(config), dry_run)
        except UsageProblem as exc:
            raise pytest.UsageError(str(exc)) from None
        if _is_worker(config) and config.workerinput.get("kimi_run_dir"):
            session.use_run_dir(Path(config.workerinput["kimi_run_dir"]))
        config.stash[SESSION_KEY] = session
    return config.stash[SESSION_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kimi_layout" not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    if "kimi_regression_metric" in metafunc.fixturenames:
        # one item per layout and gated metric; none at all without --kimi-baseline
        metrics = sorted(session.thresholds) if session.baseline is not None else []
        pairs = [(layout, m) for layout in session.layouts for m in metrics]
        _parametrize_pairs(metafunc, "kimi_regression_metric", pairs)
    elif "kimi_slo_name" in metafunc.fixturenames:
        # one test item per layout and SLO, so JUnit shows every verdict on its own
        marked = _marker_slos(metafunc.definition)
        pairs = [
            (layout, name)
            for layout in session.layouts
            for name in {**session.slos[layout.name], **marked}
        ]
        _parametrize_pairs(metafunc, "kimi_slo_name", pairs)
    else:
        metafunc.parametrize(
            "kimi_layout",
            list(session.layouts),
            indirect=True,
            scope="session",
            ids=[layout.name for layout in session.layouts],
        )


def _parametrize_pairs(
    metafunc: pytest.Metafunc, argname: str, pairs: list[tuple[Layout, str]]
) -> None:
    """Items per (layout, name), ids like ``tp32-ttft_p95``; the layout stays session-scoped."""
    metafunc.parametrize(
        ["kimi_layout", argname],
        pairs,
        indirect=["kimi_layout"],
        scope="session",
        ids=[f"{layout.name}-{name}" for layout, name in pairs],
    )


def _marker_slos(item: pytest.Item | pytest.Function) -> dict[str, Slo]:
    """``@pytest.mark.slo(ttft_p95="20s")``: SLOs of one test, over the configured ones."""
    out: dict[str, Slo] = {}
    for mark in reversed(list(item.iter_markers("slo"))):
        for name, value in mark.kwargs.items():
            try:
                out[name] = parse_slo(name, value, f"@pytest.mark.slo on {item.name}")
            except SloError as exc:
                raise pytest.UsageError(str(exc)) from None
    return out


@pytest.fixture(scope="session")
def kimi_session(pytestconfig: pytest.Config) -> KimiSession:
    """The run: validated cluster, layouts, workload, SLOs and results so far."""
    return _session(pytestconfig)


@pytest.fixture(scope="session")
def kimi_layout(request: pytest.FixtureRequest) -> Layout:
    """The layout under test (parametrized from ``--layout``)."""
    return request.param


@pytest.fixture(scope="session")
def kimi_endpoint(kimi_session: KimiSession, kimi_layout: Layout) -> Iterator[str]:
    """The router URL of the layout's running deployment; torn down after its tests."""
    with kimi_session.deployment(kimi_layout) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def kimi_result(kimi_session: KimiSession, kimi_layout: Layout, kimi_endpoint: str) -> LayoutResult:
    """The workload, run once per layout: records, summary and SLO verdicts."""
    return kimi_session.measure(kimi_layout, kimi_endpoint)


@pytest.fixture
def speedbench(kimi_result: LayoutResult, record_property) -> LayoutResult:
    """The layout's result, with its metrics attached to this test's JUnit properties."""
    record_property("layout", kimi_result.name)
    record_property("layout_label", kimi_result.label)
    if kimi_result.summary is not None:
        for name, value in kimi_result.summary.to_dict().items():
            if isinstance(value, int | float) and not (
                isinstance(value, float) and math.isnan(value)
            ):
                record_property(name, value)
    return kimi_result


@pytest.fixture
def kimi_benchmark(benchmark, kimi_session: KimiSession, kimi_layout: Layout, kimi_endpoint: str):
    """Run the layout's workload through pytest-benchmark's ``benchmark`` fixture (one round),
    metrics in ``extra_info``, so ``--benchmark-autosave`` / ``pytest-benchmark compare`` work
    on our runs. Timings there are wall time; the cluster-time metrics are in extra_info."""
    result = benchmark.pedantic(
        kimi_session.measure, args=(kimi_layout, kimi_endpoint), rounds=1, iterations=1
    )
    benchmark.extra_info["layout"] = kimi_layout.name
    benchmark.extra_info["layout_label"] = kimi_layout.label
    benchmark.extra_info["time_scale"] = kimi_session.time_scale
    if result.summary is not None:
        for name, value in result.summary.to_dict().items():
            if isinstance(value, int | float) and value is not None:
                benchmark.extra_info[name] = value
    return result


@pytest.fixture
def kimi_slos(
    kimi_session: KimiSession, kimi_layout: Layout, request: pytest.FixtureRequest
) -> dict[str, Slo]:
    """This layout's SLOs: cluster YAML, layout YAML, ini, ``--kimi-slo``, then the test's
    ``@pytest.mark.slo``."""
    return {**kimi_session.slos[kimi_layout.name], **_marker_slos(request.node)}


@pytest.fixture
def kimi_slo(kimi_slos: dict[str, Slo]):
    """Look up one of this layout's SLOs by name (``kimi_slo("ttft_p95")``)."""

    def get(name: str) -> Slo:
        try:
            return kimi_slos[name]
        except KeyError:
            known = ", ".join(kimi_slos) or "none"
            pytest.fail(f"no SLO named {name!r} is configured (configured: {known})")

    return get


@pytest.fixture
def kimi_regression(kimi_session: KimiSession, kimi_layout: Layout, kimi_result: LayoutResult):
    """Judge one metric of this layout against ``--kimi-baseline``: ``kimi_regression(name)``."""

    def judge(metric: str):
        try:
            return kimi_session.judge(kimi_layout, metric)
        except BaselineError as exc:
            pytest.fail(str(exc), pytrace=False)

    return judge


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each layout's items together, in ``--layout`` order, so its deployment is brought up
    once; without --kimi-baseline the gate's items are deselected (nothing to judge)."""
    if config.stash[OPTIONS_KEY].baseline is None:
        gated = [i for i in items if "kimi_regression_metric" in getattr(i, "fixturenames", ())]
        if gated:
            config.hook.pytest_deselected(items=gated)
            items[:] = [i for i in items if i not in gated]
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        return
    order = {layout.name: n for n, layout in enumerate(session.layouts)}

    def layout_rank(item: pytest.Item) -> int:
        callspec = getattr(item, "callspec", None)
        layout = callspec.params.get("kimi_layout") if callspec is not None else None
        if layout is None:
            return -1
        item.add_marker(pytest.mark.xdist_group(f"kimi-{layout.name}"))  # one worker each
        return order.get(layout.name, len(order))

    def key(item: pytest.Item) -> tuple[int, int]:
        # the benchmark item first: its timing must cover the workload's one real run
        uses_benchmark = "benchmark" in getattr(item, "fixturenames", ())
        return layout_rank(item), 0 if uses_benchmark else 1

    items.sort(key=key)  # stable: the order inside a layout is otherwise kept


class XdistHooks:
    """``-n N``: the controller picks the run folder and hands it to every worker; workers
    measure their layouts into it; the controller writes the one comparison from the folder."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_configure_node(self, node) -> None:
        if SESSION_KEY in self.config.stash or _explicit(self.config):
            node.workerinput["kimi_run_dir"] = str(_session(self.config).run_dir)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember which layouts have tests selected (after ``-k``/``-m``): only those can be
    "not run" when the session stops early."""
    kimi = session.config.stash.get(SESSION_KEY, None)
    if kimi is None:
        return
    selected = set()
    for item in session.items:
        callspec = getattr(item, "callspec", None)
        layout = callspec.params.get("kimi_layout") if callspec is not None else None
        if layout is not None:
            selected.add(layout.name)
    kimi.selected = frozenset(selected) if session.items else None  # xdist controller: None


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Write the comparison, report.html and baseline after every other finisher, so that a
    deployment still up (Ctrl-C, ``-x``) is torn down first and its notes reach the report."""
    config = session.config
    kimi = config.stash.get(SESSION_KEY, None)
    if kimi is not None:
        if exitstatus == pytest.ExitCode.INTERRUPTED:  # Ctrl-C, or SIGTERM turned into it
            kimi.stopped_early = "interrupted (Ctrl-C or SIGTERM)"
        elif session.shouldfail or session.shouldstop:
            kimi.stopped_early = str(session.shouldfail or session.shouldstop)
    try:
        return (yield)
    finally:
        if kimi is not None and not _is_worker(config):  # workers' layouts are on disk
            _write_reports(kimi)


def _write_reports(kimi: KimiSession) -> None:
    if not kimi.results:
        kimi.load_results_from_disk()  # under xdist the workers measured
    if kimi.results:
        kimi.write_comparison()
        saved = kimi.save_baseline()
        if saved is not None:
            kimi.say(f"[kimi] baseline saved to {saved}")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    kimi = config.stash.get(SESSION_KEY, None)
    if kimi is None or not kimi.results:
        return
    model = kimi.comparison()
    if model is None:
        return
    terminalreporter.write_sep("=", "pytest-kimi layout comparison")
    terminalreporter.write_line(render_text(model))
    for result in kimi.results.values():
        for verdict in result.verdicts:
            terminalreporter.write_line(f"{result.name}: {verdict.message()}")
        if result.error:
            terminalreporter.write_line(
                f"{result.name}: not measured: {result.error.splitlines()[0]}"
            )
    terminalreporter.write_line(f"report: {kimi.run_dir / 'comparison.md'}")
