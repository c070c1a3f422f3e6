"""The mock's performance profile: the hardware and model numbers a cluster file's
``mock.profile`` sets, with their sources. Configuration, so the cluster file is checked
against it without importing the mock; the cost model that reads it is
:mod:`pytest_kimi.mock.perfmodel` (docs/mock.md)."""

from __future__ import annotations

from collections.abc import Mapping
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
