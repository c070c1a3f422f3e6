"""The scripted server's scripts: drawn per arrival, or per prompt for two clients to compare."""

from __future__ import annotations

from pytest_kimi.testing.scripted import Defaults, make_script

BODY = {"sampling_params": {"max_new_tokens": 8}}


def test_prompt_keyed_scripts_follow_the_prompt_not_the_arrival_order():
    keyed = Defaults(jitter=1.0, seed=3, key="prompt")
    first = make_script(BODY, keyed, 0, "hello")
    assert make_script(BODY, keyed, 7, "hello") == first  # another order, the same script
    assert make_script(BODY, keyed, 0, "other") != first  # another prompt, another draw


def test_arrival_keyed_scripts_follow_the_arrival_order():
    arrival = Defaults(jitter=1.0, seed=3)
    assert make_script(BODY, arrival, 0, "hello") != make_script(BODY, arrival, 7, "hello")
    assert make_script(BODY, arrival, 7, "a") == make_script(BODY, arrival, 7, "b")


def test_a_requests_own_script_wins():
    own = {"sampling_params": {"max_new_tokens": 8, "script": {"ttft_ms": 1.0}}}
    assert make_script(own, Defaults(jitter=1.0, key="prompt"), 0, "x")["ttft_ms"] == 1.0
