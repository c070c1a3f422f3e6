"""``network.client: on_node``: the client on a node, its events followed and its clock moved
(:mod:`pytest_kimi.deploy.clientnode`, :mod:`pytest_kimi.workload.onnode`), the YAML that
asks for it, and the pre-flight probe it adds. The real process runs in
``tests/integration/test_client_on_node.py`` and over SSH in ``tests/ssh/test_ssh_bastion.py``."""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from io import BytesIO
from pathlib import Path

import pytest
from test_config import BASE, edit, load_error, write

from pytest_kimi.config import Node, load_cluster
from pytest_kimi.deploy import network
from pytest_kimi.deploy.clientnode import (
    ClientNodeError,
    NodeClient,
    Stream,
    complete_lines,
    measure_offset,
    package_zip,
    shifted,
)
from pytest_kimi.deploy.plan import plan_deployment
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.workload.client import ClientOptions, RequestSpec
from pytest_kimi.workload.onnode import EventWriter, read_spec, spec_json
from pytest_kimi.workload.prompts import ChatTemplate
from pytest_kimi.workload.sessions import Session, ThinkTime

ON_NODE = BASE + "network:\n  client: on_node\n  client_node: n3\n"
NODE = Node(name="n3", host="10.0.0.3", gpus=8)
CLUSTERS = Path(__file__).resolve().parents[2] / "clusters"


# ----------------------------------------------------------------------------- the YAML


def test_on_node_defaults_to_the_routers_node_and_the_servers_python(tmp_path: Path) -> None:
    cfg = load_cluster(write(tmp_path, BASE + "network:\n  client: on_node\n"))
    assert cfg.network.client == "on_node"
    assert cfg.network.client_node == "n1"  # router.node in BASE
    assert cfg.network.client_python == (cfg.server.python,)
    cfg = load_cluster(write(tmp_path, ON_NODE + "  client_python: [/opt/venv/bin/python]\n"))
    assert cfg.network.client_node == "n3"
    assert cfg.network.client_python == ("/opt/venv/bin/python",)


@pytest.mark.parametrize(
    ("text", "field", "said"),
    [
        (edit("client_node: n3", "client_node: n9", ON_NODE), "network.client_node",
         "'n9' is not one of the nodes"),
        (BASE + "network:\n  client_node: n3\n", "network.client_node",
         "only used with network.client: on_node"),
        (BASE + "network:\n  client: ssh_forward\n  client_python: [python3]\n",
         "network.client_python", "only used with network.client: on_node"),
        (edit("server:\n", "server:\n  container: {runtime: docker, name: sgl}\n", ON_NODE),
         "network.client_python", "the servers run in a container"),
    ],
)  # fmt: skip
def test_on_node_settings_that_cannot_work_name_the_field(tmp_path, text, field, said) -> None:
    _, message = load_error(tmp_path, text)
    assert f"field '{field}'" in message and said in message, message


def test_the_client_node_probes_the_router_before_launch() -> None:
    cfg = load_cluster(CLUSTERS / "pro6000.yaml")  # router on node601, addresses 10.0.0.x
    on_node = dataclasses.replace(cfg.network, client="on_node", client_node="node606")
    plan = plan_deployment(dataclasses.replace(cfg, network=on_node), cfg.layout("tp32"))
    whats = {(p.source.name if p.source else None, p.target.name, p.addr, p.port): p.what
             for p in network.probes(plan)}  # fmt: skip
    assert "for the benchmark client" in whats[("node606", "node601", "10.0.0.1", 30000)]
    assert (None, "node601", "10.0.0.1", 30000) in whats  # the control plane still reaches it
    # the client on the router's own node needs no probe of its own
    on_router = dataclasses.replace(on_node, client_node="node601")
    plan = plan_deployment(dataclasses.replace(cfg, network=on_router), cfg.layout("tp32"))
    assert not [p for p in network.probes(plan) if "benchmark client" in p.what]


# ----------------------------------------------------------------------------- the stream


def test_complete_lines_leave_a_line_being_written_and_count_utf8_bytes() -> None:
    text = '{"a": "ü"}\n{"b": 1}\n{"c":'
    lines, used = complete_lines(text)
    assert lines == ['{"a": "ü"}', '{"b": 1}']
    assert used == len('{"a": "ü"}\n{"b": 1}\n'.encode())  # ü is two bytes
    assert complete_lines('{"c":') == ([], 0)


