"""The mock's GPUs: state files the mock servers write and the stand-in ``nvidia-smi`` reads.

Each mock server process (and each ``nvidia_smi hold``) writes ``<state dir>/<pid>.json`` every
:data:`WRITE_EVERY_S` wall seconds and removes it at exit: which GPUs of its node it holds,
with how much memory and how busy. A file whose pid is no longer alive is stale (a killed
server cannot clean up) and is ignored. The state dir is one per node (``<work_dir>/mock-gpus/
<node>`` on SSH clusters, so leftovers and foreign holders are seen; under a run's scope on
local clusters, where every "node" is this machine).

Standard library only, and light: the stand-in ``nvidia-smi`` starts every round of telemetry on
every node (16 a round for two layouts' nodes), so each millisecond of import is paid hundreds of
times a run. Records are ``NamedTuple``: importing ``dataclasses`` (and its ``inspect``) took 7 ms
of the stand-in's ~54.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import NamedTuple

from pytest_kimi.workload.pids import pid_alive

# The stand-in's GPU: an RTX PRO 6000 Blackwell Server Edition (the seed cluster's card).
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
MEM_TOTAL_MIB = 97887.0  # what nvidia-smi reports for its 96 GB
IDLE_W = 60.0  # power draw of an idle GPU with a process on it, W
TDP_W = 600.0  # board power limit, W: drawn at 100% utilisation
SM_IDLE_MHZ = 180.0
SM_BOOST_MHZ = 2430.0
DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"
DEFAULT_GPUS = 8  # GPUs a node lists when neither a server nor --default-gpus says otherwise
COUNT_FILE = "gpu_count"  # a file in the state dir holding an integer overrides the count
WRITE_EVERY_S = 0.5


class Holder(NamedTuple):
    """One process holding GPUs of a node, as its state file says."""

    pid: int
    name: str  # process_name, as nvidia-smi lists it
    gpus: tuple[int, ...]
    mem_mib: float  # per GPU it holds
    util: float = 0.0  # 0..1, per GPU it holds
    node_gpus: int | None = None  # a server states how many GPUs its node has


def state_file(state_dir: str | Path, pid: int) -> Path:
    return Path(state_dir) / f"{pid}.json"


def write_state(state_dir: str | Path, holder: Holder) -> None:
    """Replace the holder's file atomically (readers never see half a file)."""
    path = state_file(state_dir, holder.pid)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = holder._asdict()
    data["gpus"] = list(holder.gpus)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def remove_state(state_dir: str | Path, pid: int) -> None:
    with contextlib.suppress(OSError):
        state_file(state_dir, pid).unlink()


def read_holders(state_dir: str | Path) -> list[Holder]:
    """Every live holder of the node, by pid; stale and unreadable files are skipped."""
    out = []
    directory = Path(state_dir)
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            holder = Holder(
                pid=int(data["pid"]),
                name=str(data.get("name", "python3")),
                gpus=tuple(int(g) for g in data["gpus"]),
                mem_mib=float(data.get("mem_mib", 0.0)),
                util=float(data.get("util", 0.0)),
                node_gpus=data.get("node_gpus"),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid_alive(holder.pid):
            out.append(holder)
    return out


def gpu_count(state_dir: str | Path, holders: list[Holder], default: int = DEFAULT_GPUS) -> int:
    """The node's GPU count: the ``gpu_count`` file, else what a live server says, else
    ``default`` (the node's ``gpus:`` when the product asks, else 8)."""
    with contextlib.suppress(OSError, ValueError):
        return int((Path(state_dir) / COUNT_FILE).read_text().strip())
    stated = [h.node_gpus for h in holders if h.node_gpus]
    return max(stated) if stated else default


def power_w(util: float) -> float:
    """Idle draw plus utilisation times the headroom to the board limit."""
    return IDLE_W + min(1.0, max(0.0, util)) * (TDP_W - IDLE_W)


def sm_clock_mhz(util: float) -> float:
    """Boost clock while any kernel runs in the window, idle clock otherwise."""
    return SM_BOOST_MHZ if util > 0 else SM_IDLE_MHZ
