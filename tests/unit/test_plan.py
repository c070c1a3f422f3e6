"""Deployment plans: exact argv per process, ports, router wiring, and shell safety.

With ``ports=iter(range(40000, 40100))`` on local.yaml, ports are drawn in this order:
replica 0 dist-init 40000, its four HTTP ports 40001-40004; replica 1 dist-init 40005, HTTP
40006-40009; router 40010; router Prometheus 40011.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kimi.config import ClusterConfig, load_cluster
from pytest_kimi.deploy.listing import describe
from pytest_kimi.deploy.plan import DeploymentPlan, ProcessSpec, plan_deployment
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"


@pytest.fixture(scope="module")
def local() -> ClusterConfig:
    return load_cluster(CLUSTERS / "local.yaml")


@pytest.fixture(scope="module")
def pro6000() -> ClusterConfig:
    return load_cluster(CLUSTERS / "pro6000.yaml")


@pytest.fixture
def plan(local: ClusterConfig) -> DeploymentPlan:
    return plan_deployment(local, local.layout("tp32"), ports=iter(range(40000, 40100)))


def opt(argv: tuple[str, ...] | list[str], flag: str) -> str:
    """The value after ``flag``, which must occur exactly once."""
    assert list(argv).count(flag) == 1, (flag, argv)
    return argv[list(argv).index(flag) + 1]


def values_after(argv: tuple[str, ...], flag: str) -> list[str]:
    """Every value after ``flag`` up to the next ``--option``."""
    i = argv.index(flag) + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


# ----------------------------------------------------------------------------- local.yaml


def test_server_processes(plan: DeploymentPlan) -> None:
    assert len(plan.servers) == 8
    assert [(s.replica, s.rank) for s in plan.servers] == [
        (r, k) for r in range(2) for k in range(4)
    ]
    assert [s.node.name for s in plan.servers] == [f"node60{i}" for i in range(1, 9)]
    assert all(s.role == "server" for s in plan.servers)
    assert plan.servers[0].name == "replica0-node0-node601"
    assert plan.servers[5].name == "replica1-node1-node606"
    names = [p.name for p in plan.processes]
    assert len(names) == len(set(names)) == 9
    assert plan.processes[-1] is plan.router


def test_server_argv_head(plan: DeploymentPlan) -> None:
    for s in plan.servers:
        assert s.argv[:3] == (sys.executable, "-m", "pytest_kimi.mock.launch_server")
        assert opt(s.argv, "--model-path") == str(TOKENIZER_DIR)  # builtin:mock-tokenizer


def test_ranks_and_dist_init(plan: DeploymentPlan) -> None:
    for s in plan.servers:
        assert opt(s.argv, "--nnodes") == "4"
        assert opt(s.argv, "--node-rank") == str(s.rank)
    r0 = [opt(s.argv, "--dist-init-addr") for s in plan.servers[:4]]
    r1 = [opt(s.argv, "--dist-init-addr") for s in plan.servers[4:]]
    # Shared within a replica, and pointing at the replica's rank-0 host.
    assert r0 == ["127.0.0.1:40000"] * 4
    assert r1 == ["127.0.0.1:40005"] * 4
    assert r0[0] != r1[0]


def test_http_ports(plan: DeploymentPlan) -> None:
    ports = [s.port for s in plan.servers]
    assert ports == [40001, 40002, 40003, 40004, 40006, 40007, 40008, 40009]
    for s in plan.servers:
        assert opt(s.argv, "--port") == str(s.port)
        assert opt(s.argv, "--host") == "127.0.0.1"
        assert s.url == f"http://127.0.0.1:{s.port}"


@pytest.mark.parametrize(("layout", "tp", "pp", "ep"), [("tp32", 32, 1, 4), ("pp8", 4, 8, 4)])
def test_parallel_sizes(local: ClusterConfig, layout: str, tp: int, pp: int, ep: int) -> None:
    p = plan_deployment(local, local.layout(layout), ports=iter(range(40000, 40100)))
    assert p.layout.name == layout
    for s in p.servers:
        assert opt(s.argv, "--tp-size") == str(tp)
        assert opt(s.argv, "--pp-size") == str(pp)
        assert opt(s.argv, "--ep-size") == str(ep)


def test_fixed_server_flags(plan: DeploymentPlan) -> None:
    for s in plan.servers:
        argv = s.argv
        assert opt(argv, "--chunked-prefill-size") == "8192"
        assert opt(argv, "--kv-cache-dtype") == "bf16"
        assert opt(argv, "--moe-runner-backend") == "flashinfer_mxfp4"
        assert opt(argv, "--moe-a2a-backend") == "none"
        # Boolean flags stand alone.
        for flag in ("--disable-radix-cache", "--enable-metrics"):
            assert argv.count(flag) == 1
            i = argv.index(flag)
            assert i == len(argv) - 1 or argv[i + 1].startswith("--")


def test_mock_flags(plan: DeploymentPlan) -> None:
    for s in plan.servers:
        assert opt(s.argv, "--mock-time-scale") == "40"
        assert opt(s.argv, "--mock-seed") == str(1 + s.replica)  # seed 1 + replica
        assert opt(s.argv, "--mock-gpus-per-node") == "8"


def test_mock_profile_is_passed_inline(local: ClusterConfig) -> None:
    """Inline JSON: a remote node needs no file from the client machine."""
    p = plan_deployment(local, local.layout("pp8"), ports=iter(range(40000, 40100)))
    for s in p.servers:
        assert json.loads(opt(s.argv, "--mock-profile")) == dict(local.mock.profile)


def test_full_rank0_argv(plan: DeploymentPlan) -> None:
    assert plan.servers[4].argv == (
        sys.executable, "-m", "pytest_kimi.mock.launch_server",
        "--model-path", str(TOKENIZER_DIR),
        "--tp-size", "32", "--pp-size", "1", "--ep-size", "4",
        "--nnodes", "4", "--node-rank", "0",
        "--dist-init-addr", "127.0.0.1:40005",
        "--host", "127.0.0.1", "--port", "40006",
        "--chunked-prefill-size", "8192",
        "--disable-radix-cache",
        "--kv-cache-dtype", "bf16",
        "--moe-runner-backend", "flashinfer_mxfp4",
        "--moe-a2a-backend", "none",
        "--enable-metrics",
        "--mock-time-scale", "40", "--mock-seed", "2", "--mock-gpus-per-node", "8",
        "--mock-sglang-version", "0.5.23",
        "--mock-profile", json.dumps(dict(local_profile()), separators=(",", ":")),
    )  # fmt: skip


def test_router(plan: DeploymentPlan) -> None:
    rtr = plan.router
    assert rtr.role == "router"
    assert rtr.node.name == "node601"
    assert rtr.argv[:3] == (sys.executable, "-m", "smg.launch_router")  # router.package: auto
    assert values_after(rtr.argv, "--worker-urls") == [
        "http://127.0.0.1:40001",
        "http://127.0.0.1:40006",
    ]
    assert [s.url for s in plan.rank0()] == values_after(rtr.argv, "--worker-urls")
    assert opt(rtr.argv, "--policy") == "round_robin"
    assert opt(rtr.argv, "--host") == "127.0.0.1"
    assert opt(rtr.argv, "--port") == "40010"
    assert opt(rtr.argv, "--prometheus-host") == "127.0.0.1"
    assert opt(rtr.argv, "--prometheus-port") == "40011"
    assert rtr.port == 40010
    assert plan.endpoint == "http://127.0.0.1:40010"
    assert rtr.env == {"HF_ENDPOINT": "http://127.0.0.1:9"}


def test_ports_are_distinct(plan: DeploymentPlan) -> None:
    used = [s.port for s in plan.servers]
    used += [int(opt(plan.servers[0].argv, "--dist-init-addr").rsplit(":", 1)[1])]
    used += [int(opt(plan.servers[4].argv, "--dist-init-addr").rsplit(":", 1)[1])]
    used += [plan.router.port, int(opt(plan.router.argv, "--prometheus-port"))]
    assert sorted(used) == list(range(40000, 40012))


def test_describe(plan: DeploymentPlan) -> None:
    text = describe(plan)
    lines = text.splitlines()
    assert lines[0] == "# layout tp32 (TP32/PP1/EP4) on local"
    assert lines[1] == ("# command lines for SGLang 0.5.23 (the newest profile); router smg "
                        "(router.package: auto, smg assumed)")  # fmt: skip
    assert "# router on node601 (127.0.0.1)" in lines
    assert "# replica1-node3-node608 on node608 (127.0.0.1)" in lines
    assert len(lines) == 2 + 2 * 9
    assert plan.router.command_line() in lines


# ----------------------------------------------------------------------------- pro6000.yaml


def test_pro6000_fixed_ports(pro6000: ClusterConfig) -> None:
    # An exhausted supply proves no port is drawn: every port is fixed.
    p = plan_deployment(pro6000, pro6000.layout("pp8"), ports=iter(()))
    assert [s.port for s in p.servers] == [30001] * 8
    dist = [opt(s.argv, "--dist-init-addr") for s in p.servers]
    assert dist == ["10.0.0.1:5757"] * 4 + ["10.0.0.5:5757"] * 4  # the heads' addr
    for s in p.servers:
        assert s.argv[:3] == ("/opt/sglang/venv/bin/python", "-m", "sglang.launch_server")
        assert opt(s.argv, "--model-path") == "/models/Kimi-K3"
        assert opt(s.argv, "--host") == s.node.addr
        assert opt(s.argv, "--tp-size") == "4" and opt(s.argv, "--pp-size") == "8"
        assert "--trust-remote-code" in s.argv
        assert not any(a.startswith("--mock-") for a in s.argv)
        assert s.env == {
            "GLOO_SOCKET_IFNAME": "eth0",
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_DISABLE": "0",
            "NCCL_DEBUG": "WARN",
            "SGLANG_HOST_IP": s.node.addr,  # a replica over 4 nodes: each rank's own
        }
    rtr = p.router
    assert rtr.argv[:3] == ("/opt/sglang/venv/bin/python", "-m", "smg.launch_router")
    assert values_after(rtr.argv, "--worker-urls") == [
        "http://10.0.0.1:30001",
        "http://10.0.0.5:30001",
    ]
    assert opt(rtr.argv, "--host") == "10.0.0.1"
    assert opt(rtr.argv, "--port") == "30000"
    assert opt(rtr.argv, "--prometheus-host") == "10.0.0.1"
    assert opt(rtr.argv, "--prometheus-port") == "29000"
    assert p.endpoint == "http://10.0.0.1:30000"


def test_pro6000_command_line(pro6000: ClusterConfig) -> None:
    p = plan_deployment(pro6000, pro6000.layout("tp32"))
    line = p.servers[0].command_line()
    assert line.startswith(
        "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 SGLANG_HOST_IP=10.0.0.1 "
        "NCCL_IB_DISABLE=0 NCCL_DEBUG=WARN /opt/sglang/venv/bin/python -m sglang.launch_server "
        "--model-path /models/Kimi-K3 --tp-size 32 --pp-size 1 --ep-size 4 --nnodes 4 "
        "--node-rank 0 --dist-init-addr 10.0.0.1:5757 --host 10.0.0.1 --port 30001 "
    )
    assert p.router.command_line().startswith("/opt/sglang/venv/bin/python -m ")


# ----------------------------------------------------------------------------- edge cases


def write_cluster(tmp_path: Path, *, host: str = "127.0.0.1", server: str = "", router: str = "",
                  executor: str = "local") -> Path:  # fmt: skip
    text = f"""\
