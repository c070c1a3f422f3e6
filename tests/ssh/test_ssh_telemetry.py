"""GPU telemetry over SSH: every test host's GPUs are sampled while the DP2 layout is measured.

Each host answers ``nvidia-smi`` with the mock's stand-in (run on the host, over the same SSH
connections that started the servers), driven by that host's own mock server.
"""

from __future__ import annotations

import json

import yaml
from test_ssh_deploy import _assert_no_processes, _cluster_yaml, _run_in_hub

from pytest_kimi.results.telemetry_stats import read_telemetry


def test_telemetry_sampled_on_every_node(ssh_hosts, tmp_path):
    cluster = _cluster_yaml(ssh_hosts, tmp_path / "cluster.yaml")
    data = yaml.safe_load(cluster.read_text())
    data["telemetry"] = {"enabled": True, "interval_s": 0.5}
    # a measured span of a few wall seconds: several rounds of every host inside it
    data["workload"].update(num_requests=16, output_len=128)
    data["mock"]["time_scale"] = 10
    cluster.write_text(yaml.safe_dump(data, sort_keys=False))
    done = _run_in_hub(ssh_hosts, tmp_path, cluster, "--layout=tp32")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    _assert_no_processes(ssh_hosts)

    [run] = list((tmp_path / "out").iterdir())
    series = read_telemetry(run / "tp32" / "telemetry.jsonl")
    hosts = [host.name for host in ssh_hosts.hosts]
    assert series.nodes == tuple(hosts) and series.errors == {}
    seen = {(s.node, s.gpu) for s in series.samples}
    assert seen == {(host, gpu) for host in hosts for gpu in range(8)}
    assert series.measured is not None
    start, end = series.measured
    busy = {s.node for s in series.samples if start <= s.t <= end and (s.util_pct or 0) > 0}
    assert busy == set(hosts), f"hosts above idle while measured: {sorted(busy)}"
    summary = json.loads((run / "tp32" / "summary.json").read_text())
    assert summary["telemetry"]["gpus"] == 64
    assert not [n for n in summary["notes"] if n.startswith("telemetry:")], summary["notes"]
