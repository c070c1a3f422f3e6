"""The experiment's set-up, as the seed's report opens with it: model, hardware, the server flags
every layout shares and those each layout changes, dataset and checksums, tool versions.

Read from the layouts' ``manifest.json`` files (what was launched, what the nodes said about
themselves), never from the cluster file alone: a report describes what ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOT_SET = "(not set)"
"""A flag other layouts set and this one does not (removed with ``null``, or never given)."""


def experiment_setup(manifests: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The set-up over ``manifests`` (layout name -> its manifest, in ``--layout`` order)."""
    if not manifests:
        return {}
    first = next(iter(manifests.values()))
    args = {name: dict(m["layout"].get("server_args") or {}) for name, m in manifests.items()}
    shared, own = split_flags(args)
    return {
        "model": first.get("model"),
        "cluster": (first.get("cluster") or {}).get("name"),
        "backend": first.get("backend"),
        "hardware": hardware(manifests),
        "shared_flags": shared,
        "layouts": {name: _layout_row(m, own[name]) for name, m in manifests.items()},
        "dataset": dataset(first),
        "tools": tools(manifests),
    }


def _layout_row(manifest: Mapping[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """One row of the set-up table. Attached (``--kimi-endpoint``), the endpoint's servers
    describe themselves; what they do not state (nodes, the router's policy) says so."""
    layout = manifest["layout"]
    attached = bool(manifest.get("attached"))
    unstated = "not stated by the endpoint"
    return {
        "parallel": _parallel(layout),
        "replicas": manifest.get("replicas"),
        "nodes": unstated if attached else len(layout.get("nodes") or []),
        "gpus": layout.get("gpus"),
        "router_policy": layout.get("router_policy") or (unstated if attached else None),
        "flags": flags,
    }


def split_flags(
    args: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(flags every layout runs with the same value, per layout the rest): a flag a layout
    lacks that others set shows as :data:`NOT_SET` in its own flags."""
    every = list(args.values())
    names = sorted({flag for flags in every for flag in flags})
    shared = {
        flag: every[0][flag]
        for flag in names
        if all(flag in flags and flags[flag] == every[0][flag] for flags in every)
    }
    own = {
        layout: {flag: flags.get(flag, NOT_SET) for flag in names if flag not in shared}
        for layout, flags in args.items()
    }
    return shared, own


def hardware(manifests: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per kind of node: ``8 nodes: 8 x NVIDIA H200, driver 580.95.05, CUDA 13.0``,
    from what each node's nvidia-smi said at bring-up (nothing when attached)."""
    nodes: dict[str, Mapping[str, Any]] = {}
    for manifest in manifests.values():
        for node in manifest.get("nodes") or []:
            nodes.setdefault(node.get("node", ""), node)
    kinds: dict[str, int] = {}
    for node in nodes.values():
        kinds[_node_kind(node)] = kinds.get(_node_kind(node), 0) + 1
    return [f"{count} node{'s' if count > 1 else ''}: {kind}" for kind, count in kinds.items()]


def _node_kind(node: Mapping[str, Any]) -> str:
    found = node.get("gpu_preflight") or {}
    gpus = found.get("gpus") or []
    names = sorted({g.get("name", "?") for g in gpus})
    what = f"{len(gpus)} x {' / '.join(names)}" if gpus else "GPUs not listed"
    extra = [f"driver {found['driver']}" if found.get("driver") else "",
             f"CUDA {found['cuda']}" if found.get("cuda") else ""]  # fmt: skip
    return ", ".join([what, *(e for e in extra if e)])


def dataset(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset read and its checksums; a sweep's points each name their prompts'."""
    workload = manifest.get("workload") or {}
    data = workload.get("dataset") or {}
    out: dict[str, Any] = {
        "path": data.get("path"),
        "sha256": data.get("file_sha256"),
        "speedbench_config": workload.get("speedbench_config"),
        "category": workload.get("category"),
        "prompt": workload.get("prompt"),
        "prompts_sha256": data.get("prompts_sha256"),
        "workload": {k: workload.get(k) for k in ("num_requests", "input_len", "output_len",
                                                   "concurrency", "request_rate", "api")},
    }  # fmt: skip
    points = manifest.get("points") or []
    for name in out["workload"]:  # a swept setting: every value, in the order measured
        values = [p["settings"][name] for p in points if name in (p.get("settings") or {})]
        if len(set(map(str, values))) > 1:
            out["workload"][name] = ", ".join(dict.fromkeys(str(v) for v in values))
    if points:
        out["points"] = {
            p["id"]: {
                "settings": p.get("settings"),
                "speedbench_config": p.get("speedbench_config"),
                "prompts_sha256": (p.get("dataset") or {}).get("prompts_sha256"),
            }
            for p in points
        }
    return out


def tools(manifests: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Versions that shape the numbers: the client's packages and Python, the SGLang the
    servers state (``/server_info``), the router on its node."""
    first = next(iter(manifests.values()))
    client = first.get("client") or {}
    packages = client.get("packages") or {}
    # the client's own packages only: a router package installed beside the client is not
    # necessarily the router that served (attached to an endpoint, it never is)
    out = {name: str(version) for name, version in packages.items()
           if name in ("pytest-kimi", "httpx") and version}  # fmt: skip
    if client.get("python"):
        out["python (client)"] = client["python"]
    servers = sorted(
        {n["sglang_server_version"] for m in manifests.values() for n in m.get("nodes") or []
         if n.get("sglang_server_version")}
        | {w["version"] for m in manifests.values()
           for w in (m.get("attached") or {}).get("workers") or [] if w.get("version")}
    )  # fmt: skip
    if servers:
        out["sglang (servers)"] = ", ".join(servers)
    routers = sorted({_router(m) for m in manifests.values()} - {""})
    if routers:
        out[ROUTER_TOOL] = ", ".join(routers)
    attached = [m["attached"] for m in manifests.values()
                if (m.get("attached") or {}).get("kind") == "router"]  # fmt: skip
    if attached:  # smg states its release (/get_loads); sglang-router 0.3 does not
        stated = sorted({a.get("router") for a in attached if a.get("router")})
        out["router (attached)"] = ", ".join(stated) or "version not stated by the endpoint"
    return out


ROUTER_TOOL = "router (router node)"


def _router(manifest: Mapping[str, Any]) -> str:
    """``smg 1.13.0``: the package and release the router's node had (manifest
    ``versions``), as bring-up found them; a manifest written before there were two router
    packages: its router node's ``sglang_router``; "" where none was found (attached)."""
    versions = manifest.get("versions") or {}
    if versions.get("router_version"):
        return f"{versions.get('router_package')} {versions['router_version']}"
    for node in manifest.get("nodes") or []:
        old = (node.get("router_software") or {}).get("sglang_router")
        if old and "versions" not in manifest:
            return f"sglang-router {old}"
    return ""


def _parallel(layout: Mapping[str, Any]) -> str:
    """``TP32/PP1/EP4``; a disaggregated layout's sides (manifest ``sides``) one after the
    other: ``prefill TP4/PP8/EP4 x1 + decode TP32/PP1/EP4 x1``."""
    sides = layout.get("sides") or []
    if sides:
        return " + ".join(f"{s.get('role')} TP{s.get('tp')}/PP{s.get('pp')}/EP{s.get('ep')} "
                          f"x{s.get('replicas')}" for s in sides)  # fmt: skip
    shape = "/".join(f"{k.upper()}{layout.get(k) or '?'}" for k in ("tp", "pp", "ep"))
    return shape + (" (as the servers report)" if layout.get("as_reported_by") else "")
