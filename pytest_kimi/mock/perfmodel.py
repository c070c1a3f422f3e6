"""Cost of one scheduler step on one replica, from a hardware + model profile.

The model is a roofline per layer plus the collectives a layout needs (docs/mock.md explains
it on one page):

* compute: ``2 x active params x tokens`` plus attention over the context, split over the TP
  group, at ``gpu_tflops x mfu``;
* memory: weights read once per step (dense part + the experts the batch touches) plus the KV
  cache read by decodes, split over the TP group, at ``gpu_mem_bw_gbs``;
* TP: two all-reduces per layer of ``tokens x hidden`` activations; a latency term that grows
  with log2(TP) and a ring bandwidth term, both much worse once the group crosses nodes;
* PP: each stage holds ``layers / PP`` layers; a batch hops between stages (activations over
  the intra- or inter-node link), so prefill chunks pipeline but every decode step crosses all
  stages;
* EP: experts are spread over EP groups; the busiest group sets the pace (``ep_imbalance``);
* a fixed per-stage step overhead (scheduling, kernel launches, synchronisation).

All times are cluster seconds. Kimi-K3's architecture is not public: the default model numbers
are Kimi K2's (1T total / 32B active, 61 layers, hidden 7168, 384 experts, 8 per token).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Profile:
    """Hardware and model numbers with physical meaning (units in the names)."""

    # hardware (defaults: RTX Pro 6000D, PCIe, no NVLink)
    gpu_tflops: float = 400.0  # dense tensor throughput per GPU, TFLOP/s
    mfu: float = 0.4  # fraction of gpu_tflops reached by prefill kernels
    gpu_mem_bw_gbs: float = 1570.0  # HBM/GDDR bandwidth per GPU, GB/s
    intra_node_bw_gbs: float = 12.0  # per-GPU all-reduce bus bandwidth inside a node (PCIe), GB/s
    intra_node_latency_us: float = 40.0  # latency of one collective step inside a node, us
    inter_node_bw_gbs: float = 12.5  # per-GPU share of the node's network, GB/s
    inter_node_latency_us: float = 70.0  # latency of one collective step across nodes, us
    step_overhead_ms: float = 10.0  # fixed cost per batch per pipeline stage, ms
    # model (defaults: Kimi K2 as a stand-in for Kimi-K3)
    layers: int = 61
    hidden: int = 7168
    active_params_b: float = 32.0  # parameters used per token, billions
    dense_params_b: float = 11.0  # attention + shared expert + dense layers, billions
    dense_bytes_per_param: float = 1.0  # FP8/BF16 mix
    experts: int = 384
    experts_per_token: int = 8
    expert_params_m: float = 44.0  # one routed expert's FFN, millions (3 x 7168 x 2048)
    expert_bytes_per_param: float = 0.5  # MXFP4
    attn_flops_per_token_ctx: float = 49152.0  # per layer, per (query token x context token)
    kv_bytes_per_token: float = 1152.0  # per layer (MLA latent 512 + rope 64, BF16)
    activation_bytes: float = 2.0  # BF16 activations on the wire
    ep_imbalance: float = 0.1  # extra load on the busiest EP group, per extra group
    jitter: float = 0.0  # relative std of a step's time (seeded), 0 for exact runs
    max_running_requests: int = 256

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Profile:
        """Build from YAML; unknown or non-numeric keys raise ``ValueError`` naming the key."""
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"{key}: unknown profile field (known: {', '.join(known)})")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{key}: expected a number, got {value!r}")
            if value < 0 or (value == 0 and key not in ("jitter", "ep_imbalance")):
                raise ValueError(f"{key}: must be positive, got {value!r}")
            values[key] = int(value) if known[key].type == "int" else float(value)
        return cls(**values)


@dataclass(frozen=True)
class Prefill:
    """A prefill chunk in a batch: ``tokens`` new tokens after ``context`` cached ones."""

    tokens: int
    context: int


class CostModel:
    """Per-stage step time and inter-stage hop time for one layout."""

    def __init__(self, profile: Profile, *, tp: int, pp: int, ep: int, gpus_per_node: int):
        self.p, self.tp, self.pp, self.ep = profile, tp, pp, ep
        self.gpus_per_node = gpus_per_node
        self.layers_per_stage = profile.layers / pp

    def stage_time(self, prefills: Sequence[Prefill], decode_contexts: Sequence[int]) -> float:
        """Time one pipeline stage spends on a batch (seconds, cluster time)."""
        p = self.p
        tokens = sum(c.tokens for c in prefills) + len(decode_contexts)
        if tokens == 0:
            return 0.0
        # compute, per layer, split over the TP group
        dense = 2.0 * p.active_params_b * 1e9 / p.layers * tokens
        attn = p.attn_flops_per_token_ctx * (
            sum(c.tokens * (c.context + c.tokens / 2) for c in prefills) + sum(decode_contexts)
        )
        compute = (dense + attn) / (self.tp * p.gpu_tflops * 1e12 * p.mfu)
        # memory, per layer: dense weights + touched experts + KV reads
        touched = p.experts * (1.0 - (1.0 - p.experts_per_token / p.experts) ** tokens)
        weights = (
            p.dense_params_b * 1e9 / p.layers * p.dense_bytes_per_param
            + touched * p.expert_params_m * 1e6 * p.expert_bytes_per_param
        )
        kv = p.kv_bytes_per_token * (sum(decode_contexts) + sum(c.context for c in prefills))
        memory = (weights + kv) / (self.tp * p.gpu_mem_bw_gbs * 1e9)
        ep_factor = 1.0 + p.ep_imbalance * (self.ep - 1)
        layer = max(compute, memory) * ep_factor + 2 * self.allreduce_time(tokens)
        return self.layers_per_stage * layer + p.step_overhead_ms / 1e3

    def allreduce_time(self, tokens: int) -> float:
        """One all-reduce of ``tokens x hidden`` activations over the TP group."""
        n = self.tp
        if n == 1:
            return 0.0
        p = self.p
        size = tokens * p.hidden * p.activation_bytes
        if n > self.gpus_per_node:
            latency, bandwidth = p.inter_node_latency_us, p.inter_node_bw_gbs
        else:
            latency, bandwidth = p.intra_node_latency_us, p.intra_node_bw_gbs
        return latency / 1e6 * math.log2(n) + 2 * (n - 1) / n * size / (bandwidth * 1e9)

    def hop_time(self, tokens: int, stage: int) -> float:
        """Send a batch's activations from ``stage`` to ``stage + 1``."""
        p = self.p
        gpus_before = (stage + 1) * self.tp
        crosses_node = gpus_before % self.gpus_per_node == 0
        if crosses_node:
            latency, bandwidth = p.inter_node_latency_us, p.inter_node_bw_gbs
        else:
            latency, bandwidth = p.intra_node_latency_us, p.intra_node_bw_gbs
        return latency / 1e6 + tokens * p.hidden * p.activation_bytes / (bandwidth * 1e9)
