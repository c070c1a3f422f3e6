"""Read a history file.

    python -m pytest_kimi.judge.history PATH                     every run, oldest first
    python -m pytest_kimi.judge.history PATH show RUN            one run's results (RUN: id/uid)
    python -m pytest_kimi.judge.history PATH series CASE METRIC  one metric across runs
                                                                 (CASE: tp32, or tp32-c8)
    python -m pytest_kimi.judge.history PATH changes             every change point in the store
    python -m pytest_kimi.judge.history PATH accept RUN          the level from RUN on is the new
                                                                 normal of RUN's cluster (gate)
Each takes --json for machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from pytest_kimi.judge.history.store import History, HistoryError, RunRecord

SHOWN = ("ttft_p95", "tpot_mean", "tpot_p95", "output_throughput", "success_rate")
"""The figures ``show`` prints per result (all of them are in --json)."""


def main(argv: list[str] | None = None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON")
    parser = argparse.ArgumentParser(
        prog="python -m pytest_kimi.judge.history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("path", type=Path, help="the history file")
    sub = parser.add_subparsers(dest="command")
    show = sub.add_parser("show", help="one run's results", parents=[common])
    show.add_argument("run", help="the run's id, or its uid when two runs share an id")
    series = sub.add_parser("series", help="one metric of one case across runs", parents=[common])
    series.add_argument("case", help="layout, or layout-point as in test ids: tp32-c8")
    series.add_argument("metric", help="catalogue name: ttft_p95, tpot_mean, output_throughput")
    series.add_argument("--cluster", help="the cluster's name (default: the newest run's)")
    series.add_argument("--experiment", help="experiment key (default: the newest run's)")
    changes = sub.add_parser(
        "changes", help="every change point of a gated metric, oldest first", parents=[common]
    )
    changes.add_argument("--cluster", help="only this cluster's runs")
    accept = sub.add_parser(
        "accept", help="accept the level from a run on (the history gate judges from there)",
        parents=[common],
    )  # fmt: skip
    accept.add_argument("run", help="the run's id, or its uid when two runs share an id")
    accept.add_argument("--note", default="", help="why (kept with the acceptance)")
    args = parser.parse_args(argv)
    history = History(args.path)
    try:
        if args.command == "show":
            return _show(history, args.run, args.json)
        if args.command == "series":
            return _series(history, args)
        if args.command == "changes":
            return _changes(history, args.cluster, args.json)
        if args.command == "accept":
            run = history.accept(args.run, args.note)
            print(f"accepted: the history gate on {run.cluster} judges from run {run.run_id} "
                  f"({run.finished_at}) on")  # fmt: skip
            return 0
        return _runs(history, args.json)
    except HistoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _runs(history: History, as_json: bool) -> int:
    runs = history.runs()
    if as_json:
        print(json.dumps([asdict(run) for run in runs], indent=2))
        return 0
    for run in runs:
        state = "complete" if run.complete else "INCOMPLETE: " + "; ".join(run.incomplete)
        print(f"{run.run_id}  {run.finished_at}  {run.cluster} ({run.backend})  commit "
              f"{run.git_commit or '-'}  sglang {run.sglang or '-'}  router {run.router or '-'}"
              f"  cluster file {run.cluster_sha256[:12]}  {state}")  # fmt: skip
    return 0


def _show(history: History, run: str, as_json: bool) -> int:
    results = history.results(run)
    if as_json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    for r in results:
        case = f"{r.layout}-{r.point}" if r.point else r.layout
        if r.error:
            print(f"{case}: not measured: {r.error.splitlines()[0]}")
            continue
        figures = "  ".join(f"{m} {_number(r.metrics.get(m))}" for m in SHOWN)
        print(f"{case} (experiment {r.experiment}): {figures}")
    return 0


def _series(history: History, args: argparse.Namespace) -> int:
    from pytest_kimi.results.catalogue import UnknownMetric
    from pytest_kimi.results.catalogue import metric as catalogue_metric

    try:
        catalogue_metric(args.metric)
    except UnknownMetric as exc:
        raise HistoryError(exc.args[0]) from None
    runs = history.runs()
    if not runs:
        raise HistoryError(f"{history.path}: no runs yet")
    clusters = {run.cluster for run in runs}
    cluster = args.cluster or runs[-1].cluster
    if cluster not in clusters:
        raise HistoryError(f"{history.path}: no runs on cluster {cluster!r} (it has: "
                           f"{', '.join(sorted(clusters))})")  # fmt: skip
    layout, point = _split_case(history, cluster, args.case)
    experiment = args.experiment or _newest_experiment(history, runs, cluster, layout, point)
    entries = history.series(experiment, layout, point, args.metric, cluster=cluster)
    if args.json:
        print(json.dumps([{"run_id": e.run.run_id, "uid": e.run.uid,
                           "finished_at": e.run.finished_at, "git_commit": e.run.git_commit,
                           "value": e.value} for e in entries], indent=2))  # fmt: skip
        return 0
    print(f"{args.case} {args.metric} on {cluster}, experiment {experiment}:")
    for e in entries:
        print(f"{e.run.run_id}  {e.run.git_commit or '-':>12}  {_number(e.value)}")
    return 0


def _changes(history: History, cluster: str | None, as_json: bool) -> int:
    from pytest_kimi.judge.history.gate import what_changed
    from pytest_kimi.judge.history.trend import change_data, trends

    if cluster is not None and cluster not in {run.cluster for run in history.runs()}:
        raise HistoryError(f"{history.path}: no runs on cluster {cluster!r}")
    found = [(trend, change) for trend in trends(history, cluster) for change in trend.changes]
    if as_json:
        print(json.dumps([{
            "cluster": t.cluster, "experiment": t.experiment, "case": t.case,
            "metric": t.metric, **change_data(t, c), "uid": t.runs[c.index].uid,
            "finished_at": t.runs[c.index].finished_at, "noise": t.noise, "limit": t.limit,
            "previous_run_id": t.runs[c.index - 1].run_id,
        } for t, c in found], indent=2))  # fmt: skip
        return 0
    if not found:
        print(f"no change points in {history.path}" + (f" on {cluster}" if cluster else ""))
        return 0
    for t, c in found:
        run, previous = t.runs[c.index], t.runs[c.index - 1]
        print(f"{t.cluster}  {t.case}  {t.metric}: at run {run.run_id} ({run.finished_at}) "
              f"{_number(c.before)} -> {_number(c.after)} ({abs(c.worse):.1%} {c.direction}; "
              f"noise {t.noise:.1%}, limit {t.limit:.1%}, experiment {t.experiment}); "
              f"against run {previous.run_id}: {what_changed(previous, run)}")  # fmt: skip
    return 0


def _split_case(history: History, cluster: str, case: str) -> tuple[str, str]:
    """``tp32-c8`` -> (tp32, c8), knowing the cluster's (layout, point) pairs (layout names
    may hold dashes: ``tp32-cp4k-c8``)."""
    known = history.cases(cluster)
    for layout, point in sorted(known, key=lambda pair: -len(pair[0])):
        if case == (f"{layout}-{point}" if point else layout):
            return layout, point
    names = sorted(f"{layout}-{point}" if point else layout for layout, point in known)
    raise HistoryError(f"{history.path}: no case {case!r} on {cluster} (it has: "
                       f"{', '.join(names) or 'none'})")  # fmt: skip


def _newest_experiment(
    history: History, runs: list[RunRecord], cluster: str, layout: str, point: str
) -> str:
    """The experiment of the newest run on ``cluster`` that measured (layout, point)."""
    for run in reversed([r for r in runs if r.cluster == cluster]):
        for result in history.results(run.uid):
            if (result.layout, result.point) == (layout, point):
                return result.experiment
    raise HistoryError(f"{history.path}: no run measured {layout} {point}".rstrip())


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


if __name__ == "__main__":
    sys.exit(main())
