"""The mock's stand-in nvidia-smi: CSV for any field subset, live holders only, hold."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from pytest_kimi.config import load_cluster
from pytest_kimi.config.options import DEFAULT_CLUSTER
from pytest_kimi.deploy.gpus import (
    APP_FIELDS,
    GPU_FIELDS,
    mock_gpu_dir,
    parse_apps,
    parse_gpus,
    smi_command,
)
from pytest_kimi.mock import gpustate, nvidia_smi
from pytest_kimi.mock.gpuload import BusyWindow, kv_mib, weights_mib
from pytest_kimi.mock.perfmodel import CostModel, Profile
from pytest_kimi.mock.scheduler import ReplicaSim


def _smi(state_dir, *args: str) -> str:
    argv = [sys.executable, "-m", "pytest_kimi.mock.nvidia_smi", "--node", "n1",
            "--state-dir", str(state_dir), *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def _server(state_dir, util=0.5, mem=30000.0, gpus=8) -> gpustate.Holder:
    holder = gpustate.Holder(os.getpid(), "python3", tuple(range(gpus)), mem, util, node_gpus=gpus)
    gpustate.write_state(state_dir, holder)
    return holder


def test_the_full_query_parses_with_the_products_parser(tmp_path):
    _server(tmp_path, util=0.5, mem=30000.0)
    gpus = parse_gpus(_smi(tmp_path, "--query-gpu=" + ",".join(GPU_FIELDS),
                           "--format=csv,noheader,nounits"))  # fmt: skip
    assert [g.index for g in gpus] == list(range(8))
    first = gpus[0]
    assert first.util_pct == 50.0 and first.mem_used_mib == 30000.0
    assert first.power_w == gpustate.IDLE_W + 0.5 * (gpustate.TDP_W - gpustate.IDLE_W)
    assert first.sm_clock_mhz == gpustate.SM_BOOST_MHZ and first.driver == gpustate.DRIVER_VERSION
    assert first.uuid == nvidia_smi.gpu_uuid("n1", 0) != gpus[1].uuid
    [app, *_] = parse_apps(_smi(tmp_path, "--query-compute-apps=" + ",".join(APP_FIELDS),
                                "--format=csv,noheader,nounits"))  # fmt: skip
    assert (app.gpu_uuid, app.pid, app.name, app.used_mib) == (first.uuid, os.getpid(),
                                                                 "python3", 30000.0)  # fmt: skip


def test_fields_come_in_the_order_asked_with_header_and_units_when_asked(tmp_path):
    _server(tmp_path, util=0.0, mem=1000.0, gpus=2)
    assert _smi(tmp_path, "--query-gpu=memory.used,index", "--format=csv,noheader,nounits") == (
        "1000, 0\n1000, 1\n"
    )
    text = _smi(tmp_path, "--query-gpu=index,power.draw,clocks.sm", "--format=csv")
    assert text.splitlines() == [
        "index, power.draw [W], clocks.sm [MHz]",
        f"0, {gpustate.IDLE_W:.2f} W, {gpustate.SM_IDLE_MHZ:.0f} MHz",
        f"1, {gpustate.IDLE_W:.2f} W, {gpustate.SM_IDLE_MHZ:.0f} MHz",
    ]


def test_a_dead_servers_file_is_stale_and_ignored(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = gpustate.Holder(int(dead.stdout), "python3", (0, 1), 50000.0, 1.0, node_gpus=4)
    gpustate.write_state(tmp_path, stale)
    assert _smi(tmp_path, "--query-compute-apps=pid", "--format=csv,noheader") == ""
    used = _smi(tmp_path, "--query-gpu=memory.used", "--format=csv,noheader,nounits")
    assert used.split() == ["0"] * gpustate.DEFAULT_GPUS  # nor its node_gpus


def test_the_count_file_overrides_what_servers_say(tmp_path):
    _server(tmp_path, gpus=8)
    (tmp_path / gpustate.COUNT_FILE).write_text("4\n")
    assert len(_smi(tmp_path, "-L").splitlines()) == 4


def test_without_servers_the_node_lists_its_default_count(tmp_path):
    assert len(_smi(tmp_path, "-L").splitlines()) == gpustate.DEFAULT_GPUS
    assert len(_smi(tmp_path, "--default-gpus", "4", "-L").splitlines()) == 4


def test_q_names_driver_and_cuda(tmp_path):
    text = _smi(tmp_path, "-q", "-d", "COMPUTE")
    assert f"CUDA Version                              : {gpustate.CUDA_VERSION}" in text
    assert "Driver Version" in text and "Attached GPUs                             : 8" in text


def test_hold_holds_until_killed_and_leaves_nothing(tmp_path):
    argv = [sys.executable, "-m", "pytest_kimi.mock.nvidia_smi", "--node", "n1",
            "--state-dir", str(tmp_path), "hold", "--gpus", "3", "--mib", "40960"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"holding GPU(s) 3 as pid {proc.pid}")
        [app] = parse_apps(_smi(tmp_path, "--query-compute-apps=" + ",".join(APP_FIELDS),
                                "--format=csv,noheader,nounits"))  # fmt: skip
        assert (app.pid, app.used_mib, app.gpu_uuid) == (proc.pid, 40960.0,
                                                         nvidia_smi.gpu_uuid("n1", 3))  # fmt: skip
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    assert list(tmp_path.glob("*.json")) == []


def test_an_unknown_field_is_refused_like_nvidia_smi(tmp_path):
    argv = [sys.executable, "-m", "pytest_kimi.mock.nvidia_smi", "--node", "n1",
            "--state-dir", str(tmp_path), "--query-gpu=bogus", "--format=csv"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and '"bogus" is not a valid field' in done.stderr


def test_state_dirs_are_per_run_locally_and_per_node_over_ssh():
    local = load_cluster(DEFAULT_CLUSTER)
    node = local.nodes[0]
    assert (
        mock_gpu_dir(local, node, "run1/tp32") == "/var/tmp/pytest-kimi/mock-gpus/run1/tp32/node601"
    )
    assert mock_gpu_dir(local, node, None) is None
    ssh = dataclasses.replace(local, executor="ssh", work_dir="/scratch/k/")
    assert mock_gpu_dir(ssh, node, "run1/tp32") == "/scratch/k/mock-gpus/node601"
    argv = smi_command(ssh, node, "run1/tp32")
    assert argv[1:] == ["-m", "pytest_kimi.mock.nvidia_smi", "--node", "node601",
                        "--state-dir", "/scratch/k/mock-gpus/node601",
                        "--default-gpus", "8"]  # fmt: skip


def test_busy_window_is_the_schedulers_busy_share_of_the_window():
    sim = ReplicaSim(CostModel(Profile(), tp=8, pp=1, ep=1, gpus_per_node=8),
                     chunk_size=8192, max_running=8)  # fmt: skip
    clock = iter([0.0, 1.0, 2.0]).__next__
    window = BusyWindow(sim, time_scale=10.0, clock=clock)
    sim.add("r", 4000, 1000, 0.0)
    sim.advance(2.5)  # cluster seconds: the prefill and some decodes ran
    load = window.load()
    assert 0 < load.util <= 1 and load.util == min(1.0, sim.busy_s / 10.0)
    request = sim.requests["r"]
    assert request.finished_at is None and request.generated > 1
    assert load.kv_tokens == 4000 + request.generated
    assert window.load().util == 0.0  # nothing ran in the next window


def test_memory_model_is_weights_share_plus_kv_in_use():
    p = Profile()
    total = p.dense_params_b * 1e9 * p.dense_bytes_per_param + (
        p.experts * p.expert_params_m * 1e6 * p.layers * p.expert_bytes_per_param
    )
    assert weights_mib(p, 32, 1) * 32 * 2**20 == total
    assert kv_mib(p, 8, 1000) == p.kv_bytes_per_token * p.layers / 8 * 1000 / 2**20


def test_the_stand_in_imports_no_heavy_module():
    # stdlib only: importing the stand-in pulls in no heavy module
    heavy = "('aiohttp', 'numpy', 'httpx', 'yaml')"
    code = (
        f"import sys, pytest_kimi.mock.nvidia_smi; print([m for m in {heavy} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_zombie_holder_is_dead(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        gpustate.write_state(tmp_path, gpustate.Holder(child.pid, "python3", (0,), 1000.0))
        assert gpustate.pid_alive(child.pid) is False
        assert gpustate.read_holders(tmp_path) == []
    finally:
        child.wait()
