"""One pytest-kimi run, read top to bottom: inputs -> bring-up -> measure -> store -> judge ->
report. Each step is its own module; this object only holds what passes between them.

The pytest glue (:mod:`pytest_kimi.plugin`) decides *when* each step runs; the same steps run
outside pytest. Everything a step produces lands in the run folder as soon as it exists, so a
failed run still leaves its logs, records and a report saying why.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.config.inputs import Inputs, UsageProblem, load_inputs
from pytest_kimi.config.options import DEFAULT_CLUSTER, Options
from pytest_kimi.config.points import SWEPT, Point
from pytest_kimi.deploy.telemetry import ATTACHED_NOTE, point_telemetry
from pytest_kimi.judge import verdicts as judge
from pytest_kimi.judge.runhistory import RunHistory
from pytest_kimi.report import reporting
from pytest_kimi.results.events import LayoutDone, Progress
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.run import bringup
from pytest_kimi.run.deployed import Deployed
from pytest_kimi.run.ledger import Ledger
from pytest_kimi.run.measure import measure
from pytest_kimi.run.progress.plain import PlainProgress
from pytest_kimi.run.repeated import measure_repeats
from pytest_kimi.workload.abort import Abort

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.deploy.attached import Attached
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.judge.baseline import Judgement
    from pytest_kimi.judge.history.gate import SeriesJudgement
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.run.search import Search

__all__ = ["DEFAULT_CLUSTER", "Options", "Run", "UsageProblem"]


class Run:
    """Validated inputs, the run folder and the layouts' results so far (:class:`Ledger`), each
    layout's deployment (:class:`Deployed`), and this run in the history (:class:`RunHistory`)."""

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
        self.ledger = Ledger(inputs)  # the results so far, and the run folder that keeps them
        self.deployed = Deployed()  # per layout: what its deployment left for measuring it
        self.history = RunHistory(inputs, say)  # this run in the history (a gate, trends)
        self.model: dict[str, Any] | None = None  # the comparison, once written

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
    def results(self) -> dict[tuple[str, str], LayoutResult]:
        """Measured (or failed) in this process, per (layout, point id); ("tp32", "") is also
        the deployment's: its bring-up and teardown notes, and why it did not come up."""
        return self.ledger.results

    @property
    def folder(self) -> RunFolder:
        return self.ledger.folder

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    def use_run_dir(self, path: Path) -> None:
        """Write into a folder someone else made (the xdist controller, for its workers)."""
        self.ledger.adopt(path)

    def select(self, layouts: frozenset[str] | None) -> None:
        """The layouts with tests selected (``-k``/``-m``; None: not known, as on the xdist
        controller): only those can be "not run" when the session stops early."""
        self.ledger.selected = layouts

    def stop_early(self, why: str) -> None:
        """The session stopped before every test ran (Ctrl-C, SIGTERM, ``-x``): the report
        names why, and the selected layouts never reached as not run."""
        self.ledger.stopped_early = why

    def plan(self, layout: Layout) -> DeploymentPlan:
        from pytest_kimi.deploy.plan import plan_deployment

        return plan_deployment(self.inputs.cluster, layout)

    # -- step 2, bring-up --------------------------------------------------------------------
    @contextlib.contextmanager
    def deployment(self, layout: Layout) -> Iterator[str]:
        """Bring the layout up (unless attached), yield the router URL, always tear down."""
        result = self.ledger.result(layout)
        if self.inputs.options.endpoint:
            from pytest_kimi.deploy.attached import discover

            options = self.inputs.options
            attached = self.deployed.attached[layout.name] = discover(
                options.endpoint, options.router_metrics
            )
            self.ledger.write_manifest(layout, None, None, attached)
            result.notes.append(ATTACHED_NOTE)  # no nodes of ours: no GPU telemetry
            result.notes.extend(attached.notes)
            if self.inputs.swept:  # the points write their own; this keeps the note
                self.ledger.write_summary(result)
            yield self.inputs.options.endpoint
        else:
            with contextlib.ExitStack() as stack:  # closed: torn down
                self.deployed.restarts[layout.name] = functools.partial(
                    _bring_up_again, self, layout, result, stack)  # fmt: skip
                yield _bring_up(self, layout, result, stack)
        if not self.inputs.swept:  # a sweep's points are each reported as measured
            self.on_result(result)

    # -- steps 3-5, measure, judge, store ----------------------------------------------------
    def measure(self, layout: Layout, endpoint: str, point: Point | None = None) -> LayoutResult:
        """Run the workload once per layout and workload point (later calls return the first
        run's result). A point is not measured on a deployment that failed at an earlier one
        (the watchdog found it broken): it gets that error instead."""
        point = point or self.points[0]
        result = self.ledger.result(layout, point)
        if result.summary is not None or result.error:
            return result
        broken = self.deployed.broken(layout.name)
        if broken:
            result.error = broken
            self.ledger.write_summary(result)
            return result
        endpoint = self.deployed.endpoints.get(layout.name, endpoint)  # a fresh repeat's
        attached = self.deployed.attached.get(layout.name)
        repeated = self.inputs.options.repeat > 1  # each repeat has its own clock
        clock = None if repeated else self.deployed.shared_clock(layout.name)
        try:
            if repeated:
                fresh = self.inputs.options.repeat_fresh
                again = self.deployed.restarts.get(layout.name) if fresh else None
                measure_repeats(self.inputs, layout, point, endpoint, result, self.folder,
                                self.deployed, self.progress, again,
                                self.ledger.result(layout).notes)  # fmt: skip
            else:
                target = self.deployed.target(layout.name, endpoint)
                measure(self.inputs, layout, target, self.folder, result,
                        progress=self.progress, abort=self.deployed.aborts.get(layout.name),
                        clock=clock, point=point)  # fmt: skip
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
            self.ledger.write_summary(result)
            if self.inputs.swept:
                self.on_result(result)
        return result

    def find_max_concurrency(self, layout: Layout, endpoint: str) -> Search:
        """``--kimi-find-max-concurrency``: each level a measured point on this deployment
        (a listed point already measured is reused); the outcome goes to ``search.json``."""
        from pytest_kimi.run.search import NotMeasured, find_max_concurrency

        def failed(level: int) -> list[str]:
            result = self.measure(layout, endpoint, _level(self.inputs, level))
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

    def judge(
        self, layout: Layout, metric: str, point: Point | None = None
    ) -> Judgement | SeriesJudgement:
        """This run's ``metric`` on ``layout`` (at ``point``) against ``--kimi-baseline``, or
        with ``--kimi-gate history`` against its series in the history."""
        result = self.ledger.result(layout, point or self.points[0])
        if self.inputs.gate == "history":
            tonight = self.history.tonight(layout.name, self.folder.name,
                                           lambda: self.ledger.setup([layout.name]))  # fmt: skip
            return judge.history_regression(self.inputs, result, metric, tonight)
        return judge.regression(self.inputs, result, metric)

    # -- step 6, report ----------------------------------------------------------------------
    def finish(self) -> None:
        """Write the comparison and report.html, then the baseline if asked for."""
        results = self.ledger.stored()
        model = self.ledger.comparison(results)
        if model is None:
            return
        self.history.append(self.folder.name, results, model)
        self.history.add_trends(model, results)
        reporting.write(self.folder, model, results, self.on_comparison)
        self.model = model
        path, refused = judge.save_baseline(
            self.inputs, results, model["incomplete"], self.folder.name
        )
        if refused:
            self.say(f"[kimi] {refused}")
        if path is not None:
            self.say(f"[kimi] baseline saved to {path}")

    def terminal_lines(self) -> list[str]:
        model = self.model or self.ledger.comparison()
        if model is None:
            return []
        return reporting.terminal_lines(model, self.ledger.stored())


