"""GPU pre-flight: canned nvidia-smi answers through a fake executor, one error for all nodes."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_kimi.config import Node, load_cluster
from pytest_kimi.config.options import DEFAULT_CLUSTER
from pytest_kimi.deploy import preflight
from pytest_kimi.deploy.preflight import MARK, PreflightError


def _gpus(n: int, used: dict[int, int] | None = None) -> str:
    used = used or {}
    return "".join(
        f"{i}, GPU-{i}, NVIDIA H200, 0, {used.get(i, 1)}, 143771, 70.0, 345, 570.86.15\n"
        for i in range(n)
    )


def _answer(gpus: str, apps: str = "", gpus_exit: int = 0) -> str:
    info = "Driver Version                            : 570.86.15\nCUDA Version    : 12.8\n"
    return f"{gpus}{MARK} gpus {gpus_exit}\n{apps}{MARK} apps 0\n{info}{MARK} info 0\n"


class FakeExecutor:
    """Answers each node's probe with canned text; records the commands."""

    def __init__(self, answers: dict[str, str | Exception]) -> None:
        self.answers, self.commands = answers, []

    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        self.commands.append((node.name, command))
        answer = self.answers[node.name]
        if isinstance(answer, Exception):
            raise answer
        return 0, answer

    def close(self) -> None:
        return None


def _cluster(**preflight):
    cluster = load_cluster(DEFAULT_CLUSTER)
    return dataclasses.replace(
        cluster, preflight=dataclasses.replace(cluster.preflight, **preflight)
    )


def test_clean_nodes_pass_and_record_driver_and_cuda():
    cluster = _cluster()
    nodes = cluster.nodes[:2]
    executor = FakeExecutor({n.name: _answer(_gpus(8)) for n in nodes})
    reports = preflight.check_nodes(cluster, nodes, executor, "run/tp32")
    preflight.require_clean(reports)  # no raise
    assert [r.problems for r in reports] == [[], []]
    record = reports[0].manifest()
    assert (record["driver"], record["cuda"], len(record["gpus"])) == ("570.86.15", "12.8", 8)
    # one round trip per node, with the three queries in it
    assert len(executor.commands) == 2
    assert "--query-gpu=" in executor.commands[0][1] and "-q -d COMPUTE" in executor.commands[0][1]


def test_busy_gpu_count_mismatch_and_memory_are_one_error_naming_everything():
    cluster = _cluster(busy_memory_mib=2048)
    a, b, c = cluster.nodes[:3]
    executor = FakeExecutor({
        a.name: _answer(_gpus(8, {3: 40960}), apps="GPU-3, 4242, python3, 40960\n"),
        b.name: _answer(_gpus(4)),
        c.name: _answer(_gpus(8, {5: 3000})),
    })  # fmt: skip
    reports = preflight.check_nodes(cluster, [a, b, c], executor, "s")
    with pytest.raises(PreflightError) as caught:
        preflight.require_clean(reports)
    text = str(caught.value)
    assert "3 problems; nothing was started" in text
    assert f"node {a.name} ({a.host}): GPU 3 busy: pid 4242 (python3) holds 40960 MiB" in text
    assert (
        f"node {b.name} ({b.host}): nvidia-smi lists 4 GPUs, the cluster file says gpus: 8" in text
    )
    assert f"node {c.name} ({c.host}): GPU 5 busy: 3000 MiB used by no listed process" in text
    assert "preflight: {enabled: false}" in text


