"""Sessions: the conversation each turn sends, think times, the files they come from and the
agentic generator."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pytest_kimi.workload.agentic import Agentic, agentic_sessions, tiny_vocabulary
from pytest_kimi.workload.conversations import read_sessions
from pytest_kimi.workload.rows import DatasetError
from pytest_kimi.workload.sessions import Session, ThinkTime, raw_text, words
from pytest_kimi.workload.stream import StreamParser, payload


def test_each_turn_sends_the_conversation_so_far_with_the_answers_returned():
    session = Session("s", ("plan the trip", "book it", "confirm"), system="you are an agent")
    assert session.messages(0, []) == [
        {"role": "system", "content": "you are an agent"},
        {"role": "user", "content": "plan the trip"},
    ]
    assert session.messages(2, ["A1", "A2"]) == [
        {"role": "system", "content": "you are an agent"},
        {"role": "user", "content": "plan the trip"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "book it"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "confirm"},
    ]
    with pytest.raises(ValueError, match="turn 2 of session s needs 2 answers"):
        session.messages(2, ["A1"])


def test_each_requests_text_begins_with_the_previous_one_and_its_answer():
    """The prefix the server's cache can reuse: request k+1 starts with request k + answer."""
    session = Session("s", ("one two", "three", "four five"), system="sys words")
    answers = ["ans one", "ans two"]
    texts = [raw_text(session.messages(k, answers[:k])) for k in range(3)]
    for k in range(2):
        assert texts[k + 1].startswith(texts[k] + "\n\n" + answers[k])
    assert words(texts[2]) == 2 + 2 + 2 + 1 + 2 + 2


def test_the_chat_api_sends_the_messages_and_the_others_the_text():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]  # fmt: skip
    assert payload("chat", "a\n\nb\n\nc", 8, "m", messages)["messages"] == messages
    assert payload("generate", "a\n\nb\n\nc", 8, "m", messages)["text"] == "a\n\nb\n\nc"
    assert payload("completions", "x", 8, "m")["prompt"] == "x"


def test_think_times_are_fixed_or_seeded_exponential():
    assert ThinkTime(2.0).draw(random.Random(1)) == 2.0
    draws = [ThinkTime(2.0, "exponential").draw(random.Random(7)) for _ in range(2)]
    assert draws[0] == draws[1] > 0  # the same seed, the same pause
    rng = random.Random(3)
    many = [ThinkTime(2.0, "exponential").draw(rng) for _ in range(4000)]
    assert sum(many) / len(many) == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError, match="expected one of fixed, exponential"):
        ThinkTime(1.0, "uniform")
    with pytest.raises(ValueError, match="expected seconds >= 0"):
        ThinkTime(-1.0)


