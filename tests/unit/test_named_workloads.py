"""Named workloads (``workloads:`` in the cluster file, ``--kimi-workload``): each over the
file's ``workload``, and the sessions they read or generate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimi.config import ConfigError, load_cluster
from pytest_kimi.config.inputs import UsageProblem, load_inputs
from pytest_kimi.config.options import Options
from pytest_kimi.mock.tokenizer_files import TOKENIZER_DIR

CLUSTER = """\
name: t
nodes:
  - {name: n1, host: 127.0.0.1, gpus: 8}
deployment: {replicas: 1, nodes_per_replica: 1}
layouts:
  tp8: {tp: 8}
server:
  model_path: builtin:mock-tokenizer
router: {}
workload:
  dataset: builtin:speedbench16k
  num_requests: 2
  input_len: 16
  output_len: 8
  concurrency: 1
  warmup_requests: 0
"""


def cluster_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER + extra)
    return path


def options(path: Path, **kw: object) -> Options:
    return Options(path, (), path.parent / "reports", **kw)  # type: ignore[arg-type]

NAMED = """\
workloads:
  agentic:
    kind: agentic
    num_requests: 3
    concurrency: 2
    turns: 4
    system_prompt_tokens: 50
    task_tokens: 10
    tool_result_tokens: 20
    think_time: {seconds: 1.5, kind: exponential}
  chats:
    kind: sessions
    dataset: chats.jsonl
    api: chat
"""


def _chats(folder: Path) -> Path:
    path = folder / "chats.jsonl"
    rows = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"hi {i}"},
                                              {"from": "gpt", "value": "hello"},
                                              {"from": "human", "value": "bye"}]}
            for i in range(4)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_named_workload_gives_its_settings_over_the_files_workload(tmp_path: Path) -> None:
    cluster = load_cluster(cluster_file(tmp_path, NAMED))
    assert cluster.workload.kind == "requests" and cluster.workload.name is None
    agentic = cluster.named_workload("agentic")
    assert (agentic.name, agentic.kind, agentic.sessions) == ("agentic", "agentic", True)
    assert (agentic.num_requests, agentic.concurrency, agentic.turns) == (3, 2, 4)
    assert (agentic.think_time_s, agentic.think_time_kind) == (1.5, "exponential")
    assert (agentic.output_len, agentic.input_len) == (8, 16)  # the file's workload's
    assert cluster.named_workload("chats").api == "chat"


def test_an_unknown_or_malformed_named_workload_is_refused_with_its_place(tmp_path) -> None:
    cluster = load_cluster(cluster_file(tmp_path, NAMED))
    with pytest.raises(ConfigError, match="unknown workload 'agent'; this cluster file names: "
                                          "agentic, chats"):  # fmt: skip
        cluster.named_workload("agent")
    bad = "workloads:\n  a: {kind: chatty}\n"
    with pytest.raises(ConfigError) as caught:
        load_cluster(cluster_file(tmp_path, bad))
    assert "workloads.a.kind" in str(caught.value)
    assert "requests, sessions, agentic" in str(caught.value)


def test_kimi_workload_picks_generated_or_read_sessions(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, NAMED)
    inputs = load_inputs(options(path, workload="agentic"))
    assert inputs.workload is not None and inputs.workload.prompts == ()
    assert [len(s.turns) for s in inputs.workload.sessions] == [4] * 3  # warm-up 0
    assert inputs.workload.manifest()["session_ids"] == [s.id for s in inputs.workload.sessions]
    _chats(tmp_path)
    chats = load_inputs(options(path, workload="chats")).workload
    assert chats is not None and len(chats.sessions) == 2
    assert all(s.turns[1] == "bye" for s in chats.sessions)
    with pytest.raises(UsageProblem, match="unknown workload 'nope'"):
        load_inputs(options(path, workload="nope"))


def test_sessions_are_sent_in_the_chat_template_on_generate(tmp_path: Path) -> None:
    named = NAMED.replace("    api: chat\n", "    prompt: chat_template\n")
    path = cluster_file(tmp_path, named)
    _chats(tmp_path)
    chats = load_inputs(options(path, workload="chats", tokenizer=str(TOKENIZER_DIR))).workload
    assert chats is not None and chats.chat_template is not None
    assert chats.construction.applied == "chat_template"
    text = chats.chat_template.render(chats.sessions[0].messages(1, ["hello"]))
    assert text.index("hi ") < text.index("hello") < text.index("bye")


def test_an_arrival_list_times_the_sessions_of_a_named_workload(tmp_path: Path) -> None:
    """``arrivals:`` beside the cluster file: each session starts at its row's timestamp
    after the first's (ms), divided by ``trace_speed``, and the list is one of the files."""
    (tmp_path / "arrivals.jsonl").write_text(
        "".join(json.dumps({"timestamp": t}) + "\n" for t in (500, 1500, 4500, 9999)))
    timed = NAMED.replace("    kind: agentic\n", "    kind: agentic\n    arrivals: arrivals.jsonl\n"
                          "    trace_speed: 2\n", 1)  # fmt: skip
    path = cluster_file(tmp_path, timed)
    assert load_cluster(path).named_workload("agentic").arrivals == tmp_path / "arrivals.jsonl"
    inputs = load_inputs(options(path, workload="agentic"))
    assert inputs.workload is not None
    assert inputs.workload.arrivals_s == (0.0, 0.5, 2.0)  # three sessions, the fourth unread
    assert inputs.workload.files[-1].path == tmp_path / "arrivals.jsonl"


@pytest.mark.parametrize("entry, problem", [
    ("{kind: trace, arrivals: a.jsonl}", "a trace brings its own timestamps"),
    ("{arrivals: a.jsonl, request_rate: 5}", "leave request_rate at inf"),
])  # fmt: skip
def test_an_arrival_list_is_refused_where_it_cannot_time_the_workload(tmp_path, entry, problem):
    with pytest.raises(ConfigError) as caught:
        load_cluster(cluster_file(tmp_path, f"workloads:\n  w: {entry}\n"))
    assert "workloads.w.arrivals" in str(caught.value) and problem in str(caught.value)
