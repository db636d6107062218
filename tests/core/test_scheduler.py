"""The scheduler (studio.core.scheduler) on real coroutines: dependencies, priorities,
budgets, cancel and resume; and its pure policy (studio.core.workpolicy)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from studio.core import workpolicy
from studio.core.errors import StudioError
from studio.core.scheduler import (
    CANCELLED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    WAITING,
    Scheduler,
)
from studio.core.workpolicy import Work

GIB = 2**30


def _recorder(log: list[str], name: str, seconds: float = 0.0, value: object = True):
    async def run():
        log.append(f"start {name}")
        await asyncio.sleep(seconds)
        log.append(f"end {name}")
        return value
    return run


def test_dependencies_run_first_and_a_failed_one_ends_its_dependants():
    log: list[str] = []
    ended: list[tuple[str, str]] = []
    s = Scheduler(slots=4, on_end=lambda i: ended.append((i.name, i.state)))
    export = s.add("export", _recorder(log, "export", 0.05))
    quant = s.add("quantize", _recorder(log, "quantize"), deps=[export.id])

    async def boom():
        raise RuntimeError("the compiler refused")

    comp = s.add("compile", boom, deps=[quant.id])
    val = s.add("validate", _recorder(log, "validate"), deps=[comp.id])
    asyncio.run(s.run())
    assert log == ["start export", "end export", "start quantize", "end quantize"]
    assert (export.state, quant.state, comp.state, val.state) == (
        SUCCEEDED, SUCCEEDED, FAILED, CANCELLED)
    assert comp.why == "RuntimeError: the compiler refused"
    assert val.blocked_by is comp and val.why == "not run: compile did not finish"
    assert [n for n, _ in ended] == ["export", "quantize", "compile", "validate"]


def test_higher_priority_starts_first_and_slots_bound_what_runs_together():
    log: list[str] = []
    s = Scheduler(slots=1)
    s.add("a", _recorder(log, "a", 0.01))
    s.add("b", _recorder(log, "b", 0.01), priority=1)
    s.add("c", _recorder(log, "c", 0.01))
    why = s.selection()
    assert why.start == [2]
    asyncio.run(s.run())
    assert log == ["start b", "end b", "start a", "end a", "start c", "end c"]


def test_budgets_refuse_what_never_fits_with_a_reason_and_wait_for_the_rest():
    s = Scheduler(slots=2, where="the Ray cluster", free_bytes=lambda: 10 * GIB, headroom=0)
    wide = s.add("sweep of 4 workers", _recorder([], "w"), cores=4)
    huge = s.add("compile part3", _recorder([], "h"), memory=12 * GIB)
    fits = s.add("compile part1", _recorder([], "f"), memory=6 * GIB)
    after = s.add("compile part2", _recorder([], "g"), memory=6 * GIB)
    asyncio.run(s.run())
    assert wide.state == FAILED
    assert wide.why == ("refused: sweep of 4 workers takes 4 cores and the Ray cluster gives "
                        "2 at once: give it fewer or raise the count")
    # more than the free memory: it waits for the others, then starts alone (its stage's
    # own memory check refuses it where it truly cannot fit)
    assert huge.state == fits.state == after.state == SUCCEEDED
    # the policy: the second part waits for memory while the first runs
    sel = workpolicy.select([Work(1, RUNNING, memory=6 * GIB), Work(2, memory=6 * GIB)],
                            slots=2, free_bytes=10 * GIB - 6 * GIB, headroom=0)
    assert sel.start == [] and sel.why[2] == (
        "waits for memory: it is predicted to peak at 6.0 GiB (estimated), 4.0 GiB free "
        "beside what runs")


def test_cancel_a_waiting_item_and_a_running_one():
    log: list[str] = []
    s = Scheduler(slots=1)
    stopped: list[str] = []

    async def long():
        log.append("start long")
        await asyncio.sleep(30)

    running = s.add("long", long)
    waiting = s.add("next", _recorder(log, "next"))

    async def main():
        task = asyncio.ensure_future(s.run())
        while running.state != RUNNING:
            await asyncio.sleep(0.01)
        s.cancel(waiting.id)
        assert waiting.state == CANCELLED and waiting.why == "cancelled"
        s.cancel(running.id)
        return await task

    asyncio.run(main())
    assert running.state == CANCELLED and log == ["start long"]

    # an item with its own stop: stopped its way, it ends cancelled when it returns
    s2 = Scheduler(slots=1, ok=lambda r: r is not None)

    async def worker():
        while not stopped:
            await asyncio.sleep(0.01)
        return None  # a terminated worker: no result

    item = s2.add("worker", worker, stop=lambda: stopped.append("terminated"))

    async def main2():
        task = asyncio.ensure_future(s2.run())
        while item.state != RUNNING:
            await asyncio.sleep(0.01)
        s2.cancel()
        return await task

    asyncio.run(main2())
    assert stopped == ["terminated"] and item.state == CANCELLED


def test_the_policy_words_why_each_item_waits():
    items = [Work(1, RUNNING, group="p"), Work(2, group="p"), Work(3, deps=(1,)),
             Work(4, group="q", cores=2)]
    sel = workpolicy.select(items, slots=2, free_bytes=64 * GIB)
    assert sel.start == []
    assert sel.why[2].startswith("after #1 of the same project (runs now)")
    assert sel.why[3] == "waits for #1 to finish"
    assert sel.why[4].startswith("waits for a free slot: 1 of 2 in use (#1)")
    sel = workpolicy.select(items, slots=2, free_bytes=64 * GIB, paused=True)
    assert set(sel.why.values()) == {"paused: resume starts it"}
    assert WAITING == "waiting"


# ---- a long-lived queue: the window's, ``studio queue run`` ---------------------------------


def test_items_added_while_it_runs_start_and_a_pause_holds_them_in_the_queues_words():
    log: list[str] = []
    words = workpolicy.Words(paused="the queue is paused: Resume starts it")
    s = Scheduler(slots=2, words=words)

    async def main():
        first = s.add("first", _recorder(log, "first", 0.05))
        task = asyncio.ensure_future(s.run(poll=5.0))
        while first.state != RUNNING:
            await asyncio.sleep(0.005)
        later = s.add("later", _recorder(log, "later"))  # while it runs: it starts now
        while later.state == WAITING:
            await asyncio.sleep(0.005)
        s.set_paused(True)
        held = s.add("held", _recorder(log, "held"))
        await asyncio.sleep(0.1)  # first and later end; held waits, paused, in the words
        assert first.state == later.state == SUCCEEDED
        assert held.state == WAITING and held.why == "the queue is paused: Resume starts it"
        assert not task.done()  # a long-lived run waits for the resume
        s.set_paused(False)
        await asyncio.wait_for(task, 5)
        return held

    held = asyncio.run(main())
    assert held.state == SUCCEEDED
    assert log.index("start later") < log.index("end first")  # it ran beside the first


def test_work_started_on_another_thread_ends_by_an_explicit_call():
    """The window's way: ``start`` hands the work to a thread; the thread's end comes back
    (on the scheduler's thread) as ``ended``; hooks record each transition."""
    record: list[tuple[str, int, str]] = []
    threads: dict[int, threading.Thread] = {}
    s = Scheduler(slots=1, on_start=lambda i: record.append(("start", i.id, i.state)),
                  on_end=lambda i: record.append(("end", i.id, i.state)))

    def start(item):
        if item.name == "broken":
            raise StudioError("not started: the project file is gone")
        threads[item.id] = threading.Thread(target=time.sleep, args=(0.01,))
        threads[item.id].start()

    a = s.add("a", start=start)
    broken = s.add("broken", start=start)
    b = s.add("b", start=start)
    assert [i.id for i in s.step()] == [a.id]  # one slot
    assert b.why.startswith(f"waits for a free slot: 1 of 1 in use (#{a.id})")
    threads[a.id].join()
    s.ended(a.id, SUCCEEDED, result=42)
    s.ended(a.id, FAILED)  # ended already: the first end holds
    assert (a.state, a.result) == (SUCCEEDED, 42)
    assert s.step() == [b]  # broken's start refused it: it ends failed, saying why; b starts
    assert broken.state == FAILED and broken.why == "not started: the project file is gone"
    threads[b.id].join()
    s.ended(b.id, FAILED, "the compiler refused")
    assert record == [("start", 1, RUNNING), ("end", 1, SUCCEEDED), ("start", 2, RUNNING),
                      ("end", 2, FAILED), ("start", 3, RUNNING), ("end", 3, FAILED)]
    assert b.why == "the compiler refused"
    with pytest.raises(ValueError, match="not how work ends"):
        s.ended(b.id, "paused")


def test_place_priority_busy_groups_slots_and_a_store_that_lost_the_race():
    changed: list[tuple[int, int, float]] = []
    settings: list[object] = []
    busy = {"p": "another process runs this project now"}
    s = Scheduler(slots=1, busy=busy.get, refuse_wide=False,
                  on_change=lambda i: changed.append((i.id, i.priority, i.pos)),
                  on_pause=settings.append, on_slots=settings.append,
                  # the store: #4 was started by another process first
                  on_start=lambda i: i.id != 13)
    for k, name in enumerate("abcd"):  # ids 10..13, placed in the opposite order
        s.add(name, start=lambda _i: None, item_id=10 + k, pos=float(40 - 10 * k))
    # the user's order (pos), not the ids: d (pos 2) before c (pos 3) ...
    assert s.selection().start == [13]
    s.move(10, -3)  # a, last, to the front: every place that changed is recorded
    assert changed == [(10, 0, 1.0), (13, 0, 2.0), (12, 0, 3.0), (11, 0, 4.0)]
    changed.clear()
    s.set_priority(11, 1)  # b before every normal item
    assert changed == [(11, 1, 4.0)] and s.selection().start == [11]
    with pytest.raises(StudioError, match="#99 is not waiting: only waiting items move"):
        s.move(99, 1)
    # a group another process runs waits for it; one at a time in a group
    s.items[11].group = s.items[10].group = "p"
    s.items[12].group = "q"
    sel = s.selection()
    assert sel.start == [10 + 3] and sel.why[11] == "another process runs this project now"
    assert sel.why[10].startswith("after #11 of the same project (waits now)")
    busy.clear()
    # the slots change while it runs; a wide item starts alone (refuse_wide=False)
    s.items[13].cores = 4
    assert [i.id for i in s.step()] == [11]  # b, the high one, alone in its slot
    s.set_slots(3)
    s.set_paused(True)
    s.set_paused(False)
    assert settings == [3, True, False]
    assert [i.id for i in s.step()] == [12]  # a waits for b (one group); d's 4 cores wait
    assert s.items[13].why.startswith("waits for a free slot: 1 of 3 in use (#11)")
    s.ended(11, SUCCEEDED)
    s.ended(12, SUCCEEDED)
    assert [i.id for i in s.step()] == [10]
    s.ended(10, SUCCEEDED)
    # d starts alone though it is wider than the slots; the store says another process
    # took it: the scheduler lets it go
    assert s.step() == [] and 13 not in s.items
    # what runs elsewhere counts against the slots and its group
    s.add("e", start=lambda _i: None, group="p")
    s.elsewhere = [Work(50, RUNNING, group="p")]
    assert s.selection().why[14].startswith("after #50 of the same project (runs now)")
    with pytest.raises(ValueError, match="holds #14 already"):
        s.add("again", start=lambda _i: None, item_id=14)
    s.forget(14)
    assert s.add("f", start=lambda _i: None).id == 15  # ids are not given twice
