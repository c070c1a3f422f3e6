"""``--kimi-gate history``: tonight's figure judged against its own series in the history.

The reference is the series' current level: the runs since its last change point
(:mod:`pytest_kimi.judge.history.changes`), their median. Tonight regresses when it is worse than
that level by more than the limit, and, for latencies, when the 95% bootstrap interval of the change
(tonight's requests resampled, against the level) lies wholly on the worse side. The limit is
the larger of the metric's threshold (``--kimi-fail``; for throughputs, one number per run, a 1%
floor) and :data:`~pytest_kimi.judge.history.changes.K_NOISE` times the series' own run-to-run
spread (:func:`pytest_kimi.judge.history.trend.limit_of`), so a noisy cluster needs a larger step
and a quiet one is held to its threshold.

A step smaller than that shows on two nights running: tonight also fails when the mean of it and
the night before is worse than the level by more than the two-night limit (K_NOISE x the spread
of a two-night mean, still at least the threshold) and each of them by more than half of that,
so a 10% step is caught within two nights where one night's noise would hide it. A change the
history already holds (a worse level since some run, however many changes came after it) keeps
failing until tonight is back at the level before it, or until it is accepted: ``python -m
pytest_kimi.judge.history PATH accept RUN`` (kept in the file, for every later night) or ``--kimi-
gate-since RUN`` (this run only). The gate reads the last :data:`WINDOW` runs: a change older
than that is the level. A single very bad night fails that night (one run cannot tell a step
from an outlier); if the next night is back at the level, the bad one was an outlier: its median
moves nothing and it is never a change point. A failure names the run where the change starts
and what the history records as changed between it and the run before (commit, versions, cluster
file).

At a confidence ``C`` (``--kimi-confidence``) the verdict has three values
(:func:`pytest_kimi.judge.baseline.gate_outcome`): tonight's bootstrap bounds of the change,
each one-sided at ``C``, wholly over the limit: failed; wholly at or under it: passed;
straddling it: undecided. The two-night rule and a throughput (no per-request values) decide
on their figures, as without a confidence.

Tonight measured in several runs (``--kimi-repeat``): its figure is the runs' mean and its
interval the runs' t interval against the level (throughputs too), not a bootstrap of the
requests: what varies from run to run is what a nightly gate must not mistake for a change."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimi.judge.baseline import VERDICT_WORDS, bootstrap_level, gate_outcome, interval_words
from pytest_kimi.judge.history.changes import relative_worse
from pytest_kimi.judge.history.store import RunRecord, SeriesEntry
from pytest_kimi.judge.history.trend import Trend, limit_of
from pytest_kimi.results import catalogue
from pytest_kimi.results.repeats import change_interval
from pytest_kimi.results.stats import bootstrap_against

WINDOW = 60  # runs: the gate reads the last two months of nightlies (older levels are history)

# what a run records about the code and the cluster it ran, as a change's explanation reads it
IDENTITY = (
    ("git_commit", "commit"),
    ("sglang", "SGLang"),
    ("router", "router"),
    ("pytest_kimi", "pytest-kimi"),
    ("cluster_sha256", "cluster file SHA-256"),
)


@dataclass(frozen=True)
class Tonight:
    """This run's figure, before it is added to the history."""

    run: RunRecord
    value: float | None
    samples: Sequence[float] = ()
    runs: Sequence[float] = ()  # --kimi-repeat: each run's figure (``value``: their mean)


@dataclass(frozen=True)
class SeriesJudgement:
    """One metric of one (layout, point) tonight against its series."""

    case: str
    metric: str
    current: float
    reference: float  # the level tonight is judged against (NaN without history)
    reference_runs: int  # how many runs that level is the median of
    limit: float  # the relative change that fails: max(threshold, K_NOISE x noise)
    noise: float | None  # the series' run-to-run spread (relative sigma); None: unknown yet
    worse: float  # tonight against the reference, signed so that positive is worse
    start: RunRecord | None = None  # a regression: the run where it starts
    previous: RunRecord | None = None  # the run before ``start``
    ci: tuple[float, float] | None = None  # latencies: bootstrap interval of ``worse``
    ongoing: bool = False  # the history already held the change before tonight
    tonight: bool = False  # the change starts with this run
    nights: int = 1  # 2: judged with the night before (their mean beyond the two-night limit)
    confidence: float | None = None  # --kimi-confidence: ``ci`` one-sided at it, three values
    runs: int | None = None  # --kimi-repeat: ``ci`` is tonight's runs' t interval

    @property
    def outcome(self) -> str:
        """``passed``, ``failed`` or (at a confidence) ``undecided``."""
        if math.isnan(self.current):
            return "failed"  # a metric we can no longer measure is not a pass
        if math.isnan(self.reference):
            return "passed"  # nothing to judge against yet
        # at a confidence the two-night rule decides on the two nights' figures
        two_nights = self.nights == 2 and self.confidence is not None
        interval = None if two_nights else self.ci
        return gate_outcome(self.worse, self.limit, interval, self.confidence)

    @property
    def regressed(self) -> bool:
        return self.outcome == "failed"

    @property
    def interval(self) -> tuple[float, float] | None:
        return self.ci

    def message(self) -> str:
        if math.isnan(self.current):
            return f"REGRESSION: {self.case} {self.metric} was not measured tonight"
        if math.isnan(self.reference):
            return (f"ok: {self.case} {self.metric} {self.current:.4g}: the first run of this "
                    "experiment in the history, nothing to judge against yet")  # fmt: skip
        verdict = VERDICT_WORDS[self.outcome]
        worse = "worse" if self.worse > 0 else "better"
        spread = (f"run-to-run noise {self.noise:.1%}" if self.noise is not None
                  else "noise not known yet (under 6 runs)")  # fmt: skip
        ci = interval_words(self.ci, self.confidence, self.outcome, self.limit, lead="; ",
                            runs=(1, self.runs) if self.runs else None)  # fmt: skip
        limit = f"{self.limit:.1%}" + (" for the mean of tonight and the night before"
                                       if self.nights == 2 else "")  # fmt: skip
        text = (
            f"{verdict}: {self.case} {self.metric} {self.current:.4g} is {abs(self.worse):.1%} "
            f"{worse} than its level {self.reference:.4g} (median of {self.reference_runs} "
            f"run{'s' if self.reference_runs != 1 else ''}; {spread}, limit {limit}{ci})"
        )
        if self.regressed and self.start is not None:
            text += f"; {self.where()}"
        return text

    def where(self) -> str:
        """Where the change starts and what changed there."""
        assert self.start is not None
        if self.tonight:
            text = f"the change starts at this run ({self.start.run_id})"
        else:
            text = f"the change starts at run {self.start.run_id} ({self.start.finished_at})"
        if self.ongoing:
            text += ", and every run since holds it"
        if self.previous is None:
            return text
        return f"{text}; against run {self.previous.run_id} before it: " + what_changed(
            self.previous, self.start
        )


