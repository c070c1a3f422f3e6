"""Logs over real SSH: fetched from every node in parallel (capped and gzipped on the node,
over SFTP), a big log cut to head + marker + tail, and old run folders pruned at start."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from pytest_kimi.config import Node, SSHConfig
    from pytest_kimi.deploy.logs import fetch_all
    from pytest_kimi.deploy.plan import ProcessSpec
    from pytest_kimi.deploy.ssh import SSHExecutor

    args = json.loads(sys.argv[1])
    ssh = SSHConfig(user=args["user"], key=args["key"], known_hosts=args["known_hosts"],
                    connect_timeout_s=3, command_timeout_s=30)
    nodes = [Node(name, address, 8, ssh=ssh) for name, address in args["hosts"]]
    executor = SSHExecutor(args["work_dir"], args["run_tag"])
    out = {"pruned": executor.prune_runs(nodes[0], 2)}
    handles = []
    for i, node in enumerate(nodes):
        big = "head -c 3000000 /dev/zero | tr '\\\\0' x | fold -w 99" if i == 0 else "true"
        script = f"echo FIRST {node.name}; {big}; echo; echo LAST {node.name}"
        spec = ProcessSpec(f"proc-{node.name}", node, ("sh", "-c", script))
        handles.append(executor.start(spec, Path("unused")))
    deadline = time.monotonic() + 30
    while any(executor.exit_code(h) is None for h in handles) and time.monotonic() < deadline:
        time.sleep(0.1)
    dest = Path(args["dest"])
    cuts = fetch_all(handles, lambda h: executor.fetch_log(h, dest / f"{h.spec.name}.log",
                                                           1 << 20),
                     lambda h: h.spec.node.name)
    out["cuts"] = [[c.size, c.head, c.cut] if c else None for c in cuts]
    _, out["left"] = executor.run(nodes[0], f"ls {executor.remote_dir}")
    executor.close()
    print(json.dumps(out))
    """
)


def test_logs_fetched_from_every_node_big_one_capped_old_runs_pruned(ssh_hosts, tmp_path):
    work = tmp_path / "remote"
    old = [f"2026010{d}-120000-nshosts-dp2" for d in range(1, 6)]
    for run in old:  # earlier runs' folders (the hosts share this filesystem)
        (work / run / "tp32").mkdir(parents=True)
    (work / "mock-gpus").mkdir()
    current = "20260201-120000-nshosts-dp2"
    hosts = ssh_hosts.hosts[:4]
    args = {
        "user": ssh_hosts.user,
        "key": str(ssh_hosts.key_path),
        "known_hosts": str(ssh_hosts.known_hosts_path),
        "hosts": [[h.name, h.address] for h in hosts],
        "work_dir": str(work),
        "run_tag": f"{current}/tp32",
        "dest": str(tmp_path / "fetched"),
    }
    done = ssh_hosts.run_in_hub([sys.executable, "-c", SCRIPT, json.dumps(args)], timeout=120,
                                cwd=Path(__file__).parents[2])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # pruned to the newest 2 earlier runs; the current one and other folders kept
    assert sorted(out["pruned"]) == sorted(old[:3])
    assert sorted(p.name for p in work.iterdir()) == sorted([*old[3:], current, "mock-gpus"])
    for host in hosts:  # every node's log arrived whole (the small ones)
        text = (tmp_path / "fetched" / f"proc-{host.name}.log").read_text()
        assert f"FIRST {host.name}" in text and f"LAST {host.name}" in text
    big = (tmp_path / "fetched" / f"proc-{hosts[0].name}.log").read_bytes()
    size, head, cut = out["cuts"][0]
    assert size > 3_000_000 and head == 1 << 19 and cut == size - (1 << 20)
    assert len(big) < (1 << 20) + 200 and f"[pytest-kimi: {cut} bytes cut here".encode() in big
    assert big.startswith(b"FIRST ") and big.rstrip().endswith(f"LAST {hosts[0].name}".encode())
    assert all(c is not None and c[2] == 0 for c in out["cuts"][1:])
    assert ".fetch.gz" not in out["left"]  # the node's compressed copies are removed
    for host in hosts:
        assert ssh_hosts.pids(host) == []
