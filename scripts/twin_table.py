"""Put the mock's figures beside the seed report's table, with each cell's relative error.

Usage:
  python scripts/twin_table.py            the offline twin of clusters/local.yaml's mission
  python scripts/twin_table.py --write    the same, written into docs/mock.md
  python scripts/twin_table.py reports/<run-id>/comparison.json     a live run of the mission

The live mock equals the twin on every cell (tests/integration/test_twin_live.py), so the
table in docs/mock.md is the twin's, and tests/unit/test_twin_table_doc.py fails when the
committed table is not what this script produces. The seed's figures are the hand-made
report's (../shared/seed/README.md), DP2, 40 requests, 16K in / 512 out, concurrency 8, on
8 x 8 RTX Pro 6000D.
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


ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mock.md"
BEGIN, END = "<!-- twin-table:begin -->", "<!-- twin-table:end -->"


def twin_rows(cluster_file: Path = ROOT / "clusters" / "local.yaml") -> dict[str, dict]:
    """Each seed metric's value per layout in the offline twin of the cluster file's run."""
    from pytest_kimi.config import load_cluster
    from pytest_kimi.mock import mission

    cluster = load_cluster(cluster_file)
    lens = mission.mission_input_lens(cluster)
    profile = mission.profile_of(cluster)
    rows: dict[str, dict] = {metric: {} for metric in SEED}
    for layout in ("tp32", "pp8"):
        run = mission.simulate_deployment(profile, mission.deployment(cluster, layout), lens)
        summary = mission.summarize_twin(run)
        for metric in SEED:
            rows[metric][layout] = summary.metric(metric)
    return rows


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replace the table between the markers in ``doc``."""
    body = doc.read_text()
    head, _, rest = body.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def doc_table(doc: Path = DOC) -> str:
    """The table now between the markers in ``doc``."""
    return doc.read_text().partition(BEGIN)[2].partition(END)[0].strip()


def table(comparison: dict) -> str:
    """A comparison.json (or ``{"rows": [{"metric", "values"}]}``) beside the seed."""
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


def twin_table() -> str:
    rows = twin_rows()
    return table({"rows": [{"metric": m, "values": v} for m, v in rows.items()]})


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] != "--write":
        print(table(json.loads(Path(args[0]).read_text())))
    elif args:
        write_doc(twin_table())
    else:
        print(twin_table())
