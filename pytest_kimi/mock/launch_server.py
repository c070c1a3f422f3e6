"""Drop-in for ``python -m sglang.launch_server``: ``python -m pytest_kimi.mock.launch_server``.

Takes SGLang's flags, joins the replica's nodes through a TCP rendezvous, and on node rank 0
serves SGLang's HTTP API over the layout-aware performance model; other ranks serve a dummy
``/health``, as SGLang's do. Logs in SGLang's style, ending start-up with its ready line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence

from pytest_kimi.mock.args import MockArgs, parse_args
from pytest_kimi.mock.dummy_health import serve_dummy_health
from pytest_kimi.mock.gpuload import Load, publish, share_of
from pytest_kimi.mock.rendezvous import RendezvousError, follow, join
from pytest_kimi.mock.speculative import SpeculativeError
from pytest_kimi.mock.startup import load, stalls

log = logging.getLogger("sglang.mock")


async def _main(args: MockArgs) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rank, nnodes = args.node_rank, args.nnodes
    prefix = f"TP0 PP0 node{rank}"
    log.info("[%s] server_args=%s", prefix, args.server_info())
    if args.unknown:
        log.info("[%s] flags not modelled by the mock (accepted): %s", prefix, args.unknown)
    if nnodes > 1 and not args.dist_init_addr:
        log.error("--nnodes %d needs --dist-init-addr", nnodes)
        return 2
    if rank > 0:
        return await _worker_rank(args, stop, prefix)
    from pytest_kimi.mock.rank0 import serve_rank0  # aiohttp and the model: rank 0 only

    return await serve_rank0(args, stop, prefix)


async def _worker_rank(args: MockArgs, stop: asyncio.Event, prefix: str) -> int:
    try:
        link, writer = await join(args.dist_init_addr, args.node_rank, args.mock_join_timeout)
    except (RendezvousError, OSError) as exc:
        log.error("[%s] %s", prefix, exc)
        return 1
    if stalls(args):  # joined, then silent until stopped: its /health stub never answers
        await stop.wait()
        writer.close()
        return 0
    # as SGLang's ranks >= 1: the health stub is served once this node's schedulers are up
    await load(args, stop, prefix)
    server = await serve_dummy_health(args.host, args.port)
    log.info("[%s] Dummy health server on http://%s:%d", prefix, args.host, args.port)
    latest = [Load()]  # rank 0's last window: the replica's GPUs work in lockstep

    def on_message(message: dict) -> None:
        latest[0] = Load(float(message.get("util", 0.0)), int(message.get("kv_tokens", 0)))

    share = share_of(args)
    gpus = asyncio.create_task(publish(share, lambda: latest[0])) if share else None
    lost = asyncio.create_task(follow(link, on_message))
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([lost, stopped], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if lost.done() and not stop.is_set():
        log.error("[%s] NCCL error: lost rank 0; exiting", prefix)
        code = 1
    for task in (lost, stopped, *([gpus] if gpus else [])):
        task.cancel()
    writer.close()
    await server.close()
    return code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SpeculativeError as exc:  # SGLang refuses these at start-up too
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_main(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
