"""Where a pytest session keeps its run: the :class:`~pytest_kimi.run.session.Run` in the
config's stash, loaded (and its inputs checked) on first use.

The hooks (:mod:`pytest_kimi.plugin`) and the fixtures (:mod:`pytest_kimi.plugin.fixtures`)
both reach the run through here. Like them, it imports nothing heavy until a run is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_kimi.plugin.options import resolve

if TYPE_CHECKING:
    from pytest_kimi.run.session import Run

RUN_KEY = pytest.StashKey["Run"]()


def run_of(config: pytest.Config) -> Run:
    """The session's run, loaded (and its inputs checked) on first use."""
    if RUN_KEY not in config.stash:
        from pytest_kimi.results.events import Message
        from pytest_kimi.run.progress.terminal import display_for
        from pytest_kimi.run.session import Run, UsageProblem

        display = display_for(config)  # live on a terminal, else lines (--kimi-progress)
        try:
            run = Run.load(
                resolve(config),
                dry_run=bool(config.getoption("kimi_dry_run")),
                say=lambda text: display.emit(Message(text)),
                progress=display,
                on_result=lambda result: config.hook.pytest_kimi_layout_result(
                    config=config, result=result
                ),
                on_comparison=lambda model: config.hook.pytest_kimi_comparison(
                    config=config, model=model
                ),
            )
        except UsageProblem as exc:
            raise pytest.UsageError(str(exc)) from None
        if is_worker(config) and config.workerinput.get("kimi_run_dir"):
            run.use_run_dir(Path(config.workerinput["kimi_run_dir"]))
        config.stash[RUN_KEY] = run
    return config.stash[RUN_KEY]


def is_worker(config: pytest.Config) -> bool:
    """An xdist worker's config (its layouts are measured into the controller's folder)."""
    return hasattr(config, "workerinput")
