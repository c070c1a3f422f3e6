"""Layouts as full configurations: their own flags, environment, nodes, replicas and router,
merged over the cluster's, and every mistake named by file, line, layout and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from clusterfile import BASE as CLUSTER_BASE
from clusterfile import L_PP2, edit, load_error, write

from pytest_kimi.config import ConfigError, load_cluster
from pytest_kimi.deploy.plan import plan_deployment

# The configuration tests' cluster file with a few flags, an environment and router arguments
# to merge over, and the line of its second layout free for each test's own.
BASE = edit(
    "  pp2: {tp: 8, pp: 2, ep: 8}\n",
    "  LAYOUT\n",
    edit(
        "    chunked-prefill-size: 8192\n",
        "    chunked-prefill-size: 8192\n"
        "    disable-radix-cache: true\n"
        "  env: {NCCL_DEBUG: WARN}\n",
        edit("  node: n1\n", "  node: n1\n  args:\n    request-timeout-secs: 600\n", CLUSTER_BASE),
    ),
)
L_LAYOUT = L_PP2  # the line LAYOUT stands on


def _load(tmp_path: Path, layout: str):
    path = write(tmp_path, BASE.replace("LAYOUT", layout))
    return path, load_cluster(path)


def _error(tmp_path: Path, layout: str) -> tuple[Path, str]:
    return load_error(tmp_path, BASE.replace("LAYOUT", layout))


def _argv(cluster, name: str) -> list[list[str]]:
    plan = plan_deployment(cluster, cluster.layout(name), ports=iter(range(41000, 41100)))
    return [list(p.argv) for p in plan.processes]


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_a_layouts_args_are_merged_over_the_servers_and_null_removes_one(tmp_path):
    layout = "cp4k: {tp: 16, args: {chunked-prefill-size: 4096, disable-radix-cache: null}}"
    _, cluster = _load(tmp_path, layout)
    for argv in _argv(cluster, "cp4k")[:-1]:  # every server; the router is last
        assert _flag(argv, "--chunked-prefill-size") == "4096"
        assert "--disable-radix-cache" not in argv
    for argv in _argv(cluster, "tp16")[:-1]:  # the other layout keeps the cluster's flags
        assert _flag(argv, "--chunked-prefill-size") == "8192"
        assert "--disable-radix-cache" in argv


def test_a_layouts_env_nodes_replicas_and_router(tmp_path):
    layout = ("one: {tp: 8, nodes: [n3, n4], replicas: 2, nodes_per_replica: 1, "
              "env: {NCCL_ALGO: Ring}, router: {policy: cache_aware, "
              "args: {request-timeout-secs: null, max-payload-size: 1024}}}")  # fmt: skip
    _, cluster = _load(tmp_path, layout)
    plan = plan_deployment(cluster, cluster.layout("one"), ports=iter(range(41000, 41100)))
    assert [(s.node.name, s.replica, s.rank) for s in plan.servers] == [("n3", 0, 0), ("n4", 1, 0)]
    assert all(s.env["NCCL_ALGO"] == "Ring" and s.env["NCCL_DEBUG"] == "WARN"
               for s in plan.servers)  # fmt: skip
    assert all(_flag(list(s.argv), "--nnodes") == "1" for s in plan.servers)
    router = list(plan.router.argv)
    assert _flag(router, "--policy") == "cache_aware"
    assert "--request-timeout-secs" not in router and _flag(router, "--max-payload-size") == "1024"
    assert cluster.replicas_of(cluster.layout("one")) == 2
    assert cluster.replicas_of(cluster.layout("tp16")) == 2  # the deployment's default
    default = plan_deployment(cluster, cluster.layout("tp16"), ports=iter(range(41000, 41100)))
    assert [s.node.name for s in default.servers] == ["n1", "n2", "n3", "n4"]
    assert _flag(list(default.router.argv), "--policy") == "round_robin"


@pytest.mark.parametrize(
    ("layout", "field", "problem"),
    [
        ("x: {tp: 16, nodes: [n1, n9]}", "layouts.x.nodes[1]", "'n9' is not one of the nodes"),
        ("x: {tp: 16, nodes: [n1, n1]}", "layouts.x.nodes[1]", "'n1' is listed twice"),
        ("x: {tp: 16, nodes: [n1, n2, n3]}", "layouts.x.nodes",
         "2 replicas x 2 nodes need 4 nodes, but its 'nodes' list 3"),
        ("x: {tp: 16, replicas: 3}", "layouts.x.replicas",
         "3 replicas x 2 nodes need 6 nodes, but the cluster's 'nodes' list 4"),
        ("x: {tp: 16, nodes_per_replica: 1}", "layouts.x.tp",
         "TP x PP = 16 x 1 = 16, but one replica has 8 GPUs"),
        ("x: {tp: 16, args: {cuda-graph-max-bs: null}}", "layouts.x.args.cuda-graph-max-bs",
         "null removes a flag, but server.args does not set --cuda-graph-max-bs"),
        ("x: {tp: 16, args: {tp-size: 8}}", "layouts.x.args.tp-size",
         "--tp-size is set by pytest-kimi from the layout"),
        ("x: {tp: 16, router: {args: {policy: random}}}", "layouts.x.router.args.policy",
         "--policy is set by pytest-kimi"),
        ("x: {tp: 16, router: {args: {max-payload-size: null}}}",
         "layouts.x.router.args.max-payload-size",
         "null removes a flag, but router.args does not set --max-payload-size"),
    ],
)  # fmt: skip
def test_a_layout_that_does_not_fit_is_named_by_file_line_and_field(
    tmp_path, layout, field, problem
):
    path, message = _error(tmp_path, layout)
    assert message.startswith(f"{path}:"), message
    assert f"field '{field}'" in message and problem in message, message


def test_a_flag_the_plan_sets_is_refused_in_server_args_too(tmp_path):
    path = tmp_path / "cluster.yaml"
    text = BASE.replace("LAYOUT", "").replace("    disable-radix-cache: true",
                                               "    port: 30000")  # fmt: skip
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"server\.args\.port.*--port is set by pytest-kimi"):
        load_cluster(path)


def _options(cluster: Path, parallel: bool):
    from pytest_kimi.config.options import Options

    return Options(cluster, ("tp32", "pp8"), Path("out"), parallel=parallel)


def test_parallel_layouts_on_one_real_node_are_a_usage_error_naming_it():
    from pytest_kimi.config.inputs import UsageProblem, load_inputs

    pro6000 = Path(__file__).resolve().parents[2] / "clusters" / "pro6000.yaml"
    load_inputs(_options(pro6000, parallel=False), dry_run=True)  # one after the other: fine
    with pytest.raises(UsageProblem, match="tp32 and pp8 both use node node601"):
        load_inputs(_options(pro6000, parallel=True), dry_run=True)


def test_parallel_layouts_with_their_own_nodes_and_routers_are_fine(tmp_path):
    import yaml

    from pytest_kimi.config.inputs import load_inputs

    pro6000 = Path(__file__).resolve().parents[2] / "clusters" / "pro6000.yaml"
    data = yaml.safe_load(pro6000.read_text())
    halves = {"tp32": ["node601", "node602", "node603", "node604"],
              "pp8": ["node605", "node606", "node607", "node608"]}  # fmt: skip
    for name, nodes in halves.items():
        data["layouts"][name].update(nodes=nodes, replicas=1, router={"node": nodes[0]})
    path = tmp_path / "apart.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    inputs = load_inputs(_options(path, parallel=True), dry_run=True)
    cluster = inputs.cluster
    assert {n.name for n in cluster.used_nodes(cluster.layout("pp8"))} == set(halves["pp8"])
    assert cluster.router_node(cluster.layout("pp8")).name == "node605"


def test_the_manifest_says_what_a_layout_changes_and_what_it_runs_with():
    from pytest_kimi.config.inputs import load_inputs
    from pytest_kimi.config.options import DEFAULT_CLUSTER, Options
    from pytest_kimi.run.manifest import manifest

    inputs = load_inputs(Options(DEFAULT_CLUSTER, ("tp32-cp4k",), Path("out")), dry_run=True)
    block = manifest(inputs, inputs.layouts[0], "run", None)["layout"]
    assert block["own_args"] == {"chunked-prefill-size": 4096}
    assert block["server_args"]["chunked-prefill-size"] == 4096
    assert block["server_args"]["disable-radix-cache"] is True  # the cluster's, kept
    assert block["nodes"] == [f"node60{i}" for i in range(1, 9)]
    assert block["router_policy"] == "round_robin"
