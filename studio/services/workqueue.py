"""The work queue: pipeline runs and sweeps of any project, lined up and run as the machine
allows.

Every "Run" in the window adds an item here instead of refusing while something else runs
(and ``studio queue add`` from the command line). An item names a project file and what to
do with it (stages, a retry, a sweep); the queue holds them in one SQLite file in the app's
config folder, so a window that restarts finds what was waiting (and what was running when
it ended, put back to wait: its finished stages come from the artifact store), and another
window or process sees them. The file is the record; the one scheduler
(:mod:`studio.core.scheduler`, made by :func:`queue_scheduler`, brought up to the file
by :func:`sync`) chooses what starts and writes each change back: the window's queue runner
and ``studio queue run`` run the queue through it. It says which waiting items start now
and, for each of the others, why it waits — in words a user can act on. The rules are the
scheduler's policy (:mod:`studio.core.workpolicy`), each item a project's work:

1. a paused queue starts nothing;
2. items of one project run one after another, in the queue's order (two runs of a project
   would write the same artifacts; the pipeline's run lock would refuse the second);
3. a project another process is running (``studio --batch``, a sweep from the CLI) waits
   for it;
4. at most ``slots`` items run at once (a sweep takes as many slots as its workers);
5. an item whose predicted memory peak does not fit in the free memory waits while another
   item runs (alone, it starts: the stage's own memory check then refuses it in one line).

Higher priority goes first; within a priority, the user's order. A running item is never
stopped for another.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core import workpolicy
from studio.core.errors import StudioError
from studio.core.fsutil import RunLock
from studio.core.hostmem import available_memory
from studio.core.jobs import transaction
from studio.core.scheduler import Scheduler, WorkItem
from studio.services.partplan import part_plan

WAITING, RUNNING = "waiting", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
FINAL = (SUCCEEDED, FAILED, CANCELLED)
KINDS = ("pipeline", "sweep")
PRIORITIES = {0: "normal", 1: "high"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    project TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    spec TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    pos REAL NOT NULL,
    state TEXT NOT NULL,
    added REAL NOT NULL,
    started REAL,
    finished REAL,
    run_id INTEGER,
    message TEXT NOT NULL DEFAULT '',
    peak INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class QueueItem:
    id: int
    project: str  # the project file, resolved
    name: str  # the project's name, for the list
    kind: str  # "pipeline" | "sweep"
    spec: dict[str, Any]
    priority: int = 0
    pos: float = 0.0
    state: str = WAITING
    added: float = 0.0
    started: float | None = None
    finished: float | None = None
    run_id: int | None = None
    message: str = ""
    #: the predicted peak resident memory of its largest stage, bytes (estimated; None:
    #: no prediction for this kind of project)
    peak: int | None = None
    #: live, not stored: what a running item does now ("quantize 45 %")
    progress: str = field(default="", compare=False)

    @property
    def path(self) -> Path:
        return Path(self.project)

    @property
    def what(self) -> str:
        """What the item does, in a few words."""
        s = self.spec
        if self.kind == "sweep":
            return f"sweep {s.get('sweep')!r} ({s.get('workers', 1)} worker(s))"
        if s.get("retry"):
            stage, target = s["retry"]
            return f"retry {stage}{f' @ {target}' if target else ''} and what follows"
        stages = s.get("stages")
        what = "the whole pipeline" if not stages else "stages " + " → ".join(stages)
        if s.get("targets"):
            what += " on " + ", ".join(s["targets"])
        if s.get("remeasure"):
            what += " (measured again)"
        return what

    @property
    def label(self) -> str:
        return f"#{self.id} {self.name}: {self.what}"

    @property
    def cores(self) -> int:
        """The slots the item takes while it runs."""
        return max(1, int(self.spec.get("workers", 1))) if self.kind == "sweep" else 1


def _item(row: sqlite3.Row) -> QueueItem:
    return QueueItem(
        id=row["id"], project=row["project"], name=row["name"], kind=row["kind"],
        spec=json.loads(row["spec"]), priority=row["priority"], pos=row["pos"],
        state=row["state"], added=row["added"], started=row["started"],
        finished=row["finished"], run_id=row["run_id"], message=row["message"],
        peak=row["peak"],
    )


def check_priority(priority: int) -> None:
    if priority not in PRIORITIES:
        raise StudioError(f"priority must be one of {sorted(PRIORITIES)}, not {priority}")


def order_key(item: QueueItem) -> tuple:
    """The order waiting items start in: higher priority first, then the user's order."""
    return workpolicy.order_key(as_work(item))


