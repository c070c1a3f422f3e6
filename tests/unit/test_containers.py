"""server.container / setup / env_from_local in the cluster file, and the container runtime's
commands (pytest_kimi.deploy.container): pure string building, read without a node."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from test_plan import write_cluster

from pytest_kimi.config import ConfigError, ContainerConfig, load_cluster
from pytest_kimi.deploy import container
from pytest_kimi.deploy.listing import describe
from pytest_kimi.deploy.plan import plan_deployment

PORTS = "  model_path: /m\n  port: 30001\n  dist_init_port: 5000\n"
ROUTER_PORTS = "  port: 30000\n  prometheus_port: 29000\n"


def _ssh(tmp_path: Path, server: str, environ: dict[str, str] | None = None):
    path = write_cluster(tmp_path, host="10.0.0.1", server=PORTS + server, router=ROUTER_PORTS,
                         executor="ssh")  # fmt: skip
    text = path.read_text().replace("{name: b, host: '10.0.0.1'", "{name: b, host: '10.0.0.2'")
    path.write_text(text)
    return load_cluster(path, environ={} if environ is None else environ)


def test_env_from_local_is_read_from_the_environment_given_and_redacted(tmp_path: Path):
    cfg = _ssh(tmp_path, "  env: {A: '1'}\n  env_from_local: [MY_KEY]\n", {"MY_KEY": "s3cr3t"})
    plan = plan_deployment(cfg, cfg.layout("tp8"))
    spec = plan.servers[0]
    assert spec.secret_env == {"MY_KEY": "s3cr3t"} and "MY_KEY" not in spec.env
    # besides SGLANG_HOST_IP, which every rank of a replica over two nodes gets
    assert spec.launch_env == {"SGLANG_HOST_IP": spec.addr or spec.node.host, "A": "1",
                               "MY_KEY": "s3cr3t"}  # fmt: skip
    assert "s3cr3t" not in describe(plan) and "MY_KEY='***'" in describe(plan)
    assert "s3cr3t" not in repr(spec) and "s3cr3t" not in repr(cfg)


@pytest.mark.parametrize(
    ("server", "environ", "expected"),
    [
        ("  env_from_local: [HF_TOKEN]\n", {}, "'server.env_from_local[0]': HF_TOKEN is not set"),
        ("  env: {HF_TOKEN: x}\n  env_from_local: [HF_TOKEN]\n", {"HF_TOKEN": "v"},
         "HF_TOKEN is also set in server.env"),
        ("  env_from_local: [hf-token]\n", {}, "is not an environment variable name"),
        ("  wrapper: [docker, exec, c]\n", {}, "use server.container"),
        ("  container: {runtime: docker, mode: exec}\n", {}, "mode exec needs 'name'"),
        ("  container: {runtime: docker, mode: run}\n", {}, "mode run needs 'image'"),
        ("  container: {runtime: docker, name: c, image: i}\n", {}, "only for mode run"),
        ("  container: {runtime: lxc, name: c}\n", {}, "'lxc' is not one of docker"),
        ("  container: {runtime: docker, mode: run, image: i, gpus: [a]}\n", {}, "GPU indexes"),
        ("  setup: [' ']\n", {}, "expected a list of shell lines"),
    ],
)  # fmt: skip
def test_problems_name_the_field(tmp_path: Path, server: str, environ, expected: str):
    with pytest.raises(ConfigError) as exc:
        _ssh(tmp_path, server, environ)
    assert expected in str(exc.value)


def test_containers_need_the_ssh_executor(tmp_path: Path):
    server = "  model_path: /m\n  container: {runtime: docker, name: c}\n"
    with pytest.raises(ConfigError, match="containers need executor: ssh"):
        load_cluster(write_cluster(tmp_path, server=server))


def test_plan_carries_setup_and_container(tmp_path: Path):
    server = "  setup: [conda activate x]\n  container: {runtime: podman, name: sgl}\n"
    cfg = _ssh(tmp_path, server)
    plan = plan_deployment(cfg, cfg.layout("tp8"))
    assert plan.servers[0].setup == ("conda activate x",)
    assert plan.servers[0].container == ContainerConfig("podman", "exec", "sgl")
    assert plan.router.container is None
    assert "#   setup: conda activate x" in describe(plan)


def test_exec_in_passes_names_only_and_quotes_the_command():
    box = container.Box(
        ContainerConfig("docker", "exec", "my c", executable="/opt/d ocker"), "my c"
    )
    cmd = container.exec_in(box, "echo 'a b'; kill -s TERM -- -5", ["HF_TOKEN", "A"])
    assert shlex.split(cmd) == ["/opt/d ocker", "exec", "-e", "HF_TOKEN", "-e", "A", "my c",
                                "sh", "-c", "echo 'a b'; kill -s TERM -- -5"]  # fmt: skip
    app = container.Box(ContainerConfig("apptainer", "exec", "inst"), "inst")
    assert shlex.split(container.exec_in(app, "true", ["X"]))[:3] == [
        "apptainer",
        "exec",
        "instance://inst",
    ]
    wrapped = container.with_env_file("/r/p.env", cmd)
    assert wrapped.startswith("( set -a; . /r/p.env; set +a; rm -f /r/p.env; ")


def test_run_mode_commands():
    cfg = ContainerConfig("docker", "run", None, image="img:1", mounts=("/m:/m:ro",),
                          gpus=(0, 2), args=("--shm-size", "32g"))  # fmt: skip
    box = container.box_for(cfg, "2024 run/tp8", "replica0-node0-a")
    assert box.name == "kimi-2024-run-tp8-replica0-node0-a" and box.ours
    argv = shlex.split(container.run_container(box, "/w/run"))
    assert argv[:4] == ["docker", "run", "-d", "--name"] and argv[-3:] == [
        "sleep",
        "img:1",
        "infinity",
    ]
    assert "device=0,2" in argv and "/m:/m:ro" in argv and "/w/run:/w/run" in argv
    assert "--shm-size" in argv and "--network" in argv and "--init" in argv
    assert shlex.split(container.remove_container(box)) == ["docker", "rm", "-f", box.name]
    app = container.box_for(ContainerConfig("apptainer", "run", "n", image="x.sif"), "r", "p")
    assert shlex.split(container.run_container(app, "/w")) == [
        "apptainer",
        "instance",
        "start",
        "--nv",
        "-B",
        "/w",
        "x.sif",
        "n",
    ]
    assert shlex.split(container.remove_container(app)) == ["apptainer", "instance", "stop", "n"]


def test_a_runtime_that_cannot_answer_is_never_gone():
    assert container.says_gone("Error response from daemon: No such container: c")
    assert container.says_gone("Error: container abc is not running")
    assert not container.says_gone("permission denied while trying to connect to the daemon")
    assert container.parse_inspect(0, "present\n") is True
    assert container.parse_inspect(0, "absent\n") is False
    with pytest.raises(container.RuntimeUnanswered):
        container.parse_inspect(1, "Cannot connect to the Docker daemon")
