"""The work queue's file and its rules (a real SQLite file; no window)."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core.errors import StudioError
from studio.core.fsutil import RunLock
from studio.services import workqueue
from studio.services.workqueue import WorkQueue, project_busy, queue_scheduler, sync

GIB = 2**30


def _add(q: WorkQueue, name: str, tmp: Path, **kw):
    return q.add(tmp / f"{name}.qstudio", name, kw.pop("kind", "pipeline"),
                 kw.pop("spec", {"stages": ["export"]}), **kw)


def test_items_survive_a_new_connection_and_come_back_in_order(tmp_path):
    q = WorkQueue(tmp_path / "queue.sqlite")
    a = _add(q, "a", tmp_path)
    b = _add(q, "b", tmp_path, spec={"stages": None, "targets": ["snapdragon-8-gen-3"]})
    c = _add(q, "c", tmp_path, kind="sweep", spec={"sweep": "schemes", "workers": 2})
    q.move(c.id, -2)  # c first
    q.set_priority(a.id, 1)  # a before every normal item
    q.mark_running(b.id)
    q.close()

    q = WorkQueue(tmp_path / "queue.sqlite")  # the window restarted
    assert [i.id for i in q.items()] == [b.id, a.id, c.id]
    assert q.get(c.id).what == "sweep 'schemes' (2 worker(s))" and q.get(c.id).cores == 2
    assert q.get(b.id).what == "the whole pipeline on snapdragon-8-gen-3"
    assert q.get(a.id).label == f"#{a.id} a: stages export"
    # what ran when the last window ended waits again, first of its priority
    assert q.requeue_running("interrupted") == 1
    assert [(i.id, i.state) for i in q.items()] == [(a.id, "waiting"), (b.id, "waiting"),
                                                    (c.id, "waiting")]
    assert q.get(b.id).message == "interrupted"
    assert q.cancel_waiting(c.id) and not q.cancel_waiting(c.id)
    q.finish(b.id, "succeeded", run_id=7)
    assert q.get(b.id).run_id == 7
    assert [i.state for i in q.items()] == ["waiting", "succeeded", "cancelled"]
    assert q.clear_finished() == 2 and [i.id for i in q.items()] == [a.id]
    with pytest.raises(StudioError, match="only waiting items move"):
        q.finish(a.id, "failed", "boom")
        q.move(a.id, 1)
    with pytest.raises(StudioError, match="no item #999"):
        q.get(999)
    with pytest.raises(StudioError, match="priority"):
        _add(q, "d", tmp_path, priority=5)
    with pytest.raises(StudioError, match="1 to 64"):
        q.set_slots(0)
    q.set_paused(True)
    q.set_slots(3)
    q.close()
    q = WorkQueue(tmp_path / "queue.sqlite")
    assert q.paused and q.slots == 3
    q.close()


def test_a_damaged_queue_file_is_one_line(tmp_path):
    bad = tmp_path / "queue.sqlite"
    bad.write_bytes(b"this is no database" * 100)
    with pytest.raises(StudioError, match="cannot be read .*move it away"):
        WorkQueue(bad)
    assert bad.read_bytes().startswith(b"this is no database")  # nothing overwritten


def test_the_queues_scheduler_says_why_each_item_waits(tmp_path):
    q = WorkQueue(tmp_path / "queue.sqlite")
    a1 = _add(q, "a", tmp_path)
    a2 = _add(q, "a", tmp_path, spec={"stages": ["bundle"]})
    b = _add(q, "b", tmp_path, peak=3 * GIB)
    c = _add(q, "c", tmp_path, peak=20 * GIB)
    busy: dict[str, str] = {}
    sched = queue_scheduler(q, lambda _i: None, free_bytes=lambda: 16 * GIB,
                            busy=lambda p: busy.get(p.name))

    def choose(slots: int, paused: bool = False):
        q.set_slots(slots)
        q.set_paused(paused)
        sync(sched, q, lambda _i: None)  # what the file holds now: nothing is started
        return sched.selection()

    # one slot: a1 starts, the rest wait, each for its own reason
    s = choose(1)
    assert s.start == [a1.id]
    assert s.why[a2.id].startswith(f"after #{a1.id} of the same project (runs now)")
    assert s.why[b.id].startswith("waits for a free slot: 1 of 1 in use")
    # two slots: b starts beside a1; c's predicted peak does not fit beside them
    s = choose(2)
    assert s.start == [a1.id, b.id]
    assert s.why[c.id].startswith("waits for a free slot")
    s = choose(4)
    assert s.start == [a1.id, b.id]
    assert s.why[c.id] == ("waits for memory: its largest stage is predicted to peak at 20.0 GiB "
                           "(estimated), 13.0 GiB free beside what runs")
    # alone it starts: the stage's own memory check then says what to do
    for other in (a1, a2, b):
        sched.forget(other.id)
    s = sched.selection()  # (no sync: the others are let go of)
    assert s.start == [c.id]
    # a high-priority item goes first; a paused queue starts nothing
    q.set_priority(c.id, 1)
    s = choose(1)
    assert s.start == [c.id]
    s = choose(8, paused=True)
    assert not s.start and set(s.why.values()) == {"the queue is paused: Resume starts it"}
    # a project another process runs waits for it
    busy["a.qstudio"] = "another process"
    s = choose(8)
    assert s.why[a1.id] == "another process"
    assert s.why[a2.id].startswith(f"after #{a1.id} of the same project (waits now)")
    q.close()


def test_project_busy_reads_the_pipelines_lock(tmp_path):
    path = tmp_path / "p.qstudio"
    folder = path.with_suffix(".studio")
    folder.mkdir()
    assert project_busy(path) is None
    lock = RunLock(folder)
    lock.acquire()
    try:
        assert "another process runs this project" in project_busy(path)
    finally:
        lock.release()
    assert project_busy(path) is None
    assert workqueue.default_slots() >= 1


def test_an_items_predicted_peak_is_its_stages_largest(tmp_path):
    from studio.core import project as pf
    from studio.services.projects import part_plan

    path = tmp_path / "p.qstudio"
    pf.save(pf.new_project("p", "sample:tiny-coder"), path)
    project = pf.load(path)
    peaks = part_plan(project).peaks
    assert workqueue.predicted_peak(project, "pipeline", {"stages": None}) == max(peaks.values())
    assert workqueue.predicted_peak(project, "pipeline", {"stages": ["export"]}) == \
        peaks["export"] < max(peaks.values())
    assert workqueue.predicted_peak(project, "pipeline", {"stages": ["report"]}) is None
    assert workqueue.predicted_peak(project, "sweep", {"sweep": "s"}) is None


def test_the_same_work_is_found_however_its_spec_is_written(tmp_path):
    q = WorkQueue(tmp_path / "queue.sqlite")
    try:
        p = tmp_path / "a.qstudio"
        a = q.add(p, "a", "pipeline", {"stages": ["export", "quantize"], "targets": None,
                                       "retry": None, "remeasure": False})
        s = q.add(p, "a", "sweep", {"sweep": "schemes", "workers": 2})
        items = q.items(finished=False)
        # the same stages in another order, the defaults left out: the same work
        assert workqueue.same_work(items, p, "pipeline", {"stages": ["quantize", "export"]}) == a
        # a sweep is its name: another worker count runs the same points
        assert workqueue.same_work(items, p, "sweep", {"sweep": "schemes", "workers": 1}) == s
        # other stages, a remeasure, a retry, another project: other work
        for spec in ({"stages": ["export"]}, {"stages": ["export", "quantize"],
                                              "remeasure": True},
                     {"retry": ["export", ""]}, {"stages": None}):
            assert workqueue.same_work(items, p, "pipeline", spec) is None, spec
        assert workqueue.same_work(items, tmp_path / "b.qstudio", "pipeline",
                                   {"stages": ["export", "quantize"]}) is None
        q.mark_running(a.id)  # a running item is still the same work (its recipe: the caller)
        assert workqueue.same_work(q.items(finished=False), p, "pipeline",
                                   {"stages": ["export", "quantize"]}).id == a.id
        q.finish(a.id, "succeeded")  # an ended one is not
        assert workqueue.same_work(q.items(finished=False), p, "pipeline",
                                   {"stages": ["export", "quantize"]}) is None
    finally:
        q.close()


def test_one_count_of_items(tmp_path):
    q = WorkQueue(tmp_path / "queue.sqlite")
    try:
        a, b = _add(q, "a", tmp_path), _add(q, "b", tmp_path)
        _add(q, "c", tmp_path, kind="sweep", spec={"sweep": "s", "workers": 4})
        q.mark_running(a.id)
        q.finish(b.id, "failed", "boom")
        counts = workqueue.Counts.of(q.items(), q.paused)
        assert (counts.running, counts.waiting, counts.total) == (1, 1, 2)
        assert counts.text() == "1 running, 1 waiting"  # a sweep is one item, not its workers
        assert workqueue.Counts.of(q.items(), True).text() == "1 running, 1 waiting (paused)"
    finally:
        q.close()


def test_two_windows_schedulers_share_the_file(tmp_path):
    """Two schedulers over one queue file (two windows, or a window and ``studio queue
    run``): a start is claimed in the file, what the other runs counts against its project
    and the slots, and each change one makes the other sees at its next sync."""
    path = tmp_path / "queue.sqlite"
    q1, q2 = WorkQueue(path), WorkQueue(path)

    def scheduler(q: WorkQueue):
        return queue_scheduler(q, lambda w: q.finish(w.id, w.state, w.why),
                               free_bytes=lambda: 64 * GIB, busy=lambda _p: None)

    s1, s2 = scheduler(q1), scheduler(q2)
    started: list[tuple[int, int]] = []
    a = _add(q1, "a", tmp_path)
    a2 = _add(q1, "a", tmp_path, spec={"stages": ["bundle"]})
    b = _add(q1, "b", tmp_path)
    q1.set_slots(2)
    try:
        sync(s1, q1, lambda w: started.append((1, w.id)))
        sync(s2, q2, lambda w: started.append((2, w.id)))
        assert [w.id for w in s1.step()] == [a.id, b.id]
        assert q2.get(a.id).state == q2.get(b.id).state == "running"
        # the second one's view was taken before: it loses both starts to the first, counts
        # them as running elsewhere and so does not start a's second item beside a
        assert s2.step() == [] and started == [(1, a.id), (1, b.id)]
        assert s2.items[a2.id].why.startswith(f"after #{a.id} of the same project (runs now)")
        assert a.id not in s2.items and {w.id for w in s2.elsewhere} == {a.id, b.id}

        c = _add(q2, "c", tmp_path)  # added by the second window, which pauses the queue
        s2.set_paused(True)
        sync(s1, q1, lambda w: started.append((1, w.id)))
        assert s1.paused and s1.items[c.id].state == "waiting"
        assert s1.step() == [] and s1.items[c.id].why == "the queue is paused: Resume starts it"
        s1.move(c.id, -1)  # written to the file: the other sees it
        s2.set_priority(a2.id, 1)
        s2.set_slots(3)
        with pytest.raises(StudioError, match="1 to 64"):
            s2.set_slots(65)  # the file refuses it: the scheduler keeps its slots
        assert s2.slots == 3 and q1.slots == 3
        assert [(i.id, i.priority) for i in q1.items(finished=False)
                if i.state == "waiting"] == [(a2.id, 1), (c.id, 0)]
        assert q1.get(c.id).pos < q1.get(a2.id).pos
        sync(s2, q2, lambda w: started.append((2, w.id)))
        assert s2.items[c.id].pos == q1.get(c.id).pos
        # cancelled by one, let go of by the other; an item that ended there frees its slot
        s2.cancel(c.id)
        s1.ended(a.id, "succeeded")
        sync(s1, q1, lambda w: started.append((1, w.id)))
        sync(s2, q2, lambda w: started.append((2, w.id)))
        assert c.id not in s1.items and q1.get(c.id).state == "cancelled"
        assert [w.id for w in s2.elsewhere] == [b.id]
        # what a process left running waits again, first (only its own, by id)
        assert q2.requeue_running("interrupted", [a2.id]) == 0
        assert q2.requeue_running("interrupted", [b.id]) == 1
        assert q1.get(b.id).state == "waiting" and q1.get(b.id).message == "interrupted"
    finally:
        q1.close()
        q2.close()


def test_a_new_window_leaves_running_what_another_process_runs_now(tmp_path):
    """At a window's start, what a window that ended left running waits again; an item whose
    project another process runs now (its pipeline lock held) stays running there."""

    q = WorkQueue(tmp_path / "queue.sqlite")
    a = _add(q, "a", tmp_path)
    (tmp_path / "b").mkdir()
    b = _add(q, "b", tmp_path / "b")
    q.mark_running(a.id)
    q.mark_running(b.id)
    lock = RunLock(b.path.with_suffix(".studio"))
    lock.acquire()  # b's project runs in a live process
    try:
        assert workqueue.project_busy(b.path) is not None
        assert workqueue.project_busy(a.path) is None
        assert q.requeue_left_over("interrupted") == 1
        assert (q.get(a.id).state, q.get(b.id).state) == ("waiting", "running")
    finally:
        lock.release()
    assert q.requeue_left_over("interrupted") == 1  # its process ended: b waits again too
    assert q.get(b.id).state == "waiting"
