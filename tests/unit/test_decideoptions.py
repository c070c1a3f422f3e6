"""The decision options read through a real pytest config: the command line first, else the
ini key (``kimi_repeat``, ``kimi_confidence``, ``kimi_undecided``), a bad ini value a usage
error that names its key."""

from __future__ import annotations

import pytest

from pytest_kimi.plugin.decideoptions import decision_options

pytest_plugins = ["pytester"]


def _ini(pytester: pytest.Pytester, **keys: str) -> None:
    pytester.makeini("[pytest]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))


def test_the_ini_gives_what_the_command_line_leaves_out(pytester):
    _ini(pytester, kimi_repeat="3", kimi_confidence="0.9", kimi_undecided="xfail")
    got = decision_options(pytester.parseconfig())
    assert (got["repeat"], got["confidence"], got["undecided"]) == (3, "0.9", "xfail")


def test_the_command_line_wins_over_the_ini(pytester):
    _ini(pytester, kimi_repeat="3", kimi_undecided="xfail")
    got = decision_options(pytester.parseconfig("--kimi-repeat", "5", "--kimi-undecided", "pass"))
    assert (got["repeat"], got["undecided"]) == (5, "pass")


def test_neither_means_one_run_that_fails_when_undecided(pytester):
    got = decision_options(pytester.parseconfig())
    assert (got["repeat"], got["confidence"], got["undecided"]) == (1, None, "fail")


def test_a_repeat_that_is_not_a_number_names_its_ini_key(pytester):
    _ini(pytester, kimi_repeat="three")
    with pytest.raises(pytest.UsageError, match=r"^kimi_repeat = three: expected a whole number"):
        decision_options(pytester.parseconfig())