def test_memory_at_the_threshold_is_idle():
    cluster = _cluster(busy_memory_mib=2048)
    node = cluster.nodes[0]
    executor = FakeExecutor({node.name: _answer(_gpus(8, {0: 2048}))})
    [report] = preflight.check_nodes(cluster, [node], executor, "s")
    assert report.problems == []


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (_answer("sh: 1: nvidia-smi: not found\n", gpus_exit=127), "nvidia-smi failed (exit 127)"),
        (_answer("0, GPU-0, H200\n"), "nvidia-smi answered something unreadable"),
        (RuntimeError("node node601 (127.0.0.1): unreachable"), "could not be asked"),
        ("bash: syntax error", "nvidia-smi could not be run"),
    ],
)
def test_a_node_that_cannot_answer_is_a_problem_naming_it(answer, expected):
    cluster = _cluster()
    node = cluster.nodes[0]
    [report] = preflight.check_nodes(cluster, [node], FakeExecutor({node.name: answer}), "s")
    [problem] = report.problems
    assert problem.startswith(f"node {node.name} ({node.host}): ") and expected in problem
    assert problem.count(f"node {node.name}") == 1
    if "not found" in str(answer):
        assert "nvidia-smi: not found" in problem  # the node's own words


def test_nodes_are_asked_once_each_and_the_table_lists_them():
    cluster = _cluster()
    node = cluster.nodes[0]
    executor = FakeExecutor({node.name: _answer(_gpus(8), apps="GPU-1, 77, python3, 5000\n")})
    reports = preflight.check_nodes(cluster, [node, node], executor, "s")
    assert len(reports) == 1 and len(executor.commands) == 1
    text = preflight.table(reports)
    assert node.name in text and "570.86.15" in text and "77(python3)" in text
    assert "PROBLEM node node601 (127.0.0.1): GPU 1 busy: pid 77 (python3)" in text


def test_split_sections_keeps_each_commands_exit_status():
    text = f"a\nb\n{MARK} gpus 0\n{MARK} apps 9\nx\n{MARK} info 0\n"
    assert preflight.split_sections(text) == {
        "gpus": (0, "a\nb"),
        "apps": (9, ""),
        "info": (0, "x"),
    }


def test_the_cluster_file_sets_threshold_and_command(tmp_path):
    text = DEFAULT_CLUSTER.read_text() + (
        "\npreflight: {enabled: false, busy_memory_mib: 512}\n"
        "nvidia_smi: [/usr/local/nvidia/bin/nvidia-smi]\n"
    )
    path = tmp_path / "c.yaml"
    path.write_text(text)
    cluster = load_cluster(path)
    assert cluster.preflight.enabled is False and cluster.preflight.busy_memory_mib == 512
    assert cluster.nvidia_smi == ("/usr/local/nvidia/bin/nvidia-smi",)
    from pytest_kimi.deploy.gpus import smi_command

    real = dataclasses.replace(
        cluster, server=dataclasses.replace(cluster.server, module="sglang.launch_server")
    )
    assert smi_command(real, real.nodes[0], "s") == ["/usr/local/nvidia/bin/nvidia-smi"]
    default = dataclasses.replace(real, nvidia_smi=())
    assert smi_command(default, real.nodes[0], "s") == ["nvidia-smi"]


def test_bring_up_checks_server_nodes_and_records_them_for_the_manifest():
    from types import SimpleNamespace

    from pytest_kimi.deploy.plan import plan_deployment
    from pytest_kimi.deploy.prestart import gpu_preflight

    cluster = _cluster()
    plan = plan_deployment(cluster, cluster.layouts["tp32"], ports=iter(range(40000, 40100)))
    executor = FakeExecutor({n.name: _answer(_gpus(8)) for n in cluster.nodes})
    said: list[str] = []
    records = gpu_preflight(SimpleNamespace(cluster=cluster), executor, plan, "r/tp32", said.append)
    assert sorted(r["node"] for r in records) == sorted(n.name for n in cluster.nodes)
    assert records[0]["gpu_preflight"]["cuda"] == "12.8"
    assert said == ["[kimi tp32] GPU pre-flight: 8 node(s), 64 GPU(s) idle"]
    executor.answers["node602"] = _answer(_gpus(7))
    with pytest.raises(PreflightError, match=r"node node602 .*lists 7 GPUs"):
        gpu_preflight(SimpleNamespace(cluster=cluster), executor, plan, "r/tp32", said.append)
    off = _cluster(enabled=False)
    assert gpu_preflight(SimpleNamespace(cluster=off), executor, plan, "r/tp32", said.append) == []
