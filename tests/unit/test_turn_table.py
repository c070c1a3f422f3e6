"""The per-turn table of comparison.md and report.html, from each layout's by_turn."""

from __future__ import annotations

from pytest_kimi.report.html import _splits
from pytest_kimi.report.turns import turn_lines, turn_rows


def _summary(ttft_ms: float, cached: int | None, rate: float, by_turn: dict | None = None):
    return {"completed": 4, "mean_ttft_ms": ttft_ms, "p95_ttft_ms": 2 * ttft_ms,
            "p95_e2e_latency_ms": 10 * ttft_ms, "cached_tokens_total": cached,
            "cache_hit_rate": rate, "by_turn": by_turn or {}}  # fmt: skip


def _section() -> dict:
    rr = _summary(900, 1000, 0.25, {"0": _summary(1200, 0, 0.0), "1": _summary(600, 1000, 0.5)})
    aware = _summary(500, 3000, 0.75,
                     {"0": _summary(800, 500, 0.2), "1": _summary(200, 2500, float("nan"))})
    return {"layouts": [{"name": "tp32-rr", "summary": rr},
                        {"name": "tp32-cache-aware", "summary": aware}]}  # fmt: skip


def test_each_turn_and_layout_is_a_row_with_its_ttft_and_hit_rate_then_the_whole_run():
    rows = turn_rows(_section())
    assert rows == [
        ["0", "tp32-rr", "4", "1.20 s", "2.40 s", "12.00 s", "0", "0.0%"],
        ["0", "tp32-cache-aware", "4", "0.80 s", "1.60 s", "8.00 s", "500", "20.0%"],
        ["1", "tp32-rr", "4", "0.60 s", "1.20 s", "6.00 s", "1000", "50.0%"],
        ["1", "tp32-cache-aware", "4", "0.20 s", "0.40 s", "2.00 s", "2500", "n/a"],
        ["all", "tp32-rr", "4", "0.90 s", "1.80 s", "9.00 s", "1000", "25.0%"],
        ["all", "tp32-cache-aware", "4", "0.50 s", "1.00 s", "5.00 s", "3000", "75.0%"],
    ]
    lines = turn_lines(_section(), "## Per session turn")
    assert lines[1] == "## Per session turn" and lines[-1].startswith("| all | tp32-cache-aware")
    assert [s["title"] for s in _splits(_section())] == ["Per session turn"]


def test_single_turn_runs_have_no_turn_table():
    section = {"layouts": [{"name": "tp32", "summary": _summary(900, None, float("nan"))},
                           {"name": "pp8", "error": "not measured"}]}  # fmt: skip
    assert turn_rows(section) == [] and turn_lines(section, "## x") == []
    assert _splits(section) == []
