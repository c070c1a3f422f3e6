"""``port: auto``: drawn below the ephemeral range, bindable, booked across processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_kimi.config import load_cluster
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.deploy.ports import (
    DEFAULT_EPHEMERAL,
    LOWEST,
    NoFreePort,
    PortBook,
    drawing_range,
    ephemeral_range,
    free_port,
)


def test_the_kernel_range_is_read_and_a_missing_file_falls_back_to_linux_default(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40000, 50000)
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL


def test_ports_are_drawn_outside_the_ephemeral_range():
    assert drawing_range((32768, 60999)) == range(LOWEST, 32768)
    assert drawing_range((1024, 50000)) == range(50001, 65536)  # moved low: above it
    with pytest.raises(NoFreePort, match="1024-65000"):
        drawing_range((1024, 65000))


def test_this_machine_draws_auto_ports_where_no_outgoing_connection_lands(tmp_path):
    low, high = ephemeral_range()
    with PortBook(tmp_path) as book:
        ports = [book.take() for _ in range(20)]
    assert len(set(ports)) == 20
    assert not [p for p in ports if low <= p <= high]
    unbooked = [free_port() for _ in range(20)]  # tests' own servers, dry runs
    assert not [p for p in unbooked if low <= p <= high]


def test_a_booked_port_is_never_handed_to_another_book_until_given_back(tmp_path):
    first = PortBook(tmp_path)
    port = first.take()
    only = range(port, port + 1)
    second = PortBook(tmp_path, ports=only)
    with pytest.raises(NoFreePort, match=f"{port}-{port}"):
        second.take()
    first.close()
    assert second.take() == port
    second.close()


def test_a_port_another_program_listens_on_is_not_handed_out(tmp_path):
    with PortBook(tmp_path / "a") as finder:
        port = finder.take()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        book = PortBook(tmp_path / "b", ports=range(port, port + 1))
        with pytest.raises(NoFreePort, match=r"no free port on 127\.0\.0\.1"):
            book.take()
        assert book.held == {}  # the refused booking was given back


def test_a_run_that_dies_drops_its_bookings(tmp_path):
    child = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from pytest_kimi.deploy.ports import PortBook
        book = PortBook(Path({str(tmp_path)!r}))
        print(book.take(), flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        port = int(proc.stdout.readline())
        book = PortBook(Path(tmp_path), ports=range(port, port + 1))
        with pytest.raises(NoFreePort):
            book.take()  # held by the live child
        proc.kill()
        proc.wait(timeout=10)
        assert book.take() == port  # the kernel dropped the dead run's flock
        book.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_two_layouts_planned_at_once_get_disjoint_booked_ports(tmp_path):
    local = load_cluster(Path(__file__).resolve().parents[2] / "clusters" / "local.yaml")
    with PortBook(tmp_path) as wide, PortBook(tmp_path) as deep:
        plans = [plan_deployment(local, local.layout(name), book=book)
                 for name, book in (("tp32", wide), ("pp8", deep))]  # fmt: skip
        used = [_listening_ports(p) for p in plans]
        assert used[0] and used[1] and not used[0] & used[1]
        assert used[0] == set(wide.held) and used[1] == set(deep.held)


def _listening_ports(plan) -> set[int]:
    """Every port a process of the plan will listen on (HTTP, rendezvous, Prometheus)."""
    out: set[int] = set()
    for spec in plan.processes:
        out.add(spec.port)
        for flag in ("--dist-init-addr", "--prometheus-port"):
            if flag in spec.argv:
                out.add(int(spec.argv[spec.argv.index(flag) + 1].rpartition(":")[2]))
    return out
