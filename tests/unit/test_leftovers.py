"""pytest_kimi.deploy.leftovers with real processes started as the SSH executor starts them
(pytest_kimi.deploy.remote), its shell run here by the local executor: a live process of an
earlier run is found and refused, or reaped; a pid file whose boot id or start time does not
match is stale and never touched. (tests/ssh/test_ssh_leftovers.py runs it over SSH.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pytest_kimi.config import Node
from pytest_kimi.deploy import leftovers, remote
from pytest_kimi.deploy.executor import LocalExecutor
from pytest_kimi.deploy.plan import ProcessSpec

NODE = Node("n0", "127.0.0.1", 1)


def _start(work: Path, run: str, name: str) -> tuple[remote.RemoteFiles, int]:
    """``sleep 300`` started as on a node, under ``work/<run>/``."""
    spec = ProcessSpec(name, NODE, ("sleep", "300"))
    files = remote.RemoteFiles.of(str(work / run), spec)
    (work / run).mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["sh", "-c", remote.start(spec, files)], capture_output=True,
                         text=True, timeout=30, stdin=subprocess.DEVNULL).stdout  # fmt: skip
    pgid = remote.parse_pid(out)
    assert pgid is not None
    return files, pgid


def _alive(pgid: int) -> bool:
    return remote.any_alive(LocalExecutor().run(NODE, remote.group_stats(pgid))[1])


@pytest.fixture
def started(tmp_path: Path):
    made: list[int] = []

    def start(run: str, name: str) -> tuple[remote.RemoteFiles, int]:
        files, pgid = _start(tmp_path / "work", run, name)
        made.append(pgid)
        return files, pgid

    yield start
    for pgid in made:
        LocalExecutor().run(NODE, remote.signal_group(pgid, "KILL"))


def test_a_live_process_of_an_earlier_run_is_listed_and_refused(tmp_path: Path, started):
    _, pgid = started("20260101-run/tp32", "replica0-node0-n0")
    started("20260101-run/pp8", "router")
    work = str(tmp_path / "work")
    said: list[str] = []
    with pytest.raises(leftovers.LeftoverError) as refused:
        leftovers.check(LocalExecutor(), [NODE], work, reap_them=False, say=said.append)
    message = str(refused.value)
    assert "run 20260101-run/tp32, replica0-node0-n0, pgid " + str(pgid) in message
    assert "node n0 (127.0.0.1)" in message and "--kimi-reap" in message
    assert "router" in message and not said
    assert _alive(pgid)  # refused, not touched


def test_kimi_reap_stops_them_and_says_so(tmp_path: Path, started):
    _, first = started("r1/tp32", "replica0-node0-n0")
    _, second = started("r1/tp32", "replica1-node0-n0")
    said: list[str] = []
    found = leftovers.check(LocalExecutor(), [NODE, NODE], str(tmp_path / "work"),
                            reap_them=True, say=said.append, grace_s=10)  # fmt: skip
    assert sorted(f.pid for f in found) == sorted([first, second])
    assert not _alive(first) and not _alive(second)
    assert len(said) == 1 and "stopped 2 process group(s)" in said[0]
    assert leftovers.find(LocalExecutor(), [NODE], str(tmp_path / "work")) == ([], [])


@pytest.mark.parametrize("edit", ["boot", "start", "missing"])
def test_a_pid_whose_identity_does_not_match_is_stale_and_never_touched(
    tmp_path: Path, started, edit: str
):
    files, pgid = started("r2/tp32", "replica0-node0-n0")
    ident = Path(files.ident)
    boot, start, host = ident.read_text().split()
    if edit == "boot":  # as after a reboot: the pid now names someone else's process
        ident.write_text(f"00000000-0000-0000-0000-000000000000\n{start}\n{host}\n")
    elif edit == "start":  # the pid was reused by a later process
        ident.write_text(f"{boot}\n{int(start) + 1}\n{host}\n")
    else:
        ident.unlink()
    found, stale = leftovers.find(LocalExecutor(), [NODE], str(tmp_path / "work"))
    assert found == []
    assert [s.why for s in stale] == [
        {"boot": "rebooted since", "start": "pid reused", "missing": "no identity recorded"}[edit]
    ]
    leftovers.check(LocalExecutor(), [NODE], str(tmp_path / "work"), reap_them=True,
                    say=lambda m: None)  # fmt: skip
    assert _alive(pgid)  # a stranger for all we know: left alone


def test_a_finished_process_is_not_a_leftover(tmp_path: Path):
    spec = ProcessSpec("quick", NODE, ("true",))
    run = tmp_path / "work" / "r3" / "tp32"
    run.mkdir(parents=True)
    files = remote.RemoteFiles.of(str(run), spec)
    pgid = remote.parse_pid(LocalExecutor().run(NODE, remote.start(spec, files))[1])
    assert pgid is not None
    deadline = time.monotonic() + 30
    while not Path(files.exit).exists() or _alive(pgid):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert leftovers.find(LocalExecutor(), [NODE], str(tmp_path / "work")) == ([], [])


def test_the_listing_parses_ages_and_ignores_noise():
    out = (
        "pid\t/w/r/tp32/a.pid\t12\tB\t77\t77\t3725\n"
        "garbage line\n"
        "pid\t/w/r/tp32/b.pid\t13\tB\t78\t\t\n"  # gone
        "boot\tB\n"
    )
    found, stale = leftovers.parse_scan(NODE, "/w/", out)
    assert stale == [] and [(f.run, f.process, f.pid, f.age_s) for f in found] == [
        ("r/tp32", "a", 12, 3725)
    ]
    assert "running for 1h02m" in found[0].describe()
    other = "pid\t/w/r/tp32/c.pid\t14\tB\t79\t79\t5\tnode602\nboot\tB\nhost\tnode601\n"
    assert leftovers.parse_scan(NODE, "/w", other) == ([], [])  # another node's file
