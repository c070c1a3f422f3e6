"""Where a disaggregated layout's TTFT goes: SGLang's own per-stage latencies, split.

With prefill/decode disaggregation a request's first token passes the prefill server (waiting
for its decode server's slot, queueing, the forward pass), the KV cache's transfer and the
decode server's admission. SGLang times each stage itself, in one histogram
``sglang:per_stage_req_latency_seconds{stage=...}`` on each side's ``/metrics`` (each stage the
time since the previous stage's mark). Read before and after the measured run, the histograms'
sums over their counts give each stage's mean per request; what TTFT holds beyond them is the
router, HTTP and the client.

What each release observes (pytest_kimi.config.versions): 0.5.9 the prefill's ``prefill_prepare``,
``prefill_bootstrap``, ``prefill_waiting`` (each chunk's wait) and ``prefill_forward`` (the
last chunk); from 0.5.10 ``prefill_waiting`` and ``prefill_prepare`` are only traced, the queue
is ``sglang:queue_time_seconds`` (one sample per request: the wait before its first forward;
read here from the prefill servers only, as ``prefill_queue``) and ``prefill_forward`` spans
the whole prefill, every chunk (``chunked_prefill`` times the earlier ones inside it). The
split reads what the servers export, so one reader serves every release.

KV transfer: 0.5.9 exports ``sglang:kv_transfer_speed_gb_s`` and ``sglang:kv_transfer_latency_ms``
as gauges on the prefill side and never sets them (always 0): the report says so. From 0.5.10
they are histograms observed once per request's transfer, with ``sglang:kv_transfer_total_mb``
beside them: over the measured run, the transfers, their mean size and latency, and the
throughput (all megabytes over all transfer time). Pure functions over metrics text and plain
data; :mod:`pytest_kimi.run.counters` scrapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STAGE_HISTOGRAM = "sglang:per_stage_req_latency_seconds"
QUEUE_HISTOGRAM = "sglang:queue_time_seconds"
QUEUE = "prefill_queue"  # a prefill server's sglang:queue_time_seconds (0.5.10 and later)
TRANSFER = "kv_transfer_tail"  # derived: see StageTimes.ttft_split
KV_SPEED = "sglang:kv_transfer_speed_gb_s"
KV_LATENCY = "sglang:kv_transfer_latency_ms"
KV_MB = "sglang:kv_transfer_total_mb"

# (stage, what it is) in a first token's order; each side's requests are counted by the stage
# it observes once per request at the end of its part (prefill_forward, decode_waiting)
TTFT_STAGES: tuple[tuple[str, str], ...] = (
    ("prefill_bootstrap", "prefill: waiting for the decode side's slot"),
    ("prefill_waiting", "prefill: queued (and earlier chunks)"),
    (QUEUE, "prefill: queued before its first chunk"),
    ("prefill_forward", "prefill: the last chunk's forward"),  # 0.5.10 on: FORWARD_ALL
    (TRANSFER, "KV transfer left after the last chunk, until it landed"),
    ("decode_waiting", "decode: KV landed to the first token"),
)
FORWARD_ALL = "prefill: its forward, every chunk"  # prefill_forward where QUEUE is read
# the prefill's stages up to its last forward, in either release's terms
PREFILL_STAGES = ("prefill_prepare", "prefill_bootstrap", "prefill_waiting", QUEUE,
                  "prefill_forward")  # fmt: skip
PREFILL_COUNT, DECODE_COUNT = "prefill_forward", "decode_waiting"


def stage_totals(text: str) -> dict[str, tuple[float, float]]:
    """``stage -> (sum, count)`` of the per-stage histogram in one server's ``/metrics`` text,
    summed over its other labels; a prefill server's ``sglang:queue_time_seconds`` as
    ``prefill_queue`` where it does not observe ``prefill_waiting`` (0.5.10 and later); empty
    where the server has no stages (not disaggregated)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[float, float]] = {}
    queue = (0.0, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name not in (STAGE_HISTOGRAM, QUEUE_HISTOGRAM):
            continue
        for sample in family.samples:
            if sample.name not in (f"{family.name}_sum", f"{family.name}_count"):
                continue
            if family.name == QUEUE_HISTOGRAM:
                queue = _add(queue, sample.name, sample.value)
                continue
            stage = sample.labels.get("stage")
            if stage is not None:
                out[stage] = _add(out.get(stage, (0.0, 0.0)), sample.name, sample.value)
    prefill = any(stage.startswith("prefill_") for stage in out)
    if prefill and "prefill_waiting" not in out and queue[1] > 0:
        out[QUEUE] = queue
    return out


def _add(pair: tuple[float, float], sample: str, value: float) -> tuple[float, float]:
    total, count = pair
    return (total + value, count) if sample.endswith("_sum") else (total, count + value)


def kv_gauges(text: str) -> dict[str, float]:
    """The prefill's KV transfer figures: a gauge's value (the highest of its label sets;
    0.5.9), a histogram's ``NAME_sum`` and ``NAME_count`` (summed; 0.5.10 and later); absent
    where the server has none."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (KV_SPEED, KV_LATENCY, KV_MB):
            continue
        for sample in family.samples:
            if family.type != "histogram" and sample.name == family.name:
                out[sample.name] = max(out.get(sample.name, 0.0), sample.value)
            elif sample.name in (f"{family.name}_sum", f"{family.name}_count"):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


@dataclass(frozen=True)
class Transfers:
    """The prefill servers' KV transfers over the measured run (SGLang 0.5.10 and later)."""

    count: int
    mean_mb: float
    mean_latency_ms: float
    gb_s: float  # all megabytes over all transfer time

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean_mb": self.mean_mb,
                "mean_latency_ms": self.mean_latency_ms, "gb_s": self.gb_s}  # fmt: skip


