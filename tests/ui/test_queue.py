"""The work queue in the window: three projects' runs lined up, reordered, one cancelled, the
queue paused, the window restarted, the rest run (the real pipeline on the sample's export)."""

from __future__ import annotations

import pytest

from studio.core.jobs import JobStore
from studio.ui.controller import ProjectController


def _rows(page) -> list[tuple[str, str, str]]:
    m = page.model
    return [(m.index(r, 1).data(), m.index(r, 4).data(), m.index(r, 5).data())
            for r in range(m.rowCount())]


@pytest.mark.slow
def test_three_projects_queue_wait_reorder_cancel_and_survive_a_restart(
    exported_template, copy_project, tmp_path, make_window, settings, qtbot
):
    paths = [copy_project(exported_template, tmp_path / n) for n in ("a", "b", "c")]
    win = make_window()
    q = win.ctl.queue
    q.set_slots(1)
    q.set_paused(True)  # line everything up first
    futures = []
    for p in paths:
        assert win.open_project(p)
        futures.append(win.ctl.run(["export"]))
        assert not win.ctl.running  # paused: it waits
    a, b, c = (i.id for i in q.items())
    page = win.show_page("Queue")
    page.refresh()
    assert [r[1] for r in _rows(page)] == ["waiting"] * 3
    assert {r[2] for r in _rows(page)} == {"the queue is paused: Resume starts it"}
    assert "paused" in page.status.text() and page.pause_button.text().endswith("Resume queue")
    # c goes first, b is cancelled before it starts
    assert page.select_item(c)
    page.up_button.click()
    page.up_button.click()
    assert [i.id for i in q.items()] == [c, a, b]
    assert page.select_item(b) and page.cancel_button.isEnabled()
    page.cancel_button.click()
    assert q.queue.get(b).state == "cancelled"
    assert futures[1].done() and futures[1].result() is None
    # nothing is silently disabled: a selected ended item cannot move, and says so
    assert not page.up_button.isEnabled() and page.up_button.toolTip() == "Select a waiting item"

    # the window ends with two items waiting; the next one finds them, paused
    win.close()
    win2 = make_window(controller=ProjectController(settings))
    q2 = win2.ctl.queue
    assert [(i.id, i.state) for i in q2.items(finished=False)] == [(c, "waiting"), (a, "waiting")]
    assert q2.queue.paused and q2.left_over == 2
    page2 = win2.show_page("Queue")
    page2.refresh()
    assert "2 item(s) left from the last session" in page2.status.text()
    page2.pause_button.click()  # Resume: c runs, a waits for the one slot
    assert q2.queue.get(c).state == "running"
    assert q2.why[a].startswith(f"waits for a free slot: 1 of 1 in use (#{c})")
    qtbot.waitUntil(lambda: q2.queue.get(a).state in ("succeeded", "failed"), timeout=120_000)
    assert q2.queue.get(c).state == "succeeded" and q2.queue.get(a).state == "succeeded"
    for p, item in ((paths[2], c), (paths[0], a)):
        store = JobStore(p.with_suffix(".studio") / "runs.sqlite")
        try:
            run = store.runs()[0]
            assert run["state"] == "succeeded" and run["id"] == q2.queue.get(item).run_id
        finally:
            store.close()
    page2.refresh()
    assert [r[1] for r in _rows(page2)][:3] == ["succeeded", "succeeded", "cancelled"]


def test_a_damaged_queue_file_is_kept_aside_and_the_window_opens(settings, make_window):
    bad = settings.config_dir / "queue.sqlite"
    bad.write_bytes(b"not a database at all" * 64)
    win = make_window(controller=ProjectController(settings))
    kept = list(settings.config_dir.glob("queue.sqlite.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"not a database")
    assert any("cannot be read" in t and kept[0].name in t for t in win.notifications.texts())
    assert win.ctl.queue.items() == [] and not win.ctl.queue.paused


@pytest.mark.slow
def test_quitting_while_an_item_runs_keeps_it_for_the_next_window(
    exported_template, copy_project, tmp_path, make_window, settings, qtbot
):
    path = copy_project(exported_template, tmp_path / "q")
    win = make_window()
    assert win.open_project(path)
    win.ctl.set("export", "prompt_length", 8)  # not cached: the export runs for real
    fut = win.ctl.run(["export"])
    (item,) = win.ctl.queue.items()
    assert item.state == "running"
    qtbot.waitUntil(lambda: any(j.state == "running" for j in win.ctl.active_jobs),
                    timeout=60_000)
    win.close()  # asks (answered yes), stops the run
    assert fut.done() and fut.result() is not None and fut.result().state == "cancelled"
    win2 = make_window(controller=ProjectController(settings))
    (again,) = win2.ctl.queue.items()
    assert again.id == item.id and again.state == "waiting"
    assert again.message.startswith("the window ended while it ran")
    assert win2.ctl.queue.paused and win2.ctl.queue.left_over == 1
    store = JobStore(path.with_suffix(".studio") / "runs.sqlite")
    try:
        assert store.runs()[0]["state"] == "cancelled"  # recorded, nothing left running
    finally:
        store.close()
