"""Which waiting work starts now, and why the rest waits: the one selection policy.

Every kind of work the studio runs — a pipeline run, a sweep's stage job, a stage's part, an
item of the window's queue — is described to this policy as a :class:`Work`: its id, what it
waits for (other items' ids), the group it runs one-at-a-time in (a project), its priority
and order, and the cores and memory it takes. :func:`select` is pure: given the items (some
running, some waiting), whether starting is paused, the cores (slots) and the free memory,
it says which waiting items start now and, for each of the others, why it waits — in words
a user can act on.

The rules, in order:

1. paused, nothing starts;
2. an item waits for the items it depends on to finish;
3. items of one group run one after another, in order (two runs of a project would write
   the same artifacts);
4. a group another process runs now waits for it (``busy``);
5. at most ``slots`` cores are in use at once (an item takes its ``cores``);
6. an item whose memory does not fit in the free memory waits while another item runs
   (alone, it starts: the work's own memory check then refuses it in one line).

Higher priority goes first; within a priority, the given order (:func:`moved` says the
orders after the user moves an item). A running item is never stopped for another. Used by
:mod:`studio.core.scheduler` (runs, sweep jobs, the work queue of
:mod:`studio.services.workqueue`) and a stage's parts (:mod:`studio.worker.parts`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

WAITING, RUNNING = "waiting", "running"


@dataclass(frozen=True)
class Work:
    """What the policy reads of one item of work."""

    id: int
    state: str = WAITING  # WAITING | RUNNING
    group: str = ""  # items of one group run one at a time ("": no group)
    priority: int = 0  # higher first
    order: float = 0.0  # within a priority, lower first
    cores: int = 1
    memory: int | None = None  # predicted peak bytes (None: not predicted)
    deps: tuple[int, ...] = ()  # ids of the items it waits for


@dataclass(frozen=True)
class Words:
    """How a reason names things (the queue says "the queue is paused: Resume starts it",
    a sweep has no pause)."""

    paused: str = "paused: resume starts it"
    slots_hint: str = "raise the count at once to run more together"
    memory_what: str = "it is predicted to peak at"
    group_after: str = "of the same project"
    group_why: str = "one run at a time writes a project's artifacts"


@dataclass
class Selection:
    start: list[int]
    #: why each waiting item that does not start waits
    why: dict[int, str] = field(default_factory=dict)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def order_key(w: Work) -> tuple:
    """The order waiting items start in: higher priority first, then the given order."""
    return (-w.priority, w.order, w.id)


def moved(items: Iterable[Work], item_id: int, delta: int) -> dict[int, float]:
    """The waiting items' new orders after ``item_id`` moves ``delta`` places earlier
    (negative) or later among ``items`` (the waiting items of its priority): the peers are
    numbered 1, 2, … in their new order; {id: order} of those whose order changed."""
    peers = sorted(items, key=order_key)
    at = next(k for k, w in enumerate(peers) if w.id == item_id)
    to = max(0, min(len(peers) - 1, at + delta))
    if to == at:
        return {}
    peers.insert(to, peers.pop(at))
    return {w.id: float(k + 1) for k, w in enumerate(peers) if w.order != k + 1}


def select(items: Iterable[Work], *, slots: int, free_bytes: int, paused: bool = False,
           done: Callable[[int], bool] = lambda _i: True,
           busy: Callable[[str], str | None] = lambda _g: None,
           headroom: int = 512 << 20, words: Words = Words()) -> Selection:
    """Which waiting items start now, and why each other waiting item waits.

    ``done(id)``: whether a dependency has finished (an id that is neither running nor
    waiting here and not done is an item that ended without finishing: the caller ends its
    dependants). ``busy(group)``: a sentence when another process runs that group now."""
    items = list(items)
    running = [w for w in items if w.state == RUNNING]
    waiting = sorted((w for w in items if w.state == WAITING), key=order_key)
    here = {w.id for w in items}
    used = sum(w.cores for w in running)
    free = free_bytes
    ahead: dict[str, Work] = {w.group: w for w in running if w.group}
    started: list[Work] = []
    why: dict[int, str] = {}
    for w in waiting:
        before = ahead.get(w.group) if w.group else None
        if w.group:
            ahead.setdefault(w.group, w)
        if paused:
            why[w.id] = words.paused
            continue
        blocking = [d for d in w.deps if d in here or not done(d)]
        if blocking:
            why[w.id] = "waits for " + ", ".join(f"#{d}" for d in blocking) + " to finish"
            continue
        if before is not None:
            how = "runs" if before.state == RUNNING or before in started else "waits"
            why[w.id] = (f"after #{before.id} {words.group_after} ({how} now): "
                         f"{words.group_why}")
            continue
        other = busy(w.group) if w.group else None
        if other:
            why[w.id] = other
            continue
        anyone = bool(running or started)
        if anyone and used + w.cores > slots:
            now = ", ".join(f"#{x.id}" for x in running + started)
            why[w.id] = (f"waits for a free slot: {used} of {slots} in use ({now}); "
                         f"{words.slots_hint}")
            continue
        if anyone and w.memory is not None and w.memory > free - headroom:
            why[w.id] = (f"waits for memory: {words.memory_what} {gib(w.memory)} (estimated), "
                         f"{gib(max(0, free))} free beside what runs")
            continue
        started.append(w)
        used += w.cores
        if w.memory is not None:
            free -= w.memory
    return Selection([w.id for w in started], why)


def refusal(w: Work, name: str, *, slots: int, memory_budget: int | None = None,
            where: str = "this machine") -> str | None:
    """Why ``w`` can never start under the budgets — more cores than ``slots``, more memory
    than ``memory_budget`` (the most one place offers) — in one line; None: it can."""
    if w.cores > slots:
        return (f"{name} takes {w.cores} cores and {where} gives {slots} at once: give it "
                "fewer or raise the count")
    if memory_budget is not None and w.memory is not None and w.memory > memory_budget:
        return (f"{name} needs about {gib(w.memory)} and {where} offers {gib(memory_budget)}")
    return None
