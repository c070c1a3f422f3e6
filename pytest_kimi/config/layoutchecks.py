"""Checks of one layout that its fields' types cannot express, and of the managed flags.

A layout's nodes, replicas and GPUs must fit the cluster, its parallel sizes the replica's
GPUs, a disaggregated layout's two sides each other; its flag changes must not set what
pytest-kimi sets itself (nor may ``server.args`` / ``router.args``) and a null must remove a
flag that is there. Called by :func:`pytest_kimi.config.checks.check_cluster`, so every
problem is a ``file:line: field: problem`` error before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kimi.config.models import ClusterFile
from pytest_kimi.config.yamlfile import Located

# flags the plan sets from the layout and the cluster: given again, they would contradict it
SERVER_MANAGED = ("model-path", "tp-size", "pp-size", "ep-size", "nnodes", "node-rank",
                  "dist-init-addr", "host", "port", "disaggregation-mode",
                  "disaggregation-transfer-backend", "disaggregation-bootstrap-port",
                  "disaggregation-decode-tp", "disaggregation-prefill-pp")  # fmt: skip
ROUTER_MANAGED = ("worker-urls", "policy", "host", "port", "prometheus-host", "prometheus-port",
                  "pd-disaggregation", "prefill", "decode", "prefill-policy",
                  "decode-policy")  # fmt: skip


def check_managed(
    src: Located, field: str, flags: Mapping[str, Any], managed: Sequence[str]
) -> None:
    """None of ``flags`` is one pytest-kimi sets itself (``managed``)."""
    for flag in flags:
        if flag in managed:
            raise src.error(
                f"{field}.{flag}",
                f"--{flag} is set by pytest-kimi from the layout and the cluster; remove it here",
            )


def check_layout(
    src: Located, raw: ClusterFile, name: str, layout: Any, names: set[str]
) -> None:
    """One layout: its nodes, replicas, GPUs, parallel sizes and flag changes."""
    field = f"layouts.{name}"
    dep = raw.deployment
    sides = _pd_sides(src, field, layout)
    replicas = layout.replicas or dep.replicas
    per = layout.nodes_per_replica or dep.nodes_per_replica
    nodes = list(raw.nodes)
    if layout.nodes is not None:
        seen: set[str] = set()
        for i, node in enumerate(layout.nodes):
            if node not in names:
                raise src.error(f"{field}.nodes[{i}]", f"{node!r} is not one of the nodes")
            if node in seen:
                raise src.error(f"{field}.nodes[{i}]", f"{node!r} is listed twice")
            seen.add(node)
        by_name = {n.name: n for n in raw.nodes}
        nodes = [by_name[n] for n in layout.nodes]
    needed = sum(s.replicas * s.nodes_per_replica for _, s in sides) or replicas * per
    if needed > len(nodes):
        where = "nodes" if layout.nodes is not None else "decode" if sides else "replicas"
        owned = "its" if layout.nodes is not None else "the cluster's"
        what = " + ".join(f"{role} {s.replicas} replicas x {s.nodes_per_replica} nodes"
                          for role, s in sides) or f"{replicas} replicas x {per} nodes"  # fmt: skip
        raise src.error(
            f"{field}.{where}",
            f"{what} need {needed} nodes, but {owned} 'nodes' list {len(nodes)}",
        )
    gpus = {node.gpus for node in nodes[:needed]}
    if len(gpus) != 1:
        raise src.error(f"{field}.nodes", "all nodes of one layout must have the same 'gpus'")
    node_gpus = gpus.pop()
    shapes = [(f"{field}.{role}", s.tp, s.pp, s.ep, s.nodes_per_replica) for role, s in sides]
    for where, tp, pp, ep, nodes_per in shapes or [(field, layout.tp, layout.pp, layout.ep, per)]:
        replica_gpus = nodes_per * node_gpus
        if tp * pp != replica_gpus:
            raise src.error(
                f"{where}.tp",
                f"TP x PP = {tp} x {pp} = {tp * pp}, but one replica has {replica_gpus} GPUs "
                f"(nodes_per_replica {nodes_per} x nodes[].gpus)",
            )
        if tp % ep:
            raise src.error(f"{where}.ep", f"EP {ep} must divide TP {tp}")
    if layout.router.node is not None and layout.router.node not in names:
        raise src.error(f"{field}.router.node", f"{layout.router.node!r} is not one of the nodes")
    for sub, changes, base, managed in (
        ("args", layout.args, raw.server.args, SERVER_MANAGED),
        ("router.args", layout.router.args, raw.router.args, ROUTER_MANAGED),
        *((f"{role}.args", side.args, {**raw.server.args, **layout.args}, SERVER_MANAGED)
          for role, side in sides),
    ):  # fmt: skip
        check_managed(src, f"{field}.{sub}", changes, managed)
        where = {"args": "server.args", "router.args": "router.args"}.get(
            sub, "server.args or the layout's args"
        )
        for flag, value in changes.items():
            if value is None and flag not in base:
                raise src.error(
                    f"{field}.{sub}.{flag}",
                    f"null removes a flag, but {where} does not set --{flag}",
                )
    _check_speculative(src, raw, field, layout, sides)


def _check_speculative(
    src: Located, raw: ClusterFile, field: str, layout: Any, sides: list[tuple[str, Any]]
) -> None:
    """SGLang 0.5.9 refuses speculative decoding with pipeline parallelism
    (``ServerArgs.check_server_args``): say so here, naming the flag, not on every node."""
    servers = [(f"{field}.{role}", s.pp, [("server.args", raw.server.args),
                (f"{field}.args", layout.args), (f"{field}.{role}.args", s.args)])
               for role, s in sides] or [
        (field, layout.pp, [("server.args", raw.server.args), (f"{field}.args", layout.args)])
    ]  # fmt: skip
    for where, pp, sources in servers:
        flag = None  # the last place that sets it wins, as the args merge
        for place, args in sources:
            if "speculative-algorithm" in args:
                flag = f"{place}.speculative-algorithm" if args["speculative-algorithm"] else None
        if pp > 1 and flag is not None:
            raise src.error(flag, f"speculative decoding on {where} with PP {pp}: SGLang refuses "
                            "it (\"Pipeline parallelism is not compatible with ... speculative "
                            "decoding\"); use PP 1 there")  # fmt: skip


def _pd_sides(src: Located, field: str, layout: Any) -> list[tuple[str, Any]]:
    """A layout is either one replica's sizes (``tp``) or a disaggregated one (``prefill``
    and ``decode``, each with its own sizes and nodes); the sides, prefill first, or []."""
    sides = [(role, side) for role in ("prefill", "decode")
             if (side := getattr(layout, role)) is not None]  # fmt: skip
    if not sides:
        if layout.tp is None:
            raise src.error(f"{field}.tp", "a layout needs tp (or prefill and decode)")
        if "transfer_backend" in layout.model_fields_set:
            raise src.error(f"{field}.transfer_backend", "only used with prefill and decode")
        return []
    if len(sides) == 1:
        missing = "decode" if sides[0][0] == "prefill" else "prefill"
        raise src.error(f"{field}.{missing}",
                        f"a disaggregated layout needs both prefill and decode; {missing} is "
                        "missing")  # fmt: skip
    for given in ("tp", "pp", "ep", "replicas", "nodes_per_replica"):
        if given in layout.model_fields_set:
            raise src.error(f"{field}.{given}", f"{given} is set per side (prefill, decode) in "
                            "a disaggregated layout")  # fmt: skip
    if layout.decode.policy == "bucket":
        raise src.error(f"{field}.decode.policy",
                        "bucket is a prefill policy; sglang-router's --decode-policy takes "
                        "random, round_robin, cache_aware, power_of_two or manual")  # fmt: skip
    if "bootstrap_port" in layout.decode.model_fields_set:
        raise src.error(f"{field}.decode.bootstrap_port",
                        "the bootstrap server runs on the prefill side only")  # fmt: skip
    prefill_tp, decode_tp = layout.prefill.tp, layout.decode.tp
    if max(prefill_tp, decode_tp) % min(prefill_tp, decode_tp):
        raise src.error(f"{field}.decode.tp",
                        "SGLang moves KV between sides whose TP sizes divide one another; "
                        f"prefill TP {prefill_tp}, decode TP {decode_tp}")  # fmt: skip
    return sides
