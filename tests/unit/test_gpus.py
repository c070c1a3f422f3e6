"""Reading nvidia-smi's CSV answers: numbers, unsupported fields, lines we cannot read."""

from __future__ import annotations

import pytest

from pytest_kimi.deploy.gpus import (
    GpuQueryError,
    parse_apps,
    parse_gpus,
    query_apps,
    query_gpus,
)

H200 = (
    "0, GPU-aaa, NVIDIA H200, 87, 120000, 143771, 612.40, 1980, 570.86.15\n"
    "1, GPU-bbb, NVIDIA H200, [N/A], 5, 143771, [Not Supported], 345, 570.86.15\n"
)


def test_gpus_are_read_with_unsupported_fields_as_none():
    first, second = parse_gpus(H200)
    assert (first.index, first.uuid, first.util_pct, first.power_w) == (0, "GPU-aaa", 87.0, 612.4)
    assert first.driver == "570.86.15" and first.mem_total_mib == 143771.0
    assert second.util_pct is None and second.power_w is None and second.sm_clock_mhz == 345.0


def test_a_line_with_the_wrong_width_names_itself():
    with pytest.raises(GpuQueryError, match="line 2 has 3 fields"):
        parse_gpus(H200.splitlines()[0] + "\n0, GPU-x, H200\n")


def test_a_non_number_is_refused_with_its_field():
    with pytest.raises(GpuQueryError, match=r"memory\.used is 'lots'"):
        parse_gpus("0, GPU-a, H200, 1, lots, 2, 3, 4, 570\n")


def test_compute_processes_are_read_and_none_is_empty():
    [proc] = parse_apps("GPU-aaa, 4242, python3, 40960\n")
    assert (proc.gpu_uuid, proc.pid, proc.name, proc.used_mib) == (
        "GPU-aaa",
        4242,
        "python3",
        40960.0,
    )
    assert parse_apps("") == [] and parse_apps("No running processes found\n") == []


def test_queries_quote_the_tool_and_ask_for_plain_csv():
    assert query_gpus(["/opt/my smi/nvidia-smi"]).startswith(
        "'/opt/my smi/nvidia-smi' --query-gpu=index,uuid"
    )
    assert query_apps(["nvidia-smi"]).endswith("--format=csv,noheader,nounits")
