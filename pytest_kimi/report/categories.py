"""Figures per SPEED-Bench category: what a layout does to each kind of prompt.

SPEED-Bench's throughput splits mix three entropy tiers (``low_entropy``, ``mixed``,
``high_entropy``) because speculative decoding accepts more drafts on predictable text; a run's
overall TPOT averages that away. This table puts, per category and layout, TTFT p95, TPOT mean
and p95 beside the accept length (where the layout speculated), from each layout's
``summary.json`` ``by_category``. Pure functions over the report model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

HEADER = ("category", "layout", "requests", "TTFT p95", "TPOT mean", "TPOT p95",
          "accept length")  # fmt: skip
CAPTION = (
    "Per SPEED-Bench category: each layout's requests of that category alone. Accept length: "
    "completion tokens per verify step (speculative decoding), from each response's meta_info; "
    "'-' where the layout did not speculate or its responses carried no counts (the OpenAI "
    "APIs)."
)


def category_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """One row per (category, layout), categories in name order, layouts in the section's
    order; empty when no layout's requests span two or more categories."""
    by_layout = {
        lay["name"]: (lay.get("summary") or {}).get("by_category") or {}
        for lay in section["layouts"]
    }
    names = sorted({c for by in by_layout.values() for c in by})
    rows = []
    for category in names:
        for layout, by in by_layout.items():
            if category in by:
                rows.append([category, layout, *_cells(by[category])])
    return rows


def _cells(summary: Mapping[str, Any]) -> list[str]:
    accept = summary.get("spec_accept_length")
    return [
        str(summary.get("completed", 0)),
        seconds(summary.get("p95_ttft_ms")),
        _ms(summary.get("mean_tpot_ms")),
        _ms(summary.get("p95_tpot_ms")),
        "-" if accept is None or math.isnan(accept) else f"{accept:.2f}",
    ]


def seconds(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.2f} s"


def _ms(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.1f} ms"


def category_lines(section: Mapping[str, Any], heading: str) -> list[str]:
    """The table as Markdown under ``heading``; nothing when there is nothing to split."""
    return split_lines(heading, CAPTION, HEADER, category_rows(section))


def split_lines(
    heading: str, caption: str, header: tuple[str, ...], rows: list[list[str]]
) -> list[str]:
    """A split table (two label columns, then figures) as Markdown under ``heading``;
    nothing without rows."""
    if not rows:
        return []
    lines = ["", heading, "", caption, "", "| " + " | ".join(header) + " |",
             "|" + "---|" * 2 + "---:|" * (len(header) - 2)]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