name: t
executor: {executor}
nodes:
  - {{name: a, host: '{host}', gpus: 4}}
  - {{name: b, host: '{host}', gpus: 4}}
deployment: {{replicas: 1, nodes_per_replica: 2}}
layouts:
  tp8: {{tp: 8, pp: 1, ep: 2}}
server:
  python: python3
  module: sglang.launch_server
{server}
router:
  python: python3
{router}
workload: {{dataset: d.jsonl, num_requests: 1, input_len: 1, output_len: 1, concurrency: 1}}
"""
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_false_flags_dropped_and_scalars_stringified(tmp_path: Path) -> None:
    server = """\
  model_path: /m
  args:
    enable-metrics: false
    mem-fraction-static: 0.85
    max-running-requests: 16
    trust-remote-code: true"""
    cfg = load_cluster(write_cluster(tmp_path, server=server))
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    argv = p.servers[0].argv
    assert "--enable-metrics" not in argv
    assert opt(argv, "--mem-fraction-static") == "0.85"
    assert opt(argv, "--max-running-requests") == "16"
    assert argv[-1] == "--trust-remote-code"


def test_router_args_and_env(tmp_path: Path) -> None:
    router = """\
  policy: cache_aware
  args: {log-dir: /tmp/logs, request-timeout-secs: 30}
  env: {RUST_LOG: info}"""
    cfg = load_cluster(write_cluster(tmp_path, server="  model_path: /m", router=router))
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    assert opt(p.router.argv, "--policy") == "cache_aware"
    assert p.router.argv[-4:] == ("--log-dir", "/tmp/logs", "--request-timeout-secs", "30")
    assert p.router.env == {"RUST_LOG": "info"}
    assert p.router.command_line().startswith("RUST_LOG=info python3 -m ")


def test_ipv6_host_is_bracketed(tmp_path: Path) -> None:
    cfg = load_cluster(write_cluster(tmp_path, host="::1", server="  model_path: /m"))
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    assert opt(p.servers[1].argv, "--dist-init-addr") == "[::1]:50000"
    assert opt(p.servers[0].argv, "--host") == "::1"
    assert p.servers[0].url == "http://[::1]:50001"
    assert values_after(p.router.argv, "--worker-urls") == ["http://[::1]:50001"]
    assert p.endpoint == "http://[::1]:50003"


def test_process_spec_defaults() -> None:
    cfg = load_cluster(CLUSTERS / "pro6000.yaml")
    spec = ProcessSpec(name="x", node=cfg.node("node602"), argv=("true",))
    assert spec.env == {} and spec.role == "server" and spec.port == 0
    assert spec.url == "http://node602:0"
    assert spec.command_line() == "true"


# ----------------------------------------------------------------------------- shell safety

NASTY = [
    "; rm -rf /",
    "$(touch pwned)",
    "`touch pwned2`",
    'it\'s "quoted"',
    "a b\tc",
    "x && touch pwned3 || true",
    "> pwned4",
    "",
    "\\n$HOME ${PATH}",
]


def nasty_cluster(tmp_path: Path) -> ClusterConfig:
    def q(s: str) -> str:
        # a JSON string is a valid YAML double-quoted scalar; "$${" keeps a literal "${"
        # through the file's ${NAME} expansion (pytest_kimi/config/variables.py)
        return json.dumps(s).replace("${", "$${")

    args = "\n".join(f"    nasty-{i}: {q(v)}" for i, v in enumerate(NASTY))
    env = "\n".join(f"    NASTY_{i}: {q(v)}" for i, v in enumerate(NASTY))
    model_path = q("/models/a b; rm -rf / $(touch pwned5) 'q'")
    server = f"""\
  model_path: {model_path}
  args:
{args}
  env:
{env}"""
    evil = q("$(touch pwned6); echo 'x' \"y\"")
    log_dir = q("/tmp/$(touch pwned7)")
    router = f"""\
  env:
    EVIL: {evil}
  args:
    log-dir: {log_dir}"""
    return load_cluster(write_cluster(tmp_path, server=server, router=router))


def assert_no_pwned(tmp_path: Path) -> None:
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("pwned")]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(">")]


def test_nasty_values_stay_separate_argv_elements(tmp_path: Path) -> None:
    cfg = nasty_cluster(tmp_path)
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    argv = p.servers[0].argv
    assert opt(argv, "--model-path") == "/models/a b; rm -rf / $(touch pwned5) 'q'"
    for i, value in enumerate(NASTY):
        assert opt(argv, f"--nasty-{i}") == value
        assert p.servers[0].env[f"NASTY_{i}"] == value


def test_command_line_round_trips(tmp_path: Path) -> None:
    cfg = nasty_cluster(tmp_path)
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    for spec in p.processes:
        expected = [f"{k}={v}" for k, v in spec.env.items()] + list(spec.argv)
        assert shlex.split(spec.command_line()) == expected


def test_shell_runs_argv_literally(tmp_path: Path) -> None:
    cfg = nasty_cluster(tmp_path)
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    for spec in p.processes:
        out = subprocess.run(
            ["bash", "-c", "printf '%s\\n' " + shlex.join(spec.argv)],
            cwd=tmp_path, capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        assert out.stdout == "".join(f"{a}\n" for a in spec.argv)
    assert_no_pwned(tmp_path)


PRINT_ENV_AND_ARGV = (
    "import json, os, sys; "
    "keys = [k for k in os.environ if k.startswith(('NASTY_', 'EVIL'))]; "
    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: os.environ[k] for k in keys}}))"
)


def test_shell_runs_command_line_literally(tmp_path: Path) -> None:
    """The full command line, environment first, run by a shell: nothing is interpreted."""
    cfg = nasty_cluster(tmp_path)
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    for spec in p.processes:
        probe = dataclasses.replace(
            spec, argv=(sys.executable, "-c", PRINT_ENV_AND_ARGV, *spec.argv)
        )
        out = subprocess.run(
            ["bash", "-c", probe.command_line()],
            cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        seen = json.loads(out.stdout)
        assert seen["argv"] == list(spec.argv)
        nasty = {k: v for k, v in spec.env.items() if k.startswith(("NASTY_", "EVIL"))}
        assert seen["env"] == nasty
    assert_no_pwned(tmp_path)


def test_env_name_is_not_interpreted(tmp_path: Path) -> None:
    server = """\
  model_path: /m
  env:
    "$(touch pwned)": "1"
    "X; touch pwned2; Y": "2\""""
    try:
        cfg = load_cluster(write_cluster(tmp_path, server=server))
    except ValueError:
        return  # rejected by config: fine
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    probe = dataclasses.replace(p.servers[0], argv=("true",))
    subprocess.run(["bash", "-c", probe.command_line()], cwd=tmp_path, capture_output=True,
                   timeout=30)  # fmt: skip
    assert_no_pwned(tmp_path)


