"""Workload points: option values are typed and checked, every combination is a point in the
order a layout serves them, and only the settings that vary name a point."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pytest_kimi.config import WorkloadConfig
from pytest_kimi.config.points import Point, PointError, parse_values, part, points

WORKLOAD = WorkloadConfig(
    dataset="d.jsonl", num_requests=40, input_len=16384, output_len=512, concurrency=8,
    warmup_requests=1, api="generate", seed=0, category=None, request_timeout_s=60.0,
    request_rate=math.inf,
)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "text", "values"),
    [
        ("concurrency", "1,8, 32", [1, 8, 32]),
        ("request_rate", "2.5,inf", [2.5, math.inf]),
        ("num_requests", "16", [16]),
        ("api", "chat,generate", ["chat", "generate"]),
        ("category", "low_entropy", ["low_entropy"]),
    ],
)
def test_values_are_typed(name: str, text: str, values: list) -> None:
    assert parse_values(name, text) == values


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("concurrency", "1,,8", "--kimi-concurrency '1,,8': an empty value"),
        ("concurrency", "0", "--kimi-concurrency: '0' is not a positive whole number"),
        ("concurrency", "2.5", "--kimi-concurrency: '2.5' is not a positive whole number"),
        ("num_requests", "x", "--kimi-num-prompts: 'x' is not a positive whole number"),
        ("request_rate", "-1", "--kimi-request-rate: '-1' is not a positive number"),
        ("request_rate", "nan", "--kimi-request-rate: 'nan' is not a positive number"),
        ("output_len", "", "--kimi-output-len '': an empty value"),
    ],
)
def test_bad_values_name_the_option(name: str, text: str, message: str) -> None:
    with pytest.raises(PointError) as info:
        parse_values(name, text)
    assert str(info.value).startswith(message)


def test_every_combination_concurrency_fastest_and_only_varied_settings_name_points() -> None:
    found = points({"concurrency": [4, 8], "output_len": [512, 1024], "num_requests": [16]})
    assert [p.id for p in found] == ["c4-out512", "c8-out512", "c4-out1k", "c8-out1k"]
    assert found[1].describe() == {"concurrency": 8, "num_requests": 16, "output_len": 512}


def test_a_point_sets_its_settings_over_the_workload() -> None:
    [point] = points({"concurrency": [2], "request_rate": [math.inf]})
    assert point.id == ""  # one value each: nothing varies, the layout alone names it
    assert point.apply(WORKLOAD) == replace(WORKLOAD, concurrency=2)
    assert point.describe() == {"concurrency": 2, "request_rate": "inf"}


def test_a_run_without_a_sweep_has_one_unnamed_point() -> None:
    assert Point().id == "" and Point().apply(WORKLOAD) == WORKLOAD


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [("concurrency", 32, "c32"), ("request_rate", 2.5, "r2.5"), ("request_rate", math.inf, "rinf"),
     ("input_len", 16384, "in16k"), ("output_len", 500, "out500"), ("api", "chat", "chat")],
)  # fmt: skip
def test_id_parts(name: str, value: object, text: str) -> None:
    assert part(name, value) == text


def test_a_value_given_twice_is_refused() -> None:
    with pytest.raises(PointError, match=r"--kimi-concurrency \(or workload.concurrency\): "
                       "a value is given twice"):
        points({"concurrency": [8, 8]})  # fmt: skip


@pytest.mark.parametrize("category", ["a/b", "high entropy", "x-y"])
def test_a_value_that_cannot_name_a_folder_is_refused(category: str) -> None:
    with pytest.raises(PointError, match="cannot name a point's folder"):
        points({"category": [category, "mixed"]})


def test_close_rates_get_their_own_ids() -> None:
    assert part("request_rate", 2.5) != part("request_rate", 2.5000001)
