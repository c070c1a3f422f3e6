"""Read a history file.

    python -m pytest_kimi.history PATH                      every run, oldest first
    python -m pytest_kimi.history PATH show RUN_ID          one run's results
    python -m pytest_kimi.history PATH series CASE METRIC   one metric across runs
                                                            (CASE: tp32, or tp32-c8)
Add --json for machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from pytest_kimi.history.store import History, HistoryError

SHOWN = ("ttft_p95", "tpot_mean", "tpot_p95", "output_throughput", "success_rate")
"""The figures ``show`` prints per result (all of them are in --json)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_kimi.history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, help="the history file")
    parser.add_argument("--json", action="store_true", help="print JSON")
    sub = parser.add_subparsers(dest="command")
    show = sub.add_parser("show", help="one run's results")
    show.add_argument("run_id")
    series = sub.add_parser("series", help="one metric of one layout (and point) across runs")
    series.add_argument("case", help="layout, or layout-point as in test ids: tp32-c8")
    series.add_argument("metric", help="catalogue name: ttft_p95, tpot_mean, output_throughput")
    series.add_argument("--cluster", help="the cluster's name (default: the newest run's)")
    args = parser.parse_args(argv)
    history = History(args.path)
    try:
        if args.command == "show":
            return _show(history, args.run_id, args.json)
        if args.command == "series":
            return _series(history, args.case, args.metric, args.cluster, args.json)
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


def _show(history: History, run_id: str, as_json: bool) -> int:
    results = history.results(run_id)
    if as_json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return 0
    for r in results:
        case = f"{r.layout}-{r.point}" if r.point else r.layout
        if r.error:
            print(f"{case}: not measured: {r.error.splitlines()[0]}")
            continue
        figures = "  ".join(f"{m} {_number(r.metrics.get(m))}" for m in SHOWN)
        print(f"{case}: {figures}")
    return 0


def _series(history: History, case: str, metric: str, cluster: str | None, as_json: bool) -> int:
    runs = history.runs()
    if not runs:
        raise HistoryError(f"{history.path}: no runs yet")
    cluster = cluster or runs[-1].cluster
    layout, _, point = _split_case(history, case)
    entries = history.series(cluster, layout, point, metric)
    if as_json:
        print(json.dumps([{"run_id": e.run.run_id, "finished_at": e.run.finished_at,
                           "git_commit": e.run.git_commit, "value": e.value}
                          for e in entries], indent=2))  # fmt: skip
        return 0
    for e in entries:
        print(f"{e.run.run_id}  {e.run.git_commit or '-':>12}  {_number(e.value)}")
    return 0


def _split_case(history: History, case: str) -> tuple[str, str, str]:
    """``tp32-c8`` -> (tp32, -, c8), knowing which layouts the history has (names may hold
    dashes: ``tp32-cp4k-c8``)."""
    layouts = {r.layout for run in history.runs() for r in history.results(run.run_id)}
    if case in layouts:
        return case, "", ""
    for layout in sorted(layouts, key=len, reverse=True):
        if case.startswith(layout + "-"):
            return layout, "-", case[len(layout) + 1 :]
    raise HistoryError(f"{history.path}: no layout in {case!r} (the history has: "
                       f"{', '.join(sorted(layouts)) or 'none'})")  # fmt: skip


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


if __name__ == "__main__":
    sys.exit(main())
