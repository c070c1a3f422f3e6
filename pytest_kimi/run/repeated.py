"""``--kimi-repeat N``: measure a workload point N times and keep every run.

Each repeat is the planned run again: its warm-up, then the same requests at the same
concurrency, its records in ``<point folder>/repeat-<r>/records.jsonl``. On the deployment kept
(the default) every replica's prefix cache is flushed before each run (SGLang's
``/flush_cache``), so a run does not read from the cache what an earlier one wrote: each starts
as the first did, and the spread is the run-to-run spread, not a cache's warming. With
``--kimi-repeat-fresh`` each run gets a deployment of its own: one that already served a run
is torn down and brought up again, for variance that lives in start-up (weight placement, NCCL
rings), and its logs, GPU samples and manifest move into the folder of the run it served.

The point's result pools the runs (:mod:`pytest_kimi.results.repeats`): every request (each
record says its ``repeat``), each run's summary, and the between-run spread per metric.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_kimi.results.layout import LayoutResult
from pytest_kimi.run.measure import Target, measure

if TYPE_CHECKING:
    from pytest_kimi.config import Layout
    from pytest_kimi.config.inputs import Inputs
    from pytest_kimi.config.points import Point
    from pytest_kimi.results.events import Progress
    from pytest_kimi.results.store import RunFolder
    from pytest_kimi.run.deployed import Deployed

SET_ASIDE = ("logs", "telemetry.jsonl", "manifest.json")  # one deployment's, per repeat


def repeat_folder(point: str, repeat: int) -> str:
    """The folder id of one repeat's records, under the layout's folder."""
    return f"{point}/repeat-{repeat}" if point else f"repeat-{repeat}"


def measure_repeats(
    inputs: Inputs,
    layout: Layout,
    point: Point,
    endpoint: str,
    result: LayoutResult,
    folder: RunFolder,
    deployed: Deployed,
    progress: Progress,
    redeploy: Callable[[Callable[[], None]], str] | None,
    layout_notes: list[str],
) -> None:
    """Fill ``result`` with the pooled runs of ``point``; ``redeploy`` (``--kimi-repeat-fresh``)
    tears the layout down, calls the function it is given, brings the layout up again and
    returns its new endpoint; ``layout_notes``: the deployment's, which a bring-up adds to."""
    from pytest_kimi.results.repeats import pooled, spreads

    count = inputs.options.repeat
    runs: list[LayoutResult] = []
    try:
        for repeat in range(1, count + 1):
            endpoint = _ready(layout.name, point.id, repeat, endpoint, result, folder, deployed,
                              redeploy, layout_notes)  # fmt: skip
            run = LayoutResult(result.name, result.label, point=result.point,
                               point_settings=result.point_settings)  # fmt: skip
            runs.append(run)
            _measure_one(inputs, layout, point, deployed.target(layout.name, endpoint), run,
                         folder, deployed, progress, repeat)  # fmt: skip
    except BaseException as exc:
        _keep(result, runs, folder, layout.name, count)
        if not result.error:  # it stopped between runs (a bring-up, Ctrl-C)
            result.summary = None
            result.error = f"repeat {len(runs) + 1} of {count} not measured: " + (
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)  # fmt: skip
        raise
    _keep(result, runs, folder, layout.name, count)
    summaries = [run.summary for run in runs if run.summary is not None]
    assert result.summary is not None and len(summaries) == count
    result.repeats = summaries
    confidence = inputs.confidence if inputs.confidence is not None else 0.95
    result.between_runs = spreads(summaries, result.summary.metric_names(), confidence)
    result.summary = pooled(result.summary, summaries)
    if redeploy is not None:
        result.notes.append(f"repeats: {count} deployments, one brought up for each run; each "
                            "one's logs, GPU samples and manifest are in the repeat-<r> folder "
                            "of the run it served, the last one's where a single run keeps "
                            "them; the GPU figures are the last run's")  # fmt: skip


