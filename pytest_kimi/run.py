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

from pytest_kimi import bringup, judge, reporting
from pytest_kimi.inputs import Inputs, UsageProblem, load_inputs
from pytest_kimi.manifest import manifest
from pytest_kimi.measure import measure, replica_endpoints
from pytest_kimi.options import DEFAULT_CLUSTER, Options
from pytest_kimi.progress.events import LayoutDone, Progress
from pytest_kimi.progress.plain import PlainProgress
from pytest_kimi.result import LayoutResult
from pytest_kimi.store import RunFolder, new_run_id
from pytest_kimi.telemetry import ATTACHED_NOTE
from pytest_kimi.workload.abort import Abort

if TYPE_CHECKING:
    from pytest_kimi.baseline import Judgement
    from pytest_kimi.config import Layout
    from pytest_kimi.deploy.clientnode import NodeClient
    from pytest_kimi.deploy.plan import DeploymentPlan
    from pytest_kimi.deploy.reach import Reach
    from pytest_kimi.mock.clock import SharedClock

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
        self.results: dict[str, LayoutResult] = {}  # measured (or failed) in this process
        self.stopped_early = ""  # why the session stopped before every test ran (Ctrl-C, -x)
        self.selected: frozenset[str] | None = None  # layouts with tests selected (-k)
        self.model: dict[str, Any] | None = None  # the comparison, once written
        self._folder: RunFolder | None = None
        self._plans: dict[str, DeploymentPlan] = {}
        self._aborts: dict[str, Abort] = {}  # per layout: the watchdog's cancel hook
        self._reaches: dict[str, Reach] = {}  # per layout: node URL -> URL used (network.client)
        self._clients: dict[str, NodeClient] = {}  # per layout: the client on a node (on_node)

    @classmethod
    def load(cls, options: Options, dry_run: bool = False, **hooks: Any) -> Run:
        """Step 1, inputs: everything checked before anything starts (:class:`UsageProblem`)."""
        return cls(load_inputs(options, dry_run), **hooks)

    # -- what the glue and fixtures read -----------------------------------------------------
    @property
    def layouts(self) -> tuple[Layout, ...]:
        return self.inputs.layouts

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
            self._manifest(layout, None, None)
            result.notes.append(ATTACHED_NOTE)  # no nodes of ours: no GPU telemetry
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
        self.on_result(result)

    def _reach(self, layout: Layout) -> Reach:
        from pytest_kimi.deploy.reach import DIRECT

        return self._reaches.get(layout.name, DIRECT)

    # -- steps 3-5, measure, judge, store ----------------------------------------------------
    def measure(self, layout: Layout, endpoint: str) -> LayoutResult:
        """Run the workload once per layout (later calls return the first run's result)."""
        result = self._result(layout)
        if result.summary is not None or result.error:
            return result
        plan, reach = self._plans.get(layout.name), self._reach(layout)
        replicas = {name: reach.url(url) for name, url in replica_endpoints(plan).items()}
        client = self._clients.get(layout.name)
        clock = _shared_clock(plan) if client is None else None
        try:
            measure(self.inputs, layout, endpoint, self.folder, result, self.say,
                    reach.url_or_none(plan.router_metrics_url) if plan is not None else None,
                    replicas, progress=self.progress,
                    abort=self._aborts.get(layout.name), client=client, clock=clock)  # fmt: skip
            result.verdicts = judge.verdicts(self.inputs, result)
        finally:
            if clock is not None:
                clock.close()
            self.progress.emit(LayoutDone(layout.name, error=result.error))
            self.folder.write_summary(result, self.inputs.backend, self.time_scale)
        return result

    def judge(self, layout: Layout, metric: str) -> Judgement:
        """This run's ``metric`` on ``layout`` against ``--kimi-baseline``."""
        return judge.regression(self.inputs, self._result(layout), metric)

    # -- step 6, report ----------------------------------------------------------------------
    def stored_results(self) -> list[LayoutResult]:
        """The layouts the report covers, read back from the run folder (what this process
        and any xdist worker measured), plus those an early stop never reached."""
        if self._folder is None:
            return []
        stored = {
            layout.name: self.folder.read_layout(layout.name)
            for layout in self.layouts
            if self.folder.has_layout(layout.name)
        }
        return reporting.covered(self.layouts, stored, self.stopped_early, self.selected)

    def comparison(self) -> dict[str, Any] | None:
        results = self.stored_results()
        return reporting.comparison(
            results, run_id=self.folder.name if results else "", backend=self.inputs.backend,
            time_scale=self.time_scale, stopped_early=self.stopped_early,
        )  # fmt: skip

    def finish(self) -> None:
        """Write the comparison and report.html, then the baseline if asked for."""
        results = self.stored_results()
        model = reporting.comparison(
            results, run_id=self.folder.name if results else "", backend=self.inputs.backend,
            time_scale=self.time_scale, stopped_early=self.stopped_early,
        )  # fmt: skip
        if model is None:
            return
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
        model = self.model or self.comparison()
        if model is None:
            return []
        return reporting.terminal_lines(model, self.stored_results())

    # -- helpers -----------------------------------------------------------------------------
    def _result(self, layout: Layout) -> LayoutResult:
        result = self.results.setdefault(layout.name, LayoutResult(layout.name, layout.label))
        result.result_dir = str(self.folder.layout_dir(layout.name))
        return result

    def _manifest(self, layout: Layout, plan: DeploymentPlan | None, nodes: list | None) -> None:
        self.folder.write_manifest(
            layout.name, manifest(self.inputs, layout, self.folder.name, plan, nodes)
        )


def _shared_clock(plan: DeploymentPlan | None) -> SharedClock | None:
    """The local mock run's shared cluster clock (its servers bound and hold it), if any. A
    client on a node (``network.client: on_node``) times on its own wall clock instead."""
    if plan is None or plan.mock_clock is None:
        return None
    from pytest_kimi.mock.clock import SharedClock

    return SharedClock(plan.mock_clock)
