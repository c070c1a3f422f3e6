"""The watchdog against a fake executor and router, and the client's cancel hook."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy.executor import Handle
from pytest_kimi.deploy.plan import ProcessSpec
from pytest_kimi.deploy.watchdog import Watchdog, abort_on_loss, watching
from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.workload.abort import Abort, RunAborted


def _handle(name: str, node: str, replica: int, rank: int) -> Handle:
    spec = ProcessSpec(
        name=name, node=Node(name=node, host=f"{node}.lan", gpus=8), role="server",
        replica=replica, rank=rank, argv=("sleep",), port=30000,
    )  # fmt: skip
    return Handle(spec, 100 + rank, Path(f"/logs/{name}.log"))


class FakeExecutor:
    """Exit codes and failures set by the test; each answer is counted."""

    def __init__(self) -> None:
        self.codes: dict[str, int | None] = {}
        self.failing: set[str] = set()  # node names that raise
        self.asked = 0

    def exit_code(self, handle: Handle) -> int | None:
        self.asked += 1
        if handle.spec.node.name in self.failing:
            raise RuntimeError("node stopped answering")
        return self.codes.get(handle.spec.name)

    def log_tail(self, handle: Handle, lines: int = 50) -> str:
        return f"last words of {handle.spec.name}\n"


def _router(healthy: int):
    def fetch(url: str) -> tuple[int, bytes]:
        body = {"status": "ready", "healthy_workers": healthy, "total_workers": 2}
        return 200, json.dumps(body).encode()

    return fetch


HANDLES = [_handle("replica0-node0-n1", "n1", 0, 0), _handle("replica1-node1-n4", "n4", 1, 1)]


def _dog(executor: FakeExecutor, fetch=None, **kw) -> Watchdog:
    fetch = fetch or _router(2)
    return Watchdog(executor, HANDLES, lambda problem: None, interval_s=0.01,
                    readiness_url="http://r/readiness", replicas=2, fetch=fetch, **kw)  # fmt: skip


def test_all_present_is_no_loss():
    executor = FakeExecutor()
    assert _dog(executor).check() == ""
    assert executor.asked == 2


def test_an_exited_process_is_lost_at_once_naming_node_and_log():
    executor = FakeExecutor()
    executor.codes["replica1-node1-n4"] = -9
    problem = _dog(executor, misses=5).check()
    assert problem.startswith("replica1-node1-n4 (replica 1, node n4, n4.lan) exited with code -9")
    assert "last words of replica1-node1-n4" in problem


@pytest.mark.parametrize("killed_code", [-9, 137])
def test_when_one_death_takes_others_the_killed_one_is_named_first(killed_code):
    # rank 1 was killed; rank 0 (asked first) then exited on "connection to rank 1 lost"
    executor = FakeExecutor()
    executor.codes = {"replica0-node0-n1": 1, "replica1-node1-n4": killed_code}
    problem = _dog(executor).check()
    assert problem.startswith(f"replica1-node1-n4 (replica 1, node n4, n4.lan) exited with code "
                              f"{killed_code}"), problem  # fmt: skip
    assert "also gone: replica0-node0-n1 (replica 0, node n1, n1.lan) (exit code 1)" in problem
    assert "last words of replica1-node1-n4" in problem
    executor.codes = {"replica0-node0-n1": 1, "replica1-node1-n4": 2}  # neither killed
    assert _dog(executor).check().startswith("replica0-node0-n1 ")  # the order asked


def test_a_process_killed_after_it_was_asked_is_still_named_as_the_cause():
    # the round asks rank 1 (running), then rank 1 is killed and rank 0 exits reacting to it
    class Racing(FakeExecutor):
        def exit_code(self, handle: Handle) -> int | None:
            code = super().exit_code(handle)
            if handle.spec.name == "replica1-node1-n4" and self.asked == 1:
                self.codes.update({"replica1-node1-n4": -9, "replica0-node0-n1": 1})
            return code

    handles = list(reversed(HANDLES))  # rank 1 asked first
    dog = Watchdog(Racing(), handles, lambda problem: None, interval_s=0.01)
    problem = dog.check()
    assert problem.startswith("replica1-node1-n4 (replica 1, node n4, n4.lan) exited with code -9")
    assert "also gone: replica0-node0-n1" in problem


def test_an_unanswering_node_is_lost_only_after_misses_in_a_row():
    executor = FakeExecutor()
    dog = _dog(executor, misses=2)
    executor.failing.add("n4")
    assert dog.check() == ""  # one miss is tolerated
    executor.failing.clear()
    assert dog.check() == ""  # answered: the count starts over
    executor.failing.add("n4")
    assert dog.check() == ""
    problem = dog.check()
    assert "node n4 (n4.lan) cannot be asked about replica1-node1-n4" in problem
    assert "2 polls in a row" in problem


def test_the_router_counting_a_worker_short_is_a_loss_after_misses():
    dog = _dog(FakeExecutor(), fetch=_router(1), misses=2)
    assert dog.check() == ""
    assert "the router counts 1 of 2 replicas healthy" in dog.check()


def test_a_router_that_does_not_answer_is_a_loss_after_misses():
    def down(url: str) -> tuple[int, bytes]:
        raise ConnectionError("refused")

    dog = _dog(FakeExecutor(), fetch=down, misses=1)
    assert "the router (http://r/readiness) does not answer: refused" in dog.check()


def test_the_thread_trips_the_abort_and_stops_after_the_first_loss():
    executor = FakeExecutor()
    executor.codes["replica0-node0-n1"] = 1
    abort = Abort()
    dog = Watchdog(executor, HANDLES, abort_on_loss(abort), interval_s=0.01)
    result = LayoutResult("wide", "TP8")
    with watching(dog, result):
        assert dog._thread is not None
        dog._thread.join(10)
        assert not dog._thread.is_alive()  # returned after the loss, not stopped by us
    assert abort.tripped and abort.reason.startswith("watchdog: replica0-node0-n1 (replica 0")
    assert dog.rounds == 1
    # nothing measured reported it: the note keeps it
    assert result.notes == ["watchdog: " + dog.lost.splitlines()[0]]


def test_stop_ends_a_watchdog_that_found_nothing():
    dog = _dog(FakeExecutor())
    result = LayoutResult("wide", "TP8")
    with watching(dog, result):
        pass
    assert dog._thread is not None and not dog._thread.is_alive()
    assert dog.lost == "" and result.notes == []


# ---------------------------------------------------------------------- the cancel hook


def test_a_trip_from_another_thread_cancels_the_run_in_flight():
    abort = Abort()
    in_flight = threading.Event()
    cancelled: list[bool] = []

    async def work() -> None:
        in_flight.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        await abort.guard(work())

    tripper = threading.Thread(target=lambda: in_flight.wait(10) and abort.trip("node n4 lost"))
    tripper.start()
    with pytest.raises(RunAborted, match="node n4 lost"):
        asyncio.run(main())
    tripper.join()
    assert cancelled == [True]


def test_a_run_started_after_the_trip_sends_nothing():
    abort = Abort()
    abort.trip("gone")
    abort.trip("second reason")  # the first one is kept
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    async def main() -> None:
        await abort.guard(work())

    with pytest.raises(RunAborted, match=r"^gone$"):
        asyncio.run(main())
    assert started == []


def test_a_trip_after_the_run_ended_cancels_nothing_later():
    abort = Abort()

    async def main() -> str:
        await abort.guard(asyncio.sleep(0))
        abort.trip("late")  # same thread, loop running: nothing is guarded any more
        await asyncio.sleep(0.01)
        return "finished"

    assert asyncio.run(main()) == "finished"
