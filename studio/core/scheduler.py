"""The scheduler: one queue of work items — a pipeline's stage jobs, a sweep's jobs, the
window's queue of runs and sweeps, a stage's parts — run as the machine allows, over an
executor that says where work runs (:mod:`studio.services.executors`: this machine's worker
processes, or a Ray cluster). It lives in the core, not in the services that run pipelines
and queues on it, because a stage's parts are scheduled inside the worker process that runs
the stage (:mod:`studio.worker.parts`), which sits below the services; it is pure Python
(the policy of :mod:`studio.core.workpolicy`, asyncio for its batch loop); the free memory
is all it reads of the machine.

A :class:`WorkItem` is work to run with what it waits for (other items), a priority and a
place within it, the cores and memory it takes and the group it runs one-at-a-time in.
Which waiting item starts is the pure policy of :mod:`studio.core.workpolicy`;
:class:`Scheduler` starts the chosen ones:

- an item that ends without succeeding (it raised, or returned what ``ok`` refuses) ends its
  dependants unrun, each told which item it waited for (``blocked_by``);
- :meth:`Scheduler.cancel` ends a waiting item at once, and stops a running one (its own
  ``stop``, e.g. a worker's terminate, else its task is cancelled);
- cores and memory are budgets: an item that asks for more cores than the slots is refused
  with the reason (``refuse_wide``; the window's queue lets it start alone instead); an item
  whose predicted memory does not fit in the free memory waits while another runs (alone, it
  starts: its stage's own memory check then refuses it in one line)
  (:func:`workpolicy.select`);
- a paused scheduler starts nothing, and a group another process runs now (``busy``: the
  project's run lock) waits for it; each waiting item says why it waits (``why``, in the
  scheduler's ``words``).

Two ways to run it:

- a batch (``studio --batch``, ``studio sweep``): items whose ``run`` is a coroutine,
  ``await scheduler.run()`` runs them all to their end on the event loop;
- a long-lived queue (the window's, ``studio queue run``): items are added, moved, paused
  and cancelled while it runs; :meth:`Scheduler.step` starts what may start now, each item
  through its ``start`` callback (its work goes on elsewhere, e.g. on a thread of its own)
  and :meth:`Scheduler.ended` says how it ended. A store records every transition through
  the hooks (``on_start`` — which may say another process took the item first —,
  ``on_end``, ``on_change``, ``on_pause``, ``on_slots``); ``elsewhere`` is the work another
  process runs, counted against the slots and its group. :meth:`Scheduler.run` drives such
  a queue too (``poll``, ``refresh``).

Every method is called on the scheduler's thread (the event loop's, or the window's).

A resumed run resumes through what its jobs keep, not here: a job whose artifact is stored
is a cache hit of the job runner (recorded as reused), a sweep's finished points are kept
(:mod:`studio.services.sweeps`), a stage's finished parts are kept in its work folder; an
item of the window's queue that was running when the window ended waits again, first.

Qt-free: the CLI (``studio --batch``, ``studio sweep``, ``studio queue``) and the window
use it alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from studio.core import workpolicy
from studio.core.errors import StudioError
from studio.core.hostmem import available_memory

WAITING, RUNNING = workpolicy.WAITING, workpolicy.RUNNING
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
ENDED = (SUCCEEDED, FAILED, CANCELLED)
#: how a dependency has to end for its dependants to run
DONE = (SUCCEEDED,)


@dataclass(eq=False)
class WorkItem:
    """One piece of work: ``run()`` is awaited when the policy starts it, or ``start(item)``
    starts it elsewhere and :meth:`Scheduler.ended` ends it."""

    id: int
    name: str
    run: Callable[[], Awaitable[Any]] | None = None
    deps: tuple[int, ...] = ()
    priority: int = 0
    #: within a priority, lower first (the user's order; the order added unless given)
    pos: float = 0.0
    cores: int = 1
    memory: int | None = None
    group: str = ""
    #: stops the item while it runs (a worker's terminate); None: its task is cancelled
    stop: Callable[[], None] | None = None
    #: starts the item's work elsewhere (a thread); it raises: the item ends failed, saying
    #: why. None: ``run`` is awaited on the scheduler's loop
    start: Callable[[WorkItem], None] | None = None
    state: str = WAITING
    result: Any = None
    error: BaseException | None = None
    #: why it waits now, or why it ended unrun
    why: str = ""
    #: the dependency that ended without succeeding, for an item ended unrun
    blocked_by: WorkItem | None = None
    cancel_asked: bool = False

    def as_work(self) -> workpolicy.Work:
        return workpolicy.Work(self.id, self.state, self.group, self.priority, self.pos,
                               self.cores, self.memory, self.deps)


def said(exc: BaseException) -> str:
    """What an exception says, in one line: a StudioError its message, else its type too."""
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


def _no_veto(_group: str) -> str | None:
    return None


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
    #: an item starts (before its work does); False: another process took it first: the
    #: scheduler lets it go unstarted and counts it among the work that runs ``elsewhere``
    on_start: Callable[[WorkItem], bool | None] = lambda _i: None
    #: a waiting item's priority or place changed (:meth:`move`, :meth:`set_priority`)
    on_change: Callable[[WorkItem], None] = lambda _i: None
    #: :meth:`set_paused` and :meth:`set_slots`, to be recorded (the hook may refuse: raise)
    on_pause: Callable[[bool], None] = lambda _p: None
    on_slots: Callable[[int], None] = lambda _n: None
    #: nothing starts while paused
    paused: bool = False
    #: a sentence when another process runs the group now (its items wait), else None
    busy: Callable[[str], str | None] = _no_veto
    #: how the reasons name things
    words: workpolicy.Words = field(default_factory=workpolicy.Words)
    #: an item that takes more cores than the slots is refused; False: it starts alone
    refuse_wide: bool = True
    #: work another process runs now: counted against the slots and its group
    elsewhere: list[workpolicy.Work] = field(default_factory=list)
    items: dict[int, WorkItem] = field(default_factory=dict)
    #: the highest id given so far (ids are not given twice, even after :meth:`forget`)
    last_id: int = 0
    _tasks: dict[asyncio.Future, WorkItem] = field(default_factory=dict)
    _wake: asyncio.Future | None = None

    def add(self, name: str, run: Callable[[], Awaitable[Any]] | None = None, *,
            deps: tuple[int, ...] | list[int] = (), item_id: int | None = None,
            **kw: Any) -> WorkItem:
        """A new waiting item; ``deps`` are ids of items added before it; ``item_id``: its
        id (a store's), else the next one; ``kw``: the other fields of :class:`WorkItem`."""
        if run is None and kw.get("start") is None:
            raise ValueError(f"{name}: give it a coroutine to run or a start")
        for d in deps:
            if d not in self.items:
                raise ValueError(f"{name}: it waits for #{d}, which the scheduler does not hold")
        if item_id is None:
            item_id = max(self.last_id, max(self.items, default=0)) + 1
        elif item_id in self.items:
            raise ValueError(f"{name}: the scheduler holds #{item_id} already")
        self.last_id = max(self.last_id, item_id)
        kw.setdefault("pos", float(item_id))
        item = WorkItem(item_id, name, run, tuple(deps), **kw)
        self.items[item.id] = item
        self._poke()
        return item

    def forget(self, item_id: int) -> None:
        """Let go of an item that does not run here (it ended, or a store no longer holds
        it): no hook is called. An item that waited for it counts it finished."""
        item = self.items.get(item_id)
        if item is None:
            return
        if item.state == RUNNING:
            raise ValueError(f"#{item_id} runs: it ends before it is let go")
        del self.items[item_id]

    # ---- control -------------------------------------------------------------------------
    def cancel(self, item_id: int | None = None, running: bool = True) -> bool:
        """Cancel one item (or, with no id, every one): a waiting item ends now, a running
        one is stopped and ends as it stops (``running=False``: running items are left to
        the caller, who stops them its own way). Whether anything was cancelled."""
        hit = False
        for item in list(self.items.values()):
            if item_id is not None and item.id != item_id:
                continue
            if item.state == WAITING:
                item.cancel_asked = hit = True
                self._end(item, CANCELLED, "cancelled")
            elif item.state == RUNNING and running and not item.cancel_asked:
                item.cancel_asked = hit = True
                if item.stop is not None:
                    item.stop()
                else:
                    for task in [t for t, i in self._tasks.items() if i is item]:
                        task.cancel()
        self._poke()
        return hit

    def ended(self, item_id: int, state: str, why: str = "", *, result: Any = None,
              error: BaseException | None = None) -> None:
        """A running item's work ended (``state``: succeeded, failed or cancelled): it is
        recorded (``on_end``) and what waited for it may start at the next step. An item
        that does not run here is left as it is."""
        if state not in ENDED:
            raise ValueError(f"{state!r} is not how work ends (one of {', '.join(ENDED)})")
        item = self.items.get(item_id)
        if item is None or item.state != RUNNING:
            return
        item.result, item.error = result, error
        self._end(item, state, why)
        self._poke()

    def move(self, item_id: int, delta: int) -> None:
        """Move a waiting item ``delta`` places earlier (negative) or later among the waiting
        items of its priority; each item whose place changed is recorded (``on_change``)."""
        item = self.items.get(item_id)
        if item is None or item.state != WAITING:
            state = item.state if item is not None else "not waiting"
            raise StudioError(f"#{item_id} is {state}: only waiting items move")
        peers = [i.as_work() for i in self.items.values()
                 if i.state == WAITING and i.priority == item.priority]
        for moved_id, pos in workpolicy.moved(peers, item_id, delta).items():
            self.items[moved_id].pos = pos
            self.on_change(self.items[moved_id])
        self._poke()

    def set_priority(self, item_id: int, priority: int) -> None:
        """A waiting item's priority (one that runs or ended keeps its own)."""
        item = self.items.get(item_id)
        if item is None or item.state != WAITING or item.priority == priority:
            return
        item.priority = priority
        self.on_change(item)
        self._poke()

    def set_paused(self, paused: bool) -> None:
        """Pause (nothing more starts; what runs goes on) or resume."""
        self.on_pause(paused)
        self.paused = paused
        self._poke()

    def set_slots(self, n: int) -> None:
        """The cores the items may take at once from now (what runs goes on)."""
        if n < 1:
            raise ValueError(f"slots must be at least 1, not {n}")
        self.on_slots(n)
        self.slots = n
        self._poke()

    def _end(self, item: WorkItem, state: str, why: str = "") -> None:
        item.state, item.why = state, why or item.why
        self.on_end(item)

    def _poke(self) -> None:
        """Something changed: :meth:`run` looks again."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # ---- choosing ------------------------------------------------------------------------
    def selection(self) -> workpolicy.Selection:
        """What starts now and why the rest waits (pure: nothing is started)."""
        live = [i.as_work() for i in self.items.values() if i.state in (WAITING, RUNNING)]
        return workpolicy.select(live + self.elsewhere, slots=self.slots,
                                 free_bytes=self.free_bytes(), paused=self.paused,
                                 done=self._done, busy=self.busy, headroom=self.headroom,
                                 words=self.words)

    def _done(self, item_id: int) -> bool:
        item = self.items.get(item_id)
        return item is None or item.state in DONE  # let go of: the caller saw it finish

    def _settle(self) -> None:
        """End what can no longer run and refuse what no budget holds: until nothing
        changes."""
        changed = True
        while changed:
            changed = False
            for item in list(self.items.values()):
                if item.state != WAITING:
                    continue
                bad = next((dep for d in item.deps if (dep := self.items.get(d)) is not None
                            and dep.state in (FAILED, CANCELLED)), None)
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
        if not self.refuse_wide:
            return None
        why = workpolicy.refusal(item.as_work(), item.name, slots=self.slots, where=self.where)
        return f"refused: {why}" if why else None

    # ---- running -------------------------------------------------------------------------
    def step(self) -> list[WorkItem]:
        """End what can no longer run, note why each waiting item waits and start what may
        start now (again while a start failed or was let go: its slot is free): the items
        started."""
        started: list[WorkItem] = []
        again = True
        while again:
            again = False
            self._settle()
            chosen = self.selection()
            for held in self.items.values():
                if held.state == WAITING:
                    held.why = chosen.why.get(held.id, "")
            for item_id in chosen.start:
                item = self.items.get(item_id)
                # a hook that stepped again (a signal's slot) may have started it already
                if item is None or item.state != WAITING:
                    continue
                if self._start(item):
                    started.append(item)
                else:
                    again = True
        return started

    def _start(self, item: WorkItem) -> bool:
        item.state, item.why = RUNNING, ""
        if self.on_start(item) is False:  # another process took it first: it runs there
            del self.items[item.id]
            self.elsewhere.append(item.as_work())
            return False
        if item.start is not None:
            try:
                item.start(item)
            except Exception as exc:  # noqa: BLE001 - the item ends failed, saying why
                item.error = exc
                self._end(item, FAILED, said(exc))
                return False
            return True
        assert item.run is not None  # add() holds no item without work
        self._tasks[asyncio.ensure_future(item.run())] = item
        return True

    async def run(self, poll: float | None = None,
                  refresh: Callable[[], None] | None = None) -> list[WorkItem]:
        """Run the items to their end; the items, in the order they were added. ``poll``:
        while items wait for what the scheduler does not see end (a resume, another
        process's run of their group, memory), look again every ``poll`` seconds (None:
        such items end unrun as soon as nothing runs); ``refresh()``: called before each
        look (a store's items brought in). Interrupted (the caller's task cancelled), the
        running tasks are cancelled and awaited."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if refresh is not None:
                    refresh()
                self.step()
                states = {i.state for i in self.items.values()}
                if RUNNING not in states and (poll is None or WAITING not in states):
                    break
                wake = self._wake = loop.create_future()
                done, _ = await asyncio.wait([*self._tasks, wake], timeout=poll,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task in self._tasks:
                        self._finished(task)
        except BaseException:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
            raise
        finally:
            self._wake = None
        for item in list(self.items.values()):  # what never could start
            if item.state == WAITING:
                self._end(item, CANCELLED, f"not run: {item.why or 'it never could start'}")
        return list(self.items.values())

    def _finished(self, task: asyncio.Future) -> None:
        item = self._tasks.pop(task)
        if item.state != RUNNING:  # ended already (Scheduler.ended): that end holds
            return
        if task.cancelled():
            self._end(item, CANCELLED, "cancelled")
            return
        exc = task.exception()
        if exc is not None:
            item.error = exc
            self._end(item, FAILED, said(exc))
            return
        item.result = task.result()
        if self.ok(item.result):
            self._end(item, SUCCEEDED)
        else:
            self._end(item, CANCELLED if item.cancel_asked else FAILED,
                      "cancelled" if item.cancel_asked else "")
