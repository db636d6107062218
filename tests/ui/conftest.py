"""Fixtures for the window tests: one qasync loop for the session, real projects in tmp_path.

The qasync pattern (see shared/notes/gui-stack-facts.md): one session-scoped
``QEventLoop(qapp, already_running=True)``; each test makes it the running loop and, after,
cancels what it left. The loop is never stopped (that would quit the QApplication).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import copy_store

P, C, SAMPLES = 16, 64, 2  # small shapes: the real engine runs in seconds


@pytest.fixture(scope="session")
def qloop(qapp):
    import qasync

    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.events._set_running_loop(None)
    yield loop
    # The loop's default executor runs on QThreads (asyncio.to_thread inside the service
    # layer uses it); one still alive when the QApplication goes away aborts the process.
    executor = getattr(loop, "_QEventLoop__default_executor", None)
    if executor is not None:
        executor.shutdown()


@pytest.fixture
def aloop(qloop, qapp):
    asyncio.events._set_running_loop(qloop)
    asyncio.set_event_loop(qloop)
    yield qloop
    pending = [t for t in asyncio.all_tasks(qloop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        deadline = time.monotonic() + 5
        while any(not t.done() for t in pending) and time.monotonic() < deadline:
            qapp.processEvents()
    asyncio.events._set_running_loop(None)
    asyncio.set_event_loop(None)


@pytest.fixture
def settings(tmp_path):
    from studio.ui.settings import AppSettings

    return AppSettings(tmp_path / "config")


def new_spec(folder: Path, name: str = "proj", **kw):
    from studio.services.projects import NewProjectSpec

    args = dict(
        path=Path(folder) / f"{name}.qstudio",
        source_kind="sample",
        source="tiny-coder",
        prompt_length=P,
        context_length=C,
        calibration_samples=SAMPLES,
        name=name,
        targets=["snapdragon-8-gen-3"],
    )
    ckpt = os.environ.get("QSTUDIO_TEST_CHECKPOINT")  # develop against another checkpoint
    if ckpt:
        args.update(source_kind="checkpoint", source=ckpt)
    args.update(kw)
    return NewProjectSpec(**args)


@pytest.fixture
def make_spec():
    """``make_spec(folder, name, **fields)``: the wizard's answers for a small sample project."""
    return new_spec


@pytest.fixture
def project_path(tmp_path) -> Path:
    """A fresh sample project (tiny-coder, P=16, C=64, 2 calibration windows), closed."""
    from studio.services.projects import create_project

    studio = create_project(new_spec(tmp_path / "projects"))
    path = studio.project.path
    studio.close()
    return path


@pytest.fixture(scope="session")
def exported_template(tmp_path_factory, sample_export) -> Path:
    """A sample project whose export stage already ran (headless, like studio --batch). The
    export is the session's one export (tests/conftest.py: ``sample_export``, the same key):
    the run takes it from the cache. Its store holds the export only, so a test that runs
    quantize from a copy of it does run quantize."""
    from studio.services.projects import create_project
    from tests.cli.conftest import share_store

    folder = tmp_path_factory.mktemp("exported")
    studio = create_project(new_spec(folder, "exported"))
    share_store(sample_export, studio.project.path, stages={"export"})
    out: dict = {}

    def go() -> None:
        try:
            out["summary"] = asyncio.run(studio.run_pipeline(["export"]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    t = threading.Thread(target=go)
    t.start()
    t.join(600)
    studio.close()
    if "error" in out:
        raise out["error"]
    assert out["summary"].state == "succeeded", out["summary"].to_dict()
    return studio.project.path


@pytest.fixture(scope="session")
def compiled_template(tmp_path_factory, exported_template, batch_run, small_project) -> Path:
    """``exported_template`` plus the session's quantized graph, its compile for the chip and
    its profile (the CLI's batch run computed them with the same settings, so the same keys):
    for the window tests that start from a quantized, compiled project and are not about
    running quantize or compile."""
    from tests.cli.conftest import share_store

    path = _copy_project(exported_template, tmp_path_factory.mktemp("compiled"))
    share_store(small_project, path, stages={"quantize", "compile", "profile"})
    return path


def _copy_project(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest_dir / src.name)
    copy_store(src.with_suffix(".studio"), dest_dir / src.with_suffix(".studio").name)
    return dest_dir / src.name


@pytest.fixture
def copy_project():
    """``copy_project(file, folder)``: a copy of a project with its artifacts and history."""
    return _copy_project


def _dispose(win, qtbot) -> None:
    """Close a window and delete it now: a window left to Python's garbage collector can be
    freed in the middle of a later test (e.g. while the style changes) and crash the run."""
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    ctl = win.ctl
    if ctl.running:
        ctl.cancel_run()
        qtbot.waitUntil(lambda: not ctl.running, timeout=30_000)
    ctl.close("discard")
    ctl.shutdown()
    win.hide()
    win.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


@pytest.fixture
def make_window(qtbot, aloop, settings, monkeypatch):
    """``make_window()``: a main window on ``settings``; dialog answers default to 'discard'
    and 'yes'; every window is closed and deleted at teardown."""
    from studio.ui.main_window import MainWindow

    made = []

    def make(s=None, controller=None):
        win = MainWindow(s or settings, controller)
        monkeypatch.setattr(win, "confirm_unsaved", lambda: "discard")
        monkeypatch.setattr(win, "confirm_cancel_run", lambda: True)
        win.resize(1280, 820)
        win.show()
        made.append(win)
        return win

    yield make
    for win in reversed(made):
        _dispose(win, qtbot)


@pytest.fixture
def window(make_window):
    """The main window, no project open."""
    return make_window()


def wait_task(qtbot, task, timeout: int = 300_000):
    qtbot.waitUntil(task.done, timeout=timeout)
    return task.result()


@pytest.fixture
def model_check(request):
    """``model_check(model)``: a model tester of its own per model, watching it until teardown
    (pytest-qt's single ``qtmodeltester`` mixes up the signals of several models)."""
    from pytestqt.modeltest import ModelTester

    testers = []

    def check(model, force_py: bool = True):
        t = ModelTester(request.config)
        t.check(model, force_py=force_py)
        testers.append(t)
        return t

    yield check
    for t in testers:
        t._cleanup()
