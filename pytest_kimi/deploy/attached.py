"""A deployment we did not start (``--kimi-endpoint``): what is behind the URL, asked of it.

Attached, nothing of the cluster file describes what is measured: its nodes, replica count and
flags are someone else's. So the endpoint is asked. A router (the SGLang Router and its
successor smg answer ``GET /workers`` with each worker's URL) names its workers; a server is
its own one worker. Each worker is then asked for its ``/server_info`` (``/get_server_info``
where that is not found): the SGLang version it runs and every server argument, which is the
set-up the report describes and the manifest keeps. Workers we can reach also give their
``/metrics`` counters before and after the run: the replica split, as on a deployment we start.

The router's own version is not stated over HTTP by sglang-router 0.3.2 (its
``/get_server_info`` answers ``{"router_manager": ..., "workers_count": ...}``); nothing here
guesses it from the packages installed beside the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

TIMEOUT_S = 10.0

# The server arguments the report shows for an attached deployment: the parallel shape and
# the seed's fixed conditions (chunked prefill, radix cache, KV dtype, MoE runner, A2A), the
# hardware path and what bounds batching. The manifest keeps every argument.
KEY_ARGS = (
    "tp_size", "pp_size", "ep_size", "dp_size", "nnodes", "device", "attention_backend",
    "chunked_prefill_size", "disable_radix_cache", "kv_cache_dtype", "moe_runner_backend",
    "moe_a2a_backend", "max_running_requests", "context_length", "speculative_algorithm",
    "disaggregation_mode",
)  # fmt: skip


@dataclass(frozen=True)
class Worker:
    """One server behind the endpoint, as it describes itself."""

    name: str  # replica0, replica1, ... in the router's order
    url: str
    info: dict[str, Any] = field(default_factory=dict)  # its /server_info ({} if unanswered)
    error: str = ""  # why it could not be asked

    @property
    def version(self) -> str | None:
        value = self.info.get("version")
        return None if value is None else str(value)

    def parallel(self) -> dict[str, int | None]:
        return {k: self.info.get(f"{k}_size") for k in ("tp", "pp", "ep", "dp")}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "version": self.version,
            "parallel": self.parallel(),
            "key_args": {k: self.info[k] for k in KEY_ARGS if k in self.info},
            "error": self.error,
            "server_info": self.info,
        }


@dataclass(frozen=True)
class Attached:
    """The endpoint, what it is (``router`` or ``server``) and the workers it serves from."""

    url: str
    kind: str
    workers: tuple[Worker, ...]
    router_metrics: str | None = None  # --kimi-router-metrics
    notes: tuple[str, ...] = ()

    def worker_urls(self) -> dict[str, str]:
        """Replica name -> base URL, of the workers that answered (whose counters we read)."""
        return {w.name: w.url for w in self.workers if not w.error}

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "kind": self.kind,
            "router_metrics": self.router_metrics,
            "workers": [w.to_dict() for w in self.workers],
            "notes": list(self.notes),
        }


def discover(url: str, router_metrics: str | None = None) -> Attached:
    """Ask ``url`` what it is and every worker behind it what it runs; never raises: what
    could not be learned is said in ``notes`` and each worker's ``error``."""
    base = url.rstrip("/")
    with httpx.Client(timeout=TIMEOUT_S, trust_env=False) as http:
        urls, kind, notes = _worker_urls(http, base)
        workers = tuple(
            _worker(http, f"replica{i}", worker_url) for i, worker_url in enumerate(urls)
        )
    for w in workers:
        if w.error:
            notes.append(f"{w.name} ({w.url}) could not be asked: {w.error}")
    return Attached(base, kind, workers, router_metrics, tuple(notes))


def _worker_urls(http: httpx.Client, base: str) -> tuple[list[str], str, list[str]]:
    """The workers' URLs and what the endpoint is: a router's ``/workers`` list, else the
    endpoint itself as the one server."""
    try:
        response = http.get(base + "/workers")
        listed = response.json().get("workers") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        listed = None
    if isinstance(listed, list):
        urls = [str(w["url"]).rstrip("/") for w in listed if isinstance(w, dict) and w.get("url")]
        notes = [] if urls else [f"the router at {base} lists no workers"]
        return urls, "router", notes
    return [base], "server", []


def _worker(http: httpx.Client, name: str, url: str) -> Worker:
    """``name`` at ``url`` with its ``/server_info`` (the older ``/get_server_info`` where the
    newer name is not found)."""
    error = ""
    for path in ("/server_info", "/get_server_info"):
        try:
            response = http.get(url + path)
        except httpx.HTTPError as exc:
            return Worker(name, url, error=f"{type(exc).__name__}: {exc}")
        if response.status_code == 404:
            error = f"{path}: HTTP 404"
            continue
        if response.status_code != 200:
            return Worker(name, url, error=f"{path}: HTTP {response.status_code}")
        try:
            info = response.json()
        except ValueError:
            return Worker(name, url, error=f"{path}: not JSON")
        if not isinstance(info, dict):
            return Worker(name, url, error=f"{path}: not a JSON object")
        return Worker(name, url, info)
    return Worker(name, url, error=error)
