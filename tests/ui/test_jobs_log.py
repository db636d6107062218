"""The Jobs page's log pane, fed the events the pipeline sends (through the controller's own
dispatch) with the lines stored in a real run history. The pipeline itself drives the pane in
test_pipeline.py."""

from __future__ import annotations

import time

from studio.ui.pages.jobs import NO_JOB_TEXT


def _send(ctl, **event):
    ctl.dispatch_event(event)  # what the pipeline's events go through on the UI thread


def _log(store, ctl, jid, line, deliver=True):
    """The service stores a line, then sends it (its event may arrive later)."""
    store.append_log(jid, line)
    if deliver:
        _send(ctl, kind="log", job_id=jid, line=line)


def test_lines_stored_before_the_log_loads_are_shown_once(window, project_path, qtbot):
    """Following a job loads its stored log; events for lines already loaded (still queued
    when it loaded) are not appended a second time."""
    assert window.open_project(project_path)
    page = window.show_page("Jobs")
    ctl, store = window.ctl, window.ctl.studio.jobs
    run = store.create_run({})
    jid = store.add_job(run, "export")
    _send(ctl, kind="job", job=store.job(jid))
    store.update_job(jid, state="running", started=time.time())
    # three lines are stored; their events are still on the way when the job's start arrives
    for i in range(3):
        _log(store, ctl, jid, f"line {i}", deliver=False)
    _send(ctl, kind="job", job=store.job(jid))
    assert page.selected_job().id == jid  # followed
    assert page.log.toPlainText() == "line 0\nline 1\nline 2"
    for i in range(3):  # the late events
        _send(ctl, kind="log", job_id=jid, line=f"line {i}")
    _log(store, ctl, jid, "line 3")
    _log(store, ctl, jid, "step 4\rstep 5")  # a progress line rewritten with \r
    qtbot.waitUntil(lambda: "step 5" in page.log.toPlainText(), timeout=5_000)
    assert page.log.toPlainText() == "line 0\nline 1\nline 2\nline 3\nstep 5"

    # it fails; the traceback is stored without an event: the pane shows the stored log
    _log(store, ctl, jid, "Traceback (most recent call last): boom", deliver=False)
    store.update_job(jid, state="failed", finished=time.time(), error="export crashed: boom")
    _send(ctl, kind="job", job=store.job(jid))
    text = page.log.toPlainText()
    assert text.endswith("Traceback (most recent call last): boom\n✖ export crashed: boom")
    assert text.count("line 2") == 1
    assert page.log_title.text().startswith(f"Log of #{jid} export — failed")


def test_what_the_pane_says_without_log_lines(window, project_path):
    assert window.open_project(project_path)
    page = window.show_page("Jobs")
    assert page.log.placeholderText() == NO_JOB_TEXT
    ctl, store = window.ctl, window.ctl.studio.jobs
    run = store.create_run({})
    ran, never, queued = (store.add_job(run, s) for s in ("export", "quantize", "compile"))
    now = time.time()
    store.update_job(ran, state="succeeded", started=now - 1, finished=now, progress=1.0)
    store.update_job(never, state="cancelled", finished=now, message="cancelled: not run")
    for jid in (ran, never, queued):
        _send(ctl, kind="job", job=store.job(jid))
    expect = {
        ran: "No log lines were recorded for this job.",
        never: "No log lines were recorded for this job: it never started.",
        queued: "Queued: its log appears here when it starts.",
    }
    for jid, text in expect.items():
        assert page.select_job(jid)
        assert page.log.toPlainText() == ""
        assert page.log.placeholderText() == text
        assert "waiting" not in page.log.placeholderText().lower()
    assert not page.follow_button.isChecked()  # the user chose jobs that are not running
    page.follow_button.click()  # nothing runs: back to the job that ran last
    assert page.follow_button.isChecked() and page.selected_job().id == ran


def test_a_starting_run_says_it_is_planning_and_noise_hides_behind_raw(window, project_path):
    """Before a run's jobs exist (its keys are being computed) the empty page says so, not
    "No jobs yet"; a job whose only lines are library chatter says that, and Raw shows
    them (the lines as a real run stored them)."""
    assert window.open_project(project_path)
    page = window.show_page("Jobs")
    assert page.empty.title.text() == "No jobs yet"
    window.ctl.running_changed.emit(True)
    assert page.empty.title.text() == "Planning the run…"
    window.ctl.running_changed.emit(False)
    assert page.empty.title.text() == "No jobs yet"

    ctl, store = window.ctl, window.ctl.studio.jobs
    run = store.create_run({})
    jid = store.add_job(run, "quantize")
    now = time.time()
    store.update_job(jid, state="succeeded", started=now - 2, finished=now, progress=1.0)
    notice = ("quantizer: The original model opset version is 17, which does not support "
              "16-bit integer quantization natively. Please update the model to opset >= 21.")
    colour = ("\x1b[1;31m2026-12-05 06:24:16.9 [E:onnxruntime:, qnn_execution_provider.cc:3672 "
              "CreateHtpPowerConfigId] Failed to create HTP power config id.\x1b[m")
    _log(store, ctl, jid, notice, deliver=False)
    _log(store, ctl, jid, colour, deliver=False)
    _send(ctl, kind="job", job=store.job(jid))
    assert page.select_job(jid)
    assert page.log.toPlainText() == ""
    assert page.log.placeholderText().startswith("2 lines of library output")
    page.raw_button.click()
    assert page.log.toPlainText().splitlines() == [
        notice, "2026-12-05 06:24:16.9 [E:onnxruntime:, qnn_execution_provider.cc:3672 "
        "CreateHtpPowerConfigId] Failed to create HTP power config id."]
    assert page.log.horizontalScrollBar().value() == 0  # never left scrolled sideways
