"""``sglang:per_stage_req_latency_seconds``: how long a disaggregated request spent per stage.

Each side of a disaggregated deployment (:mod:`pytest_kimi.mock.disagg`) observes the stages
SGLang's histogram does, each from the previous stage's mark, in cluster seconds, with
SGLang's buckets; the scrape writes them as Prometheus text.
"""

from __future__ import annotations

import collections

from pytest_kimi.workload.sharedclock import INF

# SGLang's per-stage histogram: exponential_buckets(start=0.001, width=1.62, length=30)
STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))


class StageLatencies:
    """``sglang:per_stage_req_latency_seconds``: one histogram per stage (cluster seconds)."""

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = collections.defaultdict(float)

    def observe(self, stage: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        counts = self.counts.setdefault(stage, [0] * (len(STAGE_BUCKETS) + 1))
        index = next((i for i, b in enumerate(STAGE_BUCKETS) if seconds <= b), len(STAGE_BUCKETS))
        counts[index] += 1
        self.sums[stage] += seconds

    def lines(self, labels: str) -> list[str]:
        """Prometheus text: cumulative ``_bucket`` lines, ``_sum`` and ``_count`` per stage."""
        name = "sglang:per_stage_req_latency_seconds"
        out = [f"# HELP {name} The latency of each stage of requests.",
               f"# TYPE {name} histogram"]  # fmt: skip
        inner = labels.strip("{}")
        for stage, counts in self.counts.items():
            tag = f'{inner},stage="{stage}"'
            total = 0
            for bound, n in zip([*STAGE_BUCKETS, INF], counts, strict=True):
                total += n
                le = "+Inf" if bound == INF else repr(float(bound))
                out.append(f'{name}_bucket{{{tag},le="{le}"}} {float(total)}')
            out.append(f"{name}_sum{{{tag}}} {self.sums[stage]}")
            out.append(f"{name}_count{{{tag}}} {float(total)}")
        return out
