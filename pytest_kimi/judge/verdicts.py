"""Judge a measured layout: SLO verdicts, and the regression gate against a stored baseline
or against the history (:mod:`pytest_kimi.judge.history.gate`).

Pure functions of the inputs and the results; the only file operation is saving a baseline,
which is refused for an incomplete run (a partial run must never become the reference that
later nights are judged against).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kimi.judge import baseline as baseline_mod
from pytest_kimi.judge.history.entries import baseline_entry
from pytest_kimi.results import baselinefile
from pytest_kimi.results import slo as slo_mod

if TYPE_CHECKING:
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.judge.history.gate import SeriesJudgement
    from pytest_kimi.judge.history.store import History, RunRecord
    from pytest_kimi.results.layout import LayoutResult


def verdicts(
    inputs: Inputs, result: LayoutResult, extra: Sequence[slo_mod.Slo] = ()
) -> list[slo_mod.Verdict]:
    """The layout's configured SLOs (and ``extra`` ones: a test's marker) against its summary,
    at the run's confidence where one is set (none when nothing was measured)."""
    from pytest_kimi.results.metrics import per_request_ms

    if result.summary is None:
        return []
    if result.looks is not None:  # --kimi-until-decided: each at the look it was decided at
        from pytest_kimi.judge.looks import verdicts_at

        return verdicts_at(inputs, result.name, result.records, result.looks, result.summary,
                           tuple(extra))  # fmt: skip
    slos = {**inputs.slos[result.name], **{s.name: s for s in extra}}
    samples = None
    if inputs.confidence is not None:
        samples = per_request_ms(result.records, time_scale=inputs.time_scale)
    return [slo_mod.evaluate(s, result.summary, samples, inputs.confidence)
            for s in slos.values()]  # fmt: skip


def regression(inputs: Inputs, result: LayoutResult, metric: str) -> baseline_mod.Judgement:
    """This run's ``metric`` on the layout against the loaded baseline, which keeps each
    workload point of a sweep under its case (``tp32-c8``)."""
    assert inputs.baseline is not None
    saved = inputs.baseline["layouts"].get(result.case)
    if saved is None:
        known = ", ".join(inputs.baseline["layouts"]) or "none"
        raise baselinefile.BaselineError(
            f"the baseline has no layout {result.case!r} (it has: {known}); save one with "
            "--kimi-save-baseline"
        )
    if result.summary is None:
        raise baselinefile.BaselineError(f"{result.case} was not measured: {result.error}")
    timed_from = inputs.baseline.get("clock_start", "send")  # older baselines: from the send
    if timed_from != inputs.cluster.workload.clock_start:
        raise baselinefile.BaselineError(
            f"the baseline's latencies were timed from the {timed_from}, this run's from the "
            f"{inputs.cluster.workload.clock_start} (workload.clock_start, docs/metrics.md): "
            f"set workload.clock_start: {timed_from} to compare with it, or save a new "
            "baseline with --kimi-save-baseline"
        )
    current = baseline_entry(inputs, result)
    saved_workload = saved.get("workload")  # older baselines did not keep it
    if saved_workload is not None and saved_workload != current["workload"]:
        changed = ", ".join(
            f"{name} {saved_workload.get(name)} -> {value}"
            for name, value in current["workload"].items()
            if saved_workload.get(name) != value
        )
        raise baselinefile.BaselineError(
            f"the baseline's {result.case} ran another workload ({changed}): judge it with the "
            "same workload settings, or save a new baseline with --kimi-save-baseline"
        )
    return baseline_mod.judge(result.case, metric, inputs.thresholds[metric], saved, current,
                              confidence=inputs.confidence)  # fmt: skip


def history_regression(
    inputs: Inputs, result: LayoutResult, metric: str, tonight: RunRecord
) -> SeriesJudgement:
    """``--kimi-gate history``: this run's ``metric`` on the layout (at its point) against the
    series of the same experiment on the same cluster in the history (none yet: nothing to
    judge against), from the accepted run on (``--kimi-gate-since``, else the newest one
    ``python -m pytest_kimi.judge.history PATH accept`` recorded); ``tonight`` is this run as the
    history will record it."""
    from pytest_kimi.judge.history.entries import experiment_id
    from pytest_kimi.judge.history.gate import Tonight, judge_series
    from pytest_kimi.results.catalogue import metric as metric_of

    if result.summary is None:
        raise baselinefile.BaselineError(f"{result.case} was not measured: {result.error}")
    history = gate_history(inputs)
    series = []
    if history is not None:
        since = gate_since(inputs, history)
        series = history.series(experiment_id(inputs, result), result.name, result.point, metric,
                                cluster=inputs.cluster.name, since=since)  # fmt: skip
    entry = baseline_entry(inputs, result)
    m = metric_of(metric)
    samples = entry["samples"].get(m.prefix, []) if m.per_request else []
    figure = Tonight(tonight, entry["metrics"].get(metric), samples,
                     entry.get("runs", {}).get(metric, ()))  # fmt: skip
    return judge_series(result.case, metric, series, figure, inputs.thresholds[metric],
                        confidence=inputs.confidence)  # fmt: skip


def gate_history(inputs: Inputs) -> History | None:
    """The history a gate or a trend reads (None before its first run wrote it)."""
    from pytest_kimi.judge.history.store import History

    path = inputs.history_path
    return History(path) if path is not None and path.is_file() else None


def gate_since(inputs: Inputs, history: History) -> str | None:
    """The uid of the run a history gate's series start at: ``--kimi-gate-since`` (named in
    the error when the history has no such run), else the cluster's accepted run, else None."""
    from pytest_kimi.judge.history.store import HistoryError

    if inputs.options.gate_since:
        try:
            return history.run(inputs.options.gate_since).uid
        except HistoryError as exc:
            raise HistoryError(f"--kimi-gate-since: {exc}") from None
    accepted = history.accepted(inputs.cluster.name)
    return accepted.uid if accepted is not None else None


def save_baseline(
    inputs: Inputs, results: Sequence[LayoutResult], incomplete: list[str], run_id: str
) -> tuple[Path | None, str]:
    """Store the run as the baseline at ``--kimi-save-baseline``; (path, "") when saved,
    (None, why) when refused, (None, "") when not asked for."""
    path = inputs.options.save_baseline
    if path is None:
        return None, ""
    if incomplete:
        return (
            None,
            f"baseline NOT saved to {path}: the run is incomplete ({'; '.join(incomplete)})",
        )
    measured = {r.case: baseline_entry(inputs, r) for r in results if r.summary is not None}
    if not measured:
        return None, ""
    meta = {"cluster": inputs.cluster.name, "backend": inputs.backend,
            "time_scale": inputs.time_scale, "run_id": run_id,
            "clock_start": inputs.cluster.workload.clock_start}  # fmt: skip
    baselinefile.save(path, baselinefile.snapshot(measured, meta))
    return path, ""