def local_profile() -> dict:
    from pytest_kimi.config import load_cluster

    return dict(load_cluster(CLUSTERS / "local.yaml").mock.profile)


def test_ranks_of_a_replica_spanning_nodes_announce_their_own_address(tmp_path: Path) -> None:
    # SGLang's cross-node broadcast binds SGLANG_HOST_IP; unset, it guesses from a route to
    # 8.8.8.8 or the hostname, which on an isolated cluster network is the wrong address
    cfg = load_cluster(write_cluster(tmp_path, server="  model_path: /m"))
    addrs = {"a": "10.0.0.1", "b": "10.0.0.2"}
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)), addrs=addrs)
    assert [s.env["SGLANG_HOST_IP"] for s in p.servers] == ["10.0.0.1", "10.0.0.2"]
    given = write_cluster(tmp_path, server="  model_path: /m\n  env: {SGLANG_HOST_IP: 1.2.3.4}")
    cfg = load_cluster(given)  # the file's own value wins
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)), addrs=addrs)
    assert {s.env["SGLANG_HOST_IP"] for s in p.servers} == {"1.2.3.4"}


def test_a_replica_on_one_node_sets_no_host_address(tmp_path: Path) -> None:
    path = write_cluster(tmp_path, server="  model_path: /m")
    text = path.read_text().replace("nodes_per_replica: 2", "nodes_per_replica: 1")
    path.write_text(text.replace("tp: 8", "tp: 4"))
    cfg = load_cluster(path)
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    assert all("SGLANG_HOST_IP" not in s.env for s in p.servers)


def test_a_node_address_that_is_a_name_is_not_announced(tmp_path: Path) -> None:
    # ZMQ binds no host name: SGLang's own guess is better than a bind that fails
    cfg = load_cluster(write_cluster(tmp_path, host="localhost", server="  model_path: /m"))
    p = plan_deployment(cfg, cfg.layout("tp8"), ports=iter(range(50000, 50010)))
    assert all("SGLANG_HOST_IP" not in s.env for s in p.servers)
