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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

# Sources (the seed's GPUs are RTX Pro 6000D, a variant whose numbers are not published; the
# numbers below are the RTX PRO 6000 Blackwell Server Edition's):
# [gpu] NVIDIA RTX PRO 6000 Blackwell: 96 GB GDDR7 on a 512-bit bus at 28 Gbps = 1792 GB/s;
#       "4000 AI TOPS" FP4 with 2:4 sparsity = 2000 dense FP4 = 500 dense BF16 TFLOP/s; PCIe 5.0
#       x16. https://www.nvidia.com/en-us/data-center/rtx-pro-6000-blackwell-server-edition/
#       (figures as reported at launch: https://gpu.name/posts/nvidia-unveils-rtx-pro-6000-
#       blackwell-gpu-with-24-064-cores-and-96gb-memory)
# [pcie] PCI Express 5.0: 32 GT/s per lane, x16 = 63 GB/s per direction (PCI-SIG).
#       https://pcisig.com/specifications
# [nic] Assumed: one 100 Gb/s Ethernet/RoCE NIC per 8-GPU node = 12.5 GB/s per node. The
#       seed does not name its network; this is a stated assumption, not a measurement.
# [nccl] NCCL 2.20.3, src/graph/tuning.cc (commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2),
#       ncclTopoTuneModel and ncclTopoGetAlgoTime, Ring algorithm, all-reduce:
#       latency = baseLat + (nsteps - nInterSteps) x intraLat + nInterSteps x interLat,
#       nsteps = 2 (ranks - 1), nInterSteps = 2 nodes when nodes > 1 (else 0);
#       intraLat = hwLat[PCI] (no NVLink), raised to the network post overhead (1 us on x86,
#       x3 for Simple) once the ring spans nodes; interLat = hwLat[NET];
#       Simple across nodes: latency x 1.4 ("plateau effect of ring", compute capability >= 80,
#       bytes / (channels x ranks) >= 64: true of every message here);
#       time = latency + bytes / algorithm bandwidth, LL's bus bandwidth 1/4 of the link's;
#       LL128 is enabled only on NVLink (typeIntra <= PATH_NVB), so PCIe rings use LL or Simple.
#       https://github.com/NVIDIA/nccl/blob/v2.20.3-1/src/graph/tuning.cc
# [nccl-measured] NCCL's table latencies are its tuner's estimates; measured small all-reduces
#       take longer. all_reduce_perf, 8 B, 8 RTX 3090 over PCIe (no NVLink, NCCL's PCI class):
#       54.18 us (https://github.com/NVIDIA/nccl/issues/1439), against NCCL 2.20.3's model of
#       that ring, 6.6 + 14 x 1.0 = 20.6 us: x2.63. Across nodes (H100 cluster, 128 B, Tree/LL)
#       NCCL's own log gives its model as 25.2 us and all_reduce_perf measured 61.6 us: x2.44
#       (https://github.com/NVIDIA/nccl/issues/1453). The mock scales NCCL's latencies by the
#       PCIe figure, 2.63; a cluster's own all_reduce_perf gives its value.
# [k2] Kimi K2 config.json: num_hidden_layers 61, hidden_size 7168, n_routed_experts 384,
#       num_experts_per_tok 8, moe_intermediate_size 2048, num_attention_heads 64,
#       qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, kv_lora_rank 512.
#       https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json
# [eagle3] EAGLE3 drafts for this model family are one Llama-style decoder layer on the
#       target's hidden size with a reduced draft vocabulary (Kimi K2.7's: hidden 7168, draft
#       vocab 32000, cm00cm/Kimi-K2.7-Code-EAGLE3). Sizes from SpecForge's DeepSeek-V3 EAGLE3
#       config (hidden 7168, intermediate 40960, 56 heads, 8 KV heads, draft vocab 32000):
#       fc 3 x 7168^2 = 154 M, q/k/v on 2 x hidden inputs 132 M, o 51 M, MLP 3 x 7168 x 40960
#       = 881 M, LM head 32000 x 7168 = 229 M: 1.45 B parameters in BF16.
#       https://github.com/sgl-project/SpecForge/blob/main/configs/deepseek-v3-671b-eagle3.json


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
class Profile:
    """Hardware and model numbers with physical meaning (units in the names)."""

    # hardware: data sheets [gpu], [pcie], [nic]
    gpu_tflops: float = 500.0  # dense BF16 tensor throughput per GPU, TFLOP/s [gpu]
    mfu: float = 0.1186  # FITTED: fraction of gpu_tflops that prefill reaches
    gpu_mem_bw_gbs: float = 1792.0  # GDDR7 bandwidth per GPU, GB/s [gpu]
    intra_node_bw_gbs: float = 63.0  # PCIe 5.0 x16 per direction, GB/s [pcie]
    inter_node_bw_gbs: float = 12.5  # the node's network, GB/s [nic]
    # measured over modelled small all-reduce time: NCCL's tables [nccl] are its tuner's
    # estimates, and all_reduce_perf on PCIe-only GPUs measures 2.63x theirs [nccl-measured]
    nccl_latency_factor: float = 2.63
    step_overhead_ms: float = 12.3589  # FITTED: per batch per pipeline stage (scheduler, sync)
    # model: Kimi K2 as a stand-in for Kimi-K3 [k2]
    layers: int = 61
    hidden: int = 7168
    active_params_b: float = 32.0  # parameters used per token, billions (K2 model card)
    dense_params_b: float = 11.0  # active minus routed experts: 32 - 60 x 8 x 44M = 11 B
    dense_bytes_per_param: float = 1.0  # FP8 checkpoint (K2 ships FP8 weights)
    experts: int = 384
    experts_per_token: int = 8
    expert_params_m: float = 44.0  # one routed expert's FFN: 3 x 7168 x 2048 = 44 M
    expert_bytes_per_param: float = 0.5  # MXFP4 (the seed's flashinfer_mxfp4 MoE runner)
    # per layer, per (query, context token): 2 FLOP x 64 heads x (192 q.k + 128 v dims)
    attn_flops_per_token_ctx: float = 40960.0
    kv_bytes_per_token: float = 1152.0  # per layer: MLA latent 512 + rope 64, BF16 (2 B)
    activation_bytes: float = 2.0  # BF16 activations on the wire
    # extra load on the busiest EP group, per extra group: no measurement, so 0 (balanced);
    # both seed layouts are EP4, so it could not tell them apart anyway
    ep_imbalance: float = 0.0
    jitter: float = 0.0  # relative std of a step's time (seeded), 0 for exact runs
    max_running_requests: int = 256
    # speculative decoding's draft model [eagle3]: read whole by every draft forward
    draft_params_b: float = 1.45
    draft_bytes_per_param: float = 2.0  # BF16

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
