"""The scheduler: one queue of work items — a pipeline's stage jobs, a sweep's jobs — run as
the machine allows, over an executor that says where work runs
(:mod:`studio.services.executors`: this machine's worker processes, or a Ray cluster). The
window's queue (:mod:`studio.services.workqueue`, persisted, paused, shared between
processes) and a stage's parts (:mod:`studio.worker.parts`) choose what starts by the same
policy (:mod:`studio.core.workpolicy`).

A :class:`WorkItem` is a coroutine to run with what it waits for (other items), a priority,
the cores and memory it takes and the group it runs one-at-a-time in. Which waiting item
starts is the pure policy of :mod:`studio.core.workpolicy` (the work queue and a stage's
parts choose by it too); :class:`Scheduler` runs the chosen ones on the event loop:

- an item that ends without succeeding (it raised, or returned what ``ok`` refuses) ends its
  dependants unrun, each told which item it waited for (``blocked_by``);
- :meth:`Scheduler.cancel` ends a waiting item at once, and stops a running one (its own
  ``stop``, e.g. a worker's terminate, else its task is cancelled);
- cores and memory are budgets: an item that asks for more cores than the slots is refused
  with the reason; an item whose predicted memory does not fit in the free memory waits
  while another runs (alone, it starts: its stage's own memory check then refuses it in one
  line) (:func:`workpolicy.select`).

A resumed run resumes through what its jobs keep, not here: a job whose artifact is stored
is a cache hit of the job runner (recorded as reused), a sweep's finished points are kept
(:mod:`studio.services.sweeps`), a stage's finished parts are kept in its work folder.

Qt-free: the CLI (``studio --batch``, ``studio sweep``) and the window use it alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from studio.core import workpolicy
from studio.core.hostmem import available_memory

WAITING, RUNNING = workpolicy.WAITING, workpolicy.RUNNING
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
ENDED = (SUCCEEDED, FAILED, CANCELLED)
#: how a dependency has to end for its dependants to run
DONE = (SUCCEEDED,)


@dataclass(eq=False)
class WorkItem:
    """One piece of work: ``run()`` is awaited when the policy starts it."""

    id: int
    name: str
    run: Callable[[], Awaitable[Any]]
    deps: tuple[int, ...] = ()
    priority: int = 0
    cores: int = 1
    memory: int | None = None
    group: str = ""
    #: stops the item while it runs (a worker's terminate); None: its task is cancelled
    stop: Callable[[], None] | None = None
    state: str = WAITING
    result: Any = None
    error: BaseException | None = None
    #: why it waits now, or why it ended unrun
    why: str = ""
    #: the dependency that ended without succeeding, for an item ended unrun
    blocked_by: WorkItem | None = None
    cancel_asked: bool = False

    def as_work(self) -> workpolicy.Work:
        return workpolicy.Work(self.id, self.state, self.group, self.priority, float(self.id),
                               self.cores, self.memory, self.deps)


@dataclass
class Scheduler:
    """Runs work items by the policy (see the module docstring). ``slots``: the cores the
    items may take at once; ``free_bytes``: the free memory now; ``ok(result)``: whether an
    item that returned ``result`` succeeded; ``on_end(item)`` is called once per item as it
    ends (succeeded, failed, cancelled or ended unrun)."""

    slots: int = 1
    free_bytes: Callable[[], int] = available_memory
    headroom: int = 512 << 20
    #: where the items run, for a refusal's words
    where: str = "this machine"
    ok: Callable[[Any], bool] = lambda _r: True
    on_end: Callable[[WorkItem], None] = lambda _i: None
    items: dict[int, WorkItem] = field(default_factory=dict)
    _tasks: dict[asyncio.Future, WorkItem] = field(default_factory=dict)

    def add(self, name: str, run: Callable[[], Awaitable[Any]], *,
            deps: tuple[int, ...] | list[int] = (), **kw: Any) -> WorkItem:
        """A new waiting item; ``deps`` are ids of items added before it."""
        for d in deps:
            if d not in self.items:
                raise ValueError(f"{name}: it waits for #{d}, which the scheduler does not hold")
        item = WorkItem(len(self.items) + 1, name, run, tuple(deps), **kw)
        self.items[item.id] = item
        return item

    # ---- control -------------------------------------------------------------------------
    def cancel(self, item_id: int | None = None, running: bool = True) -> None:
        """Cancel one item (or, with no id, every one): a waiting item ends now, a running
        one is stopped and ends as it stops (``running=False``: running items are left to
        the caller, who stops them its own way)."""
        for item in list(self.items.values()):
            if item_id is not None and item.id != item_id:
                continue
            if item.state == WAITING:
                item.cancel_asked = True
                self._end(item, CANCELLED, "cancelled")
            elif item.state == RUNNING and running and not item.cancel_asked:
                item.cancel_asked = True
                if item.stop is not None:
                    item.stop()
                else:
                    next(t for t, i in self._tasks.items() if i is item).cancel()

    def _end(self, item: WorkItem, state: str, why: str = "") -> None:
        item.state, item.why = state, why or item.why
        self.on_end(item)

    # ---- choosing ------------------------------------------------------------------------
    def selection(self) -> workpolicy.Selection:
        """What starts now and why the rest waits (pure: nothing is started)."""
        live = [i.as_work() for i in self.items.values() if i.state in (WAITING, RUNNING)]
        return workpolicy.select(live, slots=self.slots, free_bytes=self.free_bytes(),
                                 done=lambda d: self.items[d].state in DONE,
                                 headroom=self.headroom)

    def _settle(self) -> None:
        """End what can no longer run and refuse what no budget holds: until nothing
        changes."""
        changed = True
        while changed:
            changed = False
            for item in self.items.values():
                if item.state != WAITING:
                    continue
                bad = next((self.items[d] for d in item.deps
                            if self.items[d].state in (FAILED, CANCELLED)), None)
                if bad is not None:
                    item.blocked_by = bad
                    self._end(item, CANCELLED, f"not run: {bad.name} did not finish")
                elif (refused := self._refusal(item)) is not None:
                    self._end(item, FAILED, refused)
                else:
                    continue
                changed = True

    def _refusal(self, item: WorkItem) -> str | None:
        """Why the item can never start under the budgets (None: it can)."""
        why = workpolicy.refusal(item.as_work(), item.name, slots=self.slots, where=self.where)
        return f"refused: {why}" if why else None

    # ---- running -------------------------------------------------------------------------
    async def run(self) -> list[WorkItem]:
        """Run every item to its end; the items, in the order they were added. Interrupted
        (the caller's task cancelled), the running items are cancelled and awaited."""
        try:
            while True:
                self._settle()
                chosen = self.selection()
                for item in self.items.values():
                    if item.state == WAITING:
                        item.why = chosen.why.get(item.id, "")
                for item_id in chosen.start:
                    self._start(self.items[item_id])
                if not self._tasks:
                    break
                done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    self._finished(task)
        except BaseException:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
            raise
        for item in self.items.values():  # what never could start (should not happen)
            if item.state == WAITING:
                self._end(item, CANCELLED, f"not run: {item.why or 'it never could start'}")
        return list(self.items.values())

    def _start(self, item: WorkItem) -> None:
        item.state, item.why = RUNNING, ""
        self._tasks[asyncio.ensure_future(item.run())] = item

    def _finished(self, task: asyncio.Future) -> None:
        item = self._tasks.pop(task)
        if task.cancelled():
            self._end(item, CANCELLED, "cancelled")
            return
        exc = task.exception()
        if exc is not None:
            item.error = exc
            self._end(item, FAILED, getattr(exc, "message", None) or
                      f"{type(exc).__name__}: {exc}")
            return
        item.result = task.result()
        if self.ok(item.result):
            self._end(item, SUCCEEDED)
        else:
            self._end(item, CANCELLED if item.cancel_asked else FAILED,
                      "cancelled" if item.cancel_asked else "")
