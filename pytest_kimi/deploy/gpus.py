"""What ``nvidia-smi`` says about a node's GPUs: the queries we send and how we read them.

Pure string building and parsing, shared by the pre-flight check (before launch) and the
telemetry sampler (during the run). We ask ``nvidia-smi`` for CSV without header or units
(``--format=csv,noheader,nounits``), the form NVIDIA documents for scripts, one query for the
GPUs and one for the compute processes on them. A field a GPU does not support reads
``[N/A]`` or ``[Not Supported]`` and becomes ``None``; a line we cannot read raises
:class:`GpuQueryError` naming it, because a silently skipped GPU is a GPU nobody checked.
"""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kimi.config import ClusterConfig, Node

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "clocks.sm",
    "driver_version",
)
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
_MISSING = {"[n/a]", "[not supported]", "n/a", "[unknown error]", ""}


class GpuQueryError(ValueError):
    """``nvidia-smi`` answered something we cannot read (wrong tool, wrong version)."""


@dataclass(frozen=True)
class GpuState:
    """One GPU at one moment, as ``nvidia-smi --query-gpu`` reports it."""

    index: int
    uuid: str
    name: str
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    driver: str | None


@dataclass(frozen=True)
class GpuProcess:
    """A compute process holding a GPU (``nvidia-smi --query-compute-apps``)."""

    gpu_uuid: str
    pid: int
    name: str
    used_mib: float | None


def query_gpus(smi: Sequence[str]) -> str:
    """The shell command that lists every GPU with :data:`GPU_FIELDS`."""
    return shlex.join(
        [*smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
    )


def query_apps(smi: Sequence[str]) -> str:
    """The shell command that lists every compute process with :data:`APP_FIELDS`."""
    return shlex.join(
        [*smi, "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]
    )


def _rows(text: str, width: int, what: str) -> list[list[str]]:
    rows = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), 1):
        cells = [cell.strip() for cell in row]
        if not any(cells):
            continue
        if len(cells) != width:
            raise GpuQueryError(
                f"{what} line {number} has {len(cells)} fields, expected {width}: {row!r}"
            )
        rows.append(cells)
    return rows


def _number(cell: str, field: str, what: str) -> float | None:
    if cell.lower() in _MISSING:
        return None
    try:
        return float(cell)
    except ValueError:
        raise GpuQueryError(f"{what}: {field} is {cell!r}, not a number") from None


def _text(cell: str) -> str | None:
    return None if cell.lower() in _MISSING else cell


def parse_gpus(text: str) -> list[GpuState]:
    """Read the output of :func:`query_gpus`."""
    out = []
    for cells in _rows(text, len(GPU_FIELDS), "nvidia-smi --query-gpu"):
        what = f"nvidia-smi GPU {cells[0]}"
        index = _number(cells[0], "index", what)
        if index is None:
            raise GpuQueryError(f"{what}: no index")
        out.append(
            GpuState(
                index=int(index),
                uuid=cells[1],
                name=cells[2],
                util_pct=_number(cells[3], "utilization.gpu", what),
                mem_used_mib=_number(cells[4], "memory.used", what),
                mem_total_mib=_number(cells[5], "memory.total", what),
                power_w=_number(cells[6], "power.draw", what),
                sm_clock_mhz=_number(cells[7], "clocks.sm", what),
                driver=_text(cells[8]),
            )
        )
    return out


def parse_apps(text: str) -> list[GpuProcess]:
    """Read the output of :func:`query_apps` (no line: no compute process)."""
    out = []
    if "no running processes found" in text.lower():  # some drivers say so instead of nothing
        return out
    for cells in _rows(text, len(APP_FIELDS), "nvidia-smi --query-compute-apps"):
        what = f"nvidia-smi compute process {cells[1]}"
        pid = _number(cells[1], "pid", what)
        out.append(
            GpuProcess(
                gpu_uuid=cells[0],
                pid=int(pid) if pid is not None else -1,
                name=cells[2],
                used_mib=_number(cells[3], "used_memory", what),
            )
        )
    return out


MOCK_SMI_MODULE = "pytest_kimi.mock.nvidia_smi"


def mock_gpu_dir(cluster: ClusterConfig, node: Node, scope: str | None) -> str | None:
    """Where the mock servers of ``node`` publish their GPUs and the stand-in reads them.

    On SSH and Slurm clusters one folder per node, kept across runs
    (``<work_dir>/mock-gpus/<node>``): a leftover server or a foreign holder must be seen by
    the next pre-flight. On local clusters every "node" is this machine, and layouts running
    at once under xdist reuse the same node names, so the folder is under the run's scope;
    None without one (a dry run)."""
    root = f"{cluster.work_dir.rstrip('/')}/mock-gpus"
    if cluster.remote:  # ssh, slurm: the nodes are machines of their own
        return f"{root}/{node.name}"
    return f"{root}/{scope}/{node.name}" if scope else None


def smi_command(cluster: ClusterConfig, node: Node, scope: str) -> list[str]:
    """The ``nvidia-smi`` to run on ``node``: the cluster's ``nvidia_smi:`` or the plain
    ``nvidia-smi`` on a real cluster, the mock's stand-in (driven by the mock servers' own load)
    when the servers are the mock.

    ``scope`` is ``<run folder name>/<layout>``, the same tag the SSH executor uses for its
    remote folder; the stand-in keeps its GPU state under it where runs must not see each
    other (several local layouts at once under xdist share the "nodes" of one machine)."""
    from pytest_kimi.config.checks import MOCK_MODULE

    server = cluster.server
    if server.module != MOCK_MODULE:
        return list(cluster.nvidia_smi) or ["nvidia-smi"]
    state = mock_gpu_dir(cluster, node, scope)
    where = ["--state-dir", state] if state else ["--scope", scope]
    # the mock's nodes have the GPUs the cluster file gives them (a test overrides the count
    # with a gpu_count file in the state dir)
    count = ["--default-gpus", str(node.gpus)]
    return [server.python, "-m", MOCK_SMI_MODULE, "--node", node.name, *where, *count]
