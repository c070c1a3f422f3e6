"""A stand-in ``nvidia-smi`` for the mock's nodes, driven by the mock servers' own load.

``python -m pytest_kimi.mock.nvidia_smi --node NAME (--state-dir DIR | --scope SCOPE)
[nvidia-smi args]`` answers what pytest-kimi asks a real ``nvidia-smi``:

* ``--query-gpu=F1,F2,...`` (any of :data:`~pytest_kimi.deploy.gpus.GPU_FIELDS`, in the order
  asked) and ``--query-compute-apps=...`` (``gpu_uuid, pid, process_name, used_memory``), with
  ``--format=csv[,noheader][,nounits]``;
* ``-L`` (``GPU 0: NAME (UUID: GPU-...)``) and ``-q`` (the header lines ``Driver Version`` and
  ``CUDA Version``, and a product name per GPU).

``... hold --gpus 0,3 --mib 40960`` registers itself as a process holding those GPUs until it
is killed, as a foreign job would. Answers come from :mod:`pytest_kimi.mock.gpustate`.
Standard library only, and light (it starts once per node every telemetry round): no
``dataclasses``, ``uuid`` (``platform`` and ``hashlib`` behind it) or terminal-width lookup in
``argparse``; that took its CPU per call from ~54 to ~41 ms (100 calls, in a venv).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from pytest_kimi.mock import gpustate

DEFAULT_ROOT = "/tmp/pytest-kimi/mock-gpus"
UNITS = {
    "utilization.gpu": "%",
    "memory.used": "MiB",
    "memory.total": "MiB",
    "memory.free": "MiB",
    "power.draw": "W",
    "power.limit": "W",
    "clocks.sm": "MHz",
    "used_memory": "MiB",
}


class Gpu(NamedTuple):
    """One GPU of the node as the stand-in reports it."""

    index: int
    uuid: str
    util: float  # 0..1
    mem_mib: float


def gpu_uuid(node: str, index: int) -> str:
    """Stable per node and index, shaped like NVIDIA's (``GPU-`` and 8-4-4-4-12 hex digits):
    four CRC-32s of the name, since ``uuid`` and ``hashlib`` cost more to import than the
    stand-in's whole answer."""
    name = f"pytest-kimi-mock/{node}/{index}".encode()
    digits = "".join(f"{zlib.crc32(name, seed):08x}" for seed in (1, 2, 3, 4))
    cuts = (digits[:8], digits[8:12], digits[12:16], digits[16:20], digits[20:])
    return "GPU-" + "-".join(cuts)


def node_gpus(
    node: str, state_dir: str | Path, default: int = gpustate.DEFAULT_GPUS
) -> tuple[list[Gpu], list[gpustate.Holder]]:
    """The node's GPUs with every live holder's load summed, and the holders."""
    holders = gpustate.read_holders(state_dir)
    count = gpustate.gpu_count(state_dir, holders, default)
    gpus = []
    for index in range(count):
        mine = [h for h in holders if index in h.gpus]
        util = min(1.0, sum(h.util for h in mine))
        mem = min(gpustate.MEM_TOTAL_MIB, sum(h.mem_mib for h in mine))
        gpus.append(Gpu(index, gpu_uuid(node, index), util, mem))
    return gpus, holders


def gpu_value(gpu: Gpu, field: str) -> str:
    """One ``--query-gpu`` field, as nvidia-smi prints it with ``nounits``."""
    values = {
        "index": str(gpu.index),
        "uuid": gpu.uuid,
        "name": gpustate.GPU_NAME,
        "utilization.gpu": f"{round(gpu.util * 100)}",
        "memory.used": f"{round(gpu.mem_mib)}",
        "memory.total": f"{round(gpustate.MEM_TOTAL_MIB)}",
        "memory.free": f"{round(gpustate.MEM_TOTAL_MIB - gpu.mem_mib)}",
        "power.draw": f"{gpustate.power_w(gpu.util):.2f}",
        "power.limit": f"{gpustate.TDP_W:.2f}",
        "clocks.sm": f"{round(gpustate.sm_clock_mhz(gpu.util))}",
        "driver_version": gpustate.DRIVER_VERSION,
        "count": "",  # filled by the caller
        "pci.bus_id": f"00000000:{gpu.index + 1:02X}:00.0",
    }
    if field not in values:
        raise KeyError(field)
    return values[field]


def _csv(fields: list[str], rows: list[list[str]], fmt: set[str]) -> str:
    lines = []
    if "noheader" not in fmt:
        names = [f if "nounits" in fmt or f not in UNITS else f"{f} [{UNITS[f]}]" for f in fields]
        lines.append(", ".join(names))
    for row in rows:
        if "nounits" not in fmt:
            row = [f"{v} {UNITS[f]}" if f in UNITS else v for f, v in zip(fields, row, strict=True)]
        lines.append(", ".join(row))
    return "".join(line + "\n" for line in lines)


def query_gpu(node: str, state_dir: str, fields: list[str], fmt: set[str], default: int) -> str:
    gpus, _ = node_gpus(node, state_dir, default)
    rows = []
    for gpu in gpus:
        row = [gpu_value(gpu, f) if f != "count" else str(len(gpus)) for f in fields]
        rows.append(row)
    return _csv(fields, rows, fmt)