class WorkQueue:
    """The queue's items in a SQLite file (one connection, used from the UI thread and the
    runner threads under a lock)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                       check_same_thread=False)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise StudioError(f"the work queue {self.path} cannot be read ({exc}): move it "
                              "away (the window does: a new, empty queue takes its place)"
                              ) from None
        self._lock = threading.RLock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self):
        return transaction(self._db, self._lock)

    # ---- reading ------------------------------------------------------------------------
    def items(self, finished: bool = True) -> list[QueueItem]:
        """Running items, then waiting ones in the order they start, then (``finished``)
        the ended ones, newest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM items").fetchall()
        items = [_item(r) for r in rows]
        running = sorted((i for i in items if i.state == RUNNING), key=lambda i: i.started or 0)
        waiting = sorted((i for i in items if i.state == WAITING), key=order_key)
        out = running + waiting
        if finished:
            out += sorted((i for i in items if i.state in FINAL),
                          key=lambda i: -(i.finished or i.added))
        return out

    def get(self, item_id: int) -> QueueItem:
        with self._lock:
            row = self._db.execute("SELECT * FROM items WHERE id=?", (item_id,)).fetchone()
        if row is None:
            raise StudioError(f"the queue has no item #{item_id}")
        return _item(row)

    @property
    def paused(self) -> bool:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='paused'").fetchone()
        return bool(row and row["value"] == "1")

    def set_paused(self, paused: bool) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('paused', ?)",
                       ("1" if paused else "0",))

    @property
    def slots(self) -> int:
        """How many items may run at once (a sweep takes its workers' count)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='slots'").fetchone()
        return int(row["value"]) if row else default_slots()

    def set_slots(self, n: int) -> None:
        if not 1 <= int(n) <= 64:
            raise StudioError(f"items at once must be 1 to 64, not {n}")
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('slots', ?)",
                       (str(int(n)),))

    # ---- changing ------------------------------------------------------------------------
    def add(self, project: Path, name: str, kind: str, spec: dict[str, Any],
            priority: int = 0, peak: int | None = None) -> QueueItem:
        if kind not in KINDS:
            raise StudioError(f"unknown kind of queue item {kind!r} (one of {', '.join(KINDS)})")
        check_priority(priority)
        with self._tx() as db:
            row = db.execute("SELECT MAX(pos) AS m FROM items").fetchone()
            pos = (row["m"] or 0.0) + 1.0
            cur = db.execute(
                "INSERT INTO items(project, name, kind, spec, priority, pos, state, added, peak)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (str(Path(project).resolve()), name, kind, json.dumps(spec), priority, pos,
                 WAITING, time.time(), peak))
            item_id = int(cur.lastrowid or 0)
        return self.get(item_id)

    def move(self, item_id: int, delta: int) -> None:
        """Move a waiting item ``delta`` places earlier (negative) or later among the waiting
        items of its priority."""
        item = self.get(item_id)
        if item.state != WAITING:
            raise StudioError(f"#{item_id} is {item.state}: only waiting items move")
        peers = [as_work(i) for i in self.items(finished=False)
                 if i.state == WAITING and i.priority == item.priority]
        with self._tx() as db:
            for moved_id, pos in workpolicy.moved(peers, item_id, delta).items():
                db.execute("UPDATE items SET pos=? WHERE id=?", (pos, moved_id))

    def set_priority(self, item_id: int, priority: int) -> None:
        check_priority(priority)
        with self._tx() as db:
            db.execute("UPDATE items SET priority=? WHERE id=? AND state=?",
                       (priority, item_id, WAITING))

    def place(self, item_id: int, priority: int, pos: float) -> None:
        """A waiting item's priority and place (the scheduler moved it)."""
        check_priority(priority)
        with self._tx() as db:
            db.execute("UPDATE items SET priority=?, pos=? WHERE id=? AND state=?",
                       (priority, pos, item_id, WAITING))

    def mark_running(self, item_id: int) -> bool:
        """A waiting item starts; False when it was not waiting (another window or process
        started it first, or it ended)."""
        with self._tx() as db:
            cur = db.execute("UPDATE items SET state=?, started=?, message='' "
                             "WHERE id=? AND state=?", (RUNNING, time.time(), item_id, WAITING))
        return cur.rowcount == 1

    def finish(self, item_id: int, state: str, message: str = "",
               run_id: int | None = None) -> None:
        if state not in FINAL:
            raise ValueError(state)
        with self._tx() as db:
            db.execute("UPDATE items SET state=?, finished=?, message=?, "
                       "run_id=COALESCE(?, run_id) WHERE id=?",
                       (state, time.time(), message, run_id, item_id))

    def cancel_waiting(self, item_id: int) -> bool:
        """Cancel an item that has not started; False when it had (or had ended)."""
        with self._tx() as db:
            cur = db.execute("UPDATE items SET state=?, finished=?, message=? "
                             "WHERE id=? AND state=?",
                             (CANCELLED, time.time(), "cancelled before it started",
                              item_id, WAITING))
        return cur.rowcount == 1

    def requeue_running(self, why: str, ids: list[int] | None = None) -> int:
        """Items left running (by a window that ended, or one that is quitting; ``ids``:
        only these) wait again, first in the queue: their finished stages come from the
        store."""
        only = "" if ids is None else f" AND id IN ({','.join('?' * len(ids))})"
        with self._tx() as db:
            cur = db.execute("UPDATE items SET state=?, started=NULL, pos=pos-1000000, "
                             f"message=? WHERE state=?{only}",
                             (WAITING, why, RUNNING, *(ids or ())))
        return cur.rowcount

    def requeue_left_over(self, why: str,
                          busy: Callable[[Path], str | None] | None = None) -> int:
        """At a window's start: items a window or ``studio queue run`` left running when it
        ended wait again (:meth:`requeue_running`); an item whose project another process runs
        now (``busy``, default :func:`project_busy`: a live window or headless queue runs it)
        is left running there."""
        busy = project_busy if busy is None else busy
        ids = [i.id for i in self.items(finished=False)
               if i.state == RUNNING and busy(i.path) is None]
        return self.requeue_running(why, ids) if ids else 0

    def clear_finished(self) -> int:
        with self._tx() as db:
            cur = db.execute(f"DELETE FROM items WHERE state IN ({','.join('?' * len(FINAL))})",
                             FINAL)
        return cur.rowcount


