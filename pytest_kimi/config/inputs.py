"""Everything a run needs, checked and parsed once, before anything starts.

The cluster file validates itself (:mod:`pytest_kimi.config`); here it meets the command line:
which layouts, SLO overrides per layout, regression thresholds, the baseline to judge against,
and the workload's prompts. Any problem is a :class:`UsageProblem` (pytest's usage error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.config.options import Options
from pytest_kimi.config.pointdata import batch_prompts, dataset_path, load_prompts
from pytest_kimi.config.points import OPTION, Point, PointError, parse_values, points
from pytest_kimi.results import catalogue
from pytest_kimi.results import slo as slo_mod

if TYPE_CHECKING:
    from pytest_kimi.config import ClusterConfig, Layout, WorkloadConfig
    from pytest_kimi.workload.dataset import Workload


class UsageProblem(ValueError):
    """Bad input found before anything started: shown as pytest's usage error."""


@dataclass(frozen=True)
class Inputs:
    """Validated, typed inputs of a run."""

    options: Options
    cluster: ClusterConfig
    layouts: tuple[Layout, ...]
    slos: dict[str, dict[str, slo_mod.Slo]]  # layout name -> SLO name -> SLO
    workload: Workload | None  # None only for a dry run
    thresholds: dict[str, float] = field(default_factory=dict)  # regression gate, per metric
    baseline: dict[str, Any] | None = None
    points: tuple[Point, ...] = (Point(),)  # workload points, in the order they are served
    prompts: dict[str, Workload] = field(default_factory=dict)  # point id -> its prompts
    configs: dict[str, str] = field(default_factory=dict)  # point id -> SPEED-Bench config
    confidence: float | None = None  # SLO verdicts compare bounds at it (None: the point)
    batches: dict[str, list[Workload]] = field(default_factory=dict)  # --kimi-until-decided

    def batches_of(self, point: Point) -> list[Workload]:
        """The prompts of ``point``'s batches after its planned requests, in the order sent
        (none unless ``--kimi-until-decided``)."""
        return self.batches.get(point.id, [])

    def workload_of(self, point: Point) -> WorkloadConfig:
        """The cluster file's workload at ``point``."""
        return point.apply(self.cluster.workload)

    def prompts_of(self, point: Point) -> Workload:
        """The prompts measured at ``point`` (a dry run has none)."""
        assert self.workload is not None, "a dry run reads no dataset"
        return self.prompts.get(point.id, self.workload)

    def config_of(self, point: Point) -> str:
        """The SPEED-Bench config ``point`` reads (:func:`speedbench_config`)."""
        return self.configs[point.id]

    def prompt_style(self, point: Point) -> str:
        """How ``point``'s prompts are built (``raw``, ``chat_template``): the command line
        over the cluster file."""
        return self.options.prompt or self.workload_of(point).prompt

    def concurrency_range(self) -> tuple[int, int]:
        """What ``--kimi-find-max-concurrency`` searches: the concurrency list's range, or from
        1 to the one concurrency the run has."""
        levels = {self.workload_of(point).concurrency for point in self.points}
        return (min(levels), max(levels)) if len(levels) > 1 else (1, max(levels))

    @property
    def swept(self) -> bool:
        """Whether the run has several workload points (they then name items and folders)."""
        return len(self.points) > 1

    @property
    def backend(self) -> str:
        """``attached`` (--kimi-endpoint), ``mock`` or ``sglang``."""
        from pytest_kimi.config.checks import MOCK_MODULE

        if self.options.endpoint:
            return "attached"
        return "mock" if self.cluster.server.module == MOCK_MODULE else "sglang"

    @property
    def time_scale(self) -> float:
        """Cluster seconds per wall second: the mock's scale, else 1."""
        return self.cluster.time_scale if self.backend == "mock" else 1.0

    def percentiles(self, layout: str) -> list[float]:
        """The workload's percentiles plus those this layout's SLOs name."""
        needed = slo_mod.percentiles_needed(self.slos[layout].values())
        return sorted({*self.cluster.workload.percentiles, *needed})

    @property
    def gate(self) -> str | None:
        """The regression gate: ``history``, ``baseline`` or None (no test_no_regression)."""
        return self.options.gate or ("baseline" if self.baseline is not None else None)

    @property
    def history_path(self) -> Path | None:
        """``--kimi-history`` over the cluster file's ``history:``."""
        return self.options.history or self.cluster.history

    def baseline_metrics(self) -> list[str]:
        """What a baseline keeps of each layout: the standard set and every gated metric."""
        return sorted({*catalogue.BASELINE_METRICS, *self.thresholds})


