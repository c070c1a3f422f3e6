"""What a mock server's GPUs are doing, published for the stand-in ``nvidia-smi``.

Every :data:`~pytest_kimi.mock.gpustate.WRITE_EVERY_S` wall seconds a mock server writes its
state file (:mod:`pytest_kimi.mock.gpustate`): it holds GPUs ``0 .. gpus_per_node-1`` of its
node, each with

* utilisation: the fraction of the last window the scheduler was busy with batches (the
  stage time of every batch launched, in cluster seconds, over the window's cluster seconds);
* memory: this GPU's share of the weights (all parameters at their bytes per parameter, split
  over TP x PP) plus the KV cache of the tokens held by running requests (each GPU keeps the
  latent KV of its ``layers / PP`` layers, replicated over TP, as MLA does).

Only rank 0 runs the scheduler; it sends each window's numbers to the other ranks over the
rendezvous link, so every node of a replica shows the same load (the GPUs of a TP/PP group
work in lockstep).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from pytest_kimi.mock import gpustate
from pytest_kimi.mock.perfmodel import Profile
from pytest_kimi.mock.scheduler import ReplicaSim

MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class Load:
    """One window's load of the replica: busy fraction and tokens held in the KV cache."""

    util: float = 0.0
    kv_tokens: int = 0


def weights_mib(profile: Profile, tp: int, pp: int) -> float:
    """One GPU's share of the weights."""
    p = profile
    dense = p.dense_params_b * 1e9 * p.dense_bytes_per_param
    experts = p.experts * p.expert_params_m * 1e6 * p.layers * p.expert_bytes_per_param
    return (dense + experts) / max(1, tp * pp) / MIB


def kv_mib(profile: Profile, pp: int, tokens: int) -> float:
    """One GPU's KV cache for ``tokens`` held tokens: its stage's layers, replicated over TP."""
    return profile.kv_bytes_per_token * (profile.layers / max(1, pp)) * tokens / MIB


def kv_tokens(sim: ReplicaSim) -> int:
    """Tokens whose KV the running requests hold (prefilled prompt plus generated)."""
    return sum(r.prefilled + r.generated for r in sim.running if r.finished_at is None)


class BusyWindow:
    """Utilisation over the time since the last call, from the scheduler's busy seconds."""

    def __init__(self, sim: ReplicaSim, time_scale: float, clock=time.monotonic) -> None:
        self.sim, self.time_scale, self.clock = sim, time_scale, clock
        self.last_busy, self.last_wall = sim.busy_s, clock()

    def load(self) -> Load:
        now, busy = self.clock(), self.sim.busy_s
        window = (now - self.last_wall) * self.time_scale
        util = (busy - self.last_busy) / window if window > 0 else 0.0
        self.last_busy, self.last_wall = busy, now
        return Load(min(1.0, max(0.0, util)), kv_tokens(self.sim))


@dataclass(frozen=True)
class GpuShare:
    """What this server holds on its node."""

    state_dir: str
    gpus: int
    weights_mib: float
    profile: Profile
    pp: int

    def holder(self, load: Load) -> gpustate.Holder:
        mem = self.weights_mib + kv_mib(self.profile, self.pp, load.kv_tokens)
        return gpustate.Holder(
            pid=os.getpid(),
            name="python3",
            gpus=tuple(range(self.gpus)),
            mem_mib=round(mem, 1),
            util=round(load.util, 4),
            node_gpus=self.gpus,
        )


def share_of(args) -> GpuShare | None:
    """What a server started with ``--mock-gpu-state`` holds (None: it publishes nothing)."""
    if not args.mock_gpu_state:
        return None
    profile = Profile.from_mapping(args.profile)
    return GpuShare(
        state_dir=args.mock_gpu_state,
        gpus=args.mock_gpus_per_node,
        weights_mib=weights_mib(profile, args.tp_size, args.pp_size),
        profile=profile,
        pp=args.pp_size,
    )


async def publish(share: GpuShare, current: Callable[[], Load]) -> None:
    """Write the state file every window until cancelled; remove it on the way out."""
    try:
        while True:
            with contextlib.suppress(OSError):
                gpustate.write_state(share.state_dir, share.holder(current()))
            await asyncio.sleep(gpustate.WRITE_EVERY_S)
    finally:
        gpustate.remove_state(share.state_dir, os.getpid())
