"""``executor: slurm`` in the cluster file: its flags, what it refuses, and the exact salloc and
srun lines ``--kimi-dry-run`` prints (clusters/slurm-example.yaml: the seed's DP2)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from pytest_kimi.config import ConfigError, load_cluster
from pytest_kimi.config.cluster import SUBMIT_HOST
from pytest_kimi.deploy.listing import describe
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.deploy.slurm import SlurmExecutor
from pytest_kimi.deploy.slurmargv import salloc_argv, srun_argv

EXAMPLE = Path(__file__).resolve().parents[2] / "clusters" / "slurm-example.yaml"


def _edited(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_dry_run_shows_the_allocation_and_every_step():
    cluster = load_cluster(EXAMPLE)
    text = describe(plan_deployment(cluster, cluster.layout("tp32"))).splitlines()
    assert text[3] == (
        "salloc '--comment=pytest-kimi:<host>:<pid>:<start>' --no-shell "
        "'--job-name=pytest-kimi/<run>/tp32' --nodes=8 "
        "--nodelist=node601,node602,node603,node604,node605,node606,node607,node608 "
        "--time=04:00:00 --immediate=1800 --gres=gpu:8 --partition=gpu --account=llm-perf "
        "--constraint=rtx6000d --exclusive"
    )
    steps = [line for line in text if " srun " in f" {line}"]
    assert len(steps) == 9  # 8 servers and the router
    for i, line in enumerate(steps[:8]):
        node = f"node60{i + 1}"
        assert line.startswith("GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 ")
        assert " PYTHONUNBUFFERED=1 srun " in line
        # only these variables of this machine reach the node (values through srun's
        # environment); the base set a shell needs, then the process's own
        export = ("--export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR,GLOO_SOCKET_IFNAME,"
                  "NCCL_DEBUG,NCCL_IB_DISABLE,NCCL_SOCKET_IFNAME,PYTHONUNBUFFERED,"
                  "SGLANG_HOST_IP")  # fmt: skip
        assert (f'srun --jobid="$JOB" --overlap --nodes=1 --ntasks=1 --nodelist={node} '
                f"--job-name=replica{i // 4}-node{i % 4}-{node} --unbuffered {export} "
                "--gres=gpu:8 --cpu-bind=none --input=none sh -c ") in line  # fmt: skip
        script = shlex.split(line.split(" sh -c ", 1)[1])[0]
        assert script.startswith("exec /opt/sglang/venv/bin/python -m sglang.launch_server ")
        head = "10.0.0.1" if i < 4 else "10.0.0.5"  # each replica's first node
        assert f"--dist-init-addr {head}:5757 --host 10.0.0.{i + 1} --port 30001" in script
    router = steps[8]
    assert "--nodelist=node601 --job-name=router --unbuffered --export=PATH," in router
    assert "--gres" not in router  # the router takes no GPU
    assert "smg.launch_router --worker-urls http://10.0.0.1:30001 " \
           "http://10.0.0.5:30001" in router  # fmt: skip


def test_a_router_on_the_submit_host_runs_here_and_is_not_allocated(tmp_path):
    cluster = load_cluster(_edited(tmp_path, slurm={"router": "submit_host"}))
    plan = plan_deployment(cluster, cluster.layout("pp8"))
    assert plan.router.node.name == SUBMIT_HOST and plan.router.bind_addr == "127.0.0.1"
    text = describe(plan).splitlines()
    assert "--nodelist=node601,node602,node603,node604,node605,node606,node607,node608 " in text[3]
    assert SUBMIT_HOST not in text[3]
    i = text.index("# router on here, the submit host (addr 127.0.0.1)")
    assert text[i + 1].startswith("/opt/sglang/venv/bin/python -m smg.launch_router")


def test_flags_map_to_salloc_and_srun(tmp_path):
    slurm = {"gres": None, "gpus_per_node": 8, "reservation": "bench", "exclusive": False,
             "salloc_args": ["--qos=high"], "srun_args": [], "queue_timeout_s": None}  # fmt: skip
    config = load_cluster(_edited(tmp_path, slurm=slurm, startup_timeout_s=600)).slurm
    argv = salloc_argv(config, "j", ["a", "b"])
    assert argv == ["salloc", "--no-shell", "--job-name=j", "--nodes=2", "--nodelist=a,b",
                    "--time=04:00:00", "--immediate=600", "--gpus-per-node=8",
                    "--partition=gpu", "--account=llm-perf", "--constraint=rtx6000d",
                    "--reservation=bench", "--qos=high"]  # fmt: skip
    assert srun_argv(config, "7", "a", "n", resources=False, export=["TOKEN"]) == [
        "srun", "--jobid=7", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=a",
        "--job-name=n", "--unbuffered",
        "--export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR,TOKEN"]  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"executor": "ssh"}, "slurm", "only used with executor: slurm"),
        ({"network": {"client": "on_node"}}, "network.client",
         "executor: slurm runs the benchmark client here"),
        ({"server": {"port": "auto"}}, "server.port",
         "a slurm cluster needs fixed ports, not 'auto'"),
    ],
)
def test_what_a_slurm_cluster_file_refuses_names_the_field(tmp_path, changes, field, says):
    with pytest.raises(ConfigError) as info:
        load_cluster(_edited(tmp_path, **changes))
    assert f"field '{field}'" in str(info.value) and says in str(info.value)


def test_steps_do_not_inherit_a_surrounding_jobs_variables():
    """pytest may itself run inside a Slurm job: its SLURM_JOB_ID, task counts and the like
    must not shape our allocation's steps; SLURM_CONF (which cluster) is kept."""
    cluster = load_cluster(EXAMPLE)
    executor = SlurmExecutor(cluster, "run/tp32", environ={
        "SLURM_JOB_ID": "99", "SLURM_NTASKS": "64", "SRUN_CPUS_PER_TASK": "4",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "PATH": "/usr/bin"})  # fmt: skip
    try:
        assert executor._env({"A": "1"}) == {"SLURM_CONF": "/etc/slurm/slurm.conf",
                                              "PATH": "/usr/bin", "A": "1"}  # fmt: skip
        assert executor.job_name == "pytest-kimi/run/tp32"
    finally:
        executor.close()
