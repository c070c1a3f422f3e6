"""The history store: one SQLite file, safe under concurrent writers on one machine.

Why SQLite: one file to keep next to a CI job's baseline, no server, and transactions, so two
runs finishing at once (two nightly jobs, sessions on two clusters) each append whole or not
at all. Each run is a row of ``runs`` (what identifies it: when, the commit of the code under
test when given, the SGLang and router versions the nodes reported, the cluster file's
SHA-256), and each (layout, workload point) it measured a row of ``results``: the workload it
ran and its experiment key (a digest of everything that makes two runs comparable, so a series
never mixes experiments), its figures, and every request's latencies (the samples a bootstrap
needs; 40 requests x 4 latencies is a few kB).

SQLite's write-ahead log needs shared memory: keep the file on a local disk, not on NFS.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimi.results.catalogue import latency_prefix

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL UNIQUE,
    run_id TEXT NOT NULL,
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
    experiment TEXT NOT NULL,
    workload TEXT NOT NULL,
    metrics TEXT NOT NULL,
    samples TEXT NOT NULL,
    error TEXT NOT NULL,
    PRIMARY KEY (run, layout, point)
);
CREATE INDEX IF NOT EXISTS results_series ON results (experiment, layout, point, run);
CREATE TABLE IF NOT EXISTS accepted (
    run INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    accepted_at TEXT NOT NULL,
    note TEXT NOT NULL
);
"""
RUNS = "runs:"  # a samples key: ``runs:ttft_p95`` holds each run's figure (--kimi-repeat)
BUSY_TIMEOUT_S = 60.0  # another writer holds the file: wait this long before giving up


class HistoryError(ValueError):
    """A history file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class RunRecord:
    """What identifies one run in the history (``uid`` tells apart two runs that got the
    same run id: the id is unique per report folder, not per history)."""

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
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class ResultRecord:
    """One (layout, workload point) of a run: its experiment key, the workload it ran, its
    figures (catalogue names, None where not measured), its requests' latencies in ms, and
    why it was not measured."""

    layout: str
    point: str
    experiment: str
    workload: Mapping[str, Any]
    metrics: Mapping[str, float | None]
    samples: Mapping[str, Sequence[float]] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class SeriesEntry:
    """One run's value of one metric for one (layout, point), in a series oldest first."""

    run: RunRecord
    value: float | None
    samples: Sequence[float]
    workload: Mapping[str, Any]
    runs: Sequence[float] = ()  # --kimi-repeat: each run's figure (``value``: their mean)


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch the file to WAL. Two writers that meet on a new file can be told "locked" at
    once, without SQLite's busy wait (it is a change of the file's format, not a write): try
    again, within the same :data:`BUSY_TIMEOUT_S` as any other wait for the lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class SeriesKey:
    """What names one series: a cluster's runs of one experiment at one (layout, point)."""

    cluster: str
    experiment: str
    layout: str
    point: str

    @property
    def case(self) -> str:
        """``tp32``, or ``tp32-c8`` (as test ids and reports name it)."""
        return f"{self.layout}-{self.point}" if self.point else self.layout


