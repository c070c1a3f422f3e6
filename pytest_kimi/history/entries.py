"""A finished run as history rows: what identifies it, and each (layout, point) it measured.

The figures are the ones the report and the baseline use (catalogue names, cluster time), the
samples the per-request latencies a bootstrap interval needs, and the workload each point ran,
so a later gate never compares two different experiments as one series.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pytest_kimi.history.store import ResultRecord, RunRecord

if TYPE_CHECKING:
    from pytest_kimi.inputs import Inputs
    from pytest_kimi.result import LayoutResult


def run_record(
    inputs: Inputs,
    run_id: str,
    incomplete: Sequence[str],
    tools: Mapping[str, str],
    commit: str | None,
    now: datetime | None = None,
) -> RunRecord:
    """The run's identity: its id and time, the code under test's commit (when given), the
    versions the nodes reported (``tools`` of the report's set-up) and the cluster file's
    SHA-256 (a changed file is a changed experiment)."""
    when = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    return RunRecord(
        run_id=run_id,
        finished_at=when,
        cluster=inputs.cluster.name,
        cluster_sha256=hashlib.sha256(inputs.cluster.path.read_bytes()).hexdigest(),
        backend=inputs.backend,
        time_scale=inputs.time_scale,
        git_commit=commit,
        sglang=tools.get("sglang (servers)"),
        router=tools.get("sglang-router (router node)") or tools.get("sglang-router"),
        pytest_kimi=tools.get("pytest-kimi"),
        complete=not incomplete,
        incomplete=tuple(incomplete),
    )


def result_records(inputs: Inputs, results: Sequence[LayoutResult]) -> list[ResultRecord]:
    """Each (layout, point): figures and samples when measured, else why not."""
    from pytest_kimi.judge import baseline_entry, workload_settings

    out = []
    for result in results:
        if result.summary is None:
            out.append(ResultRecord(result.name, result.point, workload_settings(inputs, result),
                                    {}, {}, result.error or "not measured"))  # fmt: skip
            continue
        entry: dict[str, Any] = baseline_entry(inputs, result)
        out.append(ResultRecord(result.name, result.point, entry["workload"], entry["metrics"],
                                entry["samples"], result.error))  # fmt: skip
    return out
