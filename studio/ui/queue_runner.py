"""Runs the work queue (:mod:`studio.services.workqueue`) behind the window.

The queue's file is the record (a window that restarts finds what waited; another window or
process sees it); one :class:`~studio.core.scheduler.Scheduler` (``sched``) chooses
what starts — one item at a time per project, by priority and the user's order, within the
slots and the free memory, waiting for a project another process runs — and records each
change there: the user's cancel, move, priority, pause and slots go through it.

Each item runs on its own asyncio loop in a runner thread (:class:`ItemThread`), on a session
of its own (``Studio``) opened from the project file as it is when the item starts: what runs
is what the file says, as ``studio --batch`` and ``studio info`` read it. What running an item
means — a pipeline run, a sweep — is the item's work (:mod:`studio.services.queuework`); this
module is the Qt glue: threads, signals, the window's own project. The window's edits of the
open project are saved first — when the item is queued and again when it starts (edits made
while it waited) — or the item does not start, and says why (the file changed outside the
studio, or cannot be written). So an item of a project goes on running when the window opens
another project, and a project's items line up behind each other whichever project is open.
Events come back through a queued signal: the open project's runs go on to the pages (the
controller's ``job_event`` and the rest), its sweeps to the Sweeps page (``started``), every
item's progress to the queue's list; the item's end goes to the scheduler
(:meth:`~studio.core.scheduler.Scheduler.ended`), which records it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, QTimer, Signal

from studio.core.errors import StudioError
from studio.core.scheduler import WorkItem
from studio.services import workqueue
from studio.services.queuework import ItemWork, ended_as, load_for, work_for
from studio.services.workqueue import QueueItem, WorkQueue
from studio.ui.item_thread import ItemThread

INTERRUPTED = ("the window ended while it ran; it runs again when the queue resumes (finished "
               "stages come from the artifact store)")


@dataclass
class _Running:
    item: QueueItem
    work: ItemWork  # what it runs, on the project read from the file when it started
    thread: ItemThread
    mine: bool = False  # an item of the project open in the window when it started
    run_id: int | None = None  # the run it made, once it ended

    @property
    def cancel_asked(self) -> bool:
        return self.work.cancel_asked

    def cancel(self, job_id: int | None = None) -> None:
        """Cancel the item's run (or one job of it) on the runner's loop."""
        self.thread.cancel(job_id)


class QueueRunner(QObject):
    #: the list changed (an item added, started, moved, ended, or its progress)
    changed = Signal()
    #: an item ended: (QueueItem, RunSummary | sweep summary dict | None)
    finished = Signal(object, object)
    #: an item started: (QueueItem, ItemThread) — the Sweeps page follows its sweeps
    started = Signal(object, object)

    def __init__(self, ctl, path: Path):
        super().__init__(ctl)
        self.ctl = ctl
        #: a line for the window when the queue file had to be set aside (else "")
        self.notice = ""
        try:
            self.queue = WorkQueue(path)
        except StudioError as exc:  # a damaged file: kept aside, a new queue in its place
            kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            path.rename(kept)
            for extra in ("-wal", "-shm"):
                path.with_name(path.name + extra).unlink(missing_ok=True)
            self.queue = WorkQueue(path)
            self.notice = (f"{exc.message.split(':')[0]}: it was kept as {kept.name} and a new, "
                           "empty queue started")
        #: items that waited or ran when the last window ended (the queue starts paused)
        self.left_over = 0
        self.queue.requeue_left_over(INTERRUPTED)
        waiting = self.queue.items(finished=False)
        if waiting:
            self.left_over = len(waiting)
            self.queue.set_paused(True)
        #: chooses what starts, in the queue's words, and records each change in the file
        self.sched = workqueue.queue_scheduler(self.queue, self._ended)
        self.running: dict[int, _Running] = {}
        self._waiters: dict[int, list[asyncio.Future]] = {}
        self._threads: list[threading.Thread] = []
        self._shut = False
        self._quitting = False
        self._timer = QTimer(self)
        self._timer.setInterval(2000)  # free memory and other processes' runs change
        self._timer.timeout.connect(self.kick)
        self._timer.start()
        # what waits says why, and the status bar counts it, from the first paint: not at
        # the timer's first tick
        QTimer.singleShot(0, self.kick)

    # ---- reading -----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """After :meth:`shutdown` (the window is quitting): nothing is read or started."""
        return self._shut

    @property
    def paused(self) -> bool:
        return not self._shut and self.queue.paused

    def items(self, finished: bool = True) -> list[QueueItem]:
        if self._shut:
            return []
        out = self.queue.items(finished)
        for i in out:
            r = self.running.get(i.id)
            if r is not None:
                i.progress = r.work.progress()
        return out

    def running_for(self, project: Path | None, kind: str = "pipeline") -> _Running | None:
        if project is None:
            return None
        key = str(Path(project).resolve())
        return next((r for r in self.running.values()
                     if r.item.project == key and r.item.kind == kind), None)

    def counts(self) -> workqueue.Counts:
        """How many items run and wait now: the count the Queue page and the status bar
        both show."""
        return workqueue.Counts.of(self.items(finished=False), self.paused)

    def waiting_for(self, project: Path | None) -> list[QueueItem]:
        if project is None or self._shut:
            return []
        key = str(Path(project).resolve())
        return [i for i in self.queue.items(finished=False)
                if i.project == key and i.state == workqueue.WAITING]

    # ---- adding ------------------------------------------------------------------------
    def add(self, project, kind: str, spec: dict[str, Any], priority: int = 0
            ) -> tuple[QueueItem, asyncio.Future | None, bool]:
        """Queue ``spec`` for ``project`` (a Project with its path); starts it now when the
        queue allows. Work a waiting or running item of the project already does (the same
        stages, targets, retry, sweep — and, for a running one, the recipe the file holds
        now) is not queued twice: the call joins that item. Returns the item, a future of its
        result (None without a loop) and whether it joined an item already there."""
        if self._shut:
            raise StudioError("the window is closing: nothing more is queued")
        if self._is_open_path(project.path):
            self.ctl.save_for_run()  # the run reads the file: the window's edits go there first
        item = self.same_work(project, kind, spec)
        joined = item is not None
        if item is None:
            item = self.queue.add(project.path, project.name, kind, spec, priority,
                                  peak=workqueue.predicted_peak(project, kind, spec))
        try:
            fut: asyncio.Future | None = asyncio.get_event_loop().create_future()
        except RuntimeError:
            fut = None
        if fut is not None:
            self._waiters.setdefault(item.id, []).append(fut)
        if not joined:
            self.kick()
        return self.queue.get(item.id), fut, joined

    def same_work(self, project, kind: str, spec: dict[str, Any]) -> QueueItem | None:
        """The waiting item, or the running one that runs the recipe ``project`` holds now,
        doing the work ``spec`` asks for (None: none)."""
        if self._shut:
            return None
        same = workqueue.same_work(self.queue.items(finished=False), project.path, kind, spec)
        if same is None or same.state == workqueue.WAITING:
            return same
        r = self.running.get(same.id)
        ran = r.work.project.to_dict() if r is not None else None
        return same if ran == project.to_dict() else None

    # ---- the user's changes: through the scheduler, which records them ------------------
    def cancel(self, item_id: int) -> None:
        """Cancel an item: a waiting one does not start, a running one is stopped."""
        self._sync()
        self.sched.cancel(item_id)
        self.kick()

    def move(self, item_id: int, delta: int) -> None:
        self._sync()
        self.sched.move(item_id, delta)
        self.kick()

    def set_priority(self, item_id: int, priority: int) -> None:
        workqueue.check_priority(priority)
        self._sync()
        self.sched.set_priority(item_id, priority)
        self.kick()

    def set_paused(self, paused: bool) -> None:
        self.sched.set_paused(paused)
        if not paused:
            self.left_over = 0
        self.kick()

    def set_slots(self, n: int) -> None:
        self.sched.set_slots(n)
        self.kick()

    def clear_finished(self) -> None:
        self.queue.clear_finished()
        self.changed.emit()

    # ---- scheduling --------------------------------------------------------------------
    @property
    def why(self) -> dict[int, str]:
        """Why each waiting item waits, as the scheduler last said."""
        return {i.id: i.why for i in self.sched.items.values()
                if i.state == workqueue.WAITING and i.why}

    def _sync(self) -> None:
        workqueue.sync(self.sched, self.queue, self._start)

    def kick(self) -> None:
        """Start what may start now; note why the others wait."""
        if self._shut or self._quitting:
            return
        self._sync()
        self.sched.step()
        self.changed.emit()

    def _start(self, w: WorkItem) -> None:
        """Start the scheduler's item on a thread of its own (the file has it running); a
        StudioError raised here ends it failed, saying why."""
        ctl = self.ctl
        item = self.queue.get(w.id)
        mine = self._is_open(item)
        if mine:  # edits made while the item waited: in the file before it reads it
            ctl.save_for_run()
        # read once, here: the recipe it runs is the file's now (same_work compares it)
        work = work_for(item, load_for(item))
        thread = ItemThread(work, self)
        w.stop = thread.cancel
        self.running[item.id] = _Running(item, work, thread, mine)
        thread.event.connect(lambda ev, item_id=item.id: self._on_event(item_id, ev))
        self._threads = [t for t in self._threads if t.is_alive()] + [thread.thread]
        if mine and work.run_events:
            ctl.running_changed.emit(True)
        self.started.emit(item, thread)
        thread.start()

    # ---- events ------------------------------------------------------------------------
    def _on_event(self, item_id: int, event: dict[str, Any]) -> None:
        r = self.running.get(item_id)
        if r is None:
            return
        kind = event.get("kind")
        if kind == "done":
            self._on_done(item_id, event.get("summary"), event.get("error"))
            return
        r.work.seen(event)
        if r.work.run_events and self._is_open(r.item):
            self.ctl.dispatch_event(event)
        if kind in ("job", "run"):
            self.changed.emit()

    def _is_open(self, item: QueueItem) -> bool:
        return self._is_open_path(item.path)

    def _is_open_path(self, path: Path | None) -> bool:
        ctl = self.ctl
        return (ctl.studio is not None and path is not None
                and ctl.project.path.resolve() == Path(path).resolve())

    def _on_done(self, item_id: int, result: Any, error: BaseException | None) -> None:
        """An item's thread ended: the scheduler hears how (and :meth:`_ended` records it)."""
        r = self.running.get(item_id)
        if r is None:
            return
        state, r.run_id, msg = ended_as(r.work, result, error)
        if error is not None and not isinstance(error, StudioError):
            traceback.print_exception(error)
        self.sched.ended(item_id, state, msg, result=result if error is None else None,
                         error=error)
        self.kick()

    def _ended(self, w: WorkItem) -> None:
        """The scheduler's item ended: recorded in the file (a cancel while the window quits
        is not: the item waits for the next window), said, its waiters answered."""
        r = self.running.pop(w.id, None)
        if r is None:  # it never ran: cancelled while it waited, or refused as it started
            if w.error is not None and not isinstance(w.error, StudioError):
                traceback.print_exception(w.error)
            if w.state == workqueue.CANCELLED:
                self.queue.cancel_waiting(w.id)
                self._settle(w.id, None)
                return
            self.queue.finish(w.id, w.state, w.why)
            item = self.queue.get(w.id)
            self.ctl.message.emit("error", f"#{item.id} {item.name} ({item.what}): {w.why}")
            self._settle(w.id, None)
            self.finished.emit(item, None)
            return
        item, mine = r.item, self._is_open(r.item)
        if not (self._quitting and w.state == workqueue.CANCELLED):
            self.queue.finish(w.id, w.state, w.why, r.run_id)
            if w.error is not None and w.state == workqueue.FAILED:
                self.ctl.message.emit("error", w.why if mine else f"#{w.id} {item.name}: "
                                      f"{w.why}")
        if mine and r.work.run_events:
            self.ctl.run_ended(w.result)
        self._settle(w.id, w.result)
        self.finished.emit(item, w.result)

    def _settle(self, item_id: int, result: Any) -> None:
        for fut in self._waiters.pop(item_id, []):
            if not fut.done():
                fut.set_result(result)

    # ---- the window ends ---------------------------------------------------------------
    def wait_idle(self, timeout_s: float, only: set[int] | None = None) -> bool:
        """Keep the UI's events going until the running items (or those of ``only``) end."""
        deadline = time.monotonic() + timeout_s

        def busy() -> bool:
            return any(only is None or i in only for i in self.running)

        while busy() and time.monotonic() < deadline:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            time.sleep(0.005)
        return not busy()

    def shutdown(self) -> None:
        """Stop every running item (they wait again, first, for the next window), then let
        the threads end."""
        if self._shut:
            return
        self._quitting = True  # what ends cancelled now waits again (requeue_running)
        ids = set(self.running)
        for item_id in ids:
            self.sched.cancel(item_id)
        self.wait_idle(60.0, ids)
        self._shut = True
        self._timer.stop()
        self.queue.requeue_running(INTERRUPTED)
        for t in self._threads:
            t.join(30)
        self.queue.close()