def _events(records: list[RequestRecord]) -> list[str]:
    """What the node writes for ``records``, through the node's own writer."""
    buf = _Buf()
    out = EventWriter(buf)  # type: ignore[arg-type]
    out.event("clock", monotonic=1000.0)
    for record in records:
        out.started(record)
    for record in records:
        out.done(record)
    out.event("end")
    return buf.text.splitlines()


class _Buf:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def _record(index: int, warmup: bool = False) -> RequestRecord:
    return RequestRecord(index, f"p{index}", 16384, 512, send_time=1000.0 + index,
                         start_time=999.5 + index, first_token_time=1001.0 + index,
                         end_time=1010.0 + index, chunks=[Chunk(1001.0 + index, 1)],
                         completion_tokens=512, success=True, warmup=warmup,
                         first_answer_time=1001.0 + index)  # fmt: skip


def test_the_stream_fills_the_started_record_in_place_on_this_machines_clock() -> None:
    started, done = [], []
    stream = Stream(started.append, done.append, offset=900.0)  # node clock 900 s ahead
    sent = [_record(-1, warmup=True), _record(1), _record(0)]
    lines = _events(sent)
    stream.feed(lines[:4])  # the clock and three starts
    assert stream.node_clock == 1000.0 and len(started) == 3 and not done
    assert started[1].end_time is None and not started[1].success  # in flight
    stream.feed(lines[4:])
    assert stream.ended
    assert [id(r) for r in done] == [id(r) for r in started]  # the same objects, filled in
    one = next(r for r in done if r.index == 1)
    assert one.success and one.completion_tokens == 512
    assert one.send_time == pytest.approx(101.0) and one.end_time == pytest.approx(111.0)
    assert one.chunks == [Chunk(pytest.approx(102.0), 1)]
    # durations are the node's own: moving the clock changes none
    assert one.end_time - one.send_time == pytest.approx(10.0)
    assert [(r.index, r.warmup) for r in stream.in_order()] == [(-1, True), (0, False),
                                                                (1, False)]  # fmt: skip


def test_shifted_keeps_unset_times_unset() -> None:
    record = shifted(RequestRecord(0, "p", 1, 1, send_time=5.0), 2.0)
    assert record.send_time == 3.0 and record.first_token_time is None and record.end_time is None


def test_shifted_moves_every_time_a_record_holds() -> None:
    names = [f.name for f in dataclasses.fields(RequestRecord) if f.name.endswith("_time")]
    record = RequestRecord(0, "p", 1, 1, chunks=[Chunk(10.0, 1)])
    for k, name in enumerate(names):
        setattr(record, name, 10.0 + k)
    moved = shifted(record, 2.0)
    assert {name: getattr(moved, name) for name in names} == {
        name: 8.0 + k for k, name in enumerate(names)
    }
    assert moved.chunks == [Chunk(8.0, 1)]


def test_the_spec_file_carries_requests_and_options_both_ways(tmp_path: Path) -> None:
    options = ClientOptions(api="chat", output_len=7, concurrency=3, seed=4)
    reqs, warm = [RequestSpec("a", "text ü", 16)], [RequestSpec("w", "warm", 16)]
    path = tmp_path / "spec.json"
    path.write_text(spec_json("http://10.0.0.1:30000", options, reqs, warm))
    assert read_spec(path) == ("http://10.0.0.1:30000", options, reqs, warm)
    assert math.isinf(read_spec(path)[1].request_rate)  # inf survives JSON (Infinity)


def test_the_spec_file_carries_sessions_think_times_and_the_template(tmp_path: Path) -> None:
    template = ChatTemplate(tmp_path / "tokenizer_config.json",
                            "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
                            {"bos_token": "<s>"})  # fmt: skip
    options = ClientOptions(api="generate", think_time=ThinkTime(0.5, "exponential"),
                            chat_template=template)  # fmt: skip
    sessions = [Session("a", ("one", "two ü"), "sys", "agentic"), Session("b", ("x",))]
    path = tmp_path / "spec.json"
    path.write_text(spec_json("http://10.0.0.1:30000", options, sessions, []))
    assert read_spec(path) == ("http://10.0.0.1:30000", options, sessions, [])
    assert read_spec(path)[1].render([{"role": "user", "content": "hi"}]) == "<user>hi"


