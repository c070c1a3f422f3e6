"""The mock's wire versions without a server: the recordings, the metric store that writes
``/metrics`` from them, ``meta_info`` per version and its timings, SGLang's length checks,
the cluster file's ``server.sglang_version`` reaching the mock's command line, the flags each
release refuses, and what the conformance test calls a shape."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_kimi.config import load_cluster
from pytest_kimi.config.versions import MOCK_SGLANG_VERSIONS, NEWEST_SGLANG
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.mock.args import parse_args, unrecognized
from pytest_kimi.mock.wire import DEFAULT_VERSION, VERSIONS, recording, wire_file
from pytest_kimi.mock.wire.errors import too_long
from pytest_kimi.mock.wire.info import server_info
from pytest_kimi.mock.wire.meta import Progress, Times, meta_info
from pytest_kimi.mock.wire.metrics import MetricStore
from pytest_kimi.testing.wireshape import differences, merged_away, pattern

CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"
FILL = {"model_name": "m", "pid": "1", "engine_type": "unified", "num_pages": "8",
        "page_size": "1"}  # fmt: skip
ABORTED = "sglang:num_aborted_requests_total"


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name + ("_total" if fam.type == "counter" else "")] = fam.samples
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_each_recording_is_its_versions(version):
    rec = recording(version)
    assert rec.version == version == str(rec.server_info["version"])
    names = [f.name for f in rec.families]
    assert len(names) == len(set(names))
    assert all(f.buckets[-1] == "+Inf" for f in rec.families if f.type == "histogram")


@pytest.mark.parametrize("version", VERSIONS)
def test_a_family_is_written_from_its_first_sample(version):
    store = MetricStore(recording(version), FILL)
    assert ABORTED not in _samples(store.render())  # as a ready real server: no abort yet
    store.inc(ABORTED)
    store.inc(ABORTED)
    [sample] = _samples(store.render())[ABORTED]
    assert sample.value == 2.0 and sample.labels["model_name"] == "m"


def test_a_label_the_version_lacks_is_left_out():
    requests = "sglang:num_requests_total"
    old, new = MetricStore(recording("0.5.9"), FILL), MetricStore(recording("0.5.23"), FILL)
    for store in (old, new):
        store.inc(requests, is_streaming="true")
        store.inc(requests, is_streaming="false")
    assert [s.value for s in _samples(old.render())[requests]] == [2.0]  # one series
    by_flag = {s.labels["is_streaming"]: s.value for s in _samples(new.render())[requests]}
    assert by_flag == {"false": 1.0, "true": 1.0}
    old.observe("sglang:request_time_per_output_token_seconds", 0.1)  # 0.5.23's only
    assert "sglang:request_time_per_output_token_seconds" not in old.render()


def test_inter_token_latency_is_spread_over_the_new_tokens_as_sglangs():
    store = MetricStore(recording("0.5.9"), FILL)
    store.observe_spread("sglang:inter_token_latency_seconds", 0.03, 3)  # three at 10 ms
    samples = _samples(store.render())["sglang:inter_token_latency_seconds"]
    by_name = {(s.name, s.labels.get("le")): s.value for s in samples}
    assert by_name[("sglang:inter_token_latency_seconds_sum", None)] == pytest.approx(0.03)
    assert by_name[("sglang:inter_token_latency_seconds_count", None)] == 3.0
    assert by_name[("sglang:inter_token_latency_seconds_bucket", "0.008")] == 0.0
    assert by_name[("sglang:inter_token_latency_seconds_bucket", "0.01")] == 3.0


TIMES = Times(received=100.0, dispatched=100.5, admitted=101.0, first_token=103.0,
              finished=107.0, sent=103.2, first_output=103.1)  # fmt: skip


def _meta(version: str, **progress) -> dict:
    return meta_info(version, Progress(**{"rid": "r", "prompt": 3, **progress}), TIMES, True)


def test_0_5_9_timings_are_differences_of_its_timestamps():
    last = _meta("0.5.9", generated=5, finish="length", stream=True)
    assert last["queue_time"] == 0.5 and last["prefill_launch_latency"] == 2.0
    assert last["e2e_latency"] == 7.0 and last["inference_time"] == 6.0
    assert last["decode_throughput"] == 5 / (107.0 - 103.1)
    assert (last["request_received_ts"], last["decode_finished_ts"]) == (100.0, 107.0)
    first = _meta("0.5.9", generated=1, stream=True, first_chunk=True)
    middle = _meta("0.5.9", generated=2, stream=True)
    assert first["response_sent_to_client_ts"] == 103.2
    assert "response_sent_to_client_ts" not in middle and "e2e_latency" not in middle


def test_0_5_23_names_and_rules():
    spec = {"spec_accept_token_num": 4, "spec_draft_token_num": 6, "spec_accept_histogram": [1]}
    last = _meta("0.5.23", generated=5, finish="abort", spec=spec)
    assert {"num_retractions", "spec_num_correct_drafts", "spec_num_proposed_drafts",
            "spec_correct_drafts_histogram", "weight_versions"} <= set(last)  # fmt: skip
    assert not {"total_retractions", *spec} & set(last)
    assert last["finish_reason"]["type"] == "abort"
    assert last["decode_throughput"] == 4 / (107.0 - 103.0)  # (tokens - 1) / decode time
    assert last["first_token_latency"] == 3.0
    assert "decode_throughput" not in _meta("0.5.23", generated=1, finish="length")
    assert "weight_versions" not in _meta("0.5.23", generated=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_an_abort_in_the_waiting_queue_is_the_tokenizer_managers_answer(version):
    times = Times(received=100.0, dispatched=100.5, finished=101.0, sent=101.0)
    meta = meta_info(version, Progress("r", 3, 0, "abort"), times, True)
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert meta["completion_tokens"] == 0 and meta["e2e_latency"] == 1.0
    assert not {"prompt_tokens", "queue_time", "cached_tokens"} & set(meta)


@pytest.mark.parametrize("version", VERSIONS)
def test_without_metrics_no_timing_keys(version):
    meta = meta_info(version, Progress("r", 3, 2, "length"), TIMES, False)
    assert not {"queue_time", "request_received_ts", "decode_throughput"} & set(meta)
    assert "e2e_latency" in meta


def test_sglangs_length_checks():
    assert too_long(4096, 4, 4096).startswith("The input (4096 tokens) is longer")
    assert too_long(8, 4088, 4096).startswith("Requested token count exceeds")
    assert too_long(8, 4087, 4096) is None


@pytest.mark.parametrize("version", VERSIONS)
def test_server_info_is_the_recording_with_the_mocks_values(version):
    own = {"model_path": "/models/k", "tokenizer_path": None, "tp_size": 32, "port": 1234,
           "context_length": 8192}  # fmt: skip
    info = server_info(version, own, {"max_total_num_tokens": 500, "max_running_requests": 7})
    assert list(info) == list(recording(version).server_info)
    assert (info["tp_size"], info["port"], info["tokenizer_path"]) == (32, 1234, "/models/k")
    assert info["max_total_num_tokens"] == 500 and info["max_req_input_len"] == 499 - 5
    assert info["internal_states"][0]["tp_size"] == 32


def _with_server_version(tmp_path: Path, version: str) -> Path:
    text = (CLUSTERS / "local.yaml").read_text(encoding="utf-8")
    assert "\n  model_path: builtin:mock-tokenizer" in text
    path = tmp_path / "local.yaml"
    path.write_text(text.replace("\n  model_path: builtin:mock-tokenizer",
                                 f"\n  model_path: builtin:mock-tokenizer\n  sglang_version: "
                                 f"'{version}'"), "utf-8")  # fmt: skip
    return path


def test_the_cluster_file_names_a_recorded_version(tmp_path):
    # the versions' list (no import of the mock in the product) is the recordings' list
    assert (MOCK_SGLANG_VERSIONS, NEWEST_SGLANG) == (VERSIONS, DEFAULT_VERSION)
    assert DEFAULT_VERSION == "0.5.23"  # the mock answers as the newest unless told
    assert all(wire_file(v).is_file() for v in VERSIONS)
    with pytest.raises(Exception, match=r"server\.sglang_version.*not 0\.5\.15"):
        load_cluster(_with_server_version(tmp_path, "0.5.15"))  # supported, but not recorded
    with pytest.raises(Exception, match=r"server\.sglang_version.*older than"):
        load_cluster(_with_server_version(tmp_path, "0.5.8"))
    with pytest.raises(Exception, match=r"server\.sglang_version.*not a version"):
        load_cluster(_with_server_version(tmp_path, "latest"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_plan_passes_the_version_to_every_mock_server(version, tmp_path):
    cluster = load_cluster(_with_server_version(tmp_path, version))
    assert cluster.server.sglang_version == version
    plan = plan_deployment(cluster, cluster.layout("tp32"), ports=iter(range(40000, 40100)))
    flags = [s.argv[s.argv.index("--mock-sglang-version") + 1] for s in plan.servers]
    assert flags == [version] * len(plan.servers)


def test_each_release_refuses_the_flags_its_parser_does_not_take(capsys):
    """The recorded flags are each release's own parser's (scripts/capture_sglang_wire.py):
    0.5.23 dropped the PD shape flags, which 0.5.9 takes; a flag no release has is refused by
    both, with argparse's words and exit status, as SGLang refuses it."""
    assert "--disaggregation-decode-tp" in recording("0.5.9").server_flags
    assert "--disaggregation-decode-tp" not in recording("0.5.23").server_flags
    argv = ["--model-path", "m", "--disaggregation-mode", "prefill",
            "--disaggregation-decode-tp", "32", "--enable-metrics"]  # fmt: skip
    assert unrecognized(argv, "0.5.9") == []
    assert unrecognized(argv, "0.5.23") == ["--disaggregation-decode-tp", "32"]
    assert unrecognized(["--no-such-flag=1", "--mock-seed", "3"], "0.5.9") == ["--no-such-flag=1"]
    # argparse takes a unique prefix, as SGLang's parser does (allow_abbrev); not an ambiguous one
    assert unrecognized(["--tp", "8", "--mem-frac", "0.8"], "0.5.23") == []
    assert unrecognized(["--disable-cuda", "1"], "0.5.23") == ["--disable-cuda", "1"]
    assert parse_args([*argv, "--mock-sglang-version", "0.5.9"]).disaggregation_decode_tp == 32
    with pytest.raises(SystemExit) as exited:
        parse_args([*argv, "--mock-sglang-version", "0.5.23"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "launch_server.py: error: unrecognized arguments: --disaggregation-decode-tp 32"
    )


def test_shapes_compare_keys_types_and_the_protocols_words():
    real = {"a": 1, "b": [{"c": None}], "object": "chat.completion", "d": 1.0}
    mock = {"a": 1.5, "b": [{"c": None, "e": 0}], "object": "text_completion"}
    found = {d.path: (d.real, d.mock) for d in differences(real, mock)}
    assert set(found) == {"$.a", "$.b[0].e", "$.object", "$.d"}
    assert found["$.b[0].e"][0] == "(no such key)" and found["$.d"][1] == "(no such key)"
    assert differences({"x": "one"}, {"x": "two"}) == []  # a value, not a shape
    assert differences([], [1]) and not differences([1, 2], [3])


def test_stream_patterns_allow_only_what_merging_gives():
    first, middle = {"t": "x", "s": 1.0}, {"t": "x"}
    last = {"t": "x", "finish_reason": "length"}
    mock = pattern([first, middle, middle, middle, last, "[DONE]"])
    assert mock == pattern([first, middle, last, "[DONE]"])  # counts collapse
    assert merged_away(pattern([first, last, "[DONE]"]), mock)  # middle merged away
    assert not merged_away(pattern([middle, first, last, "[DONE]"]), mock)  # order matters
    assert not merged_away(pattern([first, middle]), mock)  # the end is never merged away
    other = {"t": "x", "finish_reason": "abort"}  # the protocol's words are the shape
    assert pattern(["[DONE]"]) != pattern(["{not json"])
    assert not merged_away(pattern([first, other, "[DONE]"]), mock)


def _capture_script():
    path = Path(__file__).resolve().parents[2] / "scripts" / "capture_sglang_wire.py"
    spec = importlib.util.spec_from_file_location("capture_sglang_wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


READY = """# HELP sglang:g A gauge.
# TYPE sglang:g gauge
sglang:g{gt="0",le="1",model_name="/m",pid="7"} 3.0
# HELP sglang:h A histogram.
# TYPE sglang:h histogram
sglang:h_bucket{le="0.5",model_name="/m"} 1.0
sglang:h_bucket{le="+Inf",model_name="/m"} 1.0
sglang:h_sum{model_name="/m"} 0.2
sglang:h_count{model_name="/m"} 1.0
"""
FINAL = READY + """# HELP sglang:c_total A counter.
# TYPE sglang:c_total counter
sglang:c_total{model_name="/m"} 1.0
"""


def test_the_capture_records_families_with_placeholders():
    families = {f["name"]: f for f in _capture_script().metric_families(READY, FINAL)}
    assert list(families) == ["sglang:g", "sglang:h", "sglang:c_total"]
    gauge, hist, counter = families.values()
    # a gauge's own "le" label is a label; the placeholders are the run's values
    assert gauge["ready"] == [{"gt": "0", "le": "1", "model_name": "{model_name}",
                               "pid": "{pid}"}] and gauge["values"] == [3.0]  # fmt: skip
    assert hist["buckets"] == ["0.5", "+Inf"] and hist["labels"] == ["model_name"]
    assert hist["ready"] == [{"model_name": "{model_name}"}]
    assert counter["ready"] == [] and counter["seen"] == [{"model_name": "{model_name}"}]


def test_thinking_tokens_are_counted_in_usage_as_each_version_counts_them():
    from pytest_kimi.mock.wire.openai_shapes import usage

    new = usage("0.5.23", 5, 8, reasoning=3)
    assert new["reasoning_tokens"] == 3
    assert new["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert usage("0.5.23", 5, 8)["completion_tokens_details"] is None  # set only when some
    old = usage("0.5.9", 5, 8, reasoning=3)
    assert old["reasoning_tokens"] == 0 and "completion_tokens_details" not in old