def load_inputs(options: Options, dry_run: bool = False) -> Inputs:
    """Validate everything up front; problems raise :class:`UsageProblem`.

    A dry run reads no dataset: it prints commands for a cluster whose data may only exist
    there."""
    from pytest_kimi.config import ConfigError, load_cluster
    from pytest_kimi.results import baselinefile as baseline_mod
    from pytest_kimi.workload.dataset import DatasetError

    try:
        cluster = with_sglang_version(load_cluster(options.cluster_path), options.sglang_version)
        if options.workload:  # --kimi-workload: one of the file's workloads: over its workload
            cluster = replace(cluster, workload=cluster.named_workload(options.workload))
        check_trace_speed(options, cluster)
        check_gate(options, cluster)
        names = options.layouts or default_layouts(cluster)
        layouts = tuple(cluster.layout(name) for name in names)
        slos = layout_slos(cluster, layouts, options.slo_overrides)
        run_points = workload_points(options, cluster)
        configs = {p.id: speedbench_config(options, cluster, p) for p in run_points}
        check_points(options, cluster, run_points)
        prompts = {} if dry_run else load_prompts(options, cluster, run_points, configs)
        workload = prompts[run_points[0].id] if prompts else None
        thresholds = {
            **catalogue.DEFAULT_THRESHOLDS,
            **cluster.regression_thresholds,
            **baseline_mod.parse_thresholds(options.fail_thresholds, "--kimi-fail"),
        }
        baseline = baseline_mod.load(options.baseline) if options.baseline else None
        confidence = cluster.slo_confidence
        if options.confidence is not None:
            confidence = slo_mod.parse_confidence(options.confidence, "--kimi-confidence")
        batches = {}
        if options.until_decided is not None:
            check_until_decided(options.until_decided, confidence, cluster, run_points)
            if not dry_run:
                batches = batch_prompts(options, cluster, run_points, configs)
    except (
        ConfigError, DatasetError, slo_mod.SloError, baseline_mod.BaselineError, PointError
    ) as exc:  # fmt: skip
        raise UsageProblem(str(exc)) from None
    if options.parallel and cluster.executor != "local":
        check_apart(cluster, layouts)
    if options.undecided not in ("pass", "fail", "xfail"):  # the ini's (pytest checks the CLI's)
        raise UsageProblem(f"kimi_undecided = {options.undecided}: expected pass, fail or xfail")
    if options.endpoint and len(layouts) != 1:
        raise UsageProblem("--kimi-endpoint attaches to one running deployment: pass one --layout")
    if options.router_metrics and not options.endpoint:
        raise UsageProblem(
            "--kimi-router-metrics names the metrics of a router you attach to: it needs "
            "--kimi-endpoint (a deployment pytest-kimi starts is read from its own ports)"
        )
    if options.endpoint and not dry_run:
        check_endpoint(options.endpoint)
    check_repeat(options)
    return Inputs(
        options, cluster, layouts, slos, workload, thresholds, baseline, run_points, prompts,
        configs, confidence, batches,
    )  # fmt: skip


def with_sglang_version(cluster: ClusterConfig, version: str | None) -> ClusterConfig:
    """``--kimi-sglang-version`` over the file's ``server.sglang_version``, checked as the
    field is (a supported release; one the mock answers as, for the mock)."""
    import dataclasses

    from pytest_kimi.config import ConfigError
    from pytest_kimi.config.checks import MOCK_MODULE
    from pytest_kimi.config.versions import VersionError, mock_version, sglang_profile

    if version is None:
        return cluster
    try:
        sglang_profile(version, "--kimi-sglang-version")
    except VersionError as exc:
        raise ConfigError(str(exc)) from None
    problem = mock_version(version) if cluster.server.module == MOCK_MODULE else None
    if problem:
        raise ConfigError(f"--kimi-sglang-version: {problem}")
    server = dataclasses.replace(cluster.server, sglang_version=version,
                                 sglang_version_from="--kimi-sglang-version")  # fmt: skip
    return dataclasses.replace(cluster, server=server)


def workload_points(options: Options, cluster: ClusterConfig) -> tuple[Point, ...]:
    """The run's workload points: each setting's values from the command line, else from the
    cluster file's list (:mod:`pytest_kimi.config.points`); errors name the option or field."""
    from pytest_kimi.config.fields import APIS

    given = {name: parse_values(name, text) for name, text in options.sweep().items()}
    values = {**cluster.workload.sweeps, **given}
    for api in values.get("api", ()):
        if api not in APIS:
            raise PointError(f"{OPTION['api']}: {api!r} is not one of {', '.join(APIS)}")
    if not values:
        return (Point(),)
    return points(values)