def test_the_shipped_zip_holds_the_client_and_its_imports() -> None:
    names = set(zipfile.ZipFile(BytesIO(package_zip())).namelist())
    for module in ("__init__", "workload/onnode", "workload/client", "results/records",
                   "workload/transport", "workload/abort", "results/files"):  # fmt: skip
        assert f"pytest_kimi/{module}.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]


# ----------------------------------------------------------------------------- the clock


class _Clocked:
    """A node whose monotonic clock is ``ahead`` of ours, with a round trip of ``trip`` s."""

    def __init__(self, ahead: float, trip: float, answer: str | None = None) -> None:
        self.now, self.ahead, self.trip, self.answer = 50.0, ahead, trip, answer

    def clock(self) -> float:
        return self.now

    def run(self, node: Node, command: str, timeout: float | None = None) -> tuple[int, str]:
        self.now += self.trip / 2
        there = self.now + self.ahead
        self.now += self.trip / 2
        return (0, f"{there!r}\n") if self.answer is None else (127, self.answer)


def test_the_offset_is_measured_with_half_the_round_trip_as_its_error() -> None:
    node = _Clocked(ahead=1234.5, trip=0.04)
    offset = measure_offset(node, NODE, ["python3"], node.clock)  # type: ignore[arg-type]
    assert offset.seconds == pytest.approx(1234.5) and offset.uncertainty_s == pytest.approx(0.02)


def test_a_client_python_that_does_not_run_is_named() -> None:
    node = _Clocked(0, 0.01, answer="sh: 1: /opt/nope/python: not found\n")
    with pytest.raises(ClientNodeError, match=r"node n3: the client's Python \(/opt/nope/python\)"):
        measure_offset(node, NODE, ["/opt/nope/python"], node.clock)  # type: ignore[arg-type]


def test_event_lines_are_json_the_harness_reads() -> None:
    lines = _events([_record(0)])
    assert [json.loads(line)["event"] for line in lines] == ["clock", "start", "done", "end"]


def test_an_event_line_is_one_ascii_line_whatever_the_record_holds() -> None:
    buf = _Buf()
    record = _record(0)
    record.error = "upstream said: caf\u00e9 \u2028 broken"  # orjson would keep these raw
    EventWriter(buf).done(record)  # type: ignore[arg-type]
    assert buf.text.isascii() and buf.text.count("\n") == 1
    lines, used = complete_lines(buf.text)
    assert used == len(buf.text) and len(lines) == 1
    assert json.loads(lines[0])["record"]["error"] == record.error


def test_a_line_separator_inside_an_event_does_not_end_it() -> None:
    text = '{"a": "x\u2028y"}\n'
    assert complete_lines(text) == (['{"a": "x\u2028y"}'], len(text.encode()))


def test_a_request_still_in_flight_sits_where_it_was_sent() -> None:
    started: list[RequestRecord] = []
    stream = Stream(started.append, lambda record: None, offset=900.0)
    stream.feed(['{"event": "start", "index": 0, "prompt_id": "p", "nominal_input_tokens": 1, '
                 '"max_output_tokens": 1, "warmup": false, "t": 1000.5}'])  # fmt: skip
    assert started[0].send_time == pytest.approx(100.5) and started[0].end_time is None


def test_a_client_python_older_than_3_11_is_named() -> None:
    node = _Clocked(0, 0.01, answer="Python 3.10: the client needs 3.11 or later\n")
    with pytest.raises(ClientNodeError, match=r"Python 3\.10: the client needs 3\.11 or later"):
        measure_offset(node, NODE, ["python3.10"], node.clock)  # type: ignore[arg-type]


def test_an_abort_tripped_before_the_run_sends_nothing() -> None:
    from pytest_kimi.workload.abort import Abort, RunAborted

    abort = Abort()
    abort.trip("watchdog: replica1-node1 lost")
    nothing = _Nothing()
    client = NodeClient(nothing, NODE, ["python3"], "/w", "http://10.0.0.1:30000",  # type: ignore[arg-type]
                        nothing.start)  # fmt: skip
    with pytest.raises(RunAborted, match="replica1-node1 lost"):
        client.run([RequestSpec("a", "t", 1)], ClientOptions(), abort=abort)
    assert nothing.calls == []


class _Nothing:
    """An executor that records every call (there must be none)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append(name)
            raise AssertionError(f"{name} called")

        return call
