"""The cluster file's ``layouts`` as pydantic models: each configuration to measure.

A layout is one replica's parallel sizes, or the two sides of a prefill/decode disaggregated
deployment, with what else it changes from the cluster's defaults (flags, environment, nodes,
the router). Part of the file's shape (:mod:`pytest_kimi.config.models`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from pytest_kimi.config.fields import (
    Count,
    Env,
    FlagChanges,
    NodeList,
    NodeName,
    Port,
    Text,
    TextValue,
    one_of,
)
from pytest_kimi.config.strictmodel import StrictModel
from pytest_kimi.config.versions import SGLANG_ROUTER, SMG, TRANSFER_BACKENDS


class LayoutRouter(StrictModel):
    """The router of one layout: what differs from ``router``."""

    node: NodeName | None = Field(None, description="Node the router runs on; default router.node.")
    policy: Text | None = Field(None, description="Load-balancing policy; default router.policy.")
    args: FlagChanges = Field(
        default_factory=dict,
        description="Router flags merged over router.args; a value of null removes one.",
    )


# every supported release's choices, from the one place that says which release has which
# (checked against the release the nodes run at bring-up)
ROUTER_POLICIES = tuple(dict.fromkeys((*SMG.policies, *SGLANG_ROUTER.policies)))


class PDSideModel(StrictModel):
    """One side of a prefill/decode disaggregated layout: its servers run with SGLang's
    ``--disaggregation-mode prefill`` (or ``decode``), with their own parallel sizes, replicas,
    nodes and flags. The prefill side's replicas take the layout's first nodes, in order."""

    model_config = ConfigDict(title="PD side")

    tp: Count = Field(description="Tensor-parallel size of this side's replicas.")
    pp: Count = Field(1, description="Pipeline-parallel size.")
    ep: Count = Field(1, description="Expert-parallel size; must divide tp.")
    replicas: Count = Field(1, description="Replicas of this side behind the router.")
    nodes_per_replica: Count = Field(description="Nodes one of its replicas spans.")
    args: FlagChanges = Field(
        default_factory=dict,
        description="Server flags of this side, over server.args and the layout's args; "
        "a value of null removes one.",
    )
    env: Env = Field(default_factory=dict, description="Environment over the layout's.")
    policy: one_of(*ROUTER_POLICIES, "bucket") | None = Field(
        None,
        description="The router's policy for this side (--prefill-policy / --decode-policy; "
        "bucket: prefill only); default: the layout's router.policy, else router.policy.",
    )
    bootstrap_port: Port | None = Field(
        None,
        description="prefill: the port of each replica's KV bootstrap server "
        "(--disaggregation-bootstrap-port); default SGLang's 8998 on an ssh cluster, 'auto' on "
        "a local one (its replicas share one host).",
    )


class LayoutModel(StrictModel):
    """One configuration to measure: a parallel layout of one replica (TP x PP must equal the
    replica's GPUs) and whatever else differs from the cluster's defaults; or, with
    ``prefill`` and ``decode`` instead of ``tp``, a prefill/decode disaggregated deployment."""

    model_config = ConfigDict(
        title="Layout",
        json_schema_extra={"anyOf": [{"required": ["tp"]}, {"required": ["prefill", "decode"]}]},
    )

    tp: Count | None = Field(
        None, description="Tensor-parallel size (required, unless prefill and decode are set)."
    )
    pp: Count = Field(1, description="Pipeline-parallel size.")
    ep: Count = Field(1, description="Expert-parallel size; must divide tp.")
    prefill: PDSideModel | None = Field(
        None, description="Prefill side of a disaggregated layout (with decode, not tp)."
    )
    decode: PDSideModel | None = Field(
        None, description="Decode side of a disaggregated layout (with prefill, not tp)."
    )
    transfer_backend: one_of(*TRANSFER_BACKENDS) = Field(
        "mooncake",
        description="Disaggregated layouts: the KV transfer backend of both sides "
        "(--disaggregation-transfer-backend).",
    )
    slo: dict[str, TextValue] = Field(
        default_factory=dict, description="SLOs for this layout only (override the cluster's)."
    )
    args: FlagChanges = Field(
        default_factory=dict,
        description="Server flags merged over server.args; a value of null removes one.",
    )
    env: Env = Field(default_factory=dict, description="Server environment over server.env.")
    nodes: Annotated[list[NodeName], NodeList] | None = Field(
        None, description="Names of the nodes this layout runs on, in order; default: all."
    )
    replicas: Count | None = Field(None, description="Replicas; default deployment.replicas.")
    nodes_per_replica: Count | None = Field(
        None, description="Nodes one replica spans; default deployment.nodes_per_replica."
    )
    router: LayoutRouter = Field(default_factory=LayoutRouter, description=LayoutRouter.__doc__)
    default: bool = Field(
        True,
        description="Run when --layout names none; false: only when named (a layout kept for "
        "one workload's comparison, e.g. a router policy on multi-turn sessions).",
    )