def transfers(
    before: Mapping[str, Mapping[str, float] | None],
    after: Mapping[str, Mapping[str, float] | None],
) -> Transfers | None:
    """The run's transfers from the histograms' growth on every prefill server; None where no
    server has them (0.5.9's gauges) or none was observed during the run."""
    grown: dict[str, float] = {}
    count = f"{KV_LATENCY}_count"
    for name, new in after.items():
        old = before.get(name)
        if not new or count not in new or old is None:
            continue  # no histograms, or no reading before the run to count from
        if new[count] < old.get(count, 0.0):
            continue  # a count went back: the server restarted
        for key in (f"{KV_LATENCY}_count", f"{KV_LATENCY}_sum", f"{KV_MB}_sum"):
            grown[key] = grown.get(key, 0.0) + new.get(key, 0.0) - old.get(key, 0.0)
    moved = grown.get(count, 0.0)
    if moved <= 0:
        return None
    latency_ms, mb = grown[f"{KV_LATENCY}_sum"], grown.get(f"{KV_MB}_sum", 0.0)
    return Transfers(int(moved), mb / moved, latency_ms / moved,
                     (mb / 1024) / (latency_ms / 1000) if latency_ms > 0 else 0.0)


@dataclass(frozen=True)
class StageTimes:
    """One disaggregated layout's measured run: each stage's mean seconds per request (cluster
    time on the mock), how many requests each side counted, and the KV transfer gauges where
    a server set them (``None``: 0 or absent, as on SGLang 0.5.9)."""

    seconds: Mapping[str, float]
    prefill_requests: int
    decode_requests: int
    kv_speed_gb_s: float | None = None
    kv_latency_ms: float | None = None
    notes: tuple[str, ...] = field(default=())
    kv_transfers: Transfers | None = None  # 0.5.10 and later: the run's transfers

    def transfer_tail(self) -> float | None:
        """Seconds from the last chunk's forward to the KV landing on the decode side. The
        router sends both sides the request at once; the decode side's stages up to the
        landing (``decode_prepare``, ``decode_bootstrap``, ``decode_transferred``) span the
        prefill side's up to its last forward and then this. (The prefill notices the decode's
        slot at its next poll, so taking the decode's bootstrap as the prefill's would count
        that wait twice.) Without the decode side's stages, the prefill's own
        ``prefill_transfer_kv_cache`` (done sending); without the prefill's, none."""
        s = self.seconds
        prefill = PREFILL_STAGES
        if "prefill_forward" not in s:
            return None
        if "decode_transferred" in s:
            landed = sum(s.get(k, 0.0) for k in ("decode_prepare", "decode_bootstrap",
                                                  "decode_transferred"))  # fmt: skip
            return max(0.0, landed - sum(s.get(k, 0.0) for k in prefill))
        return s.get("prefill_transfer_kv_cache")

    def ttft_split(self, ttft_mean_ms: float | None) -> list[tuple[str, float]]:
        """``(part, ms)`` in a first token's order, then what TTFT (mean) holds beyond the
        stages: the router, HTTP and the client (omitted without a TTFT)."""
        seconds = {**self.seconds, TRANSFER: self.transfer_tail()}
        whole = QUEUE in seconds  # 0.5.10 and later: prefill_forward spans every chunk
        parts = [(FORWARD_ALL if whole and stage == "prefill_forward" else label,
                  seconds[stage] * 1000.0) for stage, label in TTFT_STAGES
                 if seconds.get(stage) is not None]  # fmt: skip
        if ttft_mean_ms is not None and parts:
            rest = round(ttft_mean_ms - sum(ms for _, ms in parts), 3) + 0.0  # no "-0.0"
            parts.append(("the rest: router, HTTP, client", rest))
        return parts

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": dict(self.seconds),
            "prefill_requests": self.prefill_requests,
            "decode_requests": self.decode_requests,
            "kv_speed_gb_s": self.kv_speed_gb_s,
            "kv_latency_ms": self.kv_latency_ms,
            "notes": list(self.notes),
            "kv_transfers": self.kv_transfers.to_dict() if self.kv_transfers else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageTimes:
        return cls(
            seconds={str(k): float(v) for k, v in (data.get("seconds") or {}).items()},
            prefill_requests=int(data.get("prefill_requests") or 0),
            decode_requests=int(data.get("decode_requests") or 0),
            kv_speed_gb_s=data.get("kv_speed_gb_s"),
            kv_latency_ms=data.get("kv_latency_ms"),
            notes=tuple(data.get("notes") or ()),
            kv_transfers=Transfers(**data["kv_transfers"]) if data.get("kv_transfers") else None,
        )


