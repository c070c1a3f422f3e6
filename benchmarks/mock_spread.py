"""Run-to-run spread of the mission on the mock, and each run against the offline twin.

Runs ``pytest tests/perf --layout=tp32,pp8`` (the mission's command, ``clusters/local.yaml``
unless ``--cluster``) several times in a row on this machine, then prints, for each of the seed
table's twelve cells per layout: every run's value, the spread ``(max - min) / mean`` over the
runs, and the worst difference from the twin (``pytest_kimi.mock.mission``) on the same prompts.
The regression gate on the mock is only as good as this spread.

    python benchmarks/mock_spread.py                 # 3 runs (~3 minutes on 2 cores)
    python benchmarks/mock_spread.py --runs 5 --json spread.json

Machine-dependent: only the wall time. The figures are cluster time and, with the shared
clock (docs/mock.md, "One clock"), should not depend on the machine or its load at all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_kimi.mock.calibrate import CELLS  # the seed table's twelve cells

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("tp32", "pp8")


def one_run(cluster: Path, out: Path) -> tuple[dict[str, dict], float]:
    """One mission run; each layout's summary.json, and the command's wall seconds."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/perf", "--layout=" + ",".join(LAYOUTS),
         f"--cluster={cluster}", f"--kimi-report-dir={out}", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the mission failed:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    [run] = list(out.iterdir())
    return {lay: json.loads((run / lay / "summary.json").read_text()) for lay in LAYOUTS}, wall


def twin_cells(cluster: Path) -> dict[str, dict[str, float]]:
    from pytest_kimi.config import load_cluster
    from pytest_kimi.mock import mission

    config = load_cluster(cluster)
    lens, profile = mission.mission_input_lens(config), mission.profile_of(config)
    out = {}
    for lay in LAYOUTS:
        run = mission.simulate_deployment(profile, mission.deployment(config, lay), lens)
        out[lay] = mission.summarize_twin(run).to_dict()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cluster", type=Path, default=ROOT / "clusters" / "local.yaml")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    runs, walls = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            summaries, wall = one_run(args.cluster.resolve(), Path(tmp) / f"run{i}")
            runs.append(summaries)
            walls.append(wall)
            print(f"run {i + 1}/{args.runs}: {wall:.0f} s wall", file=sys.stderr)
    twin = twin_cells(args.cluster)
    rows = []
    for lay in LAYOUTS:
        for cell in CELLS:
            values = [r[lay][cell] for r in runs]
            mean = sum(values) / len(values)
            spread = (max(values) - min(values)) / mean if mean else 0.0
            vs_twin = max(abs(v / twin[lay][cell] - 1) for v in values)
            rows.append({"layout": lay, "cell": cell, "values": values, "spread": spread,
                         "worst_vs_twin": vs_twin, "twin": twin[lay][cell]})  # fmt: skip
    print(f"{'layout':6} {'cell':22} {'spread':>8} {'vs twin':>8}  values")
    for r in rows:
        shown = " ".join(f"{v:.2f}" for v in r["values"])
        lay, cell, spread, off = r["layout"], r["cell"], r["spread"], r["worst_vs_twin"]
        print(f"{lay:6} {cell:22} {spread:8.3%} {off:8.3%}  {shown}")
    worst = max(r["spread"] for r in rows)
    worst_twin = max(r["worst_vs_twin"] for r in rows)
    print(f"worst spread {worst:.3%}, worst vs twin {worst_twin:.3%}, over {args.runs} runs; "
          f"wall per run {min(walls):.0f}-{max(walls):.0f} s")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "walls_s": walls, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
