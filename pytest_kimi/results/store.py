"""The result folder, ``reports/<run-id>/``: the one module that writes and reads a run's files.

Layout folders hold ``records.jsonl``, ``summary.json``, ``manifest.json``, ``logs/`` and, where
the nodes' GPUs were sampled, ``telemetry.jsonl`` (appended as sampled); the run folder holds
``comparison.md``, ``comparison.json`` and ``report.html``. Every other file is written to a
temporary name and renamed (:mod:`pytest_kimi.results.files`), so a crash never leaves half a file.

Reading back gives the same typed :class:`~pytest_kimi.results.layout.LayoutResult` that was
written, figures included, without recomputing them: the live report, the xdist controller's report
and ``python -m pytest_kimi.report`` are built from identical values.
"""

from __future__ import annotations

import contextlib
import json
import platform
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_kimi.results.files import atomic_write_text
from pytest_kimi.results.layout import LayoutResult, verdict_from_dict, verdict_to_dict
from pytest_kimi.results.summary import Summary


class SavedRunError(ValueError):
    """A folder that is not a saved layout result; the message names the file."""


def new_run_id(cluster: str, replicas: int, now: datetime | None = None) -> str:
    """``20260902-123051-pro6000-dp2``: sortable by time, says where and how wide."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{cluster}-dp{replicas}"


def make_run_dir(base: Path, run_id: str) -> Path:
    """Create ``base/run_id``; a second run in the same second gets a numbered suffix."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = base / (run_id if n == 0 else f"{run_id}.{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run directory under {base}")


def write_text(path: Path, text: str) -> None:
    """Write atomically: a temporary file in the same folder, then rename."""
    atomic_write_text(path, text)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, allow_nan=False, default=str) + "\n")


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def client_environment() -> dict[str, Any]:
    """Where the client ran: host, Python, and the versions that shape the numbers."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(
            ("pytest-kimi", "pytest", "httpx", "numpy", "smg", "sglang-router", "sglang", "fabric")
        ),
    }


def summary_document(result: LayoutResult, backend: str, time_scale: float) -> dict[str, Any]:
    """``summary.json``: bench_serving's keys, completeness, notes, per-replica counters and
    SLO verdicts."""
    data: dict[str, Any] = {
        "layout": result.name,
        "label": result.label,
        "point": result.point,
        "point_settings": result.point_settings,
        "backend": backend,
        "time_scale": time_scale,
        "complete": result.complete,
        "error": result.error,
        "notes": result.notes,
        "replica_counters": {k: c.to_dict() for k, c in result.replica_counters.items()},
    }
    if result.telemetry is not None:
        data["telemetry"] = result.telemetry.to_dict()
    if result.stage_times is not None:
        data["pd_stages"] = result.stage_times.to_dict()
    if result.summary is not None:
        data.update(result.summary.to_dict())
        data["slo"] = [{**verdict_to_dict(v), "message": v.message()} for v in result.verdicts]
    if result.repeats:  # --kimi-repeat: every run, and the spread of their figures
        data["repeats"] = [summary.to_dict() for summary in result.repeats]
        data["between_runs"] = {name: s.to_dict() for name, s in result.between_runs.items()}
    return data


def load_layout(folder: Path) -> tuple[LayoutResult, dict[str, Any]]:
    """A saved layout folder back as its result, and its summary.json (backend, time scale).

    The summary's figures are the stored ones; ``records.jsonl`` is read for what needs every
    request (bootstrap intervals, plots)."""
    from pytest_kimi.results.pdstages import StageTimes
    from pytest_kimi.results.records import read_records
    from pytest_kimi.results.replicacounters import ReplicaCounters
    from pytest_kimi.results.telemetry_stats import TelemetrySummary, read_telemetry

    summary_path = folder / "summary.json"
    try:
        saved = json.loads(summary_path.read_text(encoding="utf-8"))
        summary = Summary.from_dict(saved) if "distributions" in saved else None
        counters = {
            name: ReplicaCounters.from_dict(entry)
            for name, entry in (saved.get("replica_counters") or {}).items()
        }
        telemetry = saved.get("telemetry")
        telemetry = TelemetrySummary.from_dict(telemetry) if telemetry is not None else None
        stages = saved.get("pd_stages")
        stages = StageTimes.from_dict(stages) if stages is not None else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SavedRunError(f"{summary_path}: not a saved layout result ({exc})") from None
    series = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # plots only: optional
        # a point's samples are its layout's, one folder up (one deployment, sampled throughout)
        at = folder if (folder / "telemetry.jsonl").exists() else folder.parent
        series = read_telemetry(at / "telemetry.jsonl")
    records_path = folder / "records.jsonl"
    result = LayoutResult(
        name=saved.get("layout", folder.name),
        label=saved.get("label", folder.name),
        point=saved.get("point", ""),
        point_settings=dict(saved.get("point_settings") or {}),
        summary=summary,
        error=saved.get("error", ""),
        result_dir=str(folder),
        notes=list(saved.get("notes", [])),
        records=read_records(records_path) if records_path.exists() else [],
        replica_counters=counters,
        telemetry=telemetry,
        telemetry_series=series,
        stage_times=stages,
    )
    result.verdicts = [verdict_from_dict(e) for e in saved.get("slo", []) if "limit" in e]
    if saved.get("repeats"):
        from pytest_kimi.results.repeats import Spread

        result.repeats = [Summary.from_dict(entry) for entry in saved["repeats"]]
        result.between_runs = {name: Spread.from_dict(entry)
                               for name, entry in saved["between_runs"].items()}  # fmt: skip
    return result, saved


class RunFolder:
    """One run's folder and everything in it, by layout name."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, base: Path, run_id: str) -> RunFolder:
        return cls(make_run_dir(base, run_id))

    @classmethod
    def adopt(cls, path: Path) -> RunFolder:
        """A folder someone else made (the xdist controller, for its workers)."""
        path.mkdir(parents=True, exist_ok=True)
        return cls(path)

    @property
    def name(self) -> str:
        return self.path.name

    def layout_dir(self, layout: str) -> Path:
        path = self.path / layout
        (path / "logs").mkdir(parents=True, exist_ok=True)
        return path

    def point_dir(self, layout: str, point: str = "") -> Path:
        """Where one workload point's records and summary go: the layout's folder when the run
        has one point, else a folder per point inside it (``tp32/c8``; a repeat's records:
        ``tp32/c8/repeat-2``)."""
        if not point:
            return self.layout_dir(layout)
        path = self.layout_dir(layout) / point
        path.mkdir(parents=True, exist_ok=True)
        return path

    def logs(self, layout: str) -> Path:
        return self.layout_dir(layout) / "logs"

    def telemetry_path(self, layout: str) -> Path:
        """GPU samples, appended while the layout runs (:mod:`pytest_kimi.deploy.telemetry`)."""
        return self.layout_dir(layout) / "telemetry.jsonl"

    def journal_path(self, layout: str, point: str = "") -> Path:
        """Finished records, one flushed line each, while the run is going."""
        return self.point_dir(layout, point) / "records.partial.jsonl"

    def write_records(self, layout: str, records: list, point: str = "") -> None:
        from pytest_kimi.results.records import write_records

        write_records(self.point_dir(layout, point) / "records.jsonl", records)

    def write_manifest(self, layout: str, manifest: dict[str, Any]) -> None:
        write_json(self.layout_dir(layout) / "manifest.json", manifest)

    def write_summary(self, result: LayoutResult, backend: str, time_scale: float) -> None:
        path = self.point_dir(result.name, result.point) / "summary.json"
        write_json(path, summary_document(result, backend, time_scale))
        result.result_dir = str(path.parent)

    def has_layout(self, layout: str, point: str = "") -> bool:
        return (self.path / layout / point / "summary.json").exists()

    def read_layout(self, layout: str, point: str = "") -> LayoutResult:
        return load_layout(self.path / layout / point)[0]

    def read_each(self, layouts: list[str], name: str) -> dict[str, dict[str, Any]]:
        """Each layout's JSON file ``name`` (``manifest.json``, ``search.json``) that exists
        and parses, by layout name: a layout that broke before writing it is left out."""
        out = {}
        for layout in layouts:
            with contextlib.suppress(OSError, ValueError):
                out[layout] = json.loads((self.path / layout / name).read_text(encoding="utf-8"))
        return out

    def write_search(self, layout: str, search: dict[str, Any]) -> None:
        """``--kimi-find-max-concurrency``'s outcome for a layout (``search.json``)."""
        write_json(self.layout_dir(layout) / "search.json", search)

    def write_file(self, name: str, text: str) -> None:
        """Another file of the report (``pareto.svg``) into the run folder."""
        write_text(self.path / name, text)

    def write_comparison(self, model: dict[str, Any], markdown: str, html: str) -> None:
        write_comparison(self.path, model, markdown, html)


def write_comparison(folder: Path, model: dict[str, Any], markdown: str, html: str) -> None:
    """``comparison.json``, ``comparison.md`` and ``report.html`` into ``folder``."""
    write_json(folder / "comparison.json", model)
    write_text(folder / "comparison.md", markdown)
    write_text(folder / "report.html", html)
