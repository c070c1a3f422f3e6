"""This run's part in the history (``--kimi-history``, or the cluster file's ``history:``).

Three things, all about one run: the run as the history will record it, which a history gate
judges tonight's figures as (read once per layout, for all its gated metrics); the run appended
to the history when it finishes, complete or not; and each gated metric's trend across its runs
for the report's plots. Writing the history or reading the trends must never cost the report:
what goes wrong there is said, and the report is written all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kimi.judge import verdicts as judge

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.judge.history.store import RunRecord
    from pytest_kimi.results.layout import LayoutResult


class RunHistory:
    """One run against the history: its record as a gate sees it, appended at its end, and
    the trends of its gated metrics."""

    def __init__(self, inputs: Inputs, say: Callable[[str], None]) -> None:
        self.inputs, self.say = inputs, say
        self._tonights: dict[str, RunRecord] = {}  # per layout: this run as the history has it

    def tonight(
        self, layout: str, run_id: str, setup: Callable[[], Mapping[str, Any]]
    ) -> RunRecord:
        """This run as the history will record it (the versions its layout's nodes reported,
        in the ``tools`` of its ``setup``), for a change that starts tonight; read once per
        layout, for all its gated metrics."""
        from pytest_kimi.judge.history.entries import run_record

        if layout not in self._tonights:
            tools, commit = setup().get("tools") or {}, self.inputs.options.commit
            self._tonights[layout] = run_record(self.inputs, run_id, [], tools, commit)
        return self._tonights[layout]

    def append(self, run_id: str, results: Sequence[LayoutResult], model: dict[str, Any]) -> None:
        """Append this run, complete or not (an incomplete run's measured layouts are in its
        series too); a file that cannot take it is said, once, and the report is written all
        the same."""
        from pytest_kimi.judge.history import HistoryError, record_run
        from pytest_kimi.judge.history.entries import result_records, run_record

        path = self.inputs.history_path
        if path is None:
            return
        tools = (model.get("setup") or {}).get("tools") or {}
        run = run_record(self.inputs, run_id, model["incomplete"], tools,
                         self.inputs.options.commit)  # fmt: skip
        try:
            record_run(path, run, result_records(self.inputs, results))
        except Exception as exc:  # the report (written next) must not be lost to it
            why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
            self.say(f"[kimi] history NOT written: {why}")
            return
        self.say(f"[kimi] run {run.run_id} added to the history {path}")

    def add_trends(self, model: dict[str, Any], results: Sequence[LayoutResult]) -> None:
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
