"""Tokens per chunk as real SGLang streams them: merged tokens, tokens with no text.

Real SGLang (0.5.9 and 0.5.23 on a CPU) merges tokens into one chunk at times (27 chunks for
32 tokens), and a random-weight model emits special tokens that decode to no text. Every
token the server counted must land in exactly one chunk, or ITL loses samples.
"""

from __future__ import annotations

import asyncio
import json

from pytest_kimi.results.metrics import unplaced_token_notes
from pytest_kimi.results.records import Chunk, RequestRecord
from pytest_kimi.workload.stream import StreamParser, payload, read_events


def _gen(text: str, done: int) -> dict:
    return {"text": text, "meta_info": {"id": "r1", "prompt_tokens": 5,
                                        "completion_tokens": done}}  # fmt: skip


def _completion(text: str | None, done: int | None) -> dict:
    choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": None}]
    usage = None if done is None else {"prompt_tokens": 5, "completion_tokens": done,
                                       "total_tokens": 5 + done}  # fmt: skip
    return {"id": "c1", "object": "text_completion", "choices": choices, "usage": usage}


def test_openai_requests_ask_for_a_count_in_every_chunk() -> None:
    for api in ("completions", "chat"):
        options = payload(api, "w1 w2", 8, "m")["stream_options"]
        assert options == {"include_usage": True, "continuous_usage_stats": True}
    assert "stream_options" not in payload("generate", "w1 w2", 8, "m")


def test_merged_completion_tokens_are_counted_by_the_usage_in_each_chunk() -> None:
    parser = StreamParser("completions")
    fed = [parser.feed(e) for e in (
        _completion(" a", 1), _completion(" b c", 3), _completion(" d", 4),
        _completion("", 4), _completion(None, 4),
    )]  # fmt: skip
    assert [tokens for tokens, _ in fed] == [1, 2, 1, 0, 0]
    assert parser.completion_tokens == 4 and parser.unstreamed() == 0


def test_a_generate_token_without_text_comes_with_the_next_chunk() -> None:
    # the first token decoded to "" (a special token): counted by the server, no text yet
    parser = StreamParser("generate")
    fed = [parser.feed(e) for e in (_gen("", 1), _gen(" a", 2), _gen(" a b", 3))]
    assert [tokens for tokens, _ in fed] == [0, 2, 1]
    assert sum(tokens for tokens, _ in fed) == parser.completion_tokens == 3


def test_an_openai_token_without_text_comes_with_the_next_chunk() -> None:
    parser = StreamParser("completions")
    fed = [parser.feed(e) for e in (
        _completion(" a", 1), _completion("", 2), _completion(" b", 3),
    )]  # fmt: skip
    assert [tokens for tokens, _ in fed] == [1, 0, 2]


def test_tokens_counted_after_the_last_text_are_unstreamed() -> None:
    parser = StreamParser("completions")
    for event in (_completion(" a", 1), _completion(" b", 2), _completion("", 3),
                  _completion(None, 3)):  # fmt: skip
        parser.feed(event)
    assert parser.unstreamed() == 1


def test_without_counts_per_chunk_nothing_is_placed_at_the_end() -> None:
    # a server that ignores continuous_usage_stats: one token per text chunk, then a total;
    # the difference may be merged tokens anywhere, so it is not invented into a chunk
    parser = StreamParser("completions")
    for event in (_completion(" a", None), _completion(" b c", None), _completion(None, 3)):
        parser.feed(event)
    assert parser.completion_tokens == 3 and parser.unstreamed() == 0


class _Response:
    """What :func:`read_events` reads of an httpx response: its body, in given reads."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads
        self.extensions: dict = {}

    async def aiter_bytes(self):
        for data in self.reads:
            yield data


class _Holds:
    def first_token(self) -> None: ...

    def done(self) -> None: ...


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def test_a_trailing_token_without_text_is_a_last_chunk_at_its_count() -> None:
    times = iter([1.0, 2.0, 3.0, 4.0])
    reads = [
        _sse(_completion(" a", 1)),
        _sse(_completion(" b", 2)),
        _sse(_completion("", 3), _completion(None, 3)),  # the last token had no text
        b"data: [DONE]\n\n",
    ]
    record = RequestRecord(index=0, prompt_id="p", nominal_input_tokens=5, max_output_tokens=3)
    parser = StreamParser("completions")
    done = asyncio.run(read_events(_Response(reads), parser, record, lambda: next(times),
                                    _Holds()))  # fmt: skip
    assert done == 4.0
    assert [(c.time, c.tokens) for c in record.chunks] == [(1.0, 1), (2.0, 1), (3.0, 1)]
    assert sum(c.tokens for c in record.chunks) == parser.completion_tokens == 3


def _done(chunks: list[int], completion: int) -> RequestRecord:
    record = RequestRecord(index=0, prompt_id="p", nominal_input_tokens=5,
                           max_output_tokens=completion)  # fmt: skip
    record.chunks = [Chunk(float(i), n) for i, n in enumerate(chunks)]
    record.completion_tokens, record.success = completion, True
    return record


def test_tokens_no_chunk_count_holds_are_said_with_their_number() -> None:
    # behind a router that drops continuous_usage_stats: 16 chunks with text for 32 tokens
    records = [_done([1] * 16, 32), _done([1] * 32, 32)]
    [note] = unplaced_token_notes(records)
    assert note.startswith("ITL: 16 of 64 output tokens (1 of 2 requests) arrived in chunks")
    assert unplaced_token_notes([_done([1, 2, 1], 4)]) == []  # every token placed: no note


def _chat(delta: dict, done: int) -> dict:
    usage = {"prompt_tokens": 5, "completion_tokens": done, "reasoning_tokens": 0}
    return {"id": "c1", "choices": [{"index": 0, "delta": delta}], "usage": usage}


def test_a_step_that_ends_the_thinking_gives_the_answer_its_first_token_time() -> None:
    # SGLang splits a step holding the end of the thinking and the start of the answer into a
    # reasoning chunk and a content chunk with the same count (continuous_usage_stats)
    times = iter([1.0, 2.0, 3.0, 4.0, 5.0])
    reads = [
        _sse(_chat({"reasoning_content": " a b c"}, 3)),
        _sse(_chat({"reasoning_content": " d e"}, 7)),
        _sse(_chat({"content": " f g"}, 7)),
        _sse(_chat({"content": " h"}, 8)),
        b"data: [DONE]\n\n",
    ]
    record = RequestRecord(index=0, prompt_id="p", nominal_input_tokens=5, max_output_tokens=8)
    parser = StreamParser("chat")
    asyncio.run(read_events(_Response(reads), parser, record, lambda: next(times), _Holds()))
    assert (record.first_token_time, record.first_answer_time) == (1.0, 3.0)
    assert [(c.time, c.tokens) for c in record.chunks] == [(1.0, 3), (2.0, 4), (4.0, 1)]
    # the shared step's 4 tokens: at least one is answer
    assert parser.reasoning_tokens == 6
