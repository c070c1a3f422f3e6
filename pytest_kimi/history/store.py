"""The history store: one SQLite file, safe under concurrent writers.

Why SQLite: one file to keep next to a CI job's baseline, no server, and transactions, so two
runs finishing at once (two nightly jobs, ``-n`` sessions on two clusters) each append whole
or not at all. Each run is a row of ``runs`` (what identifies it: when, the commit of the code
under test when given, the SGLang and router versions the nodes reported, the cluster file's
SHA-256), and each (layout, workload point) it measured a row of ``results`` with the
workload it ran, its summary figures and every request's latencies (the samples a bootstrap
interval needs; 40 requests x 4 latencies is a few kB).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL UNIQUE,
    finished_at TEXT NOT NULL,
    cluster TEXT NOT NULL,
    cluster_sha256 TEXT NOT NULL,
    backend TEXT NOT NULL,
    time_scale REAL NOT NULL,
    git_commit TEXT,
    sglang TEXT,
    router TEXT,
    pytest_kimi TEXT,
    complete INTEGER NOT NULL,
    incomplete TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    layout TEXT NOT NULL,
    point TEXT NOT NULL,
    workload TEXT NOT NULL,
    metrics TEXT NOT NULL,
    samples TEXT NOT NULL,
    error TEXT NOT NULL,
    PRIMARY KEY (run, layout, point)
);
CREATE INDEX IF NOT EXISTS results_series ON results (layout, point);
"""
BUSY_TIMEOUT_S = 60.0  # another writer holds the file: wait this long before giving up


class HistoryError(ValueError):
    """A history file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class RunRecord:
    """What identifies one run in the history."""

    run_id: str
    finished_at: str  # ISO 8601, UTC
    cluster: str
    cluster_sha256: str
    backend: str
    time_scale: float
    git_commit: str | None = None
    sglang: str | None = None
    router: str | None = None
    pytest_kimi: str | None = None
    complete: bool = True
    incomplete: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResultRecord:
    """One (layout, workload point) of a run: the workload it ran, its figures (catalogue
    names, None where not measured), its requests' latencies in ms, and why it failed."""

    layout: str
    point: str
    workload: Mapping[str, Any]
    metrics: Mapping[str, float | None]
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class SeriesEntry:
    """One run's value of one metric for one (layout, point), oldest first in a series."""

    run: RunRecord
    value: float | None
    samples: Sequence[float]
    workload: Mapping[str, Any]


class History:
    """One history file. Every method opens its own connection: safe from several processes
    and threads, and nothing stays open between calls."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        if not write and not self.path.exists():
            raise HistoryError(f"{self.path}: no history file here")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)) as db:
                db.execute("PRAGMA foreign_keys = ON")
                if write:
                    db.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
                    db.execute("BEGIN IMMEDIATE")  # one writer at a time, whole or nothing
                    _ensure_schema(db, self.path)
                else:
                    _check_version(db, self.path)
                yield db
                if write:
                    db.commit()
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.path}: not a usable history file ({exc})") from None

    def append(self, run: RunRecord, results: Sequence[ResultRecord]) -> None:
        """Add one run and its results in one transaction (a run id is kept once)."""
        with self._connect(write=True) as db:
            known = db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run.run_id,)).fetchone()
            if known:
                raise HistoryError(f"{self.path}: run {run.run_id} is already in the history")
            cursor = db.execute(
                "INSERT INTO runs (run_id, finished_at, cluster, cluster_sha256, backend,"
                " time_scale, git_commit, sglang, router, pytest_kimi, complete, incomplete)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.run_id, run.finished_at, run.cluster, run.cluster_sha256, run.backend,
                 run.time_scale, run.git_commit, run.sglang, run.router, run.pytest_kimi,
                 int(run.complete), json.dumps(list(run.incomplete))),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO results (run, layout, point, workload, metrics, samples, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(cursor.lastrowid, r.layout, r.point, _dump(r.workload), _dump(r.metrics),
                  _dump(r.samples), r.error) for r in results],
            )  # fmt: skip

    def runs(self) -> list[RunRecord]:
        """Every run, oldest first."""
        with self._connect() as db:
            rows = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id").fetchall()
        return [_run(row) for row in rows]

    def results(self, run_id: str) -> list[ResultRecord]:
        """The results of one run, in the order they were stored."""
        with self._connect() as db:
            found = db.execute("SELECT id FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if found is None:
                raise HistoryError(f"{self.path}: no run {run_id!r} in the history")
            rows = db.execute(
                "SELECT layout, point, workload, metrics, samples, error FROM results"
                " WHERE run = ? ORDER BY rowid",
                (found[0],),
            ).fetchall()
        return [ResultRecord(r[0], r[1], json.loads(r[2]), json.loads(r[3]), json.loads(r[4]),
                             r[5]) for r in rows]  # fmt: skip

    def series(self, cluster: str, layout: str, point: str, metric: str) -> list[SeriesEntry]:
        """One metric of one (cluster, layout, point) across the complete runs, oldest first;
        ``samples`` are the per-request latencies behind it (empty for throughputs)."""
        prefix = metric.partition("_")[0]
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {_RUN_COLUMNS}, results.metrics, results.samples, results.workload"
                " FROM results JOIN runs ON runs.id = results.run"
                " WHERE runs.cluster = ? AND results.layout = ? AND results.point = ?"
                " AND runs.complete = 1 AND results.error = '' ORDER BY runs.id",
                (cluster, layout, point),
            ).fetchall()
        out = []
        for row in rows:
            run, metrics, samples, workload = _run(row[:13]), *map(json.loads, row[13:])
            out.append(SeriesEntry(run, metrics.get(metric), samples.get(prefix, []), workload))
        return out


_RUN_COLUMNS = (
    "run_id, finished_at, cluster, cluster_sha256, backend, time_scale, git_commit, sglang,"
    " router, pytest_kimi, complete, incomplete, id"
)


def _run(row: Sequence[Any]) -> RunRecord:
    return RunRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                     row[9], bool(row[10]), tuple(json.loads(row[11])))  # fmt: skip


def _dump(data: Any) -> str:
    """JSON without NaN (a metric not measured is null)."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, Mapping):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(data), allow_nan=False, sort_keys=True)


def _ensure_schema(db: sqlite3.Connection, path: Path) -> None:
    for statement in filter(str.strip, _SCHEMA.split(";")):
        db.execute(statement)
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    else:
        _same_version(row[0], path)


def _check_version(db: sqlite3.Connection, path: Path) -> None:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:
        row = None
    if row is None:
        raise HistoryError(f"{path}: not a pytest-kimi history file (no schema version)")
    _same_version(row[0], path)


def _same_version(found: str, path: Path) -> None:
    if int(found) != SCHEMA_VERSION:
        raise HistoryError(f"{path}: history schema {found}, this pytest-kimi reads "
                           f"{SCHEMA_VERSION}")  # fmt: skip


def record_run(path: Path, run: RunRecord, results: Sequence[ResultRecord]) -> None:
    """Append ``run`` to the history at ``path`` (created on first use)."""
    History(path).append(run, results)
