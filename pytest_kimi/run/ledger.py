"""The run's results and the folder that keeps them.

The folder is made on first use (or adopted from the xdist controller, which made it for its
workers); each (layout, point) result this process fills is written there as soon as it
exists, with the layout's manifest. The report reads the results back from the folder, so what
an xdist worker measured counts the same as what this process did; a session that stopped
early (Ctrl-C, ``-x``) adds the selected layouts it never reached, as not run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kimi.report import reporting
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.store import RunFolder, new_run_id
from pytest_kimi.run.manifest import manifest

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.points import Point
    from pytest_kimi.deploy.attached import Attached
    from pytest_kimi.deploy.plan import DeploymentPlan


class Ledger:
    """This process's results per (layout, point), the run folder, and what the report covers
    (the layouts selected, why the session stopped early)."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        # measured (or failed) in this process, per (layout, point id); ("tp32", "") is also
        # the deployment's: its bring-up and teardown notes, and why it did not come up
        self.results: dict[tuple[str, str], LayoutResult] = {}
        self.stopped_early = ""  # why the session stopped before every test ran (Ctrl-C, -x)
        self.selected: frozenset[str] | None = None  # layouts with tests selected (-k)
        self._folder: RunFolder | None = None

    @property
    def folder(self) -> RunFolder:
        if self._folder is None:
            cluster = self.inputs.cluster
            run_id = new_run_id(cluster.name, cluster.replicas)
            self._folder = RunFolder.create(self.inputs.options.report_dir, run_id)
        return self._folder

    def adopt(self, path: Path) -> None:
        """Write into a folder someone else made (the xdist controller, for its workers)."""
        self._folder = RunFolder.adopt(path)

    def result(self, layout: Layout, point: Point | None = None) -> LayoutResult:
        """The result of ``layout`` at ``point``; without one, the deployment's."""
        key = (layout.name, point.id if point is not None else "")
        result = self.results.setdefault(key, LayoutResult(layout.name, layout.label, point=key[1]))
        if point is not None:  # without a sweep, the deployment's result is the point's too
            result.point_settings = point.describe()
        result.result_dir = str(self.folder.point_dir(*key))
        return result

    def write_summary(self, result: LayoutResult) -> None:
        self.folder.write_summary(result, self.inputs.backend, self.inputs.time_scale)

    def write_manifest(
        self,
        layout: Layout,
        plan: DeploymentPlan | None,
        nodes: list | None,
        attached: Attached | None = None,
    ) -> None:
        self.folder.write_manifest(
            layout.name, manifest(self.inputs, layout, self.folder.name, plan, nodes, attached)
        )

    def setup(self, names: list[str]) -> dict[str, Any]:
        """The experiment's set-up (:mod:`pytest_kimi.report.setup`) from these layouts'
        manifests (a layout that broke before writing one is left out)."""
        from pytest_kimi.report.setup import experiment_setup

        return experiment_setup(self.folder.read_each(names, "manifest.json"))

    def stored(self) -> list[LayoutResult]:
        """The layouts the report covers, read back from the run folder (what this process
        and any xdist worker measured), plus those an early stop never reached."""
        if self._folder is None:
            return []
        layouts, points = self.inputs.layouts, self.inputs.points
        stored = {
            (layout.name, point): self.folder.read_layout(layout.name, point)
            for layout in layouts
            for point in {"", *(p.id for p in points)}
            if self.folder.has_layout(layout.name, point)
        }
        return reporting.covered(layouts, points, stored, self.stopped_early, self.selected)

    def comparison(self, results: list[LayoutResult] | None = None) -> dict[str, Any] | None:
        """The comparison model of what the run folder holds (``results`` if read already)."""
        results = self.stored() if results is None else results
        if not results:
            return None
        names = [layout.name for layout in self.inputs.layouts]
        return reporting.comparison(
            results, run_id=self.folder.name, backend=self.inputs.backend,
            time_scale=self.inputs.time_scale, stopped_early=self.stopped_early,
            setup=self.setup(names), searches=self.folder.read_each(names, "search.json"),
        )  # fmt: skip
