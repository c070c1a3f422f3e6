"""Requests and tokens per replica, from counters the servers and the router keep themselves.

Real SGLang names no replica in its responses, so the split between replicas cannot be known
per request. It can be known in total: each replica's rank 0 counts the requests it finished
and their tokens (``--enable-metrics``; SGLang 0.5.9, srt/metrics/collector.py,
``TokenizerMetricsCollector``, label ``model_name``), and SGLang Router 0.3.x counts, per
worker URL, the attempts it sent there (``smg_worker_cb_outcomes_total{worker, outcome}``,
retries included). Reading both before and after the measured run gives the run's share of
each. Pure functions over the metrics text and plain data; :mod:`pytest_kimi.run.counters` scrapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

REQUESTS = "sglang:num_requests_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
# prompt tokens found in the prefix cache, by cache_source (device, host, storage_*; "total"
# where the server splits none): summed (SGLang 0.5.9 and 0.5.23, TokenizerMetricsCollector)
CACHED_TOKENS = "sglang:cached_tokens_total"
SERVER_COUNTERS = (REQUESTS, PROMPT_TOKENS, GENERATION_TOKENS, CACHED_TOKENS)
# speculative decoding's accept length over the scheduler's last decode-log window: a gauge,
# so the highest of its label sets (ranks that do not log it stay 0), never a sum
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
ROUTER_OUTCOMES = "smg_worker_cb_outcomes_total"


@dataclass(frozen=True)
class ReplicaCounters:
    """One replica's counter deltas over the measured run. ``None``: not known (its
    ``/metrics`` was unreachable or lacked the counter, or the counter went backwards, as
    after a restart). ``router_requests``: what the router sent to this worker, retries
    included; ``None`` where the router exports no per-worker counter."""

    url: str
    requests: int | None
    prompt_tokens: int | None
    generation_tokens: int | None
    router_requests: int | None = None
    cached_tokens: int | None = None  # prompt tokens its prefix cache held

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def plus(self, other: ReplicaCounters) -> ReplicaCounters:
        """Two runs' deltas together (``--kimi-repeat``): unknown if either is."""

        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b

        return ReplicaCounters(
            self.url, add(self.requests, other.requests),
            add(self.prompt_tokens, other.prompt_tokens),
            add(self.generation_tokens, other.generation_tokens),
            add(self.router_requests, other.router_requests),
            add(self.cached_tokens, other.cached_tokens),
        )  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaCounters:
        return cls(
            url=str(data["url"]),
            requests=data.get("requests"),
            prompt_tokens=data.get("prompt_tokens"),
            generation_tokens=data.get("generation_tokens"),
            router_requests=data.get("router_requests"),
            cached_tokens=data.get("cached_tokens"),
        )


def server_totals(text: str) -> dict[str, float]:
    """The request and token counters in one server's ``/metrics`` text, summed over their
    label sets (custom labels split them), and its accept-length gauge; a counter the text
    lacks is absent."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in SERVER_COUNTERS:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
            elif sample.name == SPEC_ACCEPT_LENGTH:
                out[sample.name] = max(out.get(sample.name, 0.0), sample.value)
    return out


def router_worker_totals(text: str) -> dict[str, float] | None:
    """Attempts the router sent to each worker URL (every outcome summed); ``None`` when the
    text has no per-worker counter at all (a router version that does not export one, or one
    that has sent nothing yet: the counter appears with its first sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROUTER_OUTCOMES:
                worker = sample.labels.get("worker", "?")
                out[worker] = out.get(worker, 0.0) + sample.value
    return out or None


@dataclass(frozen=True)
class Snapshot:
    """Counters read at one moment. ``servers``: each replica's :func:`server_totals`
    (``None``: unreadable). ``router``: :func:`router_worker_totals` (``None``: none
    exported yet); ``router_read``: whether the router's metrics could be read at all."""

    servers: Mapping[str, Mapping[str, float] | None]
    router: Mapping[str, float] | None = None
    router_read: bool = False
    # disaggregated servers: per-stage latency totals and KV gauges (pytest_kimi.results.pdstages)
    stages: Mapping[str, Mapping[str, tuple[float, float]] | None] = field(default_factory=dict)
    kv: Mapping[str, Mapping[str, float] | None] = field(default_factory=dict)


def server_accept_length(snapshot: Snapshot) -> float | None:
    """The replicas' mean ``sglang:spec_accept_length`` in a snapshot: ``None`` where no
    replica speculates (the gauge is 0 there) or none was read."""
    values = [s.get(SPEC_ACCEPT_LENGTH, 0.0) for s in snapshot.servers.values() if s]
    values = [v for v in values if v > 0]
    return sum(values) / len(values) if values else None


def _delta(before: float, after: float) -> int | None:
    return None if after < before else round(after - before)


def _server_delta(
    old: Mapping[str, float] | None, new: Mapping[str, float] | None, metric: str
) -> int | None:
    """A labelled counter has no sample until its first increment: absent before counts as
    0 when both reads succeeded."""
    if old is None or new is None or metric not in new:
        return None
    return _delta(old.get(metric, 0.0), new[metric])


def _cached_delta(old: Mapping[str, float] | None, new: Mapping[str, float] | None) -> int | None:
    """The cached-token counter has a sample only once a request hit the cache: a server
    read before and after whose other counters exist cached nothing when it has none."""
    if old is None or new is None or REQUESTS not in new:
        return None
    return _delta(old.get(CACHED_TOKENS, 0.0), new.get(CACHED_TOKENS, 0.0))


def deltas(
    urls: Mapping[str, str], before: Snapshot, after: Snapshot
) -> dict[str, ReplicaCounters]:
    """``replica name -> counters over the run``; ``urls`` maps each name to its rank-0 base
    URL, which is also the worker label the router uses."""
    out: dict[str, ReplicaCounters] = {}
    for name, url in urls.items():
        old, new = before.servers.get(name), after.servers.get(name)
        routed = None
        if before.router_read and after.router is not None:
            routed = _delta((before.router or {}).get(url, 0.0), after.router.get(url, 0.0))
        out[name] = ReplicaCounters(
            url=url,
            requests=_server_delta(old, new, REQUESTS),
            prompt_tokens=_server_delta(old, new, PROMPT_TOKENS),
            generation_tokens=_server_delta(old, new, GENERATION_TOKENS),
            router_requests=routed,
            cached_tokens=_cached_delta(old, new),
        )
    return out
