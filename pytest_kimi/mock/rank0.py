"""Node rank 0 of a mock replica: SGLang's HTTP API over the layout-aware performance model.

:mod:`pytest_kimi.mock.launch_server` imports this on rank 0 only: the other ranks serve a
dummy ``/health`` from the standard library (:mod:`pytest_kimi.mock.dummy_health`) and never
load aiohttp or the model, so an 8-node layout's start-up costs one process' imports, not 8.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from aiohttp import web

from pytest_kimi.config.versions import SGLangProfile
from pytest_kimi.mock.args import MockArgs
from pytest_kimi.mock.bootstrap import bootstrap_app, serve_lines
from pytest_kimi.mock.decodeside import DecodeSide
from pytest_kimi.mock.engine import Engine
from pytest_kimi.mock.faults import FaultError, Faults, parse_flags
from pytest_kimi.mock.gpuload import BusyWindow, Load, publish, share_of
from pytest_kimi.mock.http_common import SIDE_KEY
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.prefillside import PrefillSide
from pytest_kimi.mock.prefixreuse import PrefixReuse
from pytest_kimi.mock.rendezvous import Rank0, RendezvousError
from pytest_kimi.mock.scheduler import ReplicaSim
from pytest_kimi.mock.server import build_app
from pytest_kimi.mock.startup import load, stalls
from pytest_kimi.mock.wire.info import max_total_tokens
from pytest_kimi.workload.sharedclock import SharedClock

log = logging.getLogger("sglang.mock")
READY_LINE = "The server is fired up and ready to roll!"


def build_engine(args: MockArgs) -> Engine:
    """The performance model for this replica, from the flags and the profile."""
    profile = Profile.from_mapping(args.profile)
    cost = CostModel(
        profile,
        tp=args.tp_size,
        pp=args.pp_size,
        ep=args.ep_size,
        gpus_per_node=args.mock_gpus_per_node,
    )
    sim = ReplicaSim(
        cost,
        chunk_size=args.chunked_prefill_size,
        max_running=args.max_running_requests or profile.max_running_requests,
        mixed_chunk=args.enable_mixed_chunk,
        seed=args.mock_seed,
        jitter=profile.jitter,
        spec=args.speculation,
        decode_log_interval=args.decode_log_interval,
        cache=None if args.disable_radix_cache else PrefixReuse(
            max_total_tokens(args.wire, args.max_total_tokens), whole_answer=args.wire == "0.5.9"),
    )
    shared = SharedClock(args.mock_clock) if args.mock_clock else None
    return Engine(sim, args.mock_time_scale, shared=shared)


async def _serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def serve_rank0(args: MockArgs, stop: asyncio.Event, prefix: str) -> int:
    """Rank 0 from the model's construction to shut-down; the exit code."""
    logging.getLogger("aiohttp.server").addFilter(uvicorn_style_bad_request)
    nnodes = args.nnodes
    try:
        engine = build_engine(args)
    except (OSError, ValueError) as exc:
        log.error("[%s] --mock-clock %s: %s", prefix, args.mock_clock, exc)
        return 2
    faults = Faults(seed=args.mock_seed)
    env_faults = [f for f in os.environ.get("KIMI_MOCK_FAULT", "").split(",") if f.strip()]
    try:  # flags, or KIMI_MOCK_FAULT=name=value,... (a per-node env in the cluster YAML)
        faults.update(parse_flags([*env_faults, *args.mock_fault]))
    except FaultError as exc:
        log.error("[%s] --mock-fault: %s", prefix, exc)
        return 2
    engine.stalled = faults.stall
    rendezvous = Rank0(args.dist_init_addr or "127.0.0.1:0", nnodes) if nnodes > 1 else None
    if rendezvous is not None:
        await rendezvous.start()
        try:
            await rendezvous.wait(args.mock_join_timeout)
        except RendezvousError as exc:
            log.error("[%s] %s", prefix, exc)
            await rendezvous.close()
            return 1
    if stalls(args):
        await stop.wait()  # silent until stopped: the log does not grow
        if rendezvous is not None:
            await rendezvous.close()
        return 0
    gpus = _publish_gpus(args, engine, rendezvous)
    await load(args, stop, prefix)
    app = build_app(args, engine, faults)
    try:
        side, extras = await _disaggregation(args, engine, prefix)
    except OSError as exc:
        log.error("[%s] disaggregation bootstrap server on %s:%d: %s", prefix, args.host,
                  args.disaggregation_bootstrap_port, exc)  # fmt: skip
        return 1
    if side is not None:
        app[SIDE_KEY] = side
    runner = await _serve(app, args.host, args.port)
    scheduler = asyncio.create_task(engine.run())
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", args.host, args.port)
    log.info(READY_LINE)
    waits = [asyncio.create_task(stop.wait()), scheduler]
    if rendezvous is not None:
        waits.append(asyncio.create_task(rendezvous.lost.wait()))
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if rendezvous is not None and rendezvous.lost.is_set() and not stop.is_set():
        log.error(
            "[%s] NCCL error: connection to node rank %s lost; replica is down",
            prefix,
            rendezvous.lost_rank,
        )
        code = 1
    if scheduler.done() and scheduler.exception() is not None:
        log.error("[%s] scheduler crashed: %r", prefix, scheduler.exception())
        code = 1
    scheduler.cancel()
    if gpus is not None:
        gpus.cancel()
    if isinstance(side, DecodeSide):
        await side.close()
    for extra in extras:
        await extra()
    if rendezvous is not None:
        await rendezvous.close()
    await runner.cleanup()
    log.info("[%s] shut down", prefix)
    return code


