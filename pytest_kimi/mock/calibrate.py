"""Fit the mock's fittable constants to measured summaries, and predict the other layouts.

``python -m pytest_kimi.mock.calibrate --target FILE --fit-layout tp32 [--json]``

FILE (JSON or YAML) maps layout names to summaries with ``bench_serving``'s keys
(``{"tp32": {"mean_ttft_ms": ..., "duration": ...}, "pp8": {...}}``): a hand-typed table such
as the seed's (``pytest_kimi/data/seed_target.json``), or a saved run's ``summary.json`` files
(same keys; a single ``summary.json`` names its layout under ``"layout"``). Layouts' parallelism,
the deployment and the workload come from ``--cluster`` (default ``clusters/local.yaml``), the
prompts from its workload (:mod:`pytest_kimi.mock.mission`).

Only constants without a published source are fitted (:data:`KNOBS`): ``mfu`` and the
per-stage step overhead; collective latencies come from NCCL's own tables scaled by a measured
factor (:mod:`pytest_kimi.mock.perfmodel`). The fit (SciPy's Nelder-Mead on log factors)
minimises the mean squared log error of the fitted layouts' cells. Every layout in FILE is
then simulated (``reaction_s`` 0, as the live mock runs) and compared: fitted layouts are
fits, the others predictions.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import minimize

from pytest_kimi.mock.mission import (
    Deployment,
    deployment,
    mission_input_lens,
    profile_of,
    simulate_deployment,
    summarize_twin,
    unified_layouts,
)
from pytest_kimi.mock.perfmodel import Profile

# the seed table's twelve cells, bench_serving's output-file keys (p95: 0.5.9 writes only p99
# of TTFT/TPOT/E2E, sglang.benchmark.serving from 0.5.15 p90 and p95 too; pytest-kimi's
# summary.json has p95 with the same naming in either case)
CELLS: tuple[str, ...] = (
    "duration", "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p95_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p95_tpot_ms",
    "mean_e2e_latency_ms", "p95_e2e_latency_ms",
)  # fmt: skip
# catalogue names (ttft_p95) accepted for the same cells
ALIASES: dict[str, str] = {
    "ttft_mean": "mean_ttft_ms", "ttft_median": "median_ttft_ms", "ttft_p95": "p95_ttft_ms",
    "tpot_mean": "mean_tpot_ms", "tpot_median": "median_tpot_ms", "tpot_p95": "p95_tpot_ms",
    "e2e_mean": "mean_e2e_latency_ms", "e2e_p95": "p95_e2e_latency_ms",
}  # fmt: skip
# fitted knob -> the profile fields it scales together
KNOBS: dict[str, tuple[str, ...]] = {
    "mfu": ("mfu",),
    "step_overhead": ("step_overhead_ms",),
}


class TargetError(ValueError):
    """A target file that cannot be used; the message names the file and the field."""


def load_target(path: Path) -> dict[str, dict[str, float]]:
    """Layout -> cell -> value from a JSON or YAML file; unknown keys ignored, bad ones named."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TargetError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise TargetError(f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}") from None
    if isinstance(data, Mapping) and isinstance(data.get("layout"), str):
        data = {data["layout"]: data}  # one saved summary.json
    if not isinstance(data, Mapping) or not data:
        raise TargetError(f"{path}: expected a mapping of layout name -> summary")
    out: dict[str, dict[str, float]] = {}
    for layout, summary in data.items():
        if not isinstance(summary, Mapping):
            raise TargetError(f"{path}: {layout}: expected a mapping of metric -> value")
        cells: dict[str, float] = {}
        for key, value in summary.items():
            cell = ALIASES.get(str(key), str(key))
            if cell not in CELLS or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TargetError(f"{path}: {layout}.{key}: expected a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise TargetError(f"{path}: {layout}.{key}: must be positive, got {value!r}")
            cells[cell] = float(value)
        if not cells:
            raise TargetError(f"{path}: {layout}: none of the known metrics ({', '.join(CELLS)})")
        out[str(layout)] = cells
    return out


def predict(
    profile: Profile, dep: Deployment, input_lens: Sequence[int], *, itl: bool = False
) -> dict[str, float]:
    """One layout's twelve cells, by the product's definitions, with ``reaction_s`` 0."""
    summary = summarize_twin(simulate_deployment(profile, dep, input_lens), itl=itl)
    figures = summary.to_dict()
    return {cell: float(figures[cell]) for cell in CELLS}


def apply(start: Profile, factors: Mapping[str, float]) -> Profile:
    """``start`` with each knob's fields multiplied by its factor (mfu capped at 1)."""
    changes: dict[str, float] = {}
    for knob, factor in factors.items():
        for name in KNOBS[knob]:
            changes[name] = getattr(start, name) * factor
    if "mfu" in changes:
        changes["mfu"] = min(1.0, changes["mfu"])
    return replace(start, **changes)


def minimise(f: Callable[[np.ndarray], float], x0: np.ndarray, *, max_evals: int) -> np.ndarray:
    """Minimise ``f`` from ``x0`` by SciPy's Nelder-Mead: derivative-free, which suits a
    discrete-event simulation whose percentiles move in small jumps. The first simplex steps
    0.3 in each log factor (x1.35), wide enough to step over those jumps."""
    simplex = np.vstack([x0] + [x0 + 0.3 * row for row in np.eye(len(x0))])
    result = minimize(
        f,
        x0,
        method="Nelder-Mead",
        options={
            "initial_simplex": simplex,
            "maxfev": max_evals,
            "xatol": 1e-3,
            "fatol": 1e-4,
        },
    )
    return np.asarray(result.x)


@dataclass(frozen=True)
class Calibration:
    """A fit and what it predicts."""

    profile: Profile  # the one every layout was simulated with
    fitted: dict[str, float]  # profile field -> fitted value; empty when nothing was fitted
    fit_layouts: tuple[str, ...]
    layouts: dict[str, dict[str, float]]  # every target layout's predicted cells

    def errors(self, target: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
        """Relative error of each predicted cell against the target, per layout."""
        return {
            name: {c: self.layouts[name][c] / v - 1 for c, v in cells.items()}
            for name, cells in target.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """``--json``'s document: the fit, the fittable constants simulated, every layout."""
        return {
            "fitted": self.fitted,
            "fit_layouts": list(self.fit_layouts),
            "profile": {name: getattr(self.profile, name) for f in KNOBS.values() for name in f},
            "layouts": self.layouts,
        }


def calibrate(
    target: Mapping[str, Mapping[str, float]],
    fit_layouts: Sequence[str],
    deployments: Mapping[str, Deployment],
    input_lens: Sequence[int],
    start: Profile,
    *,
    knobs: Sequence[str] = tuple(KNOBS),
    max_evals: int = 120,
) -> Calibration:
    """Fit ``knobs`` on ``fit_layouts`` from ``start``; predict every layout of ``target``."""
    for name in fit_layouts:
        if name not in target:
            raise TargetError(f"--fit-layout {name}: not in the target (has: {', '.join(target)})")
    for name in target:
        if name not in deployments:
            known = ", ".join(deployments)
            raise TargetError(f"{name}: no such layout in the cluster file (has: {known})")

    def loss(x: np.ndarray) -> float:
        profile = apply(start, dict(zip(knobs, np.exp(x), strict=True)))
        errs = []
        for name in fit_layouts:
            cells = predict(profile, deployments[name], input_lens)
            errs += [math.log(cells[c] / v) ** 2 for c, v in target[name].items()]
        return float(np.mean(errs))

    best = np.zeros(len(knobs))
    fitting = bool(fit_layouts and knobs and max_evals > 0)
    if fitting:
        best = minimise(loss, best, max_evals=max_evals)
    profile = apply(start, dict(zip(knobs, np.exp(best), strict=True)))
    fitted = {name: round(float(getattr(profile, name)), 4) for k in knobs for name in KNOBS[k]}
    profile = replace(profile, **fitted)  # what is reported is what is simulated
    fitted = fitted if fitting else {}
    layouts = {name: predict(profile, deployments[name], input_lens) for name in target}
    return Calibration(profile, fitted, tuple(fit_layouts), layouts)


def error_table(cal: Calibration, target: Mapping[str, Mapping[str, float]]) -> str:
    """Per-cell target, twin and error, one column group per layout, fitted ones marked."""
    names = list(target)
    errors = cal.errors(target)
    head = ["metric"]
    for name in names:
        role = "fitted" if name in cal.fit_layouts else "predicted"
        head += [f"{name} target", f"{name} twin ({role})", "error"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for cell in CELLS:
        row = [cell]
        for name in names:
            if cell in target[name]:
                value = cal.layouts[name][cell]
                row += [f"{target[name][cell]:.2f}", f"{value:.2f}", f"{errors[name][cell]:+.1%}"]
            else:
                row += ["", f"{cal.layouts[name][cell]:.2f}", ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def start_profile(profile: Profile, overrides: Sequence[str]) -> Profile:
    """``profile`` with ``FIELD=VALUE`` overrides, checked as the cluster file's are."""
    values = {f.name: getattr(profile, f.name) for f in fields(profile)}
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--start {item}: expected FIELD=VALUE")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--start {item}: {value!r} is not a number") from None
    return Profile.from_mapping(values)


def main(argv: Sequence[str] | None = None) -> int:
    from pytest_kimi.config import ConfigError, load_cluster
    from pytest_kimi.workload.dataset import DatasetError

    parser = argparse.ArgumentParser(
        prog="python -m pytest_kimi.mock.calibrate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--target", required=True, type=Path, help="JSON/YAML: layout -> summary")
    parser.add_argument(
        "--fit-layout", default="", help="layout(s) to fit on, comma-separated; none: predict only"
    )
    parser.add_argument("--cluster", type=Path, default=Path("clusters/local.yaml"))
    parser.add_argument("--json", action="store_true", help="print JSON; the table to stderr")
    parser.add_argument("--max-evals", type=int, default=120, help="simulations per fit (cap)")
    parser.add_argument(
        "--knobs",
        default=",".join(KNOBS),
        help=f"constants to fit, comma-separated (default all: {', '.join(KNOBS)}); "
        "leave out one you measured and pass its value with --start",
    )
    parser.add_argument(
        "--start",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="start the fit from this profile value instead of the cluster file's (repeatable)",
    )
    args = parser.parse_args(argv)
    fit_layouts = [s.strip() for s in args.fit_layout.split(",") if s.strip()]
    knobs = [s.strip() for s in args.knobs.split(",") if s.strip()]
    try:
        unknown = [k for k in knobs if k not in KNOBS]
        if unknown:
            raise ValueError(f"--knobs {', '.join(unknown)}: unknown (known: {', '.join(KNOBS)})")
        target = load_target(args.target)
        cluster = load_cluster(args.cluster)
        deployments = {name: deployment(cluster, name) for name in unified_layouts(cluster)}
        start = start_profile(profile_of(cluster), args.start)
        cal = calibrate(
            target, fit_layouts, deployments, mission_input_lens(cluster), start,
            knobs=knobs, max_evals=args.max_evals,
        )  # fmt: skip
    except (TargetError, ConfigError, DatasetError, ValueError) as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    table = error_table(cal, target)
    if args.json:
        print(json.dumps(cal.to_dict(), indent=2))
        print(table, file=sys.stderr)
    else:
        if cal.fitted:
            print(f"fitted on {', '.join(cal.fit_layouts)}: {json.dumps(cal.fitted)}")
        else:
            print(f"nothing fitted; profile: {json.dumps(cal.to_dict()['profile'])}")
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