def speedbench_config(options: Options, cluster: ClusterConfig, point: Point) -> str:
    """The SPEED-Bench config a point reads: a point that sets another prompt length than
    the file's reads the throughput config of that length (``throughput_1k``), else the
    configured one."""
    wl = cluster.workload
    length = point.value("input_len")
    if length is None or length == wl.input_len:  # the file's own length: its own config
        return options.speedbench_config or wl.speedbench_config
    from pytest_kimi.workload.speedbench import THROUGHPUT_LENGTHS

    if length not in THROUGHPUT_LENGTHS:
        known = ", ".join(str(n) for n in THROUGHPUT_LENGTHS)
        raise PointError(
            f"{OPTION['input_len']}: {length} tokens: SPEED-Bench's throughput configs hold "
            f"prompts of {known} tokens"
        )
    if options.speedbench_config:
        raise PointError(
            f"{OPTION['input_len']} chooses the SPEED-Bench config (throughput_<length>); "
            f"leave out --kimi-speedbench-config {options.speedbench_config}"
        )
    return THROUGHPUT_LENGTHS[length]


def check_points(options: Options, cluster: ClusterConfig, run_points: tuple[Point, ...]) -> None:
    """What can be known of the points before any data is read (a dry run too): another
    length than the file's is not asked of one file (a dataset that is not on this machine is
    checked where it is read). That each length has a SPEED-Bench config is checked as the
    configs are chosen (:func:`speedbench_config`)."""
    from pytest_kimi.workload.dataset import DatasetError

    try:
        path: Path | None = dataset_path(options, cluster)
    except DatasetError:  # not on this machine: a dry run goes on, a run fails where it reads
        path = None
    own = cluster.workload.input_len
    for point in run_points:
        length = point.value("input_len")
        if length not in (None, own) and path is not None and path.is_file():
            raise PointError(
                f"{OPTION['input_len']} {length}: {path} is one file of prompts (workload."
                f"input_len {own}); other lengths come from a SPEED-Bench snapshot directory "
                "(--kimi-dataset DIR)"
            )


def default_layouts(cluster: ClusterConfig) -> tuple[str, ...]:
    """The layouts a run without ``--layout`` measures: those not marked ``default: false``."""
    names = tuple(name for name, layout in cluster.layouts.items() if layout.default)
    if not names:
        raise UsageProblem(f"{cluster.path}: every layout is default: false: name the ones to "
                           f"run with --layout (one of {', '.join(cluster.layouts)})")  # fmt: skip
    return names


def check_trace_speed(options: Options, cluster: ClusterConfig) -> None:
    """``--kimi-trace-speed`` replays a trace: it needs a trace workload, and a speed > 0."""
    speed = options.trace_speed
    if speed is None:
        return
    if cluster.workload.kind != "trace" and cluster.workload.arrivals is None:
        raise UsageProblem("--kimi-trace-speed replays a trace workload (kind: trace) or an "
                           "arrival list (arrivals:): pick one with --kimi-workload "
                           "NAME")  # fmt: skip
    if not speed > 0:
        raise UsageProblem(f"--kimi-trace-speed {speed:g}: the speed must be > 0")


def check_until_decided(
    most: int, confidence: float | None, cluster: ClusterConfig, run_points: tuple[Point, ...]
) -> None:
    """``--kimi-until-decided MAX`` sends more of a closed loop's single requests, at a
    confidence, up to more than the planned requests of each point."""
    if confidence is None:
        raise UsageProblem("--kimi-until-decided judges SLOs by their bounds: give "
                           "--kimi-confidence C (or the cluster file's slo.confidence)")
    for point in run_points:
        wl = point.apply(cluster.workload)
        if wl.sessions or wl.kind == "trace" or wl.arrivals is not None or math.isfinite(
                wl.request_rate):  # fmt: skip
            raise UsageProblem("--kimi-until-decided sends more requests of a closed loop "
                               "(concurrency, no request_rate, no trace, arrival list or "
                               "sessions), the same way as the planned ones")  # fmt: skip
        if most <= wl.num_requests:
            raise UsageProblem(f"--kimi-until-decided {most}: the most requests must be more "
                               f"than the {wl.num_requests} planned")  # fmt: skip


