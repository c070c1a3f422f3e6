"""Re-render a comparison from saved result folders, without re-running anything.

    python -m pytest_kimi.report reports/A/tp32 reports/B/pp8 [--out DIR]

The first folder is the reference. Writes comparison.md, comparison.json and report.html.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from pytest_kimi.report.comparison import render_markdown, render_text
from pytest_kimi.report.html import render_html
from pytest_kimi.report.reporting import comparison
from pytest_kimi.report.setup import experiment_setup
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.results.store import SavedRunError, load_layout, write_comparison


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_kimi.report", description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path, help="saved layout folders")
    parser.add_argument("--out", type=Path, default=Path("."), help="where to write (default .)")
    args = parser.parse_args(argv)
    try:
        loaded = [load_layout(folder) for folder in args.folders]
    except SavedRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = [result for result, _ in loaded]
    runs = [folder.parents[1] if r.point else folder.parent for r, folder in
            zip(results, args.folders, strict=True)]  # fmt: skip
    for result in results:  # each folder given is a column: a point's id joins its name
        result.name, result.point = result.case, ""
    names = [r.name for r in results]
    if len(set(names)) != len(names):  # the same layout from two runs: tell them apart
        for result, run in zip(results, runs, strict=True):
            result.name = f"{run.name}/{result.name}"
    first = loaded[0][1]
    model = comparison(
        results,
        run_id=" vs ".join(str(f) for f in args.folders),
        backend=first.get("backend", "sglang"),
        time_scale=float(first.get("time_scale") or 1.0),
        setup=experiment_setup(_manifests(results, args.folders)),
    )
    assert model is not None  # at least one folder was given
    html = render_html(
        model,
        {r.name: r.records for r in results},
        {r.name: r.replica_counters for r in results},
        {r.name: r.telemetry_series for r in results},
    )
    write_comparison(args.out, model, render_markdown(model), html)
    print(render_text(model))
    print(f"wrote {args.out / 'comparison.md'}, comparison.json, report.html")
    return 0


def _manifests(results: list[LayoutResult], folders: list[Path]) -> dict[str, dict]:
    """Each column's manifest: in its folder, or the layout folder above a point's."""
    out: dict[str, dict] = {}
    for result, folder in zip(results, folders, strict=True):
        for path in (folder / "manifest.json", folder.parent / "manifest.json"):
            if result.name not in out and path.exists():
                with contextlib.suppress(OSError, ValueError):
                    out[result.name] = json.loads(path.read_text(encoding="utf-8"))
    return out


if __name__ == "__main__":
    sys.exit(main())