def what_changed(before: RunRecord, after: RunRecord) -> str:
    """What the history records as different between two runs, in a line."""
    diffs = [
        f"{label} {getattr(before, field) or '?'} -> {getattr(after, field) or '?'}"
        for field, label in IDENTITY
        if getattr(before, field) != getattr(after, field)
    ]
    if diffs:
        return "; ".join(diffs)
    return ("nothing recorded changed (same commit, SGLang, router, pytest-kimi and cluster "
            "file): look at the cluster itself")  # fmt: skip


def judge_series(
    case: str,
    metric: str,
    series: Sequence[SeriesEntry],
    tonight: Tonight,
    threshold: float,
    *,
    seed: int = 0,
    confidence: float | None = None,
) -> SeriesJudgement:
    """Tonight's ``metric`` against ``series`` (the history's runs of this experiment, oldest
    first; the last :data:`WINDOW` of them); ``threshold`` is the metric's ``--kimi-fail``
    threshold; ``confidence``: ``--kimi-confidence`` (None: the plain comparison)."""
    m = catalogue.metric(metric)
    current = math.nan if tonight.value is None else float(tonight.value)
    trend = Trend.of(case, metric, series[-WINDOW:], threshold)
    if not trend.entries or math.isnan(current):
        return SeriesJudgement(case, metric, current, math.nan, 0, threshold, None, math.nan,
                               confidence=confidence)  # fmt: skip
    values, levels = trend.values, trend.levels
    # the reference: the oldest level that every later one is worse than (a change not yet
    # fixed or accepted, however many came after it), else the current one
    k = next(
        (j for j in range(len(levels) - 1)
         if all(relative_worse(levels[j][2], later[2], m.higher_is_better) > trend.limit
                for later in levels[j + 1:])),
        len(levels) - 1,
    )  # fmt: skip
    ongoing = k < len(levels) - 1
    first, end, reference = levels[k]
    worse = relative_worse(reference, current, m.higher_is_better)
    ci = None
    if len(tonight.runs) >= 2:  # repeats: tonight's runs' t interval against the level
        ci = change_interval([reference], tonight.runs, bootstrap_level(confidence),
                             m.higher_is_better)  # fmt: skip
    elif m.per_request:
        interval = bootstrap_against(tonight.samples, reference, m.stat, seed=seed,
                                     confidence=bootstrap_level(confidence))  # fmt: skip
        if interval is not None:
            low, high = interval
            ci = (-high, -low) if m.higher_is_better else (low, high)
    limit, nights = trend.limit, 1
    if not ongoing and end - first >= 2 and worse <= limit:
        # two nights running: their mean beyond the two-night limit (K_NOISE x the spread of
        # a two-night mean), each of them beyond half of it (one bad night and a good one is
        # an outlier, not a step)
        pair = limit_of(metric, threshold, trend.noise, nights=2)
        nights_worse = (relative_worse(reference, values[-1], m.higher_is_better), worse)
        if sum(nights_worse) / 2 > pair and min(nights_worse) > pair / 2:
            limit, nights = pair, 2
    if ongoing:
        start = levels[k + 1][0]
    else:  # the bad nights right before tonight, if any, start it
        start = len(values)
        while start > first and relative_worse(reference, values[start - 1],
                                               m.higher_is_better) > limit:  # fmt: skip
            start -= 1
    runs = [*trend.runs, tonight.run]
    return SeriesJudgement(
        case, metric, current, reference, end - first, limit, trend.noise, worse,
        start=runs[start], previous=runs[start - 1], ci=ci, ongoing=ongoing,
        tonight=start == len(values), nights=nights, confidence=confidence,
        runs=len(tonight.runs) if len(tonight.runs) >= 2 else None,
    )  # fmt: skip
