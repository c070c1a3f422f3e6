"""``manifest.json``: what exactly ran for a layout, so a result can be reproduced and trusted.

Launch command lines per process (secrets redacted), versions, the workload with every dataset
file read and its SHA-256, the SPEED-Bench config, the category and how prompts were built
(raw or chat template), SLOs, and, once the nodes are up, each node's environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_kimi.results.store import client_environment

if TYPE_CHECKING:
    from pytest_kimi.config import ClusterConfig, Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.points import Point
    from pytest_kimi.deploy.attached import Attached
    from pytest_kimi.deploy.plan import DeploymentPlan

_WORKLOAD_FIELDS = (
    "num_requests", "input_len", "output_len", "concurrency", "warmup_requests", "api", "seed",
    "category", "request_timeout_s", "clock_start", "name", "kind",
)  # fmt: skip
_SESSION_FIELDS = (  # a session workload's (an agentic one's sizes too)
    "turns", "system_prompt_tokens", "task_tokens", "tool_result_tokens", "think_time_s",
    "think_time_kind",
)  # fmt: skip


def _effective(inputs: Inputs, point: Point) -> dict[str, Any]:
    """Category, config and prompt construction as run: the command line overrides the YAML."""
    return {
        "category": inputs.workload_of(point).category,
        "speedbench_config": inputs.config_of(point),
        "prompt": inputs.prompt_style(point),
    }


def _points(inputs: Inputs) -> list[dict[str, Any]]:
    """Each workload point of a sweep: its settings, config and prompts (their checksums)."""
    return [
        {
            "id": point.id,
            "settings": point.describe(),
            **_effective(inputs, point),
            "dataset": inputs.prompts[point.id].manifest() if point.id in inputs.prompts else None,
        }
        for point in inputs.points
    ]


def disaggregation(cluster: ClusterConfig, layout: Layout) -> dict[str, Any]:
    """A disaggregated layout's sides as deployed: sizes, replicas, nodes, flags, policy."""
    if not layout.disaggregated:
        return {}
    replicas = cluster.layout_replicas(layout)
    return {
        "transfer_backend": layout.transfer_backend,
        "sides": [
            {
                "role": side.role, "tp": side.tp, "pp": side.pp, "ep": side.ep,
                "replicas": side.replicas, "nodes_per_replica": side.nodes_per_replica,
                "nodes": [n.name for r in replicas if r.side is side for n in r.nodes],
                "server_args": cluster.server_args(layout, side),
                "router_policy": cluster.router_policy(layout, side),
                "bootstrap_port": side.bootstrap_port if side.role == "prefill" else None,
            }
            for side in layout.sides
        ],
    }  # fmt: skip


