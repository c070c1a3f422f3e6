"""Fault knobs: make one mock process fail the ways real SGLang servers fail.

Set at start with ``--mock-fault NAME=VALUE`` (repeatable) or at run time with
``POST /kimi/faults`` and a JSON object of the same names. The reliability tests use them to
prove that every failure is explained and nothing is lost.

| knob | value | effect |
|---|---|---|
| ``crash_after`` | N | request N+1 kills the process (exit 1, EngineDeadError logged) |
| ``crash_after_tokens`` | K | the process dies mid-stream once it has generated K tokens |
| ``stall`` | true/false | the scheduler stops: running requests never finish |
| ``cut_after_tokens`` | K | each stream is cut (connection closed, no ``[DONE]``) after K tokens |
| ``malformed_after_tokens`` | K | after K tokens a stream carries a line that is not JSON |
| ``error_rate`` | 0..1 | that share of generation requests get HTTP 500 (seeded) |
| ``health`` | ok / fail / slow:S | ``/health`` answers 503, or only after S wall seconds |
| ``health`` | busy_slow:S | only after S wall seconds while requests run (SGLang's own |
| | | ``/health`` waits for a scheduler output, slow behind long prefills) |
| ``hold_until_late_health`` | true/false | test-only, with ``health=slow:S``/``busy_slow:S``: |
| | | requests wait before scheduling until one ``/health`` that arrived |
| | | while busy has been answered S s late (once; see ``healthgate.py``) |
| ``log`` | oom / nccl / traceback / engine_dead | print that error to the log now |
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger("sglang.mock")

LOG_LINES = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.",
    "nccl": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
    "unhandled system error, NCCL version 2.21.5 (ncclSystemError)",
    "traceback": "Traceback (most recent call last):\n"
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2521, '
    "in run_scheduler_process\n    scheduler.event_loop_normal()\nRuntimeError: mock fault",
    "engine_dead": "sglang.srt.managers.io_struct.EngineDeadError: The engine is dead "
    "(scheduler process exited). Please restart the server.",
}


class FaultError(ValueError):
    """A knob name or value that does not exist."""


@dataclass
class Faults:
    """The current fault settings of one process."""

    crash_after: int | None = None
    crash_after_tokens: int | None = None
    stall: bool = False
    cut_after_tokens: int | None = None
    malformed_after_tokens: int | None = None
    error_rate: float = 0.0
    health: str = "ok"
    hold_until_late_health: bool = False
    seed: int = 0
    rng: random.Random = field(default_factory=random.Random, repr=False)
    requests_seen: int = 0

    def update(self, values: dict[str, Any]) -> None:
        """Apply knobs by name; ``log`` prints its line at once. All or nothing: a bad name,
        value or combination raises FaultError and changes nothing."""
        names = {f.name for f in fields(self)} - {"rng", "requests_seen"}
        new: dict[str, Any] = {}
        lines: list[str] = []
        for name, value in values.items():
            if name == "log":
                line = LOG_LINES.get(str(value))
                if line is None:
                    raise FaultError(f"log: one of {', '.join(LOG_LINES)}, got {value!r}")
                lines.append(line)
            elif name not in names:
                raise FaultError(f"unknown fault {name!r}; known: {', '.join(sorted(names))}, log")
            else:
                new[name] = _convert(name, value)
        health = new.get("health", self.health)
        if new.get("hold_until_late_health", self.hold_until_late_health) and not (
            health.startswith(("slow:", "busy_slow:"))
        ):
            raise FaultError(
                f"hold_until_late_health needs health=slow:S or busy_slow:S, not {health!r}: "
                "no /health would ever be answered late, so held requests would wait for nothing"
            )
        for name, value in new.items():
            setattr(self, name, value)
        for line in lines:
            log.error(line)
        self.rng.seed(self.seed)

    def should_fail_request(self) -> bool:
        return self.error_rate > 0 and self.rng.random() < self.error_rate

    def health_delay(self, busy: bool) -> float:
        """Wall seconds ``/health`` waits before answering, given whether requests run."""
        kind, _, seconds = self.health.partition(":")
        if kind == "slow" or (kind == "busy_slow" and busy):
            return float(seconds)
        return 0.0


def _convert(name: str, value: Any) -> Any:
    try:
        if name in ("stall", "hold_until_late_health"):
            if isinstance(value, str):
                return value.lower() in ("1", "true", "yes", "on")
            return bool(value)
        if name in ("crash_after", "crash_after_tokens", "cut_after_tokens",
                    "malformed_after_tokens"):  # fmt: skip
            return None if value in (None, "", "none") else int(value)
        if name == "error_rate":
            rate = float(value)
            if not 0 <= rate <= 1:
                raise ValueError
            return rate
        if name == "seed":
            return int(value)
        if name == "health":
            text = str(value)
            kind, sep, seconds = text.partition(":")
            if text not in ("ok", "fail") and not (
                kind in ("slow", "busy_slow") and sep and float(seconds) >= 0
            ):
                raise ValueError
            return text
    except (TypeError, ValueError):
        raise FaultError(f"{name}: bad value {value!r}") from None
    raise FaultError(f"unknown fault {name!r}")


def parse_flags(items: list[str]) -> dict[str, str]:
    """``["crash_after=3", "log=oom"]`` -> dict; a malformed item raises FaultError."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise FaultError(f"--mock-fault expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out
