"""Read a saved layout folder (``reports/<run>/<layout>/``) back into a :class:`LayoutResult`.

Statistics are recomputed from ``records.jsonl`` (the source of truth); SLO verdicts and notes
come from ``summary.json`` as they were judged at the time.
"""

from __future__ import annotations

import json
from pathlib import Path

from pytest_kimi.metrics import summarize
from pytest_kimi.report.comparison import LayoutResult
from pytest_kimi.slo import Slo, Verdict
from pytest_kimi.workload.records import read_records


class SavedRunError(ValueError):
    """A folder that is not a saved layout result; the message names the file."""


def load_layout(folder: Path) -> tuple[LayoutResult, dict]:
    """The layout's result and its summary.json (for backend and time scale)."""
    summary_path = folder / "summary.json"
    try:
        saved = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SavedRunError(f"{summary_path}: not a saved layout result ({exc})") from None
    records_path = folder / "records.jsonl"
    records = read_records(records_path) if records_path.exists() else []
    scale = float(saved.get("time_scale") or 1.0)
    percentiles = saved.get("percentiles") or (50, 90, 95, 99)
    result = LayoutResult(
        name=saved.get("layout", folder.name),
        label=saved.get("label", folder.name),
        summary=summarize(records, time_scale=scale, percentiles=percentiles) if records else None,
        error=saved.get("error", ""),
        result_dir=str(folder),
        notes=list(saved.get("notes", [])),
        records=records,
    )
    for entry in saved.get("slo", []):
        if "limit" not in entry:
            continue
        slo = Slo(entry["name"], entry["limit"], entry["upper_bound"], entry["unit"],
                  entry.get("source", "saved run"))  # fmt: skip
        measured = entry["measured"]
        result.verdicts.append(Verdict(slo, float("nan") if measured is None else measured))
    return result, saved
