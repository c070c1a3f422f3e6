"""The mock's own, test-only endpoints under ``/kimi/``: every request's model-side timings
(to check the client against) and fault knobs changed at run time. SGLang has neither."""

from __future__ import annotations

from aiohttp import web

from pytest_kimi.mock.faults import FaultError
from pytest_kimi.mock.http_common import ENGINE_KEY, FAULTS_KEY, BadRequest, read_body


async def ground_truth(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    late = sorted(engine.lateness)
    body = {
        "time_scale": engine.time_scale,
        "requests": [r.ground_truth() for r in engine.sim.requests.values()],
        "steps": engine.sim.steps,
        "lateness_ms": {  # how late (wall) the scheduler ran each event: its own timing error
            "count": len(late),
            "mean": 1000 * sum(late) / len(late) if late else 0.0,
            "p99": 1000 * late[int(0.99 * (len(late) - 1))] if late else 0.0,
            "max": 1000 * late[-1] if late else 0.0,
        },
    }
    return web.json_response(body)


async def set_faults(request: web.Request) -> web.Response:
    """Change fault knobs at run time (JSON object of knob -> value); answers the new state."""
    faults, engine = request.app[FAULTS_KEY], request.app[ENGINE_KEY]
    try:
        faults.update(await read_body(request))
    except FaultError as exc:
        raise BadRequest(str(exc)) from None
    engine.stalled = faults.stall
    engine.wake.set()
    state = {
        "crash_after": faults.crash_after,
        "stall": faults.stall,
        "cut_after_tokens": faults.cut_after_tokens,
        "malformed_after_tokens": faults.malformed_after_tokens,
        "error_rate": faults.error_rate,
        "health": faults.health,
        "hold_until_late_health": faults.hold_until_late_health,
        "requests_seen": faults.requests_seen,
    }
    return web.json_response(state)
