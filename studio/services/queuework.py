"""What running one item of the work queue means (:mod:`studio.services.workqueue`), Qt-free.

:func:`work_for` turns a queue item and the project read from its file when it starts into an
:class:`ItemWork`: the coroutine that runs it on a session of its own (``Studio``) and closes
that session, how it is cancelled (the whole item or one job of it), what its events look
like to another thread, what the queue records when it ends and what it does now. The
window's queue runner starts every item the same way, on a thread and an asyncio loop of its
own (``studio queue run`` on tasks of one loop), and leaves the rest to the item:

- a ``pipeline`` item runs the project's pipeline (the stages, targets, retry and remeasure
  its spec names), as ``studio --batch`` does; its events are a run's (the window's run pages
  follow the open project's);
- a ``sweep`` item runs the project's sweep with its worker count, as ``studio sweep``
  does; its events are copied as plain data (the Sweeps page draws them).

Every method except :meth:`ItemWork.run` and :meth:`ItemWork.cancel` is called on the
caller's thread with the events it was handed (:meth:`ItemWork.seen`); ``cancel`` runs on
the item's loop (the caller hands it there), ``cancel_asked`` may be set from anywhere.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.core.hostmem import available_memory
from studio.core.jobs import FINAL as JOB_FINAL
from studio.core.project import Project
from studio.core.scheduler import WorkItem
from studio.services import workqueue
from studio.services.pipeline import Pipeline, RunSummary
from studio.services.session import Studio
from studio.services.sweeps import SweepRunner, find_spec
from studio.services.workqueue import QueueItem, WorkQueue

Listener = Callable[[dict[str, Any]], None]


class ItemWork(ABC):
    """One queue item's work; see the module docstring."""

    #: its events are a pipeline run's: the window's run pages follow the open project's
    run_events = False

    def __init__(self, item: QueueItem, project: Project):
        self.item = item
        self.project = project  # the file as it was when the item started: what it runs
        self.listeners: list[Listener] = []
        self.cancel_asked = False
        self.jobs: dict[Any, Any] = {}  # what its events said of its jobs, by id or key
        self.run_id: int | None = None

    def _emit(self, event: dict[str, Any]) -> None:
        for cb in list(self.listeners):
            cb(event)

    async def run(self) -> Any:
        """Run the item on a session of its own, closed after."""
        studio = Studio(self.project)
        try:
            return await self._run(studio)
        finally:
            studio.close()

    @abstractmethod
    async def _run(self, studio: Studio) -> Any:
        """The item's work on ``studio``; its result."""

    @abstractmethod
    def cancel(self, job_id: int | None = None) -> None:
        """Cancel the item (or one job of it), on the item's loop."""

    def copy(self, event: dict[str, Any]) -> dict[str, Any]:
        """An event as another thread may keep it (the objects go on changing here)."""
        return event

    @abstractmethod
    def seen(self, event: dict[str, Any]) -> None:
        """A copied event, on the caller's thread: what the item's progress reads."""

    @abstractmethod
    def outcome(self, result: Any) -> tuple[str, int | None, str]:
        """What the queue records of an item that returned ``result``: its state, the run it
        made and a message."""

    @abstractmethod
    def progress(self) -> str:
        """What the item does now, in a few words."""


