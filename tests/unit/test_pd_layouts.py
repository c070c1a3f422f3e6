"""Prefill/decode disaggregated layouts (issue 20, part 1): the cluster file's ``prefill:`` and
``decode:`` sides, where each side's replicas run, and the exact SGLang server flags and router
PD-mode command line they become, per SGLang release.

The flags are SGLang's own (``srt/server_args.py``): ``--disaggregation-mode``,
``--disaggregation-transfer-backend``, the prefill's ``--disaggregation-bootstrap-port``; in
0.5.9 also ``--disaggregation-decode-tp`` (its KV is sliced for the decode side's TP; SGLang
defaults it to the prefill's own TP) and the decode's ``--disaggregation-prefill-pp`` (it pulls
the KV of every prefill stage; default 1), which later releases refuse (they learn both through
the bootstrap server). The router's are ``router_args.py``'s (smg and sglang-router alike):
``--pd-disaggregation``, ``--prefill URL BOOTSTRAP_PORT`` and ``--decode URL`` per worker, a
policy per side. tests/conformance/test_real_parsers.py parses them with the real parsers."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusterfile import BASE, edit, load_error, write

from pytest_kimi.config import PDSide, load_cluster
from pytest_kimi.config.versions import assumed
from pytest_kimi.deploy.plan import plan_deployment

CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"

# BASE has four nodes of 8 GPUs; this splits them 2 + 2
PD = """\
  pd:
    prefill: {tp: 8, pp: 2, ep: 8, nodes_per_replica: 2}
    decode: {tp: 16, ep: 4, nodes_per_replica: 2, policy: cache_aware}
