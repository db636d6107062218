"""``studio queue``: two projects' runs lined up from the command line (one high priority,
the same work asked twice joins, one cancelled), listed with why each waits in the window's
words, run headless by the window's scheduler over the window's queue file (the report
stage alone: the real pipeline, in seconds), and bad input in one line."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from studio.core.jobs import JobStore
from studio.services.workqueue import WorkQueue
from tests.cli.conftest import studio
from tests.conftest import small_sample_project


def _runs(path: Path) -> list[dict]:
    store = JobStore(path.with_suffix(".studio") / "runs.sqlite")
    try:
        return store.runs()
    finally:
        store.close()


def test_queue_add_list_cancel_and_run_headless(tmp_path):
    config = tmp_path / "config"
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(config))
    p, q, r = (small_sample_project(tmp_path, n) for n in ("p", "q", "r"))

    def queue(*args):
        return studio("queue", *args, env=env, timeout=600)

    out = queue("add", p, "--stages", "report")
    assert out.returncode == 0 and out.stdout == "queued #1: p: stages report\n", out.stderr
    again = queue("add", p, "--stages", "report")  # the same work: it joins the waiting item
    assert again.returncode == 0
    assert again.stdout == "#1 (stages report) already waits: not queued twice\n"
    assert queue("add", q, "--stages", "report", "--priority", "high").returncode == 0
    assert queue("add", r, "--stages", "report").returncode == 0
    cancelled = queue("cancel", "3")
    assert cancelled.returncode == 0 and cancelled.stdout.startswith("cancelled #3: r")
    wq = WorkQueue(config / "queue.sqlite")  # the window's file: it sees what was queued
    try:
        wq.set_slots(1)
        wq.set_paused(True)  # the window paused it: asking the command line to run resumes
    finally:
        wq.close()

    listed = queue("list")
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == [
        "0 running, 2 waiting (paused) · 1 at once",
        "#2    waiting    q: stages report (high)",
        "       the queue is paused: Resume starts it",
        "#1    waiting    p: stages report",
        "       the queue is paused: Resume starts it",
    ]

    ran = queue("run")
    assert ran.returncode == 0, ran.stderr
    # the high-priority item first, one at a time
    assert ran.stderr.splitlines()[-5:] == [
        "#2 q: stages report: started", "#2 q: stages report: succeeded",
        "#1 p: stages report: started", "#1 p: stages report: succeeded",
        "2 item(s) ran: 2 succeeded, 0 did not"]
    wq = WorkQueue(config / "queue.sqlite")
    try:
        states = {i.id: (i.state, i.run_id) for i in wq.items()}
    finally:
        wq.close()
    assert states[3] == ("cancelled", None)
    for item_id, path in ((1, p), (2, q)):
        (run,) = _runs(path)
        assert run["state"] == "succeeded" and states[item_id] == ("succeeded", run["id"])
    assert not r.with_suffix(".studio").exists() or not _runs(r)  # cancelled: never ran
    nothing = queue("run")
    assert nothing.returncode == 0 and nothing.stderr.endswith("nothing waits in the queue\n")
    listed = queue("list", "--all")
    assert "#3    cancelled  r: stages report\n       cancelled before it started" in \
        listed.stdout


def test_bad_queue_input_is_one_line(tmp_path):
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "config"))
    project = small_sample_project(tmp_path, "p")
    for args, says in (
        (("cancel", "99"), "error: the queue has no item #99\n"),
        (("add", tmp_path / "missing.qstudio"), "does not exist"),
        (("add", project, "--stages", "nonsense"), "nonsense"),
        (("add", project, "--sweep", "none-such"), "declares no sweeps"),
        (("add", project, "--priority", "urgent"), "invalid choice: 'urgent'"),
        ((), "required"),
    ):
        out = studio("queue", *args, env=env, timeout=300)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
        assert says in out.stderr, (args, out.stderr)
    # a started or ended item is not cancelled: it says why
    (tmp_path / "config").mkdir(exist_ok=True)
    wq = WorkQueue(tmp_path / "config" / "queue.sqlite")
    try:
        a = wq.add(project, "p", "pipeline", {"stages": ["report"]})
        b = wq.add(project, "p", "pipeline", {"stages": ["export"]})
        wq.mark_running(a.id)
        wq.finish(b.id, "failed", "boom")
    finally:
        wq.close()
    out = studio("queue", "cancel", str(a.id), env=env)
    assert out.returncode == 2 and "runs now" in out.stderr
    out = studio("queue", "cancel", str(b.id), env=env)
    assert out.returncode == 2 and "has ended (failed)" in out.stderr


def test_an_interrupted_queue_run_leaves_its_item_waiting_first(tmp_path):
    """``studio queue run`` interrupted (Ctrl-C cancels its task) while an export runs: the
    run is stopped, the item waits again, first, saying why; what another process runs is
    left running."""
    from studio.services.queuework import INTERRUPTED, HeadlessQueue

    p = small_sample_project(tmp_path, "p", export={"prompt_length": 8})  # not cached
    wq = WorkQueue(tmp_path / "queue.sqlite")
    other = wq.add(tmp_path / "elsewhere.qstudio", "elsewhere", "pipeline", {"stages": None})
    wq.mark_running(other.id)  # a window runs it
    item = wq.add(p, "p", "pipeline", {"stages": ["export"]})
    wq.set_slots(2)
    lines: list[str] = []

    async def interrupted():
        task = asyncio.ensure_future(HeadlessQueue(wq, lines.append).run(poll=0.2))
        runs = p.with_suffix(".studio") / "runs.sqlite"
        while not (runs.exists() and _runs(p)):  # the export's run is under way
            assert not task.done(), "the queue run ended before its item's run began"
            await asyncio.sleep(0.1)
        assert wq.get(item.id).state == "running"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(interrupted())
        again = wq.get(item.id)
        assert (again.state, again.message) == ("waiting", INTERRUPTED)
        assert wq.items(finished=False)[1].id == item.id  # first of the waiting ones
        assert wq.get(other.id).state == "running"
        assert lines == [f"#{item.id} p: stages export: started",
                         f"#{item.id} p: stages export: stopped; it waits again"]
        (run,) = _runs(p)
        assert run["state"] in ("cancelled", "interrupted")  # recorded, nothing left running
    finally:
        wq.close()


def test_the_list_says_what_starts_next_and_what_waits_behind_it(tmp_path):
    """Listing starts nothing: the first item of a project starts next, the one behind it
    waits for it (it does not run yet)."""
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "config"))
    project = small_sample_project(tmp_path, "p")
    (tmp_path / "config").mkdir()
    wq = WorkQueue(tmp_path / "config" / "queue.sqlite")
    try:
        a = wq.add(project, "p", "pipeline", {"stages": ["export"]})
        b = wq.add(project, "p", "pipeline", {"stages": ["quantize"]})
        wq.set_slots(1)
    finally:
        wq.close()
    listed = studio("queue", "list", env=env, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "0 running, 2 waiting · 1 at once",
        f"#{a.id}    waiting    p: stages export",
        "       starts next",
        f"#{b.id}    waiting    p: stages quantize",
        f"       after #{a.id} of the same project (starts next): one run at a time writes a "
        "project's artifacts",
    ]
