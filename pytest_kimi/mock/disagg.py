"""Prefill/decode disaggregation in the mock, as SGLang 0.5.9 does it (``--disaggregation-mode``).

The router (``--pd-disaggregation``) sends the same request to a prefill and a decode server
at once, with ``bootstrap_host``/``bootstrap_port`` (the prefill's bootstrap server) and a
random ``bootstrap_room`` that pairs the two copies. Then, per ``srt/disaggregation/``:

* **decode** (``decode.py``): the request waits in the *prealloc queue* until the server has
  room for its KV cache, tells the prefill so (the room's KV indices), and waits in the
  *transfer queue* until the KV has landed; then a "prebuilt" step (no forward pass) streams
  its first token, the one the prefill produced, and it decodes with the running batch.
* **prefill** (``prefill.py``): the request waits in the *bootstrap queue* until its decode
  server has room for it (so a full decode side holds prefills back), is prefilled with one
  token to make (``max_new_tokens`` 1), sends each chunk's KV as the chunk is done, and waits
  in the *inflight queue* until the transfer is done.

Here each side is a :class:`~pytest_kimi.mock.prefillside.PrefillSide` or
:class:`~pytest_kimi.mock.decodeside.DecodeSide` beside the replica's
:class:`~pytest_kimi.mock.engine.Engine`; this module holds what they share (the request's
pairing, the hold for a notice). What the transfer costs is :mod:`pytest_kimi.mock.kvlink`, how
the two find each other :mod:`pytest_kimi.mock.bootstrap`, the per-stage histogram
:mod:`pytest_kimi.mock.stagelatency`.
A request with SGLang's fake bootstrap host (``2.2.2.2``: warm-ups, health checks) moves no KV:
the prefill just prefills it, the decode decodes it as if its KV were there.

Times in the notices are on the shared clock where there is one; otherwise on the wall clock
both processes read (:meth:`~pytest_kimi.mock.timebase.TimeBase.to_common`), since each counts
cluster time from its own start. On a shared clock (a local run) each notice between the two
sides holds the clock until the other side takes it in, as a request on its way to an engine
does; and the prefill does not let the clock pass a request's arrival until its decode side has
said whether it has room, so neither side's wall-time latency turns into cluster time.

The stages SGLang's ``sglang:per_stage_req_latency_seconds`` histogram observes (each from the
previous stage's mark) are observed here on cluster time: ``prefill_prepare``,
``prefill_bootstrap``, ``prefill_waiting`` (once per chunk), ``prefill_forward``,
``prefill_transfer_kv_cache``; ``decode_prepare``, ``decode_bootstrap``, ``decode_transferred``,
``decode_waiting``. Not modelled: KV capacity in tokens (the decode side's room is
``max_running_requests`` requests), bootstrap and transfer time-outs, failures and retries
(their counters stay 0), and the prefill's response waiting for its transfer (the router
discards that body; it is answered when the prompt is prefilled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_kimi.mock.engine import Engine

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's disaggregation/utils.py: no KV moves


class BootstrapError(ValueError):
    """A disaggregated request without what pairs its two copies."""


@dataclass(frozen=True)
class Bootstrap:
    """A request's pairing, as the router injects it."""

    host: str
    port: int | None
    room: int

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST

    @classmethod
    def of(cls, body: dict[str, Any]) -> Bootstrap:
        host, port, room = (body.get(k) for k in ("bootstrap_host", "bootstrap_port",
                                                  "bootstrap_room"))  # fmt: skip
        if not isinstance(host, str) or not host:
            raise BootstrapError("bootstrap_host is required in disaggregation mode")
        if isinstance(room, bool) or not isinstance(room, int):
            raise BootstrapError("bootstrap_room must be an integer in disaggregation mode")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
            raise BootstrapError("bootstrap_port must be an integer or null")
        return cls(host, port, room)


def hold_for_notice(engine: Engine) -> None:
    """A notice is on its way to the other side: the clock waits until it is taken in."""
    if engine.shared is not None:
        engine.shared.hold_if_attached(1)