"""


def with_pd(pd: str = PD, text: str = BASE) -> str:
    return edit("  pp2: {tp: 8, pp: 2, ep: 8}\n", "  pp2: {tp: 8, pp: 2, ep: 8}\n" + pd, text)


def test_the_pro6000_pd_layout_splits_the_nodes_prefill_first() -> None:
    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    layout = cluster.layout("pd-pp8-tp32")
    assert layout.disaggregated and layout.transfer_backend == "mooncake"
    assert layout.sides == (
        PDSide("prefill", 4, 8, 4, replicas=1, nodes_per_replica=4),
        PDSide("decode", 32, 1, 4, replicas=1, nodes_per_replica=4),
    )
    assert layout.label == "prefill TP4/PP8/EP4 x1 + decode TP32/PP1/EP4 x1"
    replicas = cluster.layout_replicas(layout)
    assert [(r.index, r.role, r.tp, r.pp) for r in replicas] == [
        (0, "prefill", 4, 8), (1, "decode", 32, 1)
    ]  # fmt: skip
    assert [n.name for n in replicas[0].nodes] == [f"node60{i}" for i in range(1, 5)]
    assert [n.name for n in replicas[1].nodes] == [f"node60{i}" for i in range(5, 9)]
    assert cluster.replicas_of(layout) == 2
    assert [n.name for n in cluster.used_nodes(layout)] == [f"node60{i}" for i in range(1, 9)]


@pytest.mark.parametrize("sglang", ["0.5.9", "0.5.23"])
def test_the_pro6000_pd_plan_has_sglangs_flags_on_every_node_and_the_router_in_pd_mode(
    sglang: str,
) -> None:
    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    versions = assumed(sglang, "auto")
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"), ports=iter(()),
                           versions=versions)  # fmt: skip
    shape_flags = sglang == "0.5.9"  # later releases learn the other side's shape themselves
    names = [s.name for s in plan.servers]
    assert names == [f"prefill0-node{r}-node60{r + 1}" for r in range(4)] + [
        f"decode0-node{r}-node60{r + 5}" for r in range(4)
    ]
    for spec in plan.servers:
        argv = list(spec.argv)

        def value(flag: str, argv: list[str] = argv) -> str:
            return argv[argv.index(flag) + 1]

        prefill = spec.disaggregation == "prefill"
        assert value("--disaggregation-mode") == spec.disaggregation
        assert value("--disaggregation-transfer-backend") == "mooncake"
        assert (value("--tp-size"), value("--pp-size"), value("--ep-size")) == (
            ("4", "8", "4") if prefill else ("32", "1", "4")
        )
        assert value("--nnodes") == "4"
        head = "10.0.0.1" if prefill else "10.0.0.5"  # each side's replica has its own head
        assert value("--dist-init-addr") == f"{head}:5757"
        if prefill:
            assert value("--disaggregation-bootstrap-port") == "8998"
            assert ("--disaggregation-decode-tp" in argv) is shape_flags
            if shape_flags:
                assert value("--disaggregation-decode-tp") == "32"
            assert "--disaggregation-prefill-pp" not in argv
        else:
            assert ("--disaggregation-prefill-pp" in argv) is shape_flags
            if shape_flags:
                assert value("--disaggregation-prefill-pp") == "8"
            assert "--disaggregation-bootstrap-port" not in argv
            assert "--disaggregation-decode-tp" not in argv
    router = list(plan.router.argv)
    start = router.index("--pd-disaggregation")
    assert router[start : start + 10] == [
        "--pd-disaggregation",
        "--prefill", "http://10.0.0.1:30001", "8998",
        "--decode", "http://10.0.0.5:30001",
        "--prefill-policy", "round_robin",
        "--decode-policy", "round_robin",
    ]  # fmt: skip
    assert "--worker-urls" not in router and "--policy" not in router
    assert [s.name for s in plan.rank0()] == ["prefill0-node0-node601", "decode0-node0-node605"]


def test_unified_layouts_plan_as_before() -> None:
    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    plan = plan_deployment(cluster, cluster.layout("tp32"), ports=iter(()))
    assert not any("disaggregation" in arg for s in plan.servers for arg in s.argv)
    assert plan.servers[4].name == "replica1-node0-node605"
    assert "--pd-disaggregation" not in plan.router.argv
    assert plan.router.argv[plan.router.argv.index("--worker-urls") + 1 :][:2] == (
        "http://10.0.0.1:30001",
        "http://10.0.0.5:30001",
    )


def test_side_args_env_and_policy_apply_to_their_side_only(tmp_path: Path) -> None:
    pd = PD.replace(
        "nodes_per_replica: 2}\n",
        "nodes_per_replica: 2, args: {chunked-prefill-size: 4096}, env: {SIDE: p},"
        " bootstrap_port: auto}\n",
        1,
    )
    cluster = load_cluster(write(tmp_path, with_pd(pd)))
    plan = plan_deployment(cluster, cluster.layout("pd"), ports=iter(range(41000, 41100)))
    by_side = {s.disaggregation: s for s in plan.servers if s.rank == 0}
    prefill, decode = by_side["prefill"], by_side["decode"]
    assert prefill.argv[prefill.argv.index("--chunked-prefill-size") + 1] == "4096"
    assert decode.argv[decode.argv.index("--chunked-prefill-size") + 1] == "8192"
    assert prefill.env["SIDE"] == "p" and "SIDE" not in decode.env
    bootstrap = prefill.argv[prefill.argv.index("--disaggregation-bootstrap-port") + 1]
    assert bootstrap == str(prefill.bootstrap_port) and 41000 <= int(bootstrap) < 41100
    router = list(plan.router.argv)
    assert router[router.index("--prefill") : router.index("--prefill") + 3] == [
        "--prefill", prefill.url, bootstrap
    ]  # fmt: skip
    assert router[router.index("--decode-policy") + 1] == "cache_aware"
    assert router[router.index("--prefill-policy") + 1] == "round_robin"


@pytest.mark.parametrize(
    ("pd", "field", "words"),
    [
        ("  pd:\n    prefill: {tp: 8, pp: 2, nodes_per_replica: 2}\n", "layouts.pd.decode",
         "needs both prefill and decode; decode is missing"),
        (PD.replace("  pd:\n", "  pd:\n    tp: 16\n"), "layouts.pd.tp",
         "tp is set per side"),
        (PD.replace("{tp: 8, pp: 2, ep: 8,", "{tp: 8, pp: 1, ep: 8,"), "layouts.pd.prefill.tp",
         "TP x PP = 8 x 1 = 8, but one replica has 16 GPUs"),
        (PD.replace("{tp: 16, ep: 4, nodes_per_replica: 2", "{tp: 24, ep: 4, nodes_per_replica: 3"),
         "layouts.pd.decode", "need 5 nodes"),
        (PD.replace("{tp: 8, pp: 2, ep: 8,", "{tp: 2, pp: 8, ep: 2,").replace(
            "{tp: 16, ep: 4,", "{tp: 3, pp: 1, ep: 3,"), "layouts.pd.decode.tp",
         "TP sizes divide one another"),
        (PD.replace("policy: cache_aware}", "policy: cache_aware, bootstrap_port: 9000}"),
         "layouts.pd.decode.bootstrap_port", "prefill side only"),
        (PD.replace("nodes_per_replica: 2}\n", "nodes_per_replica: 2, args: "
                    "{disaggregation-mode: decode}}\n", 1),
         "layouts.pd.prefill.args.disaggregation-mode", "set by pytest-kimi"),
        ("  pd: {tp: 16, transfer_backend: nixl}\n", "layouts.pd.transfer_backend",
         "only used with prefill and decode"),
        ("  pd: {pp: 2}\n", "layouts.pd.tp", "needs tp (or prefill and decode)"),
    ],
)  # fmt: skip
def test_a_bad_pd_layout_names_the_field(tmp_path: Path, pd: str, field: str, words: str) -> None:
    _, message = load_error(tmp_path, with_pd(pd))
    assert f"field '{field}'" in message and words in message, message


def test_an_ssh_cluster_needs_a_fixed_bootstrap_port(tmp_path: Path) -> None:
    text = (CLUSTERS / "pro6000.yaml").read_text()
    text = text.replace("nodes_per_replica: 4}   # node601-604",
                        "nodes_per_replica: 4, bootstrap_port: auto}   #")  # fmt: skip
    _, message = load_error(tmp_path, text)
    assert "field 'layouts.pd-pp8-tp32.prefill.bootstrap_port'" in message
    assert "fixed ports, not 'auto'" in message


def test_the_local_cluster_plays_the_seeds_pd_layout_on_the_mock() -> None:
    """clusters/local.yaml's pd-pp8-tp32: the mock's servers get SGLang's flags per side and a
    drawn bootstrap port (the replicas share one host)."""
    cluster = load_cluster(CLUSTERS / "local.yaml")
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"), ports=iter(range(42000, 42100)))
    heads = {spec.replica_name: spec for spec in plan.rank0()}
    assert set(heads) == {"prefill0", "decode0"}
    prefill, decode = heads["prefill0"].argv, heads["decode0"].argv
    assert "pytest_kimi.mock.launch_server" in prefill
    port = prefill[prefill.index("--disaggregation-bootstrap-port") + 1]
    assert 42000 <= int(port) < 42100
    assert decode[decode.index("--disaggregation-mode") + 1] == "decode"
    # the mock answers as the newest release: no shape flags (its decode side tells the prefill)
    assert prefill[prefill.index("--mock-sglang-version") + 1] == "0.5.23"
    assert "--disaggregation-decode-tp" not in prefill
    assert "--disaggregation-prefill-pp" not in decode
    router = " ".join(plan.router.argv)
    assert f"--prefill http://127.0.0.1:{heads['prefill0'].port} {port}" in router


def test_the_manifest_records_each_side_as_deployed() -> None:
    from pytest_kimi.run.manifest import disaggregation

    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    assert disaggregation(cluster, cluster.layout("tp32")) == {}
    found = disaggregation(cluster, cluster.layout("pd-pp8-tp32"))
    assert found["transfer_backend"] == "mooncake"
    prefill, decode = found["sides"]
    assert (prefill["role"], prefill["tp"], prefill["pp"], prefill["bootstrap_port"]) == (
        "prefill", 4, 8, 8998
    )  # fmt: skip
    assert decode["nodes"] == ["node605", "node606", "node607", "node608"]
    assert decode["bootstrap_port"] is None and decode["router_policy"] == "round_robin"


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("nodes_per_replica: 4}   # node605-608", "nodes_per_replica: 4, policy: bucket}   #",
         "layouts.pd-pp8-tp32.decode.policy", "bucket is a prefill policy"),
        ("nodes_per_replica: 4}   # node601-604",
         "nodes_per_replica: 4, bootstrap_port: 30001}   #",
         "layouts.pd-pp8-tp32.prefill.bootstrap_port", "port 30001 is also server.port"),
    ],
)  # fmt: skip
def test_pro6000_pd_mistakes_name_the_field(
    tmp_path: Path, old: str, new: str, field: str, words: str
) -> None:
    text = (CLUSTERS / "pro6000.yaml").read_text()
    assert old in text
    _, message = load_error(tmp_path, text.replace(old, new))
    assert f"field '{field}'" in message and words in message, message


def test_a_local_cluster_draws_the_bootstrap_port_like_any_auto_port(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, with_pd()))
    prefill, _ = cluster.layout("pd").sides
    assert prefill.bootstrap_port is None  # 'auto': prefill replicas share the host
    plan = plan_deployment(cluster, cluster.layout("pd"), ports=iter(range(42000, 42100)))
    [head] = [s for s in plan.rank0() if s.disaggregation == "prefill"]
    assert head.bootstrap_port is not None and 42000 <= head.bootstrap_port < 42100


def test_counters_of_both_sides_are_named_by_side_and_not_counted_twice() -> None:
    from pytest_kimi.report.dataquality import notes
    from pytest_kimi.results.replicacounters import ReplicaCounters
    from pytest_kimi.run.measure import replica_endpoints

    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    plan = plan_deployment(cluster, cluster.layout("pd-pp8-tp32"), ports=iter(()))
    assert replica_endpoints(plan) == {
        "prefill0": "http://10.0.0.1:30001", "decode0": "http://10.0.0.5:30001"
    }  # fmt: skip
    # every request finishes once on the prefill server and once on the decode server
    counters = {name: ReplicaCounters(url, 40, 655360, 20480)
                for name, url in replica_endpoints(plan).items()}  # fmt: skip
    said = " ".join(notes([], counters, replicas=2, succeeded=40))
    assert "requests per replica: decode0: 40, prefill0: 40" in said
    assert "other traffic" not in said
    assert "other traffic" in " ".join(notes([], counters, replicas=2, succeeded=39))


def test_the_reports_setup_names_each_side() -> None:
    from pytest_kimi.report.setup import _parallel
    from pytest_kimi.run.manifest import disaggregation

    cluster = load_cluster(CLUSTERS / "pro6000.yaml")
    layout = cluster.layout("pd-pp8-tp32")
    shown = _parallel({"tp": None, **disaggregation(cluster, layout)})
    assert shown == layout.label == "prefill TP4/PP8/EP4 x1 + decode TP32/PP1/EP4 x1"
    assert _parallel({"tp": 32, "pp": 1, "ep": 4}) == "TP32/PP1/EP4"


@pytest.mark.parametrize("sglang", ["0.5.9", "0.5.23"])
def test_the_dry_run_prints_every_pd_and_speculative_command_and_starts_nothing(
    sglang: str,
) -> None:
    import subprocess

    from pytest_kimi.testing.processes import pytest_argv

    root = CLUSTERS.parent
    done = subprocess.run(
        [*pytest_argv(), str(root / "tests" / "perf"), f"--cluster={CLUSTERS / 'pro6000.yaml'}",
         "--kimi-dry-run", "--layout=pd-pp8-tp32,tp32-eagle", "-p", "no:cacheprovider",
         f"--kimi-sglang-version={sglang}", f"--rootdir={root}"],
        capture_output=True, text=True, timeout=120, cwd=root,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-2000:] + done.stderr[-2000:]
    assert "# layout pd-pp8-tp32 (prefill TP4/PP8/EP4 x1 + decode TP32/PP1/EP4 x1)" in out
    assert (f"# command lines for SGLang {sglang} (--kimi-sglang-version); router smg "
            "(router.package: auto, smg assumed)") in out
    for rank in range(4):
        assert f"# prefill0-node{rank}-node60{rank + 1} on node60{rank + 1}" in out
        assert f"# decode0-node{rank}-node60{rank + 5} on node60{rank + 5}" in out
    prefill = ("--disaggregation-mode prefill --disaggregation-transfer-backend mooncake "
               "--disaggregation-bootstrap-port 8998 ")
    decode = "--disaggregation-mode decode --disaggregation-transfer-backend mooncake "
    if sglang == "0.5.9":
        prefill += "--disaggregation-decode-tp 32 "
        decode += "--disaggregation-prefill-pp 8 "
    assert out.count(prefill) == 4 and out.count(decode) == 4
    if sglang != "0.5.9":
        assert "--disaggregation-decode-tp" not in out and "--disaggregation-prefill-pp" not in out
    assert ("smg.launch_router --pd-disaggregation --prefill http://10.0.0.1:30001 "
            "8998 --decode http://10.0.0.5:30001 --prefill-policy round_robin --decode-policy "
            "round_robin ") in out
    # tp32-eagle: every node of both replicas speculates with the layout's flags
    eagle = out[out.index("# layout tp32-eagle"):]
    assert eagle.count("--speculative-algorithm EAGLE3 --speculative-draft-model-path "
                       "/models/Kimi-K3-eagle3 --speculative-num-steps 3 "
                       "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4") == 8
    assert eagle.count("--tp-size 32 --pp-size 1 --ep-size 4") == 8
    assert "dry run: nothing was started" in out + done.stderr


def test_the_warm_up_tells_each_side_that_no_kv_moves() -> None:
    """SGLang's own health check sends a disaggregated server bootstrap host 2.2.2.2, room 0:
    without them a decode server waits for KV from a prefill that never sends it."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from pytest_kimi.deploy.poststart import FAKE_BOOTSTRAP_HOST, warm_replicas

    bodies: list[tuple[int, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append((self.server.server_address[1], body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        heads = [
            SimpleNamespace(url=f"http://127.0.0.1:{s.server_address[1]}", replica=i,
                            disaggregation=role)
            for i, (s, role) in enumerate(zip(servers, ["", "prefill", "decode"], strict=True))
        ]  # fmt: skip
        warm_replicas(SimpleNamespace(rank0=lambda: heads))
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    by_port = dict(bodies)
    unified, prefill, decode = (by_port[s.server_address[1]] for s in servers)
    assert "bootstrap_host" not in unified
    for body in (prefill, decode):
        assert (body["bootstrap_host"], body["bootstrap_room"]) == (FAKE_BOOTSTRAP_HOST, 0)
        assert body["sampling_params"]["max_new_tokens"] == 4
