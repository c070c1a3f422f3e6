"""Figures per session turn: what a layout does to the later turns of a conversation.

A session's later turns resend everything before them, so what they cost depends on the
prefix cache: a hit skips that prefill, a miss pays for the whole conversation again. A run's
overall TTFT mixes the turns; this table puts, per turn and layout, TTFT mean and p95 beside
the prompt tokens the servers found cached and their share of the prompt, from each layout's
``summary.json`` ``by_turn``, and the whole run's hit rate under ``all``. Pure functions over
the report model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_kimi.report.categories import seconds, split_lines

HEADER = ("turn", "layout", "requests", "TTFT mean", "TTFT p95", "E2E p95", "cached tokens",
          "cache hit rate")  # fmt: skip
CAPTION = (
    "Per session turn (0 = each session's first request): each layout's requests of that turn "
    "alone, and 'all' of them. Cached tokens: prompt tokens the servers found in their prefix "
    "cache, as each response said (SGLang's meta_info.cached_tokens; the OpenAI APIs report "
    "them only with --enable-cache-report); hit rate = cached / prompt tokens; 'n/a' where no "
    "response said."
)


def turn_rows(section: Mapping[str, Any]) -> list[list[str]]:
    """One row per (turn, layout), turns in order, then each layout's whole run; empty when
    no layout's run had sessions of two or more turns."""
    summaries = {lay["name"]: lay.get("summary") or {} for lay in section["layouts"]}
    by_layout = {name: s.get("by_turn") or {} for name, s in summaries.items()}
    turns = sorted({int(t) for by in by_layout.values() for t in by})
    if not turns:
        return []
    rows = [[str(turn), layout, *_cells(by[str(turn)])]
            for turn in turns for layout, by in by_layout.items() if str(turn) in by]  # fmt: skip
    rows += [["all", layout, *_cells(summaries[layout])]
             for layout, by in by_layout.items() if by]  # fmt: skip
    return rows


def _cells(summary: Mapping[str, Any]) -> list[str]:
    cached, rate = summary.get("cached_tokens_total"), summary.get("cache_hit_rate")
    return [
        str(summary.get("completed", 0)),
        seconds(summary.get("mean_ttft_ms")),
        seconds(summary.get("p95_ttft_ms")),
        seconds(summary.get("p95_e2e_latency_ms")),
        "n/a" if cached is None else str(cached),
        "n/a" if rate is None or math.isnan(rate) else f"{rate:.1%}",
    ]


def turn_lines(section: Mapping[str, Any], heading: str) -> list[str]:
    """The table as Markdown under ``heading``; nothing when there are no turns to split."""
    return split_lines(heading, CAPTION, HEADER, turn_rows(section))
