"""Cost of one scheduler step on one replica, from a hardware + model profile.

The model is a roofline per layer plus the collectives a layout needs (docs/mock.md explains
it on one page):

* compute: ``2 x active params x tokens`` plus attention over the context, split over the TP
  group, at ``gpu_tflops x mfu``;
* memory: weights read once per step (dense part + the experts the batch touches) plus the KV
  cache read by decodes, split over the TP group, at ``gpu_mem_bw_gbs``;
* TP: two all-reduces per layer of ``tokens x hidden`` activations, costed with NCCL's own
  ring model and latency tables (``src/graph/tuning.cc``, :data:`NCCL_RING`): a base latency
  plus each ring step's hardware latency (PCIe inside a node, the network across), for the
  protocol NCCL's model picks for the message (LL for decode's few tokens, Simple for
  prefill chunks), plus the ring's bandwidth term;
* PP: each stage holds ``layers / PP`` layers; a batch hops between stages (activations over
  the intra- or inter-node link), so prefill chunks pipeline but every decode step crosses all
  stages;
* EP: experts are spread over EP groups; the busiest group sets the pace (``ep_imbalance``);
* a fixed cost per batch per pipeline stage (``step_overhead_ms``): each stage runs its own
  scheduler loop, launches its kernels and synchronises once per batch, so PP8 pays it eight
  times per decode step and TP32 once.

Every constant is shared by all layouts. Hardware numbers come from data sheets, collective
latencies from NCCL's tuning tables, model numbers from Kimi K2's published config (sources
beside each); only ``mfu`` and ``step_overhead_ms`` have no published source and are fitted
by ``python -m pytest_kimi.mock.calibrate`` (the shipped values are its fit to the seed).

All times are cluster seconds. Kimi-K3's architecture is not public: the default model numbers
are Kimi K2's (1T total / 32B active, 61 layers, hidden 7168, 384 experts, 8 per token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimi.config.profile import Profile

# Sources [gpu], [pcie], [nic], [nccl], [nccl-measured], [k2], [eagle3]: in
# pytest_kimi/config/profile.py, beside the profile whose numbers they give.


@dataclass(frozen=True)
class NcclProtocol:
    """One protocol's Ring entries in NCCL's tuning tables [nccl] (microseconds)."""

    name: str
    base_us: float  # baseLat[Ring][proto]
    pci_us: float  # hwLat[PCI][Ring][proto]: one ring step between GPUs of a node
    net_us: float  # hwLat[NET][Ring][proto]: one ring step between nodes
    net_overhead_us: float  # getNetOverhead (x86) for this protocol: intra-step floor off-node
    plateau: float  # latency factor of a multi-node all-reduce ("plateau effect of ring")
    bw_share: float  # bus bandwidth as a share of the link's (LL: 1/4)


# NCCL 2.20.3's Ring rows [nccl]; LL128 is off without NVLink, so these are the two it can pick
NCCL_RING: tuple[NcclProtocol, ...] = (
    NcclProtocol("LL", base_us=6.6, pci_us=1.0, net_us=2.7, net_overhead_us=1.0, plateau=1.0,
                 bw_share=0.25),
    NcclProtocol("Simple", base_us=8.4, pci_us=5.7, net_us=14.0, net_overhead_us=3.0,
                 plateau=1.4, bw_share=1.0),
)  # fmt: skip


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

    def verify_time(self, decode_contexts: Sequence[int], draft_tokens: int) -> float:
        """Speculative decoding's verify: one target forward over ``draft_tokens`` positions
        of each request (position ``j`` attends to its context plus ``j``), so the batch has
        ``draft_tokens`` times a decode's tokens and touches that many more experts."""
        positions = [c + j for c in decode_contexts for j in range(draft_tokens)]
        return self.stage_time([], positions)

    def draft_time(self, tokens: int) -> float:
        """One draft-model forward over ``tokens`` positions on this layout's TP group: its
        roofline (weights read once, ``2 x params`` FLOP per position) plus the two
        all-reduces of its one layer. Its scheduler overhead is the verify's (one step)."""
        if tokens == 0:
            return 0.0
        p = self.p
        params = p.draft_params_b * 1e9
        compute = 2.0 * params * tokens / (self.tp * p.gpu_tflops * 1e12 * p.mfu)
        memory = params * p.draft_bytes_per_param / (self.tp * p.gpu_mem_bw_gbs * 1e9)
        return max(compute, memory) + 2 * self.allreduce_time(tokens)

    def allreduce_time(self, tokens: int) -> float:
        """One all-reduce of ``tokens x hidden`` activations over the TP group: NCCL's ring
        model [nccl], with the protocol NCCL's model would pick (the fastest)."""
        n = self.tp
        if n == 1:
            return 0.0
        p = self.p
        nodes = math.ceil(n / self.gpus_per_node)
        size = tokens * p.hidden * p.activation_bytes
        # the ring's slowest link: a node's network carries every byte that leaves the node
        link = p.intra_node_bw_gbs if nodes == 1 else min(p.intra_node_bw_gbs, p.inter_node_bw_gbs)
        steps, inter_steps = 2 * (n - 1), (2 * nodes if nodes > 1 else 0)
        best = math.inf
        for proto in NCCL_RING:
            intra = proto.pci_us if nodes == 1 else max(proto.pci_us, proto.net_overhead_us)
            latency = proto.base_us + (steps - inter_steps) * intra + inter_steps * proto.net_us
            latency *= p.nccl_latency_factor * (proto.plateau if nodes > 1 else 1.0)
            moved = steps / n * size / (link * 1e9 * proto.bw_share)
            best = min(best, latency / 1e6 + moved)
        return best

    def hop_time(self, tokens: int, stage: int) -> float:
        """Send a batch's activations from ``stage`` to ``stage + 1``: one step of a ring
        over that link, as NCCL costs a one-step transfer (``baseLat + hwLat``) [nccl]."""
        p = self.p
        gpus_before = (stage + 1) * self.tp
        crosses_node = gpus_before % self.gpus_per_node == 0
        bandwidth = p.inter_node_bw_gbs if crosses_node else p.intra_node_bw_gbs
        size = tokens * p.hidden * p.activation_bytes
        return min(
            (proto.base_us + (proto.net_us if crosses_node else proto.pci_us))
            * p.nccl_latency_factor
            / 1e6
            + size / (bandwidth * 1e9 * proto.bw_share)
            for proto in NCCL_RING
        )