Totals = Mapping[str, tuple[float, float]]


def stage_times(
    before: Mapping[str, Totals | None],
    after: Mapping[str, Totals | None],
    kv: Mapping[str, Mapping[str, float] | None],
    kv_before: Mapping[str, Mapping[str, float] | None] | None = None,
) -> StageTimes | None:
    """Each stage's mean over the run, from every server's totals before and after (replica
    name -> :func:`stage_totals`) and its :func:`kv_gauges` after (and before: a histogram's
    growth is the run's). ``None`` when no server has stages (not a disaggregated layout, or
    its metrics unreadable)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for name, new in after.items():
        old = before.get(name)
        if new is None or old is None:
            continue
        if any(count < old.get(stage, (0.0, 0.0))[1] for stage, (_, count) in new.items()):
            continue  # a count went back: the server restarted, its figures mean nothing here
        for stage, (total, count) in new.items():
            was_total, was_count = old.get(stage, (0.0, 0.0))
            sums[stage] = sums.get(stage, 0.0) + total - was_total
            counts[stage] = counts.get(stage, 0.0) + count - was_count
    if not sums:
        return None
    per_side = {"prefill": counts.get(PREFILL_COUNT, 0.0), "decode": counts.get(DECODE_COUNT, 0.0)}
    seconds = {}
    for stage, total in sums.items():
        n = per_side["decode" if stage.startswith("decode") else "prefill"]
        if n > 0:
            seconds[stage] = total / n
    moved = transfers(kv_before or {}, kv)
    if moved is not None:
        return StageTimes(seconds, int(per_side["prefill"]), int(per_side["decode"]),
                          kv_speed_gb_s=moved.gb_s, kv_latency_ms=moved.mean_latency_ms,
                          kv_transfers=moved)  # fmt: skip
    speeds = [g.get(KV_SPEED, 0.0) for g in kv.values() if g]
    latencies = [g.get(KV_LATENCY, 0.0) for g in kv.values() if g]
    notes = ()
    if not any(s > 0 for s in speeds):
        notes = ("KV transfer throughput not reported: sglang:kv_transfer_speed_gb_s is 0 on "
                 "every prefill server (SGLang 0.5.9 exports it and never sets it)",)  # fmt: skip
    return StageTimes(
        seconds=seconds,
        prefill_requests=int(per_side["prefill"]),
        decode_requests=int(per_side["decode"]),
        kv_speed_gb_s=max(speeds) if any(s > 0 for s in speeds) else None,
        kv_latency_ms=max(latencies) if any(x > 0 for x in latencies) else None,
        notes=notes,
    )


CAPTION = (
    "Where a disaggregated layout's TTFT (mean) goes, by SGLang's own per-stage latencies "
    "(sglang:per_stage_req_latency_seconds on each side, means per request over the measured "
    "run); the rest is the router, HTTP and the client."
)


def ttft_tables(section: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per disaggregated layout of a report section: its name, rows ``[part, ms, share of
    TTFT]`` as text, and what it says of KV transfer throughput."""
    out = []
    for lay in section["layouts"]:
        data = lay.get("pd_stages")
        if not data:
            continue
        times = StageTimes.from_dict(data)
        ttft = (lay.get("summary") or {}).get("mean_ttft_ms")
        rows = [[part, _ms(ms), f"{ms / ttft:.0%}" if ttft else "n/a"]
                for part, ms in times.ttft_split(ttft)]  # fmt: skip
        if ttft is not None:
            rows.append(["TTFT (mean)", _ms(ttft), "100%"])
        out.append({"name": lay["name"], "rows": rows, "kv": _kv_text(times),
                    "against": against_sides(section, lay)})  # fmt: skip
    return out