def check_repeat(options: Options) -> None:
    """``--kimi-repeat N`` is a count of runs; ``--kimi-repeat-fresh`` repeats them on new
    deployments of ours; repeats and ``--kimi-until-decided`` answer different questions."""
    if options.repeat < 1:
        raise UsageProblem(f"--kimi-repeat {options.repeat}: give a number of runs, 1 or more")
    if options.repeat_fresh and options.repeat < 2:
        raise UsageProblem("--kimi-repeat-fresh brings the layout up again for each later "
                           "run: give --kimi-repeat N with N >= 2")  # fmt: skip
    if options.repeat_fresh and options.endpoint:
        raise UsageProblem("--kimi-repeat-fresh tears down and brings up the deployment: an "
                           "attached one (--kimi-endpoint) is not ours to restart")  # fmt: skip
    if options.repeat > 1 and options.until_decided is not None:
        raise UsageProblem("--kimi-repeat and --kimi-until-decided: choose one (repeats "
                           "measure the run-to-run spread of a point, --kimi-until-decided "
                           "grows one run until its SLOs are decided)")  # fmt: skip


def check_gate(options: Options, cluster: ClusterConfig) -> None:
    """The gate's options agree: a history gate has a history and no baseline besides."""
    if options.gate == "baseline" and options.baseline is None:
        raise UsageProblem("--kimi-gate baseline needs --kimi-baseline PATH (a saved run)")
    if options.gate == "history":
        if options.history is None and cluster.history is None:
            raise UsageProblem(
                f"--kimi-gate history needs a history: --kimi-history PATH, or history: in "
                f"{cluster.path}"
            )
        if options.baseline is not None:
            raise UsageProblem(
                "--kimi-baseline judges against one stored run, --kimi-gate history against "
                "the history's series: choose one gate"
            )
    if options.gate_since and options.gate != "history":
        raise UsageProblem("--kimi-gate-since chooses where a history's series starts: it "
                           "needs --kimi-gate history")  # fmt: skip


def check_apart(cluster: ClusterConfig, layouts: tuple[Layout, ...]) -> None:
    """Under ``-n`` layouts are brought up at once: on a real cluster two of them on one node
    would fight over its GPUs and ports. Each needs its own ``nodes:`` (and router node)."""
    owner: dict[str, str] = {}
    for layout in layouts:
        for node in sorted(n.name for n in cluster.deployment_nodes(layout)):
            if node in owner:
                raise UsageProblem(
                    f"-n runs layouts at once, but {owner[node]} and {layout.name} both use "
                    f"node {node} ({cluster.path}): give each layout its own `nodes:` and "
                    "`router: {node: ...}`, or run without -n"
                )
            owner[node] = layout.name


def check_endpoint(url: str, timeout_s: float = 5.0) -> None:
    """An endpoint to attach to must answer at all (any HTTP status will do: a router that is
    not ready yet still answers). One line naming the URL and the error, before anything is
    measured: 40 requests failing one by one would say the same thing forty times, later."""
    import httpx

    from pytest_kimi.workload import http

    try:
        http.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.InvalidURL as exc:
        raise UsageProblem(f"--kimi-endpoint {url}: not a URL ({exc})") from None
    except httpx.HTTPError as exc:
        why = str(exc) or type(exc).__name__
        raise UsageProblem(
            f"--kimi-endpoint {url} does not answer: {type(exc).__name__}: {why}"
        ) from None


def layout_slos(
    cluster: ClusterConfig, layouts: tuple[Layout, ...], overrides: tuple[str, ...]
) -> dict[str, dict[str, slo_mod.Slo]]:
    """Per layout: the cluster's SLOs, then the layout's own, then ini/CLI overrides
    (``NAME=VALUE`` for every layout, ``LAYOUT:NAME=VALUE`` for one)."""
    parsed = [slo_mod.parse_assignment(text, "--kimi-slo") for text in overrides]
    for layout_name, slo in parsed:
        if layout_name is not None and layout_name not in cluster.layouts:
            known = ", ".join(cluster.layouts)
            raise slo_mod.SloError(
                f"--kimi-slo {layout_name}:{slo.name}: unknown layout {layout_name!r} ({known})"
            )
    out = {}
    for layout in layouts:
        own = slo_mod.from_mapping(dict(layout.slo), f"{cluster.path} layouts.{layout.name}")
        cli = [slo for name, slo in parsed if name in (None, layout.name)]
        out[layout.name] = slo_mod.merge(
            slo_mod.from_mapping(cluster.slo, str(cluster.path)), own, cli
        )
    return out
