"""The mock says only what SGLang says, checked without a real server at hand: for each wire
version, its info endpoints carry exactly the keys of that version's recording and its
``/metrics`` only the recorded families, types, help texts and label names.

The recordings (``pytest_kimi/mock/wire/sglang-<version>.json``) are what a real server of the
version answered (``scripts/capture_sglang_wire.py``), and
``tests/conformance/test_mock_vs_sglang.py`` holds them and every other answer of the mock
against the live server: no field list here is copied from SGLang's source. Mock-only
conveniences exist behind ``--mock-*`` flags (``--mock-replica-header``,
``--mock-server-info-extras``) and are checked to be off by default; the ``/kimi/...`` routes
are the mock's own test endpoints (extra paths; the live test checks a real server answers
404 there), never extra fields in SGLang's answers.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_kimi.mock.wire import DEFAULT_VERSION, VERSIONS, recording

pytestmark = pytest.mark.slow
# what the product reads per replica (pytest_kimi.results.replicacounters)
PRODUCT_COUNTERS = {"sglang:num_requests_total", "sglang:prompt_tokens_total",
                    "sglang:generation_tokens_total"}  # fmt: skip


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [x[6:] for x in response.text.splitlines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.fixture(scope="module", params=VERSIONS)
def server(request: pytest.FixtureRequest, start_mock) -> tuple[str, str]:
    """(version, URL) of a mock with its defaults, an unknown flag (never echoed) and
    metrics on."""
    url = start_mock("--tp-size", "8", "--enable-metrics", "--mock-time-scale", "1000",
                     "--schedule-policy", "lpm", "--mock-sglang-version", request.param).url
    return request.param, url


def test_server_info_keys_are_the_recorded_ones(server):
    version, url = server
    rec = recording(version).server_info
    for path in ("/get_server_info", "/server_info"):
        info = httpx.get(url + path, timeout=10).json()
        assert list(info) == list(rec), path  # the same keys, in SGLang's order
        assert set(info["internal_states"][0]) == set(rec["internal_states"][0])
        assert info["tp_size"] == 8 and info["enable_metrics"] is True  # the mock's own
        assert info["version"] == f"{version}-kimi-mock"


def test_model_info_keys_are_the_recorded_ones(server):
    version, url = server
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(url + path, timeout=10).json()
        assert set(info) == set(recording(version).model_info), path


def test_metrics_are_recorded_families_with_their_labels(server):
    version, url = server
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 3}}
    httpx.post(url + "/generate", json={**body, "stream": True}, timeout=30).raise_for_status()
    families = {f.name: f for f in recording(version).families}
    seen = set()
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        name = family.name + "_total" if family.type == "counter" else family.name
        known = families.get(name)
        assert known is not None, (version, name)
        assert (family.type, family.documentation) == (known.type, known.help), name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} <= set(known.labels), (name, sample.labels)
        seen.add(name)
    assert seen >= PRODUCT_COUNTERS  # what the product reads per replica is there


def test_meta_info_speaks_the_versions_names(server):
    """The renames the issue names (0.5.9 -> 0.5.23), each verified on the real servers by
    the live test: ``total_retractions`` became ``num_retractions``."""
    version, url = server
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 2}}
    meta = httpx.post(url + "/generate", json=body, timeout=30).json()["meta_info"]
    old, new = "total_retractions" in meta, "num_retractions" in meta
    assert (old, new) == ((True, False) if version == "0.5.9" else (False, True)), meta


@pytest.mark.parametrize("version", VERSIONS)
def test_the_abort_counter_appears_at_the_first_abort(start_mock, version):
    """Real SGLang creates ``num_aborted_requests_total`` at its first abort, not at start-up
    (issue 31, item 4; the recording says so, the live test checks both sides)."""
    name = "# TYPE sglang:num_aborted_requests_total counter"
    url = start_mock("--enable-metrics", "--mock-sglang-version", version).url
    assert name not in httpx.get(url + "/metrics", timeout=10).text
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 100000}, "stream": True,
            "rid": "first-abort"}  # fmt: skip
    with httpx.stream("POST", url + "/generate", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # running
        httpx.post(url + "/abort_request", json={"rid": "first-abort"}, timeout=10)
        last = [x for x in lines if x.startswith("data: {")][-1]
    assert json.loads(last[6:])["meta_info"]["finish_reason"]["type"] == "abort"
    assert name in httpx.get(url + "/metrics", timeout=10).text


def test_mock_only_conveniences_are_behind_flags(start_mock):
    """With the flags, the extras appear: so their absence above is the flags' doing."""
    server = start_mock("--mock-replica-header", "--mock-server-info-extras",
                        "--schedule-policy", "lpm")  # fmt: skip
    info = httpx.get(server.url + "/get_server_info", timeout=10).json()
    recorded = set(recording(DEFAULT_VERSION).server_info)
    assert {"unrecognized_args", "kimi_mock"} <= set(info) - recorded
    body = {"text": "a", "sampling_params": {"max_new_tokens": 2}, "stream": True}
    response = httpx.post(server.url + "/generate", json=body, timeout=10)
    assert "x-kimi-replica" in response.headers
    assert "kimi_replica" in _events(response)[0]["meta_info"]


def test_mock_only_conveniences_are_off_by_default(server):
    _, url = server
    info = httpx.get(url + "/get_server_info", timeout=10).json()
    assert not {"unrecognized_args", "kimi_mock"} & set(info)
    body = {"text": "a", "sampling_params": {"max_new_tokens": 2}, "stream": True}
    response = httpx.post(url + "/generate", json=body, timeout=10)
    assert "x-kimi-replica" not in response.headers
    assert all("kimi_replica" not in e["meta_info"] for e in _events(response))
