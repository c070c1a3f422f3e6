"""The mock held against real SGLang, per version: the same requests to a real server and to
the mock speaking its wire (``--mock-sglang-version``), and everything that is not a value
compared (``pytest_kimi.testing.wireprobe`` sends them, ``pytest_kimi.testing.wireshape`` says what
a shape is):

* every answer's status, header names and content type, and its body's keys and types,
  recursively (``int`` is not ``float``), with the protocol's own words (``object``,
  ``finish_reason``, ``role``, an error's ``type`` and ``code``) compared as values;
* a stream's pattern: which kinds of chunk come in which order, runs of one kind collapsed.
  Real SGLang merges tokens into fewer chunks when its HTTP side falls behind, so a real
  pattern may lack runs the mock's has, but only where the real stream has fewer chunks than
  tokens (the merge is seen, not assumed);
* ``/metrics`` before any traffic and after each part of it: every family's name, type, help
  text, label names and label sets (the ``pid`` label's value aside). Two kinds of label
  value depend on the run, not the wire: the endpoints of the HTTP counters (a real server
  counts its own warm-up requests, and its readiness polls answered 503 while it started, the
  mock neither) are compared once the probe has repeated the warm-up's requests, leaving out
  what the real one answered before it was ready; and which of a real server's processes its
  CPU monitor has reported yet (every 5 s, ``srt/metrics/cpu_monitor.py``), by label name.

A difference fails naming the version, the request, the field and both answers.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from pytest_kimi.testing.wireprobe import Answer, Transcript
from pytest_kimi.testing.wireshape import (
    differences,
    excerpt,
    merged_away,
    metric_families,
    pattern,
)

pytestmark = pytest.mark.slow

HTTP_FAMILIES = frozenset({"sglang:http_requests_total", "sglang:http_responses_total",
                           "sglang:http_requests_active"})  # fmt: skip
TIMED_FAMILIES = frozenset({"sglang:process_cpu_seconds_total"})
RUN_LABELS = frozenset({"pid"})


def _fail(version: str, step: str, found: list[str], real: Any, mock: Any) -> None:
    lines = "\n  ".join(found[:40])
    more = f"\n  ... and {len(found) - 40} more" if len(found) > 40 else ""
    pytest.fail(f"SGLang {version}, {step}: the mock differs from the real server:\n  {lines}"
                f"{more}\nreal: {excerpt(real, 1500)}\nmock: {excerpt(mock, 1500)}",
                pytrace=False)  # fmt: skip


def _token_chunks(events: list[Any]) -> int:
    """Chunks that carry generated tokens (a ``/generate`` chunk, an OpenAI delta with
    text): what merging makes fewer of."""
    out = 0
    for e in events:
        if not isinstance(e, dict):
            continue
        choice = (e.get("choices") or [{}])[0]
        text = choice.get("text") or (choice.get("delta") or {}).get("content")
        out += bool("meta_info" in e or text)
    return out


def _tokens(events: list[Any]) -> int:
    """Tokens the stream carried, as its last usage or ``meta_info`` counts them."""
    for e in reversed(events):
        if isinstance(e, dict):
            counted = (e.get("meta_info") or e.get("usage") or {}).get("completion_tokens")
            if counted is not None:
                return int(counted)
    return 0


def _stream(real: list[Any], mock: list[Any]) -> list[str]:
    real_p, mock_p = pattern(real), pattern(mock)
    if real_p == mock_p:
        return []
    merged = _token_chunks(real) < max(_tokens(real), _tokens(mock))
    if merged and merged_away(real_p, mock_p):
        return []
    out = [f"chunk pattern: real {len(real_p)} kinds, mock {len(mock_p)} kinds"
           f"{' (real chunks merged)' if merged else ''}"]  # fmt: skip
    for i in range(max(len(real_p), len(mock_p))):
        r = real_p[i] if i < len(real_p) else None
        m = mock_p[i] if i < len(mock_p) else None
        if r != m:
            out += [f"chunk kind {i}: {d}" for d in differences(r, m, f"$[{i}]")]
            break
    return out


def compare(version: str, step: str, real: Answer, mock: Answer) -> None:
    """Fail (see :func:`_fail`) on any difference of shape between two answers."""
    found = []
    if real.status != mock.status:
        found.append(f"status: real {real.status} | mock {mock.status}")
    if set(real.headers) != set(mock.headers):
        found.append(f"header names: real {sorted(real.headers)} | mock {sorted(mock.headers)}")
    ctype = (real.headers.get("content-type"), mock.headers.get("content-type"))
    if ctype[0] != ctype[1]:
        found.append(f"content-type: real {ctype[0]!r} | mock {ctype[1]!r}")
    if real.kind != mock.kind:
        found.append(f"body: real {real.kind} | mock {mock.kind}")
    elif real.kind == "sse":
        found += _stream(real.body, mock.body)
    elif real.kind == "json":
        found += [str(d) for d in differences(real.body, mock.body)]
    if found:
        _fail(version, step, found, real.body, mock.body)


def _steps(t: Transcript, prefix: str) -> list[str]:
    return [name for name in t.answers if name.startswith(prefix)]


@pytest.mark.parametrize("api", ["generate", "completions", "chat"])
def test_each_api_answers_as_sglang_does(wire_pair, api):
    steps = [s for s in _steps(wire_pair.real, api) if s.split("/")[0] == api]
    assert len(steps) >= 2, steps  # whole and streamed
    for step in steps:
        compare(wire_pair.version, step, wire_pair.real.answers[step], wire_pair.mock.answers[step])


@pytest.mark.parametrize("kind", ["long/", "too-many-new/", "bad-json/", "missing/",
                                  "empty-messages/"])  # fmt: skip
def test_refusals_are_sglangs(wire_pair, kind):
    steps = _steps(wire_pair.real, kind)
    assert steps
    for step in steps:
        compare(wire_pair.version, step, wire_pair.real.answers[step], wire_pair.mock.answers[step])


def _throughput_as_sglang_counts(version: str, meta: dict[str, Any]) -> bool:
    """Whether ``decode_throughput`` is there exactly when the version's rule says for the
    tokens the request had: 0.5.23 when it had more than one (``get_decode_throughput``),
    0.5.9 when the HTTP side had an output before the last (a whole request's come every 50
    tokens: ``DEFAULT_FORCE_STREAM_INTERVAL``; at exactly 50 either can happen)."""
    tokens, present = meta["completion_tokens"], "decode_throughput" in meta
    if version == "0.5.9":
        return tokens == 50 or present == (tokens > 50)
    return present == (tokens > 1)


def test_aborted_requests_end_as_sglangs_do(wire_pair):
    """How many tokens an aborted request had is a race, and 0.5.23's ``decode_throughput``
    (0.5.9's, for a whole request) depends on it: each side's is checked against the rule
    for its own count, then both are compared without it."""
    steps = _steps(wire_pair.real, "abort/")
    assert len(steps) == 3, steps
    real, mock = dict(wire_pair.real.answers), dict(wire_pair.mock.answers)
    for side, answers in (("real", real), ("mock", mock)):
        body = copy.deepcopy(answers["abort/generate"].body)
        meta = body["meta_info"]
        assert meta["finish_reason"]["type"] == "abort", (side, meta)  # not finished
        assert _throughput_as_sglang_counts(wire_pair.version, meta), (side, meta)
        meta.pop("decode_throughput", None)
        answers["abort/generate"] = dataclasses.replace(answers["abort/generate"], body=body)
    for step in steps:
        compare(wire_pair.version, step, real[step], mock[step])


def test_info_endpoints_answer_as_sglangs(wire_pair):
    steps = [*_steps(wire_pair.real, "info/"), "freeze_gc", "flush_cache"]
    for step in steps:
        compare(wire_pair.version, step, wire_pair.real.answers[step], wire_pair.mock.answers[step])


def _metric_differences(checkpoint: str, real_text: str, mock_text: str, final: bool,
                        startup: dict) -> list[str]:  # fmt: skip
    real, mock = metric_families(real_text, RUN_LABELS), metric_families(mock_text, RUN_LABELS)
    found = [f"{checkpoint}: family {n} ({real[n].type}) only on the real server"
             for n in sorted(set(real) - set(mock))]
    found += [f"{checkpoint}: family {n} ({mock[n].type}) only on the mock"
              for n in sorted(set(mock) - set(real))]  # fmt: skip
    for name in sorted(set(real) & set(mock)):
        r, m = real[name], mock[name]
        for what, real_is, mock_is in (("type", r.type, m.type), ("help", r.help, m.help),
                                       ("label names", sorted(r.label_names),
                                        sorted(m.label_names))):  # fmt: skip
            if real_is != mock_is:
                found.append(f"{checkpoint}: {name} {what}: real {real_is!r} | mock {mock_is!r}")
        if name in TIMED_FAMILIES or (name in HTTP_FAMILIES and not final):
            continue
        real_sets = r.sets - startup.get(name, frozenset())
        for only, sets in (("real server", real_sets - m.sets), ("mock", m.sets - real_sets)):
            found += [f"{checkpoint}: {name} label set only on the {only}: {dict(s)}"
                      for s in sorted(sets)[:6]]  # fmt: skip
    return found


def _startup_only(ready_text: str) -> dict[str, frozenset]:
    """The HTTP counters' label sets of answers a real server gave before it was ready (its
    readiness polls' 503s): not the wire, and the mock listens only once ready."""
    fams = metric_families(ready_text, RUN_LABELS)
    out = {}
    for name in HTTP_FAMILIES & set(fams):
        out[name] = frozenset(s for s in fams[name].sets
                              if not dict(s).get("status_code", "200").startswith("2"))  # fmt: skip
    return out


def test_metrics_families_and_label_sets_are_sglangs(wire_pair):
    real, mock = wire_pair.real.metrics, wire_pair.mock.metrics
    assert list(real) == list(mock) == ["ready", "traffic", "errors", "disconnect", "aborted"]
    startup = _startup_only(real["ready"])
    found = []
    for checkpoint in real:
        found += _metric_differences(checkpoint, real[checkpoint], mock[checkpoint],
                                     checkpoint == "aborted", startup)  # fmt: skip
    if found:
        _fail(wire_pair.version, "/metrics", found, "(see above)", "(see above)")


@pytest.mark.parametrize("checkpoint", ["ready", "disconnect"])
def test_the_abort_counter_appears_when_sglangs_does(wire_pair, checkpoint):
    """Issue 31 item 4: real SGLang exports ``num_aborted_requests_total`` only once it has
    aborted a request; the mock follows, per version."""
    name = "# TYPE sglang:num_aborted_requests_total"
    seen = [name in wire_pair.real.metrics[checkpoint], name in wire_pair.mock.metrics[checkpoint]]
    assert seen == [checkpoint == "disconnect"] * 2, (wire_pair.version, checkpoint, seen)


def test_the_mocks_own_routes_are_not_sglangs(wire_pair):
    """``/kimi/...`` are extra paths of the mock's, never extra fields in SGLang's answers:
    the real server does not have them."""
    assert set(wire_pair.kimi_routes_on_real.values()) == {404}, wire_pair.kimi_routes_on_real
