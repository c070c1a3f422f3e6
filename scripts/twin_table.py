"""Put a mock run's comparison beside the seed report's table, with each cell's relative error.

Usage: python scripts/twin_table.py reports/<run-id>/comparison.json
The seed's figures are the hand-made report's (../shared/seed/README.md), DP2, 40 requests,
16K in / 512 out, concurrency 8, on 8 x 8 RTX Pro 6000D.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# metric -> (label, unit divisor for display, seed tp32, seed pp8); latencies in ms
SEED = {
    "duration": ("Benchmark duration (s)", 1, 238.18, 370.30),
    "input_throughput": ("Input TPS", 1, 2797.64, 1799.46),
    "output_throughput": ("Output TPS", 1, 85.99, 55.31),
    "total_throughput": ("Total TPS", 1, 2883.63, 1854.76),
    "ttft_mean": ("TTFT mean (s)", 1000, 8350.0, 7840.0),
    "ttft_median": ("TTFT median (s)", 1000, 5300.0, 7030.0),
    "ttft_p95": ("TTFT p95 (s)", 1000, 20790.0, 11680.0),
    "tpot_mean": ("TPOT mean (ms)", 1, 75.93, 126.86),
    "tpot_median": ("TPOT median (ms)", 1, 79.95, 136.09),
    "tpot_p95": ("TPOT p95 (ms)", 1, 88.06, 145.13),
    "e2e_mean": ("E2E mean (s)", 1000, 47150.0, 72660.0),
    "e2e_p95": ("E2E p95 (s)", 1000, 59240.0, 82830.0),
}


def table(comparison: dict) -> str:
    rows = {r["metric"]: r["values"] for r in comparison["rows"]}
    out = [
        "| metric | seed tp32 | mock tp32 | error | seed pp8 | mock pp8 | error |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for metric, (label, div, seed_tp, seed_pp) in SEED.items():
        mock_tp, mock_pp = rows[metric]["tp32"], rows[metric]["pp8"]
        cells = [label]
        for seed, mock in ((seed_tp, mock_tp), (seed_pp, mock_pp)):
            cells += [f"{seed / div:.2f}", f"{mock / div:.2f}", f"{(mock - seed) / seed:+.1%}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