class History:
    """One history file. Every method opens its own connection: safe from several processes
    and threads, and nothing stays open between calls."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection for one call. Writing: WAL (readers never block the writer), then
        ``BEGIN IMMEDIATE``, which takes the write lock before the first read, so two
        writers queue (up to :data:`BUSY_TIMEOUT_S`) instead of interleaving."""
        if not write and not self.path.exists():
            raise HistoryError(f"{self.path}: no history file here")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)) as db:
                db.row_factory = sqlite3.Row
                db.execute("PRAGMA foreign_keys = ON")
                if write:
                    _use_wal(db)  # outside any transaction
                    db.execute("BEGIN IMMEDIATE")
                    _ensure_schema(db, self.path)
                else:
                    _check_version(db, self.path)
                yield db
                if write:
                    db.commit()  # leaving without it (an exception) rolls everything back
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise HistoryError(f"{self.path}: another writer held it for over "
                                   f"{BUSY_TIMEOUT_S:g} s") from None  # fmt: skip
            raise HistoryError(f"{self.path}: not a usable history file ({exc})") from None
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.path}: not a usable history file ({exc})") from None
        except OSError as exc:
            raise HistoryError(f"{self.path}: cannot be written ({exc})") from None

    def append(self, run: RunRecord, results: Sequence[ResultRecord]) -> None:
        """Add one run and its results in one transaction: all of it, or nothing."""
        rows = [(r.layout, r.point, r.experiment, _dump(r.workload), _dump(r.metrics),
                 _dump(r.samples), r.error) for r in results]  # fmt: skip
        with self._connect(write=True) as db:
            cursor = db.execute(
                "INSERT INTO runs (uid, run_id, finished_at, cluster, cluster_sha256, backend,"
                " time_scale, git_commit, sglang, router, pytest_kimi, complete, incomplete)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.uid, run.run_id, run.finished_at, run.cluster, run.cluster_sha256,
                 run.backend, run.time_scale, run.git_commit, run.sglang, run.router,
                 run.pytest_kimi, int(run.complete), json.dumps(list(run.incomplete))),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO results (run, layout, point, experiment, workload, metrics,"
                " samples, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(cursor.lastrowid, *row) for row in rows],
            )

    def runs(self) -> list[RunRecord]:
        """Every run, in the order they were added."""
        with self._connect() as db:
            return [_run(row) for row in db.execute("SELECT * FROM runs ORDER BY id")]

    def results(self, run: str) -> list[ResultRecord]:
        """The results of one run (its run id, or its uid when two runs share an id)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT * FROM results WHERE run = ? ORDER BY rowid", (self._row(db, run),)
            ).fetchall()
        return [_result(row) for row in rows]

    def run(self, run: str) -> RunRecord:
        """One run, by its run id (or its uid when two runs share an id)."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (self._row(db, run),)).fetchone()
        return _run(row)

    def _row(self, db: sqlite3.Connection, run: str) -> int:
        found = db.execute(
            "SELECT id, uid FROM runs WHERE run_id = ? OR uid = ?", (run, run)
        ).fetchall()
        if not found:
            raise HistoryError(f"{self.path}: no run {run!r} in the history")
        if len(found) > 1:
            uids = ", ".join(row["uid"] for row in found)
            raise HistoryError(f"{self.path}: {len(found)} runs have the id {run!r}; give "
                               f"one of their uids: {uids}")  # fmt: skip
        return int(found[0]["id"])

    def accept(self, run: str, note: str = "") -> RunRecord:
        """Accept the level from ``run`` on as its cluster's new normal: every later history
        gate on that cluster judges series from this run on (``--kimi-gate-since`` for every
        night, kept in the file)."""
        from datetime import datetime, timezone

        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self._connect(write=True) as db:
            row = self._row(db, run)
            db.execute("INSERT INTO accepted VALUES (?, ?, ?)", (row, when, note))
            found = db.execute("SELECT * FROM runs WHERE id = ?", (row,)).fetchone()
        return _run(found)

    def accepted(self, cluster: str) -> RunRecord | None:
        """The newest run accepted on ``cluster`` (by :meth:`accept`), if any."""
        with self._connect() as db:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'accepted'").fetchone():
                return None  # a file no writer of this version has touched yet
            row = db.execute(
                "SELECT runs.* FROM accepted JOIN runs ON runs.id = accepted.run"
                " WHERE runs.cluster = ? ORDER BY accepted.rowid DESC LIMIT 1",
                (cluster,),
            ).fetchone()
        return None if row is None else _run(row)

    def cases(self, cluster: str) -> set[tuple[str, str]]:
        """Every (layout, point) the cluster's runs measured."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT DISTINCT layout, point FROM results JOIN runs ON runs.id = results.run"
                " WHERE runs.cluster = ?",
                (cluster,),
            ).fetchall()
        return {(row["layout"], row["point"]) for row in rows}

    def experiments(self, cluster: str | None = None) -> list[SeriesKey]:
        """Every series the store holds (on ``cluster``), in the order first measured."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT runs.cluster, results.experiment, results.layout, results.point,"
                " MIN(results.rowid) AS first FROM results JOIN runs ON runs.id = results.run"
                " WHERE results.error = '' AND (? IS NULL OR runs.cluster = ?)"
                " GROUP BY runs.cluster, results.experiment, results.layout, results.point"
                " ORDER BY first",
                (cluster, cluster),
            ).fetchall()
        return [SeriesKey(row[0], row[1], row[2], row[3]) for row in rows]

    def series(
        self,
        experiment: str,
        layout: str,
        point: str,
        metric: str,
        *,
        cluster: str,
        since: str | None = None,
    ) -> list[SeriesEntry]:
        """One metric of one (layout, point) across the runs of one experiment (its key, from
        :func:`pytest_kimi.judge.history.entries.experiment_key`), oldest first: every run that
        measured it, complete or not (a run stopped at another layout still measured this one
        in full). ``samples`` are the per-request latencies behind it (empty for
        throughputs). ``since``: only the runs from this one (its uid) on."""
        prefix = latency_prefix(metric)
        with self._connect() as db:
            first = 0 if since is None else self._row(db, since)
            rows = db.execute(
                "SELECT runs.*, results.metrics, results.samples, results.workload"
                " FROM results JOIN runs ON runs.id = results.run"
                " WHERE results.experiment = ? AND results.layout = ? AND results.point = ?"
                " AND runs.cluster = ? AND runs.id >= ? AND results.error = '' ORDER BY runs.id",
                (experiment, layout, point, cluster, first),
            ).fetchall()
        out = []
        for row in rows:
            samples = json.loads(row["samples"])
            out.append(SeriesEntry(_run(row), json.loads(row["metrics"]).get(metric),
                                   samples.get(prefix, []), json.loads(row["workload"]),
                                   samples.get(f"{RUNS}{metric}", [])))  # fmt: skip
        return out


def _run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"], finished_at=row["finished_at"], cluster=row["cluster"],
        cluster_sha256=row["cluster_sha256"], backend=row["backend"],
        time_scale=row["time_scale"], git_commit=row["git_commit"], sglang=row["sglang"],
        router=row["router"], pytest_kimi=row["pytest_kimi"], complete=bool(row["complete"]),
        incomplete=tuple(json.loads(row["incomplete"])), uid=row["uid"],
    )  # fmt: skip


def _result(row: sqlite3.Row) -> ResultRecord:
    return ResultRecord(row["layout"], row["point"], row["experiment"],
                        json.loads(row["workload"]), json.loads(row["metrics"]),
                        json.loads(row["samples"]), row["error"])  # fmt: skip


def _dump(data: Any) -> str:
    """JSON with every non-finite number as null (a figure that could not be computed)."""

    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items()}
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
    if found != str(SCHEMA_VERSION):
        raise HistoryError(f"{path}: history schema {found!r}, this pytest-kimi reads "
                           f"{SCHEMA_VERSION}")  # fmt: skip


def record_run(path: Path, run: RunRecord, results: Sequence[ResultRecord]) -> None:
    """Append ``run`` to the history at ``path`` (created on first use)."""
    History(path).append(run, results)