async def _disaggregation(
    args: MockArgs, engine: Engine, prefix: str
) -> tuple[PrefillSide | DecodeSide | None, list[Callable[[], Awaitable[None]]]]:
    """A disaggregated server's side; a prefill's also serves its bootstrap server and the
    line its decode servers connect to. Returns the side and what to close at the end."""
    mode = args.disaggregation_mode
    if mode == "null":
        return None, []
    profile = Profile.from_mapping(args.profile)
    release = SGLangProfile(args.wire)  # what the release observes and takes
    if mode == "decode":
        log.info("[%s] disaggregation: decode (transfer backend %s)", prefix,
                 args.disaggregation_transfer_backend)  # fmt: skip
        side = DecodeSide(engine, profile, nodes=args.nnodes, tp=args.tp_size,
                          bootstrap_port=args.disaggregation_bootstrap_port)  # fmt: skip
        side.queue_times = not release.pd_queue_stages and bool(args.enable_metrics)
        return side, []
    # 0.5.9 slices the KV for --disaggregation-decode-tp (default: its own TP); later releases
    # learn the decode side's TP from the decode side
    flag = release.pd_shape_flags
    decode_tp = (args.disaggregation_decode_tp or args.tp_size) if flag else None
    side = PrefillSide(engine, profile, nodes=args.nnodes, decode_tp=decode_tp,
                       queue_stages=release.pd_queue_stages)  # fmt: skip
    side.keep_observed = bool(args.enable_metrics)  # only a /metrics scrape takes them
    lines = await serve_lines(args.host, side.hear)
    rank_port = lines.sockets[0].getsockname()[1]
    info = {"prefill_attn_tp_size": args.tp_size, "prefill_dp_size": args.dp_size,
            "prefill_pp_size": args.pp_size, "prefill_page_size": 1}  # fmt: skip
    try:
        runner = await _serve(bootstrap_app(info, args.host, rank_port), args.host,
                              args.disaggregation_bootstrap_port)  # fmt: skip
    except OSError:
        lines.close()
        raise
    log.info("[%s] disaggregation: prefill, bootstrap server on %s:%d (decode tp %s, "
             "transfer backend %s)", prefix, args.host, args.disaggregation_bootstrap_port,
             decode_tp or "from the decode side", args.disaggregation_transfer_backend)  # fmt: skip

    async def close() -> None:
        lines.close()
        await runner.cleanup()

    return side, [close]


def _publish_gpus(args: MockArgs, engine: Engine, peers: Rank0 | None) -> asyncio.Task | None:
    """Rank 0: publish this node's GPU load from the scheduler, and send it to the other
    ranks of the replica."""
    share = share_of(args)
    if share is None:
        return None
    window = BusyWindow(engine.sim, args.mock_time_scale)

    def current() -> Load:
        load = window.load()
        if peers is not None:
            peers.broadcast({"util": load.util, "kv_tokens": load.kv_tokens})
        return load

    return asyncio.create_task(publish(share, current))


def uvicorn_style_bad_request(record: logging.LogRecord) -> bool:
    """The router probes each worker's port for gRPC with an HTTP/2 preface. SGLang's uvicorn
    logs one warning line for it; aiohttp would log a traceback, which log checks would
    rightly flag. Log what SGLang logs."""
    from aiohttp.http_exceptions import BadHttpMessage

    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, BadHttpMessage):
        record.msg, record.args, record.exc_info = "Invalid HTTP request received.", (), None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True
