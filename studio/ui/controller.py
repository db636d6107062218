"""The bridge between one ``Studio`` session and the widgets.

The controller owns the open session (no singleton: the window makes one and hands it to
every page). It turns the core's callbacks into Qt signals, runs the pipeline, keeps the
project file safe (dirty state, autosave to a recovery file, changes made on disk by someone
else) and runs slow reads (the model description, ONNX graphs) in a thread.

Running the pipeline: every run goes through the work queue (:mod:`studio.ui.queue_runner`),
which runs each item on its own asyncio loop in a runner thread (``asyncio.run`` in a Python
thread, as ``studio --batch`` runs it) on a session of its own: ``Pipeline.run`` does blocking
work between its awaits (hashing the checkpoint folder for the artifact key, verifying and
hashing artifacts) that froze the window 80–160 ms per run on the UI loop with the 13 MiB
sample and would freeze it for seconds with a real checkpoint. The open project's events come
to the widgets through a queued Qt signal.

Widgets never change the project themselves: every edit is ``controller.set(...)``, a
``SetValue`` on the session's command stack.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, QTimer, Signal

from studio.core import project as projectfile
from studio.core.commands import Change, SetValue, SetValues
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_text
from studio.core.jobs import FINAL, Job
from studio.services import projects
from studio.services.pipeline import plan
from studio.services.session import Studio
from studio.ui.queue_runner import QueueRunner
from studio.ui.settings import AppSettings


class SaveConflict(StudioError):
    """The project file changed on disk since it was opened or saved."""


class ProjectController(QObject):
    opened = Signal()  # a session is open (self.studio)
    closing = Signal()  # the session is about to close
    closed = Signal()
    changed = Signal(object)  # frozenset of (section, key) the last command touched
    dirty_changed = Signal(bool)
    undo_changed = Signal()
    job_event = Signal(object)  # studio.core.jobs.Job (new or updated)
    job_failed = Signal(object)  # a Job that just failed
    log_line = Signal(int, str)  # job id, line
    job_partial = Signal(int, object)  # job id, a partial result the stage sent (dict)
    run_state = Signal(int, str)  # run id, state
    running_changed = Signal(bool)
    run_finished = Signal(object)  # RunSummary
    message = Signal(str, str)  # level ("info" | "error"), text
    disk_changed = Signal()  # the project file was changed by someone else
    autosave_found = Signal(object, float)  # list[SetValue], when (epoch seconds)
    model_ready = Signal(object)  # ModelInfo | OnnxGraph | StudioError

    def __init__(self, settings: AppSettings, parent: QObject | None = None):
        super().__init__(parent)

        self.settings = settings
        self.studio = None
        #: every run of every project goes through the work queue (its file in the config
        #: folder: what waits survives a restart of the window)
        self.queue = QueueRunner(self, settings.config_dir / "queue.sqlite")
        #: the future of the newest run() of the window (its RunSummary once it ends)
        self.last_run: asyncio.Future | None = None
        self._active: dict[int, Job] = {}  # queued / running jobs of the current run
        self._notified_failures: set[int] = set()
        self._disk_sig: projects.FileSignature | None = None
        self._base: dict[str, Any] | None = None
        self._disk_reported: projects.FileSignature | None = None
        self._model: Any = None
        self._model_task: asyncio.Future | None = None
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="qstudio-io")
        self._shut = False  # after shutdown(): work asked of the pool is dropped
        self._autosave = QTimer(self)
        self._autosave.timeout.connect(self.autosave_now)
        self._disk_timer = QTimer(self)
        self._disk_timer.setInterval(2000)
        self._disk_timer.timeout.connect(self.check_disk)

    # ---- state ----------------------------------------------------------------------------
    @property
    def project(self):
        return self.studio.project if self.studio else None

    @property
    def running(self) -> bool:
        """Whether a pipeline run of the open project is going (the work queue runs it)."""
        return self._own_run() is not None

    @property
    def dirty(self) -> bool:
        return bool(self.studio and self.studio.commands.dirty)

    @property
    def active_jobs(self) -> list[Job]:
        return sorted(self._active.values(), key=lambda j: j.id)

    @property
    def run_jobs(self) -> tuple[int, int]:
        """(jobs ended, jobs in all) of the open project's running run ((0, 0): none)."""
        r = self._own_run()
        if r is None:
            return 0, 0
        jobs = list(r.work.jobs.values())
        return sum(1 for j in jobs if j.state in FINAL), len(jobs)

    # ---- opening and closing -----------------------------------------------------------
    def open(self, path: Path) -> None:
        """Open a project file; a StudioError (broken file, ...) leaves everything as it was."""
        path = Path(path)
        studio = Studio.open(path)
        self._attach(studio)

    def create(self, spec: projects.NewProjectSpec) -> None:
        """The wizard's accept: validate, write the project file, open it."""
        studio = projects.create_project(spec)
        self._attach(studio)

    def _attach(self, studio) -> None:
        if self.studio is not None:
            self.close()
        self.studio = studio
        self._active.clear()
        self._model = None
        self._model_task = None
        studio.commands.listeners.append(self._on_command)
        path = studio.project.path
        self._base = studio.project.to_dict()  # what unsaved edits are made on
        self._disk_sig = projects.file_signature(path)
        self._disk_reported = None
        self.settings.add_recent(path)
        self.settings.last_folder = path.parent
        secs = self.settings.autosave_seconds
        if secs:
            self._autosave.start(secs * 1000)
        self._disk_timer.start()
        self.opened.emit()
        own = self._own_run()
        if own is not None:  # a queued run of this project is going: its jobs so far
            self._active = {i: j for i, j in own.jobs.items() if j.state not in FINAL}
            self.running_changed.emit(True)
        self.dirty_changed.emit(False)
        self.undo_changed.emit()
        if studio.interrupted_jobs:
            self.message.emit(
                "info",
                f"{studio.interrupted_jobs} job(s) of an earlier run were interrupted when its "
                "process ended; run the pipeline again to finish them (finished stages are cached)",
            )
        found = projects.read_autosave(studio.project)
        if found is not None:
            _, edits, when = found
            self.autosave_found.emit(edits, when)

    def close(self, unsaved: str = "keep") -> None:
        """Close the session (the window asks about unsaved edits before calling this).

        ``unsaved``: ``"keep"`` writes unsaved edits to the autosave file (offered back at the
        next open), ``"discard"`` drops them.
        """
        if self.studio is None:
            return
        self.closing.emit()
        # a run of the project goes on in the work queue on a session of its own
        if self.running:
            self.running_changed.emit(False)
        self._autosave.stop()
        self._disk_timer.stop()
        studio = self.studio
        if studio.commands.dirty and unsaved == "keep":
            self.autosave_now()
        else:
            projects.discard_autosave(studio.project)
        self.studio = None
        self._active.clear()
        self._model = None
        studio.close()
        self.closed.emit()
        self.dirty_changed.emit(False)
        self.undo_changed.emit()

    def wait_for_run(self, timeout_s: float) -> bool:
        """Keep the event loop (and so the pipeline) going until the run ends; True if it did."""
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            time.sleep(0.005)
        return not self.running

    def set_autosave(self, seconds: int) -> None:
        self.settings.autosave_seconds = seconds
        if seconds and self.studio is not None:
            self._autosave.start(seconds * 1000)
        else:
            self._autosave.stop()

    def shutdown(self) -> None:
        """Close the session and wait for every thread that touched Qt: a thread still alive
        when the QApplication goes away aborts the process ("QThread: Destroyed while thread
        is still running")."""
        self._shut = True
        self.queue.shutdown()  # running items stop and wait for the next window
        self.close()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- saving -------------------------------------------------------------------------------
    def save(self, force: bool = False) -> Path:
        """Save the project file; a SaveConflict when someone else changed it on disk."""
        studio = self._need()
        path = studio.project.path
        if not force and projects.changed_on_disk(self._disk_sig, path):
            raise SaveConflict(
                f"{path.name} was changed outside QStudio since it was opened; reload it, or "
                "save your version over it (the other version is kept in the project folder)"
            )
        if force and path.exists() and projects.changed_on_disk(self._disk_sig, path):
            self.keep_disk_copy()
        out = studio.save()
        self._base = studio.project.to_dict()
        self._disk_sig = projects.file_signature(path)
        self._disk_reported = None
        projects.discard_autosave(studio.project)
        self.dirty_changed.emit(False)
        return out

    def save_for_run(self) -> bool:
        """Put the window's edits in the project file before anything of the open project
        runs: every run reads the file (as ``studio --batch`` and ``studio info`` do), so
        the window, the CLI and the run see one recipe. Saved atomically; the undo stack is
        kept (an undo is an edit like any other: the next run saves it again). True when it
        wrote the file. Raises a StudioError saying why the run cannot start: the file was
        changed outside the studio since it was opened (the run would not run what the
        window shows), or it cannot be written."""
        studio = self._need()
        path = studio.project.path
        if projects.changed_on_disk(self._disk_sig, path):
            raise SaveConflict(
                f"not started: {path.name} was changed outside QStudio since it was opened, and "
                "a run reads the file: reload it, or save your version over it, then run")
        if not studio.commands.dirty:
            return False
        try:
            self.save()
        except OSError as exc:
            raise StudioError(f"not started: the edits could not be saved to {path.name} "
                              f"({exc.strerror or exc}), and a run reads the file") from None
        self.message.emit("info", f"Saved your edits to {path.name} before the run: the run "
                                  "reads the file (Undo still works)")
        return True

    def keep_disk_copy(self) -> Path | None:
        """Copy the file on disk into ``<project>.studio/conflicts/`` before overwriting it."""
        studio = self._need()
        path = studio.project.path
        if not path.exists():
            return None
        dest = (
            studio.project.folder
            / "conflicts"
            / f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}.qstudio"
        )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        return dest

    def save_copy(self, dest: Path) -> Path:
        """Write the project as it is now to another file (the session stays on its own)."""
        studio = self._need()

        dest = Path(dest)
        if dest.suffix != ".qstudio":
            dest = dest.with_suffix(".qstudio")
        atomic_write_text(dest, projectfile.dumps(studio.project))
        return dest

    def autosave_now(self) -> Path | None:
        if self.studio is None or not self.studio.commands.dirty:
            return None
        try:
            return projects.write_autosave(self.studio.project, self._base)
        except OSError as exc:
            self.message.emit("error", f"autosave failed: {exc}")
            return None

    def check_disk(self) -> bool:
        """True (and ``disk_changed`` once per change) when the file changed on disk."""
        if self.studio is None:
            return False
        path = self.studio.project.path
        now = projects.file_signature(path)
        if now is None and self._disk_sig is None:
            return False
        if now is not None and self._disk_sig is not None and now.sha256 == self._disk_sig.sha256:
            return False
        if now == self._disk_reported:
            return True
        self._disk_reported = now
        self.disk_changed.emit()
        return True

    def reload(self) -> None:
        """Re-read the project file; unsaved edits go to the autosave file and are offered back."""
        studio = self._need()
        if self.running:
            raise StudioError("a pipeline run is going: wait for it or cancel it before reloading")
        path = studio.project.path
        projectfile.load(path)  # a broken file raises here and the open session is kept
        self.close("keep")  # unsaved edits go to the autosave file, offered back after reload
        self.open(path)

    def keep_mine(self) -> None:
        """Ignore the change on disk until the next save (which keeps a copy of it)."""
        self._disk_reported = projects.file_signature(self._need().project.path)

    # ---- edits ---------------------------------------------------------------------------------
    def set(self, section: str, key: str, value: Any, label: str = "") -> Change:
        """One undoable edit (``label``: what it does, for the Undo action); a StudioError
        (invalid value) changes nothing."""
        return self._need().set(section, key, value, label)

    def apply_edits(self, edits: list[SetValue]) -> list[str]:
        """Push several edits (an autosave restore); returns the ones that were refused."""
        refused = []
        for cmd in edits:
            try:
                self._need().commands.push(SetValue(cmd.section, cmd.key, cmd.value))
            except StudioError as exc:
                refused.append(f"{cmd.text}: {exc.message}")
        return refused

    def apply_as_one(self, edits: list[SetValue], label: str) -> Change:
        """Several edits as one undoable step (a StudioError changes nothing)."""
        return self._need().commands.push(SetValues(list(edits), label))

    def undo(self) -> Change:
        return self._need().commands.undo()

    def redo(self) -> Change:
        return self._need().commands.redo()

    def _on_command(self, change: Change) -> None:
        if ("model", "source") in change:
            self._model = None
            self._model_task = None
            self.load_model()
        self.changed.emit(change)
        self.dirty_changed.emit(self.dirty)
        self.undo_changed.emit()

    # ---- the pipeline -------------------------------------------------------------------------
    def plan(self, stages: list[str] | None = None, targets: list[str] | None = None,
             retry: tuple[str, str] | None = None):
        return plan(self._need().project, stages, targets, retry=retry)

    def run(
        self, stages: list[str] | None = None, targets: list[str] | None = None,
        retry: tuple[str, str] | None = None, remeasure: bool = False, priority: int = 0,
    ) -> asyncio.Future:
        """Queue a run of ``stages`` (all the project's stages when None) of the open project;
        it starts now when the work queue allows, else waits its turn (why: on the Queue page).
        The same work already waiting, or running with the recipe the file holds, is joined
        (its future), not queued twice.

        The run reads the project file when it starts, like ``studio --batch``: the window's
        edits are saved to it first (now, and again when a waiting run starts), or the run is
        refused with the reason (a StudioError now; a failed queue item and a message later);
        edits made while it runs apply to the next run. ``remeasure``: the measuring stages (run, profile) time again rather than reuse a
        measurement. Returns a future of its RunSummary (None when it failed to start or was
        cancelled before it started; the failure is a message).
        """
        studio = self._need()
        self.plan(stages, targets, retry)  # unknown stage / target: a clear error now
        spec: dict[str, Any] = {"stages": stages, "targets": targets,
                                "retry": list(retry) if retry else None,
                                "remeasure": remeasure}
        item, fut, joined = self.queue.add(studio.project, "pipeline", spec, priority)
        if joined:
            self.message.emit("info", f"#{item.id} ({item.what}) already {item.state} with the "
                                      "same recipe: this run joins it rather than run twice")
        elif item.state == "waiting":
            self.message.emit("info", f"Queued as #{item.id} ({item.what}): "
                                      f"{self.queue.why.get(item.id, 'waits its turn')}")
        assert fut is not None
        self.last_run = fut
        return fut

    @property
    def sweeping(self) -> str | None:
        """The name of the open project's sweep that runs now (None: none)."""
        r = self.queue.running_for(self.project.path if self.studio else None, "sweep")
        return r.item.spec.get("sweep") if r is not None else None

    def run_ended(self, summary) -> None:
        """The queue's run of the open project ended (summary None: it failed to start)."""
        self._active.clear()
        self.running_changed.emit(False)
        if summary is not None:
            self.run_finished.emit(summary)

    def retry(self, job: Job) -> asyncio.Future:
        """Run a finished job again, and every job downstream of it (its upstream stages
        come from the cache)."""
        return self.run(retry=(job.stage, job.target))

    def _own_run(self):
        return self.queue.running_for(self.project.path if self.studio else None)

    def cancel(self, job_id: int) -> None:
        """Cancel one job of the open project's run (a running worker is terminated)."""
        r = self._own_run()
        if r is not None:
            r.cancel(job_id)

    def cancel_run(self) -> None:
        """Cancel every queued and running job of the open project's run."""
        r = self._own_run()
        if r is not None:
            r.cancel()

    def dispatch_event(self, event: dict[str, Any]) -> None:
        """A pipeline event of the open project's run (from the work queue) to the pages."""
        kind = event.get("kind")
        if kind == "job":
            job: Job = event["job"]
            if job.state in FINAL:
                self._active.pop(job.id, None)
            else:
                self._active[job.id] = job
            self.job_event.emit(job)
            if job.state == "failed" and job.id not in self._notified_failures:
                self._notified_failures.add(job.id)
                self.job_failed.emit(job)
        elif kind == "log":
            self.log_line.emit(int(event["job_id"]), str(event["line"]))
        elif kind == "partial":
            self.job_partial.emit(int(event["job_id"]), event.get("data") or {})
        elif kind == "run":
            self.run_state.emit(int(event["run_id"]), str(event["state"]))

    # ---- slow reads, off the UI thread --------------------------------------------------------
    def in_thread(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """``fn(*args)`` on the window's thread pool. After :meth:`shutdown` (the window is
        quitting) the work is dropped: a cancelled future, which ends the page's task that
        awaited it quietly instead of with "cannot schedule new futures after shutdown"."""
        loop = asyncio.get_event_loop()
        if self._shut:
            dropped = loop.create_future()
            dropped.cancel()
            return dropped
        return loop.run_in_executor(self._pool, fn, *args)

    @property
    def model(self):
        """The model description once loaded (ModelInfo, OnnxGraph or a StudioError)."""
        return self._model

    def load_model(self) -> asyncio.Future | None:
        """Describe the project's model in a thread; ``model_ready`` fires when done."""
        if self.studio is None:
            return None
        if self._model is not None:
            self.model_ready.emit(self._model)
            return None
        if self._model_task is not None and not self._model_task.done():
            return self._model_task
        project = self.studio.project.copy()
        studio = self.studio

        async def load():
            try:
                info = await self.in_thread(projects.describe_model, project)
            except StudioError as exc:
                info = exc
            except Exception as exc:  # noqa: BLE001 - shown as a message on the page
                info = StudioError(f"cannot read the model: {exc}")
            if self.studio is studio:
                self._model = info
                self.model_ready.emit(info)
            return info

        self._model_task = asyncio.ensure_future(load())
        return self._model_task

    def _need(self):
        if self.studio is None:
            raise StudioError("no project is open: create one (File ▸ New) or open one")
        return self.studio
