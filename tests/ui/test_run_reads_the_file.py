"""The window runs what the project file says: a precision edit made in the window is saved
(atomically, the undo stack kept) before the run starts, the run records the settings and the
file it ran, and the window, ``studio info`` and ``studio --batch`` see one recipe. A run the
file cannot back (changed outside the studio) is refused with its reason, when it is queued
and when a waiting one starts. (The report stage alone: a real run through the work queue
and the pipeline's worker, in a second.)"""

from __future__ import annotations

import hashlib
import json

import pytest

from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.core.jobs import JobStore
from tests.cli.conftest import studio as studio_cli
from tests.conftest import run_batch
from tests.ui.conftest import wait_task

RULE = {"*.down_proj": "INT16"}


@pytest.fixture
def ctl(settings, aloop, project_path, qtbot):
    from studio.ui.controller import ProjectController

    c = ProjectController(settings)
    c.open(project_path)
    yield c
    if c.running:
        c.cancel_run()
        qtbot.waitUntil(lambda: not c.running, timeout=30_000)
    c.close("discard")
    c.shutdown()


def _record(path, run_id: int) -> dict:
    store = JobStore(path.with_suffix(".studio") / "runs.sqlite")
    try:
        run = store.run(run_id)
        assert run is not None
        return run["config"]
    finally:
        store.close()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_precision_edit_is_in_the_file_before_the_run_and_in_its_record(ctl, qtbot):
    path = ctl.project.path
    messages: list[tuple[str, str]] = []
    ctl.message.connect(lambda level, text: messages.append((level, text)))
    ctl.set("quantization", "overrides", dict(RULE), "down_proj to INT16")
    assert ctl.dirty and projectfile.load(path).quantization["overrides"] == {}

    fut = ctl.run(["report"])
    # before the run reads anything, the edit is in the file, the window clean, undo kept
    assert projectfile.load(path).quantization["overrides"] == RULE
    assert not ctl.dirty and ctl.studio.commands.can_undo
    assert any("Saved your edits" in t for _, t in messages), messages
    summary = wait_task(qtbot, fut, 120_000)
    assert summary.state == "succeeded", summary.to_dict()

    # the run's record: the settings it ran with are the file's, byte for byte
    rec = _record(path, summary.run_id)
    assert rec["settings"]["quantization"]["overrides"] == RULE
    assert rec["settings"] == projectfile.load(path).to_dict()
    assert rec["file"] == {"path": str(path), "sha256": _sha(path), "matches": True}

    # studio info (a real process) reads the same recipe and says the run ran the file
    r = studio_cli("info", path, "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(r.stdout)
    assert info["quantization"]["overrides"] == RULE
    newest = info["recent_runs"][0]
    assert newest["id"] == summary.run_id and newest["ran_the_file"] is True
    assert newest["file_sha256"] == _sha(path)
    text = studio_cli("info", path, timeout=300)
    assert "1 override(s)" in text.stdout, text.stdout

    # studio --batch on the same file runs the same recipe the window ran
    batch, _ = run_batch(path, "--stages", "report")
    assert _record(path, batch["run_id"])["settings"] == rec["settings"]

    # Undo is an edit like any other: the next run saves it (the override is gone) first
    ctl.undo()
    assert ctl.dirty and projectfile.load(path).quantization["overrides"] == RULE
    again = wait_task(qtbot, ctl.run(["report"]), 120_000)
    assert projectfile.load(path).quantization["overrides"] == {}
    assert _record(path, again.run_id)["settings"]["quantization"]["overrides"] == {}
    assert ctl.studio.commands.can_redo  # the stack is whole: redo brings the rule back


def test_a_run_the_file_cannot_back_is_refused_with_its_reason(ctl, qtbot):
    path = ctl.project.path
    ctl.set("quantization", "overrides", dict(RULE))
    # someone else changes the file: running now would not run what the window shows
    other = projectfile.load(path)
    other.export["prompt_length"] = 8
    projectfile.save(other, path)
    before = ctl.queue.items()
    with pytest.raises(StudioError, match="changed outside QStudio .* a run reads the file"):
        ctl.run(["report"])
    assert ctl.queue.items() == before  # nothing queued
    assert projectfile.load(path).export["prompt_length"] == 8  # their version untouched
    assert ctl.dirty  # and the window's edit kept


def test_a_waiting_run_saves_the_edits_made_while_it_waited(ctl, qtbot):
    path = ctl.project.path
    q = ctl.queue
    q.set_paused(True)
    fut = ctl.run(["report"])
    (item,) = q.items(finished=False)
    assert item.state == "waiting"
    ctl.set("quantization", "overrides", dict(RULE))  # while it waits
    assert projectfile.load(path).quantization["overrides"] == {}
    q.set_paused(False)  # it starts: the edit goes to the file first
    summary = wait_task(qtbot, fut, 120_000)
    assert summary.state == "succeeded"
    assert projectfile.load(path).quantization["overrides"] == RULE
    assert _record(path, summary.run_id)["settings"]["quantization"]["overrides"] == RULE

    # a waiting run whose file changed outside the studio does not start, and says why
    q.set_paused(True)
    fut = ctl.run(["report"])
    (item,) = q.items(finished=False)
    ctl.set("export", "prompt_length", 8)
    outside = projectfile.load(path)
    outside.name = "renamed elsewhere"
    projectfile.save(outside, path)
    q.set_paused(False)
    qtbot.waitUntil(fut.done, timeout=30_000)
    assert fut.result() is None
    ended = q.queue.get(item.id)
    assert ended.state == "failed" and "changed outside QStudio" in ended.message
    assert projectfile.load(path).name == "renamed elsewhere"