def manifest(
    inputs: Inputs,
    layout: Layout,
    run_id: str,
    plan: DeploymentPlan | None,
    nodes: list[dict] | None = None,
    attached: Attached | None = None,
) -> dict[str, Any]:
    """The manifest of ``layout``; ``plan`` is None when attached to a running endpoint, and
    ``attached`` says what answered there (its workers, their versions and arguments)."""
    cluster, first = inputs.cluster, inputs.points[0]
    wl = inputs.workload_of(first)
    out: dict[str, Any] = {
        "run_id": run_id,
        "layout": {
            "name": layout.name,
            # a disaggregated layout's sizes are per side ("sides")
            "tp": layout.tp or None,
            "pp": layout.pp or None,
            "ep": layout.ep or None,
            # what this layout changes from the cluster's defaults, and the flags it runs with
            "own_args": dict(layout.args),
            "server_args": cluster.server_args(layout),
            "router_policy": cluster.router_policy(layout),
            "nodes": [n.name for n in cluster.used_nodes(layout)],
            "gpus": sum(n.gpus for n in cluster.used_nodes(layout)),
            **disaggregation(cluster, layout),
        },
        "model": cluster.server.model_path,
        "cluster": {
            "name": cluster.name,
            "file": str(cluster.path),
            "sha256": cluster.source.sha256,
            # what the file's ${NAME} references stood for in this run
            "variables": dict(cluster.variables),
        },
        "backend": inputs.backend,
        "time_scale": inputs.time_scale,
        "replicas": cluster.replicas_of(layout),
        # a disaggregated layout's are per side (layout.sides)
        "nodes_per_replica": None if layout.disaggregated else cluster.nodes_per_replica_of(layout),
        "workload": {
            **{k: getattr(wl, k) for k in _WORKLOAD_FIELDS},
            **({k: getattr(wl, k) for k in _SESSION_FIELDS} if wl.sessions else {}),
            **({"trace_speed": inputs.prompts_of(first).trace_speed}
               if wl.kind == "trace" and inputs.workload else {}),
            "request_rate": str(wl.request_rate),
            **_effective(inputs, first),
            "dataset": inputs.workload.manifest() if inputs.workload else None,
        },
        "points": _points(inputs) if inputs.swept else [],
        "slo": {name: s.describe() for name, s in inputs.slos[layout.name].items()},
        "client": client_environment(),
        "endpoint": inputs.options.endpoint,
    }
    if attached is not None:  # what was measured is the endpoint's, not the cluster file's
        out["attached"] = attached.to_dict()
        out.update(attached_layout(attached, layout.name))
    if plan is not None:
        out["processes"] = [
            {
                "name": p.name,
                "node": p.node.name,
                "host": p.node.host,
                "role": p.role,
                "replica": p.replica,
                "rank": p.rank,
                "command": p.command_line(redact=True),
            }
            for p in plan.processes
        ]
        out["router_url"] = plan.endpoint
        if plan.versions is not None:  # what the command lines were built for, and why
            out["versions"] = plan.versions.to_dict()
        if plan.allocation is not None:  # executor: slurm
            out["slurm"] = dict(plan.allocation)
    if nodes is not None:
        out["nodes"] = nodes
    return out


def attached_layout(attached: Attached, name: str) -> dict[str, Any]:
    """The manifest's ``layout``, ``replicas`` and ``model`` as the attached endpoint's workers
    state them (``/server_info``): each worker a replica; its parallel shape and the key
    server arguments (as flags) where every worker agrees, ``None`` where they differ or none
    said; GPUs per worker as TP x PP, times DP unless DP attention places the DP ranks inside
    TP (SGLang's ``enable_dp_attention``), unknown unless every worker said. Nodes and the
    router's policy are not stated over HTTP: left empty, never taken from the cluster file."""
    from pytest_kimi.deploy.attached import KEY_ARGS

    infos = [w.info for w in attached.workers if w.info]

    def agreed(key: str) -> Any:
        values = {repr(info.get(key)) for info in infos}
        return infos[0].get(key) if infos and len(values) == 1 else None

    args = {
        key.replace("_", "-"): value
        for key in KEY_ARGS
        if key not in ("tp_size", "pp_size", "ep_size", "dp_size", "nnodes")
        and not _unset(value := agreed(key))
    }
    gpus = [_gpus(info) for info in infos]
    known = bool(gpus) and len(gpus) == len(attached.workers) and None not in gpus
    return {
        "layout": {
            "name": name,
            "tp": agreed("tp_size"),
            "pp": agreed("pp_size"),
            "ep": agreed("ep_size"),
            "own_args": {},
            "server_args": args,
            "router_policy": None,
            "nodes": [],
            "gpus": sum(g for g in gpus if g is not None) if known else None,
            "as_reported_by": "the servers' /server_info (attached)",
        },
        "replicas": len(attached.workers),
        "nodes_per_replica": agreed("nnodes"),
        "model": agreed("model_path"),
    }


def _unset(value: Any) -> bool:
    """An argument left at "off": absent, ``false`` or SGLang's ``"null"`` mode (0 is a value)."""
    return value is None or value is False or value == "null"


def _gpus(info: dict[str, Any]) -> int | None:
    """GPUs one worker uses by its own account; ``None`` where a size is not a whole number."""
    sizes = [info.get(k, 1) for k in ("tp_size", "pp_size", "dp_size")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        return None
    tp, pp, dp = sizes
    return tp * pp * (1 if info.get("enable_dp_attention") else dp)