def _ready(
    layout: str, point: str, repeat: int, endpoint: str, result: LayoutResult,
    folder: RunFolder, deployed: Deployed, redeploy: Callable[[Callable[[], None]], str] | None,
    layout_notes: list[str],
) -> str:  # fmt: skip
    """Make the deployment ready for a run; its endpoint. Fresh: a deployment that already
    served a run (of this point or an earlier one) is brought up again, its files moved into
    that run's folder. Kept: every replica's prefix cache emptied."""
    served = deployed.served.get(layout)
    if redeploy is None:
        result.notes.extend(flush_caches(deployed.target(layout, endpoint), repeat))
    elif served is not None:
        aside = functools.partial(set_aside, folder, layout, *served)
        before = len(layout_notes)
        try:
            endpoint = redeploy(aside)
        except BaseException as exc:
            abort = deployed.aborts.get(layout)
            if abort is not None:  # later points are not sent to a deployment that is gone
                abort.trip(f"bringing the layout up again for repeat {repeat} failed: {exc}")
            raise
        finally:  # the teardown's and the bring-up's notes, named for the run they precede
            layout_notes[before:] = [f"deployment for repeat {repeat}: {note}"
                                     for note in layout_notes[before:]]  # fmt: skip
    deployed.served[layout] = (point, repeat)
    return endpoint


def _measure_one(
    inputs: Inputs, layout: Layout, point: Point, target: Target, run: LayoutResult,
    folder: RunFolder, deployed: Deployed, progress: Progress, repeat: int,
) -> None:  # fmt: skip
    """One repeat, its records under its own folder, each record marked with it."""
    clock = deployed.shared_clock(layout.name)
    at = repeat_folder(point.id, repeat)
    try:
        measure(inputs, layout, target, folder, run, progress=progress,
                abort=deployed.aborts.get(layout.name), clock=clock, point=point,
                records_at=at)  # fmt: skip
    finally:
        if clock is not None:
            clock.close()
        for record in run.records:
            record.repeat = repeat
        if run.records:  # written by the run before they had their repeat
            folder.write_records(layout.name, run.records, at)


def _keep(
    result: LayoutResult, runs: list[LayoutResult], folder: RunFolder, layout: str, count: int
) -> None:
    """The runs so far pooled into ``result``: records (in ``records.jsonl``), notes, replica
    counters, and the first failed run's error; the pooled summary when every run has one."""
    from pytest_kimi.results.metrics import summarize

    records = [r for run in runs for r in run.records]
    result.records = records
    folder.write_records(layout, records, result.point)
    result.notes.extend(_notes(runs))
    for run in runs:
        for name, counters in run.replica_counters.items():
            before = result.replica_counters.get(name)
            result.replica_counters[name] = counters if before is None else before.plus(counters)
    failed = [(i, run) for i, run in enumerate(runs, 1) if run.error or run.summary is None]
    if failed:
        i, run = failed[0]
        result.error = f"repeat {i} of {count}: {run.error or 'not measured'}"
        return
    last = runs[-1].summary
    assert last is not None
    result.summary = summarize(
        records, time_scale=last.time_scale, percentiles=list(last.percentiles),
        goodput_limits_ms=dict(last.goodput_limits_ms),
        server_accept_length=last.spec_accept_length
        if last.spec_accept_length_source == "server" else None,
    )  # fmt: skip


def _notes(runs: list[LayoutResult]) -> list[str]:
    """Each run's notes: one every run gave, once; the others with the repeat they are of."""
    every = set.intersection(*(set(run.notes) for run in runs)) if runs else set()
    out = [note for note in runs[0].notes if note in every] if runs else []
    for i, run in enumerate(runs, 1):
        out += [f"repeat {i}: {note}" for note in run.notes if note not in every]
    return out


def flush_caches(target: Target, repeat: int) -> list[str]:
    """Empty every replica's prefix cache before each run on the deployment kept, the first
    too (an earlier point may have sent the same prompts): rank 0's ``/flush_cache``; attached
    without workers, the router's, which passes it on. SGLang refuses while requests run: a
    refusal is a note, the run goes on."""
    from pytest_kimi.workload.http import client

    urls = list(target.replica_urls.values()) or [target.endpoint]
    out = []
    with client(timeout=30.0) as http:
        for url in urls:
            try:
                answer = http.post(url.rstrip("/") + "/flush_cache")
                problem = "" if answer.status_code == 200 else f"HTTP {answer.status_code}"
            except Exception as exc:  # any failure is the note's
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                out.append(f"repeat {repeat}: {url}/flush_cache answered {problem}: it may "
                           "read from its prefix cache what an earlier repeat sent")  # fmt: skip
    return out


def set_aside(folder: RunFolder, layout: str, point: str, repeat: int) -> None:
    """Move the deployment of ``repeat``'s logs, GPU samples and manifest into its folder,
    before the next deployment writes its own."""
    home = folder.layout_dir(layout)
    into = folder.point_dir(layout, repeat_folder(point, repeat))
    into.mkdir(parents=True, exist_ok=True)
    for name in SET_ASIDE:
        with contextlib.suppress(FileNotFoundError):
            (home / name).rename(into / name)
