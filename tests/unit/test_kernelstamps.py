"""The kernel's arrival stamps: when a segment arrived, not when we read it."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from pytest_kimi.workload import kernelstamps

SLACK_S = 50e-6  # the realtime -> monotonic conversion, bracketed by two reads


@contextlib.contextmanager
def _stamped_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A loopback pair (client, server) whose server end asks for stamps; each send is its
    own segment."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert kernelstamps.enable(listener)
        with socket.create_connection(listener.getsockname()) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server, _ = listener.accept()
            with server:
                yield client, server


@pytest.fixture
def pair():
    """A stamped pair opened once the kernel's stamping is on: :func:`kernelstamps.held_on`
    waits for Linux's lazy switch and keeps it on, so no segment here arrives unstamped."""
    with kernelstamps.held_on(timeout_s=10.0) as on, _stamped_pair() as opened:
        assert on, "the kernel never stamped a segment"
        yield opened


def test_a_segment_read_late_carries_the_time_it_was_sent(pair):
    client, server = pair
    before = time.perf_counter()
    client.sendall(b"x" * 100)
    after = time.perf_counter()
    time.sleep(0.05)  # the reader is late: its own clock would say so
    data, ancillary, _, _ = server.recvmsg(4096, kernelstamps.ANCILLARY_SIZE)
    read_at = time.perf_counter()
    at = kernelstamps.stamp(ancillary)
    assert data == b"x" * 100 and at is not None
    assert before - SLACK_S <= at <= after + SLACK_S
    assert read_at - at >= 0.05


def test_a_read_over_several_segments_carries_the_last_ones_time(pair):
    client, server = pair
    client.sendall(b"first")
    time.sleep(0.02)
    before = time.perf_counter()
    client.sendall(b"second")
    after = time.perf_counter()
    time.sleep(0.01)
    data, ancillary, _, _ = server.recvmsg(4096, kernelstamps.ANCILLARY_SIZE)
    assert data == b"firstsecond"
    at = kernelstamps.stamp(ancillary)
    assert at is not None and before - SLACK_S <= at <= after + SLACK_S  # never early


def test_no_ancillary_data_means_no_stamp():
    assert kernelstamps.stamp([]) is None


def test_the_clock_offset_puts_realtime_on_perf_counter():
    before = time.perf_counter()
    real = time.clock_gettime(time.CLOCK_REALTIME)
    after = time.perf_counter()
    assert before - SLACK_S <= kernelstamps.to_monotonic(real) <= after + SLACK_S


def test_inside_held_on_a_new_connections_first_segment_is_stamped():
    # what the client relies on (run_requests holds stamping on for its run): no first
    # segment of a request falls back to its read time while the kernel's switch is pending
    with kernelstamps.held_on(timeout_s=10.0) as on:
        assert on
        with _stamped_pair() as (client, server):
            client.sendall(b"first")
            data, ancillary, _, _ = server.recvmsg(16, kernelstamps.ANCILLARY_SIZE)
            assert data == b"first" and kernelstamps.stamp(ancillary) is not None
