"""A deployment we did not start (``--kimi-endpoint``): what is behind the URL, asked of it.

Attached, nothing of the cluster file describes what is measured: its nodes, replica count and
flags are someone else's. So the endpoint is asked. A router (the SGLang Router and its
successor smg answer ``GET /workers`` with each worker's URL) names its workers; a server is
its own one worker. Each worker is then asked for its ``/server_info`` (``/get_server_info``
where that is not found): the SGLang version it runs and every server argument, which is the
set-up the report describes and the manifest keeps. Workers we can reach also give their
``/metrics`` counters before and after the run: the replica split, as on a deployment we start.

The router's own release is asked as well: smg states it in ``GET /get_loads``
(``{"version": "smg-1.13.0", ...}``); sglang-router 0.3.2 states none (its ``/get_loads``
lists the workers' loads, its ``/get_server_info`` ``{"router_manager": ...}``), and nothing
here guesses it from the packages installed beside the client. The servers' stated SGLang
release picks the version profile (:mod:`pytest_kimi.config.versions`) as bring-up's probe does: one
older than supported or newer than read is said in the notes.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_kimi.deploy.secrets import REDACTED
from pytest_kimi.workload import http

TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 3.0  # a listed worker the client cannot reach (a pod address) fails fast

# Server arguments that hold secrets (SGLang's api_key, admin_api_key, ssl_keyfile_password,
# watermark_key): /server_info answers them in clear to a client without an admin key
SECRET_ARG = re.compile(
    r"(^|_)(api_?key|key|password|passwd|passphrase|secret|credentials?|private_key)($|_)", re.I
)

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
    router: str | None = None  # "smg 1.13.0", as the router states it (None: it does not)

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
            "router": self.router,
        }


def discover(url: str, router_metrics: str | None = None) -> Attached:
    """Ask ``url`` what it is and every worker behind it what it runs; never raises: what
    could not be learned is said in ``notes`` and each worker's ``error``."""
    base = url.rstrip("/")
    timeout = httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with http.client(timeout=timeout) as asking:
        listed, kind, notes = _worker_urls(asking, base)
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(listed)))) as pool:
            workers = tuple(pool.map(lambda item: _worker(asking, *item), listed))
        router = _router_release(asking, base) if kind == "router" else None
    for w in workers:
        if w.error:
            notes.append(f"{w.name} ({w.url}) could not be asked: {w.error}")
    notes += release_notes({w.version for w in workers if w.version})
    return Attached(base, kind, workers, router_metrics, tuple(notes), router)


def _router_release(http: httpx.Client, base: str) -> str | None:
    """``smg X.Y.Z`` where the router states it (smg's ``/get_loads``), else None."""
    try:
        response = http.get(base + "/get_loads")
        stated = response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(stated, str) or not stated.startswith("smg-"):
        return None
    return f"smg {stated.removeprefix('smg-')}"


def release_notes(stated: set[str]) -> list[str]:
    """What the servers' stated SGLang releases mean for reading them: the profile's notes
    (newer than read), a release older than supported, several releases at once."""
    from pytest_kimi.config.versions import VersionError, sglang_profile

    notes: list[str] = []
    if len(stated) > 1:
        notes.append(f"the servers state different SGLang releases: {', '.join(sorted(stated))}")
    for version in sorted(stated):
        try:  # the mock states "0.5.23-kimi-mock": the release it answers as
            notes += sglang_profile(version.removesuffix("-kimi-mock"), "stated by the servers")[1]
        except VersionError as exc:
            notes.append(f"{exc}: what it answers may not be what pytest-kimi reads")
    return notes


def _worker_urls(
    http: httpx.Client, base: str
) -> tuple[list[tuple[str, str]], str, list[str]]:
    """(name, URL) of each worker and what the endpoint is: a router's ``/workers`` list, else
    the endpoint itself as the one server. Workers are named as the product names a
    deployment's: ``replica<i>``, or ``prefill<i>`` / ``decode<i>`` behind a PD router (its
    ``worker_type``). A DP-aware router lists one entry per DP rank (``http://h:p@0``): the
    server is the URL before the ``@``, once."""
    try:
        response = http.get(base + "/workers")
        listed = response.json().get("workers") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        return [("replica0", base)], "server", []
    named: dict[str, str] = {}  # URL -> name, in the router's order
    count: dict[str, int] = {}
    for entry in listed:
        if not isinstance(entry, dict) or not entry.get("url"):
            continue
        worker_url = re.sub(r"@\d+$", "", str(entry["url"])).rstrip("/")
        role = str(entry.get("worker_type") or "regular")
        prefix = role if role in ("prefill", "decode") else "replica"
        if worker_url not in named:
            named[worker_url] = f"{prefix}{count.get(prefix, 0)}"
            count[prefix] = count.get(prefix, 0) + 1
    notes = [] if named else [f"the router at {base} lists no workers"]
    return [(name, u) for u, name in named.items()], "router", notes


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
        return Worker(name, url, redacted(info))
    return Worker(name, url, error=error)


def redacted(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with every secret-holding argument's value replaced, in the dict and in its
    ``launch_command`` (0.5.23 answers the whole command line): a manifest keeps what ran,
    never a key."""
    out = {k: (REDACTED if SECRET_ARG.search(k) and v not in (None, "") else v)
           for k, v in info.items()}  # fmt: skip
    command = out.get("launch_command")
    if isinstance(command, str):
        out["launch_command"] = _redacted_command(command)
    elif isinstance(command, list):
        out["launch_command"] = _redacted_command(" ".join(map(str, command))).split(" ")
    states = out.get("internal_states")
    if isinstance(states, list):
        out["internal_states"] = [redacted(x) if isinstance(x, dict) else x for x in states]
    return out


def _redacted_command(command: str) -> str:
    """``--api-key VALUE`` and ``--api-key=VALUE`` with the value replaced."""
    words, out, hide = command.split(" "), [], False
    for word in words:
        name, eq, _ = word.partition("=")
        flag = name.startswith("--") and bool(SECRET_ARG.search(name[2:].replace("-", "_")))
        if hide:
            out.append(REDACTED)
        elif flag and eq:
            out.append(f"{name}={REDACTED}")
        else:
            out.append(word)
        hide = flag and not eq
    return " ".join(out)
