"""The run history: runs, jobs, their logs and metrics in one SQLite file (WAL).

A *run* is one pipeline execution, a DAG of *jobs* (one stage on one target). Jobs move
queued → running → succeeded | failed | cancelled; a job that was running or queued when
its process died shows as *interrupted* the next time the history is opened.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.metrics import Metric

STATES = ("queued", "running", "succeeded", "failed", "cancelled", "interrupted", "skipped")
FINAL = {"succeeded", "failed", "cancelled", "interrupted", "skipped"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL, finished REAL,
    state TEXT NOT NULL, owner_pid INTEGER,
    config TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    stage TEXT NOT NULL, target TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL, progress REAL NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '',
    depends_on TEXT NOT NULL DEFAULT '[]',
    created REAL NOT NULL, started REAL, finished REAL,
    artifact_key TEXT, cached INTEGER NOT NULL DEFAULT 0,
    result TEXT, error TEXT, pid INTEGER
);
CREATE TABLE IF NOT EXISTS logs (
    job_id INTEGER NOT NULL REFERENCES jobs(id), ts REAL NOT NULL, line TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    name TEXT NOT NULL, value REAL NOT NULL, unit TEXT NOT NULL,
    source TEXT NOT NULL, device TEXT NOT NULL, target TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS sweeps (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, executor TEXT NOT NULL DEFAULT '',
    owner_pid INTEGER
);
CREATE TABLE IF NOT EXISTS sweep_points (
    sweep TEXT NOT NULL, point_id TEXT NOT NULL, idx INTEGER NOT NULL,
    settings TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    run_id INTEGER, keys TEXT NOT NULL DEFAULT '', figures TEXT NOT NULL DEFAULT '{}',
    updated REAL NOT NULL, PRIMARY KEY (sweep, point_id)
);
CREATE INDEX IF NOT EXISTS jobs_run ON jobs(run_id);
CREATE INDEX IF NOT EXISTS logs_job ON logs(job_id);
CREATE INDEX IF NOT EXISTS metrics_job ON metrics(job_id);
"""


@dataclass
class Job:
    id: int
    run_id: int
    stage: str
    target: str
    state: str
    progress: float
    message: str
    depends_on: list[int] = field(default_factory=list)
    created: float = 0.0
    started: float | None = None
    finished: float | None = None
    artifact_key: str | None = None
    cached: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None
    pid: int | None = None

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.target}]" if self.target else self.stage

    @property
    def elapsed(self) -> float | None:
        if self.started is None:
            return None
        return (self.finished or time.time()) - self.started


def run_outcome(states: list[str]) -> str:
    """A finished run's state from its jobs' states: succeeded when every job did, failed
    when one failed, else cancelled (the one rule the pipeline and its report use)."""
    if all(s == "succeeded" for s in states):
        return "succeeded"
    if any(s == "failed" for s in states):
        return "failed"
    return "cancelled"


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def transaction(db: sqlite3.Connection, lock: threading.RLock) -> Iterator[sqlite3.Connection]:
    """One write transaction on a connection shared by threads (under ``lock``): committed
    when the block ends, rolled back when it raises."""
    with lock:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


class JobStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                   check_same_thread=False)
        self._lock = threading.RLock()  # one connection, shared by the UI and a runner thread
        self._db.row_factory = sqlite3.Row
        self._setup()

    def _setup(self) -> None:
        """WAL mode and the schema. Two processes opening a new history at once (two sweeps,
        a sweep and the window) can find it locked while the other switches it to WAL, which
        SQLite answers at once instead of through its busy timeout: try again for a while."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def set_depends_on(self, job_id: int, deps: list[int]) -> None:
        with self._tx() as db:
            db.execute("UPDATE jobs SET depends_on=? WHERE id=?", (json.dumps(deps), job_id))

    def _tx(self):
        return transaction(self._db, self._lock)

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---- recovery ----------------------------------------------------------------
    def mark_interrupted(self) -> int:
        """Jobs left queued/running by a process that no longer exists become interrupted."""
        n = 0
        with self._tx() as db:
            runs = db.execute("SELECT id, owner_pid FROM runs WHERE state='running'").fetchall()
            for run in runs:
                if run["owner_pid"] == os.getpid() or _pid_alive(run["owner_pid"]):
                    continue
                now = time.time()
                cur = db.execute(
                    "UPDATE jobs SET state='interrupted', finished=?, message='interrupted: the "
                    "process running it ended' WHERE run_id=? AND state IN ('queued','running')",
                    (now, run["id"]),
                )
                n += cur.rowcount
                db.execute("UPDATE runs SET state='interrupted', finished=? WHERE id=?",
                           (now, run["id"]))
        return n

    # ---- runs & jobs ----------------------------------------------------------------
    def create_run(self, config: dict[str, Any]) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs(created, state, owner_pid, config) VALUES (?,?,?,?)",
                (time.time(), "running", os.getpid(), json.dumps(config)),
            )
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, state: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE runs SET state=?, finished=? WHERE id=?", (state, time.time(), run_id))

    def run(self, run_id: int) -> dict[str, Any] | None:
        """One run with its recorded config (what it asked for, the settings it ran with)."""
        rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            return None
        d = dict(rows[0])
        try:
            d["config"] = json.loads(d["config"] or "{}")
        except ValueError:
            d["config"] = {}
        return d

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(r) for r in rows]

    def add_job(self, run_id: int, stage: str, target: str = "", depends_on=()) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO jobs(run_id, stage, target, state, depends_on, created) "
                "VALUES (?,?,?,?,?,?)",
                (run_id, stage, target, "queued", json.dumps(list(depends_on)), time.time()),
            )
            return int(cur.lastrowid or 0)

    def update_job(self, job_id: int, **fields: Any) -> None:
        allowed = {"state", "progress", "message", "started", "finished", "artifact_key",
                   "cached", "result", "error", "pid"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown job fields {bad}")
        if "result" in fields and fields["result"] is not None:
            fields["result"] = json.dumps(fields["result"], default=str)
        if "state" in fields:
            assert fields["state"] in STATES, fields["state"]
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job_id))

    def _job(self, row: sqlite3.Row) -> Job:
        d = dict(row)
        d["depends_on"] = json.loads(d["depends_on"] or "[]")
        d["result"] = json.loads(d["result"]) if d["result"] else None
        d["cached"] = bool(d["cached"])
        return Job(**d)

    def job(self, job_id: int) -> Job:
        rows = self._query("SELECT * FROM jobs WHERE id=?", (job_id,))
        if not rows:
            raise KeyError(job_id)
        return self._job(rows[0])

    def jobs(self, run_id: int | None = None, limit: int = 500) -> list[Job]:
        if run_id is None:
            rows = self._query("SELECT * FROM jobs ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = self._query("SELECT * FROM jobs WHERE run_id=? ORDER BY id", (run_id,))
        return [self._job(r) for r in rows]

    # ---- sweeps ------------------------------------------------------------------------
    def start_sweep(self, name: str, spec: dict[str, Any], executor: str) -> None:
        """Record a sweep (again): its spec, ``running``, this process as its owner."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO sweeps(name, spec, state, created, updated, executor, owner_pid) "
                "VALUES (?,?,?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET spec=excluded.spec, "
                "state=excluded.state, updated=excluded.updated, executor=excluded.executor, "
                "owner_pid=excluded.owner_pid",
                (name, json.dumps(spec), "running", now, now, executor, os.getpid()))

    def finish_sweep(self, name: str, state: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE sweeps SET state=?, updated=? WHERE name=?",
                       (state, time.time(), name))

    def sweep(self, name: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM sweeps WHERE name=?", (name,))
        if not rows:
            return None
        d = dict(rows[0])
        d["spec"] = json.loads(d["spec"] or "{}")
        if d["state"] == "running" and d["owner_pid"] != os.getpid() and not _pid_alive(
                d["owner_pid"]):
            d["state"] = "interrupted"
        return d

    def sweeps(self) -> list[dict[str, Any]]:
        names = [r["name"] for r in self._query("SELECT name FROM sweeps ORDER BY updated DESC")]
        return [s for n in names if (s := self.sweep(n)) is not None]

    def set_point(self, sweep: str, point_id: str, idx: int, settings: dict[str, Any],
                  state: str, reason: str = "", run_id: int | None = None, keys: str = "",
                  figures: dict[str, Any] | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO sweep_points(sweep, point_id, idx, settings, state, reason, run_id, "
                "keys, figures, updated) VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT(sweep, point_id) DO UPDATE SET idx=excluded.idx, "
                "settings=excluded.settings, state=excluded.state, reason=excluded.reason, "
                "run_id=excluded.run_id, keys=excluded.keys, figures=excluded.figures, "
                "updated=excluded.updated",
                (sweep, point_id, idx, json.dumps(settings, default=str), state, reason, run_id,
                 keys, json.dumps(figures or {}, default=str), time.time()))

    def sweep_run_ids(self) -> set[int]:
        """The runs that are points of a sweep (their config names the sweep)."""
        rows = self._query("SELECT id FROM runs WHERE json_extract(config, '$.sweep') IS NOT NULL")
        return {int(r["id"]) for r in rows}

    def points(self, sweep: str) -> list[dict[str, Any]]:
        rows = self._query("SELECT * FROM sweep_points WHERE sweep=? ORDER BY idx", (sweep,))
        out = []
        for r in rows:
            d = dict(r)
            d["settings"] = json.loads(d["settings"] or "{}")
            d["figures"] = json.loads(d["figures"] or "{}")
            out.append(d)
        return out

    # ---- logs & metrics ---------------------------------------------------------------
    def append_log(self, job_id: int, line: str) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO logs(job_id, ts, line) VALUES (?,?,?)", (job_id, time.time(), line))

    def log(self, job_id: int) -> list[str]:
        rows = self._query("SELECT line FROM logs WHERE job_id=? ORDER BY rowid", (job_id,))
        return [r["line"] for r in rows]

    def add_metrics(self, job_id: int, metrics: list[Metric]) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO metrics(job_id, name, value, unit, source, device, target, detail) "
                "VALUES (?,?,?,?,?,?,?,?)",
                [(job_id, m.name, float(m.value), m.unit, m.source, m.device, m.target, m.detail)
                 for m in metrics],
            )

    def metrics(self, job_id: int | None = None, run_id: int | None = None) -> list[Metric]:
        if job_id is not None:
            rows = self._query("SELECT * FROM metrics WHERE job_id=?", (job_id,))
        elif run_id is not None:
            rows = self._query(
                "SELECT m.* FROM metrics m JOIN jobs j ON j.id=m.job_id WHERE j.run_id=?", (run_id,))
        else:
            rows = self._query("SELECT * FROM metrics")
        return [Metric(name=r["name"], value=r["value"], unit=r["unit"], source=r["source"],
                       device=r["device"], target=r["target"], detail=r["detail"])
                for r in rows]