class PipelineWork(ItemWork):
    """A pipeline run of the project, as ``studio --batch`` runs it."""

    run_events = True

    def __init__(self, item: QueueItem, project: Project):
        super().__init__(item, project)
        self.pipeline: Pipeline | None = None

    async def _run(self, studio: Studio) -> RunSummary:
        spec = self.item.spec
        pipeline = studio.pipeline
        pipeline.listeners.append(self._emit)
        self.pipeline = pipeline
        if self.cancel_asked:
            raise StudioError("cancelled before it started")
        retry = tuple(spec["retry"]) if spec.get("retry") else None
        task = asyncio.ensure_future(pipeline.run(spec.get("stages"), spec.get("targets"),
                                                  retry, bool(spec.get("remeasure"))))
        await asyncio.sleep(0)  # the run has set itself up: a cancel holds
        if self.cancel_asked:
            pipeline.cancel(None)
        return await task

    def cancel(self, job_id: int | None = None) -> None:
        if job_id is None:
            self.cancel_asked = True
        if self.pipeline is not None:
            self.pipeline.cancel(job_id)

    def seen(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "job":
            self.jobs[event["job"].id] = event["job"]
        elif event.get("kind") == "run":
            self.run_id = int(event["run_id"])

    def outcome(self, result: RunSummary) -> tuple[str, int | None, str]:
        return result.state, result.run_id, result.error or ""

    def progress(self) -> str:
        jobs = list(self.jobs.values())
        if not jobs:
            return "planning the run (hashing the inputs)…"
        done = sum(1 for j in jobs if j.state in JOB_FINAL)
        running = [j for j in jobs if j.state == "running"]
        text = f"job {min(done + 1, len(jobs))} of {len(jobs)}"
        if running:
            j = running[0]
            text += f" · {j.label} {j.progress:.0%}" + (f" · {j.message}" if j.message else "")
        return text


class SweepWork(ItemWork):
    """A sweep of the project with the item's worker count, as ``studio sweep`` runs it;
    its result is the sweep's summary as plain data."""

    def __init__(self, item: QueueItem, project: Project):
        super().__init__(item, project)
        self.runner: SweepRunner | None = None

    async def _run(self, studio: Studio) -> dict[str, Any]:
        spec = find_spec(studio.project, self.item.spec["sweep"])
        runner = SweepRunner(studio.project, studio.jobs, studio.store, spec, None,
                             int(self.item.spec.get("workers", 1)))
        runner.listeners.append(self._emit)
        self.runner = runner
        if self.cancel_asked:  # cancelled before the runner existed
            runner.cancel()
        summary = await runner.run()
        return summary.to_dict()

    def cancel(self, job_id: int | None = None) -> None:
        self.cancel_asked = True
        if self.runner is not None:
            self.runner.cancel()

    def copy(self, event: dict[str, Any]) -> dict[str, Any]:
        kind = event.get("kind")
        if kind == "point":
            return {"kind": "point", "point": event["point"].to_dict()}
        if kind == "job":
            j = event["job"]
            return {"kind": "job", "job": {**j.to_dict(), "label": j.label,
                                           "progress": j.progress}}
        return {"kind": "sweep", "state": event.get("state"), "points": event.get("points"),
                "jobs": len(self.runner.unique) if self.runner is not None else 0}

    def seen(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "job":
            self.jobs[event["job"]["key"]] = event["job"]

    def outcome(self, result: dict[str, Any] | None) -> tuple[str, int | None, str]:
        state = (result or {}).get("state", workqueue.FAILED)
        return (state if state in workqueue.FINAL else workqueue.SUCCEEDED), None, ""

    def progress(self) -> str:
        jobs = list(self.jobs.values())
        done = sum(1 for j in jobs if j["state"] in ("succeeded", "failed", "cancelled"))
        now = [f"{j['label']} {j['progress']:.0%}" for j in jobs if j["state"] == "running"]
        return f"{done} of {len(jobs)} jobs done" + (" · " + ", ".join(now) if now else "")


#: the work of each kind of queue item (workqueue.KINDS)
WORKS: dict[str, type[ItemWork]] = {"pipeline": PipelineWork, "sweep": SweepWork}


def ended_as(work: ItemWork, result: Any, error: BaseException | None
             ) -> tuple[str, int | None, str]:
    """What the queue records of an item whose work returned ``result`` or raised ``error``:
    its state, the run it made and a message. An error after a cancel is the cancel; one
    that is no StudioError is a bug, said as such (the caller prints its traceback)."""
    if error is None:
        return work.outcome(result)
    if isinstance(error, StudioError):
        state = workqueue.CANCELLED if work.cancel_asked else workqueue.FAILED
        return state, work.run_id, error.message
    return workqueue.FAILED, work.run_id, f"stopped with an unexpected error: {error!r}"


def work_for(item: QueueItem, project: Project) -> ItemWork:
    """The work of ``item``, on ``project`` (read from the item's file as it starts)."""
    try:
        return WORKS[item.kind](item, project)
    except KeyError:
        raise StudioError(f"unknown kind of queue item {item.kind!r}") from None


def load_for(item: QueueItem) -> Project:
    """The project an item runs, read from its file as it starts (a StudioError says why it
    does not start)."""
    try:
        return projectfile.load(item.path)
    except StudioError as exc:
        raise StudioError(f"not started: {exc.message}") from None


#: what an item ``studio queue run`` ran when it was interrupted says as it waits again
INTERRUPTED = ("studio queue run was interrupted while it ran; it runs again when the queue "
               "does (finished stages come from the artifact store)")


class HeadlessQueue:
    """The queue's items run on this process's event loop (``studio queue run``): the
    window's scheduler over the same file (:func:`workqueue.queue_scheduler`), each item's
    work a task of the loop. Items added while it runs (by a window, ``studio queue add``)
    run too; a pause of the window's queue does not hold it (asking it to run is the
    resume). ``say(line)``: a line as an item starts and ends."""

    def __init__(self, queue: WorkQueue, say: Callable[[str], None] = lambda _line: None, *,
                 free_bytes: Callable[[], int] = available_memory,
                 busy: Callable[[Path], str | None] = workqueue.project_busy):
        self.queue, self.say = queue, say
        self.sched = workqueue.queue_scheduler(queue, self._ended, free_bytes=free_bytes,
                                               busy=busy)
        self.works: dict[int, ItemWork] = {}
        self.tasks: dict[int, asyncio.Task] = {}
        self.run_ids: dict[int, int | None] = {}
        #: the items it ran (or refused as they started), as they ended
        self.ran: list[WorkItem] = []
        self.stopping = False

    async def run(self, poll: float = 2.0) -> list[WorkItem]:
        """Run until nothing waits or runs (looking at the file every ``poll`` seconds while
        items wait for another process); the items it ran. Interrupted, its running items
        are stopped and wait again, first."""
        try:
            await self.sched.run(poll=poll, refresh=self._sync)
        except BaseException:
            self.stopping = True
            left = [i for i, t in self.tasks.items() if not t.done()]
            for item_id in left:
                self.tasks[item_id].cancel()
            if left:
                await asyncio.wait([self.tasks[i] for i in left])
            self.queue.requeue_running(INTERRUPTED, left)
            raise
        return self.ran

    def _sync(self) -> None:
        workqueue.sync(self.sched, self.queue, self._start, paused=False)

    def _start(self, w: WorkItem) -> None:
        item = self.queue.get(w.id)
        work = work_for(item, load_for(item))
        self.works[w.id] = work
        w.stop = work.cancel
        task = asyncio.get_running_loop().create_task(work.run())
        self.tasks[w.id] = task
        task.add_done_callback(functools.partial(self._done, w.id))
        self.say(f"{w.name}: started")

    def _done(self, item_id: int, task: asyncio.Task) -> None:
        work = self.works[item_id]
        result, error = None, None
        if task.cancelled():
            state, run_id, msg = workqueue.CANCELLED, work.run_id, "cancelled"
        else:
            error = task.exception()
            result = task.result() if error is None else None
            state, run_id, msg = ended_as(work, result, error)
            if error is not None and not isinstance(error, StudioError):
                self.say("".join(traceback.format_exception(error)).rstrip())
        self.run_ids[item_id] = run_id
        self.sched.ended(item_id, state, msg, result=result, error=error)

    def _ended(self, w: WorkItem) -> None:
        """An item ended: recorded in the file (not one stopped as the run is interrupted:
        it waits again), and said."""
        work = self.works.pop(w.id, None)
        self.ran.append(w)
        if work is None and w.state == workqueue.CANCELLED:
            self.queue.cancel_waiting(w.id)
        elif self.stopping and w.state == workqueue.CANCELLED:
            self.say(f"{w.name}: stopped; it waits again")
            return
        else:
            self.queue.finish(w.id, w.state, w.why, self.run_ids.pop(w.id, None))
        self.say(f"{w.name}: {w.state}" + (f": {w.why}" if w.why not in ("", w.state) else ""))
