"""The options that decide how a verdict is reached: at what confidence, what an undecided one
does, and how many requests or runs a point gets (``--kimi-until-decided``, ``--kimi-repeat``).
Standard library and pytest only: this runs in every pytest session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest


def add_decision_options(group: pytest.OptionGroup) -> None:
    """``--kimi-confidence``, ``--kimi-until-decided``, ``--kimi-repeat[-fresh]``,
    ``--kimi-undecided``."""
    group.addoption(
        "--kimi-confidence",
        dest="kimi_confidence",
        default=None,
        metavar="C",
        help="judge each SLO and regression gate by its bounds at confidence C (e.g. 0.95): "
        "passed, failed or undecided (default: the cluster file's slo.confidence, else the "
        "measured value alone)",
    )
    group.addoption(
        "--kimi-until-decided", dest="kimi_until_decided", nargs="?", const=400, type=int,
        default=None, metavar="MAX",
        help="with a confidence: after the planned requests, send more in batches until every "
        "SLO of the point is decided or MAX requests (400) were sent; give MAX with = or the "
        "option after the test paths",
    )  # fmt: skip
    group.addoption(
        "--kimi-repeat", dest="kimi_repeat", type=int, default=None, metavar="N",
        help="measure each workload point N times on its deployment (prefix caches flushed "
        "between runs); the summary keeps each run and adds the between-run mean, sd, CV and "
        "t interval per metric",
    )  # fmt: skip
    group.addoption(
        "--kimi-repeat-fresh", dest="kimi_repeat_fresh", action="store_true", default=False,
        help="with --kimi-repeat: tear the layout down and bring it up again before each "
        "later run (variance that lives in start-up: weight placement, NCCL rings)",
    )  # fmt: skip
    group.addoption(
        "--kimi-undecided", dest="kimi_undecided", default=None, choices=("pass", "fail", "xfail"),
        help="what an undecided SLO or gate test does (default: fail: never green on a coin toss)",
    )  # fmt: skip


def option_or_ini(config: pytest.Config, name: str) -> str | None:
    """The command line's value, else the ini key of the same name's, else None."""
    value = config.getoption(name)
    return value if value else (config.getini(name) or None)


def decision_options(config: pytest.Config) -> dict[str, Any]:
    """Their values as :class:`~pytest_kimi.config.options.Options` fields: the command line's,
    else the ini's (``kimi_confidence``, ``kimi_undecided``, ``kimi_repeat``)."""
    import pytest

    repeat = config.getoption("kimi_repeat")
    if repeat is None:
        text = config.getini("kimi_repeat")
        try:
            repeat = int(text) if text else 1
        except ValueError:
            raise pytest.UsageError(f"kimi_repeat = {text}: expected a whole number of "
                                    "runs") from None  # fmt: skip
    return {
        "confidence": option_or_ini(config, "kimi_confidence"),
        "undecided": option_or_ini(config, "kimi_undecided") or "fail",
        "until_decided": config.getoption("kimi_until_decided"),
        "repeat": repeat,
        "repeat_fresh": bool(config.getoption("kimi_repeat_fresh", False)),
    }
