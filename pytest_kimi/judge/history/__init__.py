"""The run history: every run's results, kept in one file, so a nightly gate can judge a
series instead of a pair (:mod:`pytest_kimi.judge.history.store`), and people can read it
(``python -m pytest_kimi.judge.history``)."""

from pytest_kimi.judge.history.store import History, HistoryError, RunRecord, record_run

__all__ = ["History", "HistoryError", "RunRecord", "record_run"]