def against_sides(section: Mapping[str, Any], pd: Mapping[str, Any]) -> str:
    """The seed's question of a PD layout, where the run has the unified layouts of its sides'
    shapes: is its TTFT p95 near the prefill shape's, its TPOT near the decode shape's, and by
    how much. "" where the run has neither."""
    match = re.search(r"prefill (\S+) x\d+ \+ decode (\S+) x\d+", pd.get("label") or "")
    if match is None or not pd.get("summary"):
        return ""
    parts = []
    questions = ((match[1], "p95_ttft_ms", "TTFT p95", "prefill"),
                 (match[2], "mean_tpot_ms", "TPOT mean", "decode"))  # fmt: skip
    for shape, key, figure, side in questions:
        same = [lay for lay in section["layouts"]
                if lay.get("label") == shape and lay.get("summary")]  # fmt: skip
        mine = pd["summary"].get(key)
        if not same or mine is None or not same[0]["summary"].get(key):
            continue
        theirs = same[0]["summary"][key]
        parts.append(f"{figure} {_ms(mine)} against {same[0]['name']}'s {_ms(theirs)} "
                     f"({mine / theirs - 1:+.1%}; {shape}, the {side} side's shape)")  # fmt: skip
    return "; ".join(parts)


def _ms(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if abs(ms) >= 1000 else f"{ms:.1f} ms"


def _kv_text(times: StageTimes) -> str:
    moved = times.kv_transfers
    if moved is not None:
        return (f"KV transfer: {moved.count} transfers over the measured run, {moved.gb_s:.2f} "
                f"GB/s (all {moved.count * moved.mean_mb:,.0f} MB over all transfer time), mean "
                f"{moved.mean_mb:,.1f} MB in {moved.mean_latency_ms:.1f} ms (the prefill "
                "servers' sglang:kv_transfer_* histograms; SGLang times a transfer from its "
                "last chunk's forward: the rate of the part TTFT waits for)")  # fmt: skip
    if times.kv_speed_gb_s is None:
        return ("KV transfer throughput: not reported (sglang:kv_transfer_speed_gb_s is 0 on "
                "every prefill server: SGLang 0.5.9 exports it and never sets it)")  # fmt: skip
    text = f"KV transfer throughput: {times.kv_speed_gb_s:.2f} GB/s"
    if times.kv_latency_ms is not None:
        text += f", latency {times.kv_latency_ms:.1f} ms"
    return text + " (the prefill servers' last reported values)"


def ttft_lines(section: Mapping[str, Any], heading: str) -> list[str]:
    """The tables as Markdown under ``heading``; nothing without a disaggregated layout."""
    tables = ttft_tables(section)
    if not tables:
        return []
    lines = ["", heading, "", CAPTION]
    for table in tables:
        lines += ["", f"**{table['name']}**", "", "| part | mean | share of TTFT |",
                  "|---|---:|---:|"]  # fmt: skip
        lines += [f"| {part} | {ms} | {share} |" for part, ms, share in table["rows"]]
        if table["against"]:
            lines += ["", f"Against the unified layouts of its sides' shapes: {table['against']}."]
        lines += ["", table["kv"]]
    return lines