@pytest.mark.parametrize(("api", "chunks", "answer"), [
    ("chat", [{"choices": [{"delta": {"reasoning_content": "think"}}]},
              {"choices": [{"delta": {"content": "Hello"}}]},
              {"choices": [{"delta": {"content": " world"}}],
               "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}}],
     "Hello world"),
    ("completions", [{"choices": [{"text": "Hello"}]}, {"choices": [{"text": " world"}]},
                     {"choices": [], "usage": {"prompt_tokens": 9,
                                               "prompt_tokens_details": {"cached_tokens": 4}}}],
     "Hello world"),
    ("generate", [{"text": "Hello", "meta_info": {"completion_tokens": 1, "cached_tokens": 4}},
                  {"text": "Hello world", "meta_info": {"completion_tokens": 2,
                                                        "cached_tokens": 4}}],
     "Hello world"),  # /generate's text is the whole answer so far
])  # fmt: skip
def test_the_parser_keeps_the_answer_and_the_servers_cached_tokens(api, chunks, answer):
    parser = StreamParser(api, keep_text=True)
    for chunk in chunks:
        parser.feed(chunk)
    assert parser.text == answer  # the thinking is not sent back
    assert parser.cached_tokens == 4
    quiet = StreamParser(api)
    for chunk in chunks:
        quiet.feed(chunk)
    assert quiet.text == "" and quiet.cached_tokens == 4


def test_a_server_that_says_nothing_of_its_cache_leaves_cached_tokens_unknown():
    parser = StreamParser("chat")
    parser.feed({"choices": [{"delta": {"content": "x"}}], "usage": {"prompt_tokens": 3}})
    assert parser.cached_tokens is None


def _jsonl(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sharegpt_conversations_become_sessions_of_their_human_turns(tmp_path: Path):
    path = _jsonl(tmp_path, [
        {"id": "c1", "conversations": [
            {"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "hello"}, {"from": "human", "value": "bye"},
            {"from": "gpt", "value": "ciao"}]},
        {"conversations": [{"from": "user", "value": "only"}]},
    ])  # fmt: skip
    first, second = read_sessions(path)
    assert first == Session("c1", ("hi", "bye"), "be brief")
    assert second.id == "line-2" and second.turns == ("only",) and second.system == ""


def test_speedbench_rows_of_several_turns_become_sessions(tmp_path: Path):
    path = _jsonl(tmp_path, [
        {"question_id": 7, "category": "coding", "turns": ["write it", "now test it"]},
        {"question_id": "m", "messages": [
            {"role": "system", "content": "sys"}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]},
    ])  # fmt: skip
    coding, chat = read_sessions(path)
    assert coding == Session("7", ("write it", "now test it"), "", "coding")
    assert chat == Session("m", ("q1", "q2"), "sys", "uncategorized")


@pytest.mark.parametrize(("rows", "message"), [
    ([{"conversations": [{"from": "human", "value": "a"}]}, {"turns": ["b"]}],
     "data.jsonl:2 a speedbench row in a sharegpt file"),
    ([{"conversations": [{"from": "robot", "value": "a"}]}],
     "data.jsonl:1 field 'conversations[0].from': unknown speaker 'robot'"),
    ([{"conversations": [{"from": "gpt", "value": "a"}]}],
     "data.jsonl:1 field 'conversations': no user turn"),
    ([{"conversations": [{"from": "human", "value": 3}]}],
     "data.jsonl:1 field 'conversations[0].value': expected a string, got number"),
    ([{"turns": ["a", 5]}], "data.jsonl:1 field 'turns[1]': expected a string, got number"),
    ([{"turns": ["a", "  "]}], "data.jsonl:1 field 'turns[1]': empty prompt"),
    ([{"id": "x", "conversations": [{"from": "human", "value": "a"}]},
      {"id": "x", "conversations": [{"from": "human", "value": "b"}]}],
     "data.jsonl:2 field 'id': session id 'x' again (first at line 1)"),
    ([{"prompt": "a"}], "data.jsonl:1 field 'turns': missing: a session needs"),
])  # fmt: skip
def test_a_bad_session_row_is_refused_where_it_is(tmp_path: Path, rows, message):
    with pytest.raises(DatasetError) as caught:
        read_sessions(_jsonl(tmp_path, rows))
    assert message in str(caught.value)


def test_the_agentic_generator_shares_one_system_prompt_and_sizes_each_turn():
    spec = Agentic(sessions=5, turns=4, system_prompt_tokens=300, task_tokens=40,
                   tool_result_tokens=70, seed=3)  # fmt: skip
    sessions = agentic_sessions(spec)
    assert sessions == agentic_sessions(spec)  # seeded
    assert sessions != agentic_sessions(Agentic(**{**spec.__dict__, "seed": 4}))
    assert len({s.system for s in sessions}) == 1 and words(sessions[0].system) == 300
    for session in sessions:
        assert len(session.turns) == 4 and session.category == "agentic"
        assert [words(t) for t in session.turns] == [40, 70, 70, 70]
    vocabulary = set(tiny_vocabulary())
    assert set(" ".join(sessions[0].turns).split()) <= vocabulary  # one word, one token
    assert len({s.id for s in sessions}) == 5
    with pytest.raises(ValueError, match="turns must be >= 1"):
        Agentic(turns=0)


def test_turns_a_session_never_sent_are_counted_in_the_notes():
    from pytest_kimi.results.records import RequestRecord
    from pytest_kimi.run.notes import unsent_turn_notes

    def record(i: int, warmup: bool = False) -> RequestRecord:
        return RequestRecord(index=i, prompt_id=f"p{i}", nominal_input_tokens=1,
                             max_output_tokens=1, warmup=warmup)  # fmt: skip

    sent = [record(-1, warmup=True), *[record(i) for i in range(7)]]
    assert unsent_turn_notes(9, sent) == [
        "2 of 9 session turns were not sent: a session ends at its first failed turn "
        "(the next would need its answer)"]  # fmt: skip
    assert unsent_turn_notes(7, sent) == []
