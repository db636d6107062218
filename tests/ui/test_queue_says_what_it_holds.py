"""A queue that says what it holds: the same work queued twice joins the item already there
(waiting, or running with the recipe the file holds), the status bar and the Queue page show
one count of items, and the wizard proposes a name and folder that are free. (Runs of the
report stage alone: the real queue and pipeline, in a second.)"""

from __future__ import annotations

import pytest

from studio.core.errors import StudioError
from studio.core.jobs import JobStore
from tests.ui.conftest import wait_task


def _runs(path) -> list[dict]:
    store = JobStore(path.with_suffix(".studio") / "runs.sqlite")
    try:
        return store.runs()
    finally:
        store.close()


def test_the_same_work_joins_the_waiting_item(window, project_path, qtbot):
    assert window.open_project(project_path)
    ctl, q = window.ctl, window.ctl.queue
    messages: list[str] = []
    ctl.message.connect(lambda _level, text: messages.append(text))
    q.set_paused(True)
    first = ctl.run(["report"])
    second = ctl.run(["report"])  # the same work while the first waits
    (item,) = q.items(finished=False)
    assert item.state == "waiting"
    assert messages[-1] == (f"#{item.id} (stages report) already waiting with the same "
                            "recipe: this run joins it rather than run twice")
    # a sweep asked for twice is one item too (another worker count runs the same points)
    sweep, _, joined = q.add(ctl.project, "sweep", {"sweep": "grid", "workers": 1})
    again, _, joined_again = q.add(ctl.project, "sweep", {"sweep": "grid", "workers": 2})
    assert not joined and joined_again and again.id == sweep.id
    q.cancel(sweep.id)

    # the one count: the status bar and the Queue page say the same
    other = ctl.run(["export"])  # other work: its own item
    page = window.show_page("Queue")
    page.refresh()
    window._update_jobs_status()
    assert page.status.text().startswith("0 running, 2 waiting · the queue is paused")
    assert window.jobs_label.text() == "Queue: 0 running, 2 waiting (paused)"
    q.cancel(q.items(finished=False)[-1].id)
    assert other.done() and other.result() is None

    q.set_paused(False)
    summary = wait_task(qtbot, first, 120_000)
    assert summary.state == "succeeded"
    assert second.done() and second.result() is summary  # one run served both
    assert [r["id"] for r in _runs(ctl.project.path)] == [summary.run_id]


def test_a_running_item_is_joined_only_while_it_runs_the_files_recipe(window, project_path,
                                                                       qtbot):
    assert window.open_project(project_path)
    ctl, q = window.ctl, window.ctl.queue
    first = ctl.run(["report"])
    (item,) = q.items(finished=False)
    assert item.state == "running"
    window._update_jobs_status()
    assert "Queue: 1 running, 0 waiting" in window.jobs_label.text()
    same = ctl.run(["report"])  # the same recipe: joins the running item
    assert [i.id for i in q.items(finished=False)] == [item.id]
    ctl.set("run", "max_new_tokens", 9)
    changed = ctl.run(["report"])  # another recipe now: its own item, after the running one
    items = q.items(finished=False)
    assert [i.state for i in items] == ["running", "waiting"]
    done = wait_task(qtbot, first, 120_000)
    assert wait_task(qtbot, same, 120_000) is done
    later = wait_task(qtbot, changed, 120_000)
    assert later.run_id != done.run_id and later.state == "succeeded"
    window._update_jobs_status()
    assert window.jobs_label.text() == "No jobs running"


def test_the_wizard_proposes_a_free_name_and_folder(window, tmp_path, make_spec):
    from studio.services import projects

    folder = tmp_path / "projects"
    folder.mkdir()
    (folder / "tiny-coder.qstudio").write_text("")  # a project of that name
    (folder / "tiny-coder-2.studio").mkdir()  # the folder an earlier project left
    assert projects.free_project_name(folder, "tiny-coder") == "tiny-coder 3"
    assert "already exists" in projects.path_taken(folder / "tiny-coder.qstudio")
    assert "project folder tiny-coder-2.studio" in projects.path_taken(
        folder / "tiny-coder-2.qstudio")

    wiz = window.new_project()
    src = wiz.source_page
    src.sample_radio.setChecked(True)
    src.sample.setCurrentIndex(src.sample.findData("tiny-coder"))
    loc = wiz.location_page
    loc.folder.setText(str(folder))
    loc.initializePage()
    assert loc.name.text() == "tiny-coder 3" and loc.isComplete()
    assert loc.path() == folder / "tiny-coder-3.qstudio"
    loc.folder.setText(str(tmp_path / "empty"))  # another folder: the plain name is free there
    assert loc.name.text() == "tiny-coder" and loc.isComplete()
    loc.name.setText("tiny-coder 2")  # typed by the user: kept, and said to be taken
    loc.folder.setText(str(folder))
    assert loc.name.text() == "tiny-coder 2" and not loc.isComplete()
    assert "project folder tiny-coder-2.studio already exists" in loc.result.text()
    wiz.reject()
    # and the service refuses it too, whoever asks
    with pytest.raises(StudioError, match="project folder tiny-coder-2.studio"):
        projects.create_project(make_spec(folder, "tiny-coder-2"))
