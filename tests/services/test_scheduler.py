"""The scheduler (studio.services.scheduler) on real coroutines: dependencies, priorities,
budgets, cancel and resume; and its pure policy (studio.core.workpolicy)."""

from __future__ import annotations

import asyncio

from studio.core import workpolicy
from studio.core.workpolicy import Work
from studio.services.scheduler import (
    CANCELLED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    WAITING,
    Scheduler,
)

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