def _bring_up(run: Run, layout: Layout, result: LayoutResult, stack: contextlib.ExitStack) -> str:
    """Bring the layout up inside ``stack`` (its close tears it down); its router's URL."""
    deployed = run.deployed
    abort = deployed.aborts[layout.name] = Abort()
    plan = stack.enter_context(bringup.deployment(
        run.inputs, layout, run.folder, result, run.say,
        on_manifest=lambda plan, nodes: run.ledger.write_manifest(layout, plan, nodes),
        progress=run.progress, abort=abort,
        on_reach=lambda reach: deployed.reaches.__setitem__(layout.name, reach),
        on_client=lambda client: deployed.clients.__setitem__(layout.name, client),
    ))  # fmt: skip
    deployed.plans[layout.name] = plan
    deployed.served.pop(layout.name, None)  # no run measured on this deployment yet
    url = deployed.endpoints[layout.name] = deployed.reach(layout.name).url(plan.endpoint)
    return url


def _bring_up_again(
    run: Run, layout: Layout, result: LayoutResult, stack: contextlib.ExitStack,
    between: Callable[[], None],
) -> str:  # fmt: skip
    """``--kimi-repeat-fresh``: tear the layout down, call ``between``, bring it up again."""
    stack.close()
    between()
    return _bring_up(run, layout, result, stack)


def attached_split_notes(attached: Attached, result: LayoutResult) -> list[str]:
    """The replica split of an attached run, from the counters of the workers that answered
    (one that could not be asked is named in the discovery's notes, not counted here)."""
    from pytest_kimi.report.dataquality import cache_notes, split_notes

    summary = result.summary
    succeeded = summary.completed if summary is not None else None
    cached = summary.cached_tokens_total if summary is not None else None
    counters = result.replica_counters
    return split_notes(counters, len(attached.worker_urls()), succeeded) + cache_notes(
        counters, cached
    )


def _level(inputs: Inputs, concurrency: int) -> Point:
    """The point measured at one concurrency: a listed one if it has it, else the first
    point's settings at that concurrency (named ``c<N>``)."""
    for point in inputs.points:
        if inputs.workload_of(point).concurrency == concurrency:
            return point
    settings = {**dict(inputs.points[0].settings), "concurrency": concurrency}
    ordered = tuple((name, settings[name]) for name in SWEPT if name in settings)
    return Point(ordered, ("concurrency",))
