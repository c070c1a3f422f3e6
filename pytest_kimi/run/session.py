"""One pytest-kimi run, read top to bottom: inputs -> bring-up -> measure -> store -> judge ->
report. Each step is its own module; this object only holds what passes between them.

The pytest glue (:mod:`pytest_kimi.plugin`) decides *when* each step runs; the same steps run
outside pytest. Everything a step produces lands in the run folder as soon as it exists, so a
failed run still leaves its logs, records and a report saying why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.config.inputs import Inputs, UsageProblem, load_inputs
from pytest_kimi.config.options import DEFAULT_CLUSTER, Options
from pytest_kimi.config.points import SWEPT, Point
from pytest_kimi.deploy.telemetry import ATTACHED_NOTE, point_telemetry
from pytest_kimi.judge import verdicts as judge
from pytest_kimi.report import reporting
from pytest_kimi.results.events import LayoutDone, Progress
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.store import RunFolder, new_run_id
from pytest_kimi.run import bringup
from pytest_kimi.run.manifest import manifest
from pytest_kimi.run.measure import measure, replica_endpoints
from pytest_kimi.run.progress.plain import PlainProgress
from pytest_kimi.workload.abort import Abort

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.deploy.attached import Attached
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.deploy.reach import Reach
    from pytest_kimi.judge.baseline import Judgement
    from pytest_kimi.judge.history.gate import SeriesJudgement
    from pytest_kimi.judge.history.store import RunRecord
    from pytest_kimi.run.search import Search
    from pytest_kimi.workload.sharedclock import SharedClock

__all__ = ["DEFAULT_CLUSTER", "Options", "Run", "UsageProblem"]


class Run:
    """Validated inputs, the run folder, and the layouts' results so far."""

    def __init__(
        self,
        inputs: Inputs,
        say: Callable[[str], None] = print,
        on_result: Callable[[LayoutResult], None] = lambda result: None,
        on_comparison: Callable[[dict[str, Any]], None] = lambda model: None,
        progress: Progress | None = None,
    ) -> None:
        self.inputs = inputs
        self.say = say
        # bring-up and measuring report events here; without a display, lines through say
        self.progress: Progress = progress if progress is not None else PlainProgress(say)
        self.on_result, self.on_comparison = on_result, on_comparison
        # measured (or failed) in this process, per (layout, point id); ("tp32", "") is also
        # the deployment's: its bring-up and teardown notes, and why it did not come up
        self.results: dict[tuple[str, str], LayoutResult] = {}
        self.stopped_early = ""  # why the session stopped before every test ran (Ctrl-C, -x)
        self.selected: frozenset[str] | None = None  # layouts with tests selected (-k)
        self.model: dict[str, Any] | None = None  # the comparison, once written
        self._folder: RunFolder | None = None
        self._plans: dict[str, DeploymentPlan] = {}
        self._aborts: dict[str, Abort] = {}  # per layout: the watchdog's cancel hook
        self._tonights: dict[str, RunRecord] = {}  # per layout: this run as the history has it
        self._reaches: dict[str, Reach] = {}  # per layout: node URL -> URL used (network.client)
        self._clients: dict[str, NodeClient] = {}  # per layout: the client on a node (on_node)
        self._attached: dict[str, Attached] = {}  # per layout: what --kimi-endpoint serves

    @classmethod
    def load(cls, options: Options, dry_run: bool = False, **hooks: Any) -> Run:
        """Step 1, inputs: everything checked before anything starts (:class:`UsageProblem`)."""
        return cls(load_inputs(options, dry_run), **hooks)

    # -- what the glue and fixtures read -----------------------------------------------------
    @property
    def layouts(self) -> tuple[Layout, ...]:
        return self.inputs.layouts

    @property
    def points(self) -> tuple[Point, ...]:
        return self.inputs.points

    @property
    def time_scale(self) -> float:
        return self.inputs.time_scale

    @property
    def folder(self) -> RunFolder:
        if self._folder is None:
            cluster = self.inputs.cluster
            run_id = new_run_id(cluster.name, cluster.replicas)
            self._folder = RunFolder.create(self.inputs.options.report_dir, run_id)
        return self._folder

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    def use_run_dir(self, path: Path) -> None:
        """Write into a folder someone else made (the xdist controller, for its workers)."""
        self._folder = RunFolder.adopt(path)

    def plan(self, layout: Layout) -> DeploymentPlan:
        from pytest_kimi.deploy.plan import plan_deployment

        return plan_deployment(self.inputs.cluster, layout)

    # -- step 2, bring-up --------------------------------------------------------------------
    @contextlib.contextmanager
    def deployment(self, layout: Layout) -> Iterator[str]:
        """Bring the layout up (unless attached), yield the router URL, always tear down."""
        result = self._result(layout)
        if self.inputs.options.endpoint:
            from pytest_kimi.deploy.attached import discover

            options = self.inputs.options
            attached = self._attached[layout.name] = discover(
                options.endpoint, options.router_metrics
            )
            self._manifest(layout, None, None, attached)
            result.notes.append(ATTACHED_NOTE)  # no nodes of ours: no GPU telemetry
            result.notes.extend(attached.notes)
            if self.inputs.swept:  # the points write their own; this keeps the note
                self.folder.write_summary(result, self.inputs.backend, self.time_scale)
            yield self.inputs.options.endpoint
        else:
            abort = self._aborts[layout.name] = Abort()
            with bringup.deployment(
                self.inputs, layout, self.folder, result, self.say,
                on_manifest=lambda plan, nodes: self._manifest(layout, plan, nodes),
                progress=self.progress, abort=abort,
                on_reach=lambda reach: self._reaches.__setitem__(layout.name, reach),
                on_client=lambda client: self._clients.__setitem__(layout.name, client),
            ) as plan:  # fmt: skip
                self._plans[layout.name] = plan
                yield self._reach(layout).url(plan.endpoint)
        if not self.inputs.swept:  # a sweep's points are each reported as measured
            self.on_result(result)

    def _reach(self, layout: Layout) -> Reach:
        from pytest_kimi.deploy.reach import DIRECT

        return self._reaches.get(layout.name, DIRECT)

    # -- steps 3-5, measure, judge, store ----------------------------------------------------
    def measure(self, layout: Layout, endpoint: str, point: Point | None = None) -> LayoutResult:
        """Run the workload once per layout and workload point (later calls return the first
        run's result). A point is not measured on a deployment that failed at an earlier one
        (the watchdog found it broken): it gets that error instead."""
        point = point or self.points[0]
        result = self._result(layout, point)
        if result.summary is not None or result.error:
            return result
        broken = self._broken(layout)
        if broken:
            result.error = broken
            self.folder.write_summary(result, self.inputs.backend, self.time_scale)
            return result
        plan, reach = self._plans.get(layout.name), self._reach(layout)
        replicas = {name: reach.url(url) for name, url in replica_endpoints(plan).items()}
        router_metrics = reach.url_or_none(plan.router_metrics_url) if plan else None
        attached = self._attached.get(layout.name)
        if attached is not None:  # the workers the endpoint named, and the router's metrics
            replicas, router_metrics = attached.worker_urls(), attached.router_metrics
        client = self._clients.get(layout.name)
        clock = _shared_clock(plan) if client is None else None
        try:
            measure(self.inputs, layout, endpoint, self.folder, result, self.say,
                    router_metrics, replicas, progress=self.progress,
                    abort=self._aborts.get(layout.name), client=client, clock=clock,
                    point=point)  # fmt: skip
            result.verdicts = judge.verdicts(self.inputs, result)
            if attached is not None:  # a deployment we start says this at its teardown
                result.notes.extend(attached_split_notes(attached, result))
        finally:
            if clock is not None:
                clock.close()
            if self.inputs.swept:
                result.telemetry = point_telemetry(self.folder.telemetry_path(layout.name),
                                                   result.records)  # fmt: skip
            self.progress.emit(LayoutDone(result.case, error=result.error))
            self.folder.write_summary(result, self.inputs.backend, self.time_scale)
            if self.inputs.swept:
                self.on_result(result)
        return result

    def find_max_concurrency(self, layout: Layout, endpoint: str) -> Search:
        """``--kimi-find-max-concurrency``: each level a measured point on this deployment
        (a listed point already measured is reused); the outcome goes to ``search.json``."""
        from pytest_kimi.run.search import NotMeasured, find_max_concurrency

        def failed(level: int) -> list[str]:
            result = self.measure(layout, endpoint, self._level(level))
            if result.summary is None:
                raise NotMeasured(result.error.splitlines()[0] if result.error else "no summary")
            out = [v.slo.name for v in result.verdicts if not v.passed]
            if result.summary.failed:
                out.append(f"{result.summary.failed} requests failed")
            return out

        search = find_max_concurrency(*self.inputs.concurrency_range(), failed)
        search.settings = {k: v for k, v in self.points[0].describe().items() if k != "concurrency"}
        self.folder.write_search(layout.name, search.to_dict())
        return search

    def _level(self, concurrency: int) -> Point:
        """The point measured at one concurrency: a listed one if it has it, else the first
        point's settings at that concurrency (named ``c<N>``)."""
        for point in self.points:
            if self.inputs.workload_of(point).concurrency == concurrency:
                return point
        settings = {**dict(self.points[0].settings), "concurrency": concurrency}
        ordered = tuple((name, settings[name]) for name in SWEPT if name in settings)
        return Point(ordered, ("concurrency",))

    def judge(
        self, layout: Layout, metric: str, point: Point | None = None
    ) -> Judgement | SeriesJudgement:
        """This run's ``metric`` on ``layout`` (at ``point``) against ``--kimi-baseline``, or
        with ``--kimi-gate history`` against its series in the history."""
        result = self._result(layout, point or self.points[0])
        if self.inputs.gate == "history":
            return judge.history_regression(self.inputs, result, metric, self._tonight(layout))
        return judge.regression(self.inputs, result, metric)

    def _tonight(self, layout: Layout) -> RunRecord:
        """This run as the history will record it (the versions its layout's nodes reported),
        for a change that starts tonight; read once per layout, for all its gated metrics."""
        from pytest_kimi.judge.history.entries import run_record
        from pytest_kimi.report.setup import experiment_setup

        if layout.name not in self._tonights:
            setup = experiment_setup(self.folder.read_each([layout.name], "manifest.json"))
            tools, commit = setup.get("tools") or {}, self.inputs.options.commit
            self._tonights[layout.name] = run_record(
                self.inputs, self.folder.name, [], tools, commit
            )
        return self._tonights[layout.name]

    def _broken(self, layout: Layout) -> str:
        """Why an earlier point left this layout's deployment unable to serve ("" if none)."""
        abort = self._aborts.get(layout.name)
        if abort is not None and abort.reason:
            return f"not measured: the deployment was lost at an earlier point: {abort.reason}"
        return ""

    # -- step 6, report ----------------------------------------------------------------------
    def stored_results(self) -> list[LayoutResult]:
        """The layouts the report covers, read back from the run folder (what this process
        and any xdist worker measured), plus those an early stop never reached."""
        if self._folder is None:
            return []
        stored = {
            (layout.name, point): self.folder.read_layout(layout.name, point)
            for layout in self.layouts
            for point in {"", *(p.id for p in self.points)}
            if self.folder.has_layout(layout.name, point)
        }
        return reporting.covered(
            self.layouts, self.points, stored, self.stopped_early, self.selected
        )

    def comparison(self, results: list[LayoutResult] | None = None) -> dict[str, Any] | None:
        """The comparison model of what the run folder holds (``results`` if read already)."""
        from pytest_kimi.report.setup import experiment_setup

        results = self.stored_results() if results is None else results
        if not results:
            return None
        names = [layout.name for layout in self.layouts]
        return reporting.comparison(
            results, run_id=self.folder.name, backend=self.inputs.backend,
            time_scale=self.time_scale, stopped_early=self.stopped_early,
            setup=experiment_setup(self.folder.read_each(names, "manifest.json")),
            searches=self.folder.read_each(names, "search.json"),
        )  # fmt: skip

    def finish(self) -> None:
        """Write the comparison and report.html, then the baseline if asked for."""
        results = self.stored_results()
        model = self.comparison(results)
        if model is None:
            return
        self._add_to_history(results, model)
        self._add_trends(model, results)
        reporting.write(self.folder, model, results, self.on_comparison)
        self.model = model
        path, refused = judge.save_baseline(
            self.inputs, results, model["incomplete"], self.folder.name
        )
        if refused:
            self.say(f"[kimi] {refused}")
        if path is not None:
            self.say(f"[kimi] baseline saved to {path}")

    def _add_to_history(self, results: list[LayoutResult], model: dict[str, Any]) -> None:
        """``--kimi-history`` (or the cluster file's ``history:``): append this run, complete
        or not (an incomplete run's measured layouts are in its series too); a file that
        cannot take it is said, once, and the report is written all the same."""
        from pytest_kimi.judge.history import HistoryError, record_run
        from pytest_kimi.judge.history.entries import result_records, run_record

        path = self.inputs.history_path
        if path is None:
            return
        tools = (model.get("setup") or {}).get("tools") or {}
        run = run_record(self.inputs, self.folder.name, model["incomplete"], tools,
                         self.inputs.options.commit)  # fmt: skip
        try:
            record_run(path, run, result_records(self.inputs, results))
        except Exception as exc:  # the report (written next) must not be lost to it
            why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
            self.say(f"[kimi] history NOT written: {why}")
            return
        self.say(f"[kimi] run {run.run_id} added to the history {path}")

    def _add_trends(self, model: dict[str, Any], results: list[LayoutResult]) -> None:
        """With a history: each gated metric's trend across its runs (this one the last), as
        the history gate reads it, into the report's model for the trend plots. Whatever goes
        wrong here is said, and the report is written without its trend section."""
        from pytest_kimi.judge.history.entries import experiment_id
        from pytest_kimi.judge.history.gate import WINDOW
        from pytest_kimi.judge.history.store import SeriesKey
        from pytest_kimi.judge.history.trend import report_trends

        history = judge.gate_history(self.inputs)
        if history is None:
            return
        try:
            cluster = self.inputs.cluster.name
            keys = [SeriesKey(cluster, experiment_id(self.inputs, r), r.name, r.point)
                    for r in results if r.summary is not None]  # fmt: skip
            trends = report_trends(history, keys, self.inputs.thresholds,
                                   since=judge.gate_since(self.inputs, history),
                                   window=WINDOW)  # fmt: skip
        except Exception as exc:  # the report matters more than its trend section
            self.say(f"[kimi] no trend in the report: {type(exc).__name__}: {exc}")
            return
        if trends:
            model["trends"] = trends

    def terminal_lines(self) -> list[str]:
        model = self.model or self.comparison()
        if model is None:
            return []
        return reporting.terminal_lines(model, self.stored_results())

    # -- helpers -----------------------------------------------------------------------------
    def _result(self, layout: Layout, point: Point | None = None) -> LayoutResult:
        """The result of ``layout`` at ``point``; without one, the deployment's."""
        key = (layout.name, point.id if point is not None else "")
        result = self.results.setdefault(key, LayoutResult(layout.name, layout.label, point=key[1]))
        if point is not None:  # without a sweep, the deployment's result is the point's too
            result.point_settings = point.describe()
        result.result_dir = str(self.folder.point_dir(*key))
        return result

    def _manifest(
        self,
        layout: Layout,
        plan: DeploymentPlan | None,
        nodes: list | None,
        attached: Attached | None = None,
    ) -> None:
        self.folder.write_manifest(
            layout.name, manifest(self.inputs, layout, self.folder.name, plan, nodes, attached)
        )


def attached_split_notes(attached: Attached, result: LayoutResult) -> list[str]:
    """The replica split of an attached run, from the counters of the workers that answered
    (one that could not be asked is named in the discovery's notes, not counted here)."""
    from pytest_kimi.report.dataquality import split_notes

    succeeded = result.summary.completed if result.summary is not None else None
    return split_notes(result.replica_counters, len(attached.worker_urls()), succeeded)


def _shared_clock(plan: DeploymentPlan | None) -> SharedClock | None:
    """The local mock run's shared cluster clock (its servers bound and hold it), if any. A
    client on a node (``network.client: on_node``) times on its own wall clock instead."""
    if plan is None or plan.mock_clock is None:
        return None
    from pytest_kimi.workload.sharedclock import SharedClock

    return SharedClock(plan.mock_clock)