def work_of(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """What an item does, in a form two items that do the same work share: a pipeline's
    stages and targets as sets, no retry / no remeasure however written; a sweep by its name
    (its worker count changes how, not what)."""
    if kind == "sweep":
        return {"kind": kind, "sweep": spec.get("sweep")}
    return {"kind": kind, "stages": sorted(spec.get("stages") or []) or None,
            "targets": sorted(spec.get("targets") or []) or None,
            "retry": list(spec["retry"]) if spec.get("retry") else None,
            "remeasure": bool(spec.get("remeasure"))}


def same_work(items: list[QueueItem], project: Path, kind: str, spec: dict[str, Any]
              ) -> QueueItem | None:
    """The waiting or running item of ``project`` that does the work ``kind``/``spec`` asks
    for (None: none): queueing it again would run it twice. A running item's recipe is the
    one it read when it started: the caller checks that it is still the file's."""
    key = str(Path(project).resolve())
    want = work_of(kind, spec)
    for item in items:
        if (item.state in (WAITING, RUNNING) and item.project == key
                and work_of(item.kind, item.spec) == want):
            return item
    return None


@dataclass(frozen=True)
class Counts:
    """How many items run and wait: the one count the Queue page and the status bar show."""

    running: int
    waiting: int
    paused: bool = False

    @classmethod
    def of(cls, items: list[QueueItem], paused: bool = False) -> Counts:
        return cls(sum(1 for i in items if i.state == RUNNING),
                   sum(1 for i in items if i.state == WAITING), paused)

    @property
    def total(self) -> int:
        return self.running + self.waiting

    def text(self) -> str:
        return (f"{self.running} running, {self.waiting} waiting"
                + (" (paused)" if self.paused else ""))


def default_slots() -> int:
    """One item per four cores, at least one: the HTP simulator and the quantizer each keep
    a core busy, and the profile's simulated timings follow the host's load."""
    return max(1, (os.cpu_count() or 1) // 4)


#: how the queue's reasons name things (the scheduler's policy words them)
QUEUE_WORDS = workpolicy.Words(
    paused="the queue is paused: Resume starts it",
    slots_hint="raise 'at once' to run more together",
    memory_what="its largest stage is predicted to peak at")


def as_work(item: QueueItem) -> workpolicy.Work:
    """A queue item as the scheduler's policy reads it: one project at a time, a sweep
    taking its workers' slots, its predicted peak."""
    return workpolicy.Work(item.id, item.state, item.project, item.priority, item.pos,
                           item.cores, item.peak)


def scheduled(item: QueueItem) -> dict[str, Any]:
    """What the scheduler holds of a queue item beside its name (a :class:`WorkItem`'s
    fields): its project the group it runs one at a time in, its priority and place, the
    slots of a sweep's workers, its predicted peak."""
    return {"group": item.project, "priority": item.priority, "pos": item.pos,
            "cores": item.cores, "memory": item.peak}


def predicted_peak(project, kind: str, spec: dict[str, Any]) -> int | None:
    """The item's largest predicted stage peak (estimated), from the project's part plan;
    None where the studio has no memory line for the project or its stages."""
    if kind != "pipeline":
        return None
    try:
        plan = part_plan(project)
    except Exception:  # noqa: BLE001 - no prediction; the stage checks its own memory
        return None
    if plan is None:
        return None
    stages = spec.get("stages") if not spec.get("retry") else None
    peaks = [v for k, v in plan.peaks.items() if v and (stages is None or k in stages)]
    return max(peaks) if peaks else None


def project_busy(path: Path) -> str | None:
    """A sentence when another process runs the project (its pipeline lock is held)."""
    try:
        held = RunLock(Path(path).with_suffix(".studio")).held()
    except OSError:
        return None
    if held:
        return ("another process runs this project now (studio --batch or a second window): "
                "it starts when that run ends")
    return None


def queue_scheduler(queue: WorkQueue, on_end: Callable[[WorkItem], None], *,
                    free_bytes: Callable[[], int] = available_memory,
                    busy: Callable[[Path], str | None] = project_busy) -> Scheduler:
    """The scheduler of the queue's items (:func:`sync` brings them in), by the rules of the
    module docstring in the words the Queue page shows: a sweep wider than the slots starts
    alone. It records in the file as an item starts (one another window or process started
    first is let go), moves or changes priority, and as the queue is paused or its slots
    change; ``on_end(item)``: the caller records how an item ended (:meth:`WorkQueue.finish`,
    with the run it made)."""
    return Scheduler(slots=queue.slots, paused=queue.paused, free_bytes=free_bytes,
                     words=QUEUE_WORDS, busy=lambda group: busy(Path(group)),
                     refuse_wide=False, on_end=on_end,
                     on_start=lambda i: queue.mark_running(i.id),
                     on_change=lambda i: queue.place(i.id, i.priority, i.pos),
                     on_pause=queue.set_paused, on_slots=queue.set_slots)


def sync(sched: Scheduler, queue: WorkQueue, start: Callable[[WorkItem], None], *,
         paused: bool | None = None) -> None:
    """Bring the scheduler up to the queue's file, which other windows and processes share:
    its pause (``paused``: the caller's own instead) and slots; its waiting items — added,
    moved, ended or started elsewhere —, each started by ``start``; and what runs elsewhere,
    counted against the slots and its project. What runs here is left as it is."""
    stored = queue.items(finished=False)
    sched.paused = queue.paused if paused is None else paused
    sched.slots = queue.slots
    waiting = {i.id: i for i in stored if i.state == WAITING}
    for w in list(sched.items.values()):
        if w.state != RUNNING and (w.id not in waiting or w.state != WAITING):
            sched.forget(w.id)
    for item in waiting.values():
        held = sched.items.get(item.id)
        if held is None:
            sched.add(item.label, item_id=item.id, start=start, **scheduled(item))
        elif held.state == WAITING:
            held.priority, held.pos = item.priority, item.pos
    sched.elsewhere = [as_work(i) for i in stored
                       if i.state == RUNNING and i.id not in sched.items]
