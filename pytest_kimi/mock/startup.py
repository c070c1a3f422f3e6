"""Start-up steps every rank of a mock replica shares: loading, and the stall fault."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from pytest_kimi.mock.args import MockArgs

log = logging.getLogger("sglang.mock")


def stalls(args: MockArgs) -> bool:
    """``--mock-startup-stall`` or ``KIMI_MOCK_STARTUP_STALL=1`` (a per-node env in a YAML)."""
    flag = os.environ.get("KIMI_MOCK_STARTUP_STALL", "").strip().lower()
    return bool(args.mock_startup_stall) or flag in ("1", "true", "yes")


async def load(args: MockArgs, stop: asyncio.Event, prefix: str) -> None:
    """What loading weights logs, then ``--mock-startup-delay`` (ends early when stopped)."""
    log.info(
        "[%s] Load weight end. type=KimiMockForCausalLM, dtype=bfloat16 (mock, no weights)", prefix
    )
    if args.mock_startup_delay:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.mock_startup_delay)