def query_apps(node: str, state_dir: str, fields: list[str], fmt: set[str], default: int) -> str:
    gpus, holders = node_gpus(node, state_dir, default)
    by_index = {g.index: g for g in gpus}
    rows = []
    for holder in holders:
        for index in holder.gpus:
            if index not in by_index:
                continue
            values = {
                "gpu_uuid": by_index[index].uuid,
                "pid": str(holder.pid),
                "process_name": holder.name,
                "used_memory": f"{round(holder.mem_mib)}",
                "gpu_bus_id": f"00000000:{index + 1:02X}:00.0",
            }
            rows.append([values[f] for f in fields])
    return _csv(fields, rows, fmt)


def list_gpus(node: str, state_dir: str, default: int) -> str:
    gpus, _ = node_gpus(node, state_dir, default)
    return "".join(f"GPU {g.index}: {gpustate.GPU_NAME} (UUID: {g.uuid})\n" for g in gpus)


def query_all(node: str, state_dir: str, default: int) -> str:
    """``nvidia-smi -q``: the header real tools read, and one section per GPU."""
    gpus, _ = node_gpus(node, state_dir, default)
    pad = 42
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp':<{pad}}: {time.strftime('%a %b %d %H:%M:%S %Y')}",
        f"{'Driver Version':<{pad}}: {gpustate.DRIVER_VERSION}",
        f"{'CUDA Version':<{pad}}: {gpustate.CUDA_VERSION}",
        "",
        f"{'Attached GPUs':<{pad}}: {len(gpus)}",
    ]
    for gpu in gpus:
        lines += [
            f"GPU 00000000:{gpu.index + 1:02X}:00.0",
            f"    {'Product Name':<{pad - 4}}: {gpustate.GPU_NAME}",
            f"    {'GPU UUID':<{pad - 4}}: {gpu.uuid}",
            "",
        ]
    return "\n".join(lines) + "\n"


def hold(state_dir: str, gpus: list[int], mib: float, name: str) -> int:
    """Hold ``gpus`` until SIGTERM/SIGINT; the state file goes with the process."""
    pid = os.getpid()
    holder = gpustate.Holder(pid, name, tuple(gpus), mib, util=0.0)
    gpustate.write_state(state_dir, holder)

    def stop(signum, frame):
        gpustate.remove_state(state_dir, pid)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"holding GPU(s) {','.join(map(str, gpus))} as pid {pid}", flush=True)
    while True:
        signal.pause()


def _formatter(prog: str) -> argparse.HelpFormatter:
    """A width of its own: the default asks the terminal, importing shutil (3 ms a call)."""
    return argparse.HelpFormatter(prog, width=100)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pytest_kimi.mock.nvidia_smi",
        allow_abbrev=False,
        formatter_class=_formatter,
    )
    p.add_argument("--node", required=True, help="the node's name (GPU UUIDs derive from it)")
    p.add_argument("--state-dir", default=None, help="the node's state dir (overrides the rest)")
    p.add_argument("--state-root", default=DEFAULT_ROOT)
    p.add_argument("--scope", default=None, help="<run>/<layout> on local clusters")
    p.add_argument(
        "--default-gpus",
        type=int,
        default=gpustate.DEFAULT_GPUS,
        help="GPUs the node lists when no live server and no gpu_count file says (its gpus:)",
    )
    p.add_argument("-L", "--list-gpus", action="store_true")
    p.add_argument("-q", "--query", action="store_true")
    p.add_argument("-d", "--display", default=None)
    p.add_argument("--query-gpu", default=None)
    p.add_argument("--query-compute-apps", default=None)
    p.add_argument("--format", default="csv")
    sub = p.add_subparsers(dest="command")
    h = sub.add_parser(
        "hold", help="hold GPUs until killed, like a foreign job", formatter_class=_formatter
    )
    h.add_argument("--gpus", required=True, help="comma-separated indices, e.g. 3 or 0,1")
    h.add_argument("--mib", type=float, default=40960.0)
    h.add_argument("--name", default="python3")
    return p


def state_dir_of(args: argparse.Namespace) -> str:
    if args.state_dir:
        return args.state_dir
    parts = [args.state_root, *([args.scope] if args.scope else []), args.node]
    return os.path.join(*parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    where = state_dir_of(args)
    if args.command == "hold":
        return hold(where, [int(g) for g in args.gpus.split(",")], args.mib, args.name)
    fmt = {part.strip() for part in args.format.split(",")}
    node, count = args.node, args.default_gpus
    try:
        if args.query_gpu:
            out = query_gpu(node, where, args.query_gpu.split(","), fmt, count)
        elif args.query_compute_apps:
            out = query_apps(node, where, args.query_compute_apps.split(","), fmt, count)
        elif args.list_gpus:
            out = list_gpus(node, where, count)
        elif args.query:
            out = query_all(node, where, count)
        else:
            out = list_gpus(node, where, count)
    except KeyError as exc:
        print(f'Field "{exc.args[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    sys.stdout.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
