"""The studio window: navigation, pages, menus and shortcuts, status bar, notifications.

The window owns no project logic: it forwards every request to the ``ProjectController``
and shows what the controller reports. Its navigation, View menu and page shortcuts come
from the page registry (``studio.ui.pages.registry.PAGES``); a page is built the first time
it is shown, so start-up imports only what the first page needs, and the window reaches it
only through the hooks of :class:`studio.ui.pages.base.Page`. The Run Stage menu lists the
stages of the open project's kind and is rebuilt when a project opens or closes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.services import devices, projects
from studio.ui.controller import ProjectController, SaveConflict
from studio.ui.demo import open_for_window
from studio.ui.doctor_dialog import DoctorDialog
from studio.ui.notifications import NotificationArea
from studio.ui.pages.registry import PAGES, has_page, page_spec
from studio.ui.settings import AppSettings
from studio.ui.stages import project_stages, stage_title
from studio.ui.theme import apply_theme
from studio.ui.welcome import Welcome
from studio.ui.widgets import EmptyState, label
from studio.ui.wizard import NewProjectWizard

if TYPE_CHECKING:
    from studio.ui.pages.base import Page


class MainWindow(QMainWindow):
    def __init__(self, settings: AppSettings, controller: ProjectController | None = None):
        super().__init__()
        self.settings = settings
        self.ctl = controller or ProjectController(settings, self)
        self.pages: dict[str, Page] = {}  # by key, as they are built
        self.setWindowTitle("QStudio")
        self.resize(1280, 820)
        self.setMinimumSize(900, 600)

        # -- layout: navigation | pages (notifications are in the status bar: they never move
        # the page) --
        central = QWidget()
        cl = QHBoxLayout(central)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        self.nav = QListWidget()
        self.nav.setObjectName("nav")
        for i, spec in enumerate(PAGES):
            item = QListWidgetItem(spec.title)
            item.setToolTip(spec.tip + (f" (Ctrl+{i + 1})" if i < 9 else ""))
            self.nav.addItem(item)
        self.nav.setFixedWidth(170)
        self.nav.currentRowChanged.connect(self._nav_changed)
        cl.addWidget(self.nav)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(0)
        self.stack = QStackedWidget()
        rl.addWidget(self.stack, 1)
        cl.addWidget(right, 1)
        self.setCentralWidget(central)
        self.welcome = Welcome(self)
        self.stack.addWidget(self.welcome)
        #: shown while a page is built the first time
        self.loading_page = EmptyState("Loading…", "")
        self.stack.addWidget(self.loading_page)

        self._build_actions()
        self._build_menus()
        self._build_status()

        c = self.ctl
        c.opened.connect(self._opened)
        c.closed.connect(self._closed)
        c.dirty_changed.connect(self._update_title)
        c.undo_changed.connect(self._update_undo)
        c.running_changed.connect(self._running_changed)
        c.job_event.connect(self._job_event)
        c.queue.changed.connect(self._update_jobs_status)
        c.job_failed.connect(self._job_failed)
        c.message.connect(self._message)
        c.disk_changed.connect(self._disk_changed)
        c.autosave_found.connect(self._autosave_found)
        if c.queue.notice:  # the queue file was damaged: set aside, a new one started
            self.notify(c.queue.notice, "error")
        c.run_finished.connect(self._run_finished)

        geo, state, page = settings.window_state()
        if geo is not None:
            self.restoreGeometry(geo)
        if state is not None:
            self.restoreState(state)
        self._start_page = page_spec(page).title if page and has_page(page) else "Overview"
        self._update_title()
        self._update_undo()
        self._update_project_actions()
        self.welcome.refresh()
        self.show_page("Overview")
        QTimer.singleShot(0, self._update_devices)

    # ---- actions and menus ---------------------------------------------------------------------
    def _act(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
            a.setToolTip(tip)
        a.triggered.connect(lambda _checked=False: slot())
        self.addAction(a)
        return a

    def _build_actions(self) -> None:
        K = QKeySequence.StandardKey
        self.new_act = self._act(
            "&New Project…",
            self.new_project,
            K.New,
            "Create a project from a sample, a checkpoint or an ONNX file",
        )
        self.open_act = self._act("&Open…", self.open_dialog, K.Open, "Open a .qstudio project")
        self.save_act = self._act("&Save", self.save, K.Save, "Save the project file")
        self.save_copy_act = self._act(
            "Save a &Copy As…",
            self.save_copy,
            "Ctrl+Shift+S",
            "Write the project as it is now to another file",
        )
        self.reload_act = self._act(
            "&Reload from Disk",
            self.reload,
            None,
            "Re-read the project file (unsaved edits are offered back)",
        )
        self.close_act = self._act(
            "&Close Project",
            self.close_project,
            K.Close,
            "Close the project (asks about unsaved edits)",
        )
        self.quit_act = self._act("&Quit", self.close, K.Quit, "Quit QStudio")
        self.undo_act = self._act("&Undo", self.undo, K.Undo)
        self.redo_act = self._act("&Redo", self.redo, K.Redo)
        self.run_act = self._act(
            "Run &Pipeline",
            lambda: self.run_stages(None),
            "F5",
            "Run every stage of the project (as studio --batch)",
        )
        self.cancel_act = self._act(
            "&Cancel Run", self.ctl.cancel_run, "Shift+F5", "Cancel every queued and running job"
        )
        self.stage_acts: dict[str, QAction] = {}  # the open project's stages (_fill_stages)
        self.page_acts = [
            self._act(spec.title, lambda k=spec.key: self.show_page(k),
                      f"Ctrl+{i + 1}" if i < 9 else None)
            for i, spec in enumerate(PAGES)
        ]
        self.autosave_act = QAction("&Autosave Unsaved Edits", self, checkable=True)
        self.autosave_act.setChecked(self.settings.autosave_seconds > 0)
        self.autosave_act.setStatusTip(
            "Every 30 s, keep unsaved edits in the project folder "
            "(offered back if QStudio stops before you save)"
        )
        self.autosave_act.toggled.connect(self._toggle_autosave)
        self.theme_group = QActionGroup(self)
        self.theme_acts = {}
        for name in ("system", "light", "dark"):
            a = QAction(name.capitalize(), self, checkable=True)
            a.setChecked(self.settings.theme == name)
            a.triggered.connect(lambda _c=False, n=name: self.set_theme(n))
            self.theme_group.addAction(a)
            self.theme_acts[name] = a
        self.demo_act = self._act("&Demo", self.show_demo, "F11",
                                  "Show the project full screen for a stakeholder demo")
        self.shortcuts_act = self._act("&Keyboard Shortcuts", self.show_shortcuts, None)
        self.doctor_act = self._act("&Doctor…", self.show_doctor, None,
                                    "Check this machine, the project and a device: each "
                                    "finding with its fix")
        self.about_act = self._act("&About QStudio", self.show_about, None)

    def _build_menus(self) -> None:
        mb = self.menuBar()
        f = mb.addMenu("&File")
        f.addAction(self.new_act)
        f.addAction(self.open_act)
        self.recent_menu = f.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        f.addSeparator()
        f.addAction(self.save_act)
        f.addAction(self.save_copy_act)
        f.addAction(self.reload_act)
        f.addAction(self.autosave_act)
        f.addSeparator()
        f.addAction(self.close_act)
        f.addAction(self.quit_act)
        e = mb.addMenu("&Edit")
        e.addAction(self.undo_act)
        e.addAction(self.redo_act)
        v = mb.addMenu("&View")
        for a in self.page_acts:
            v.addAction(a)
        v.addSeparator()
        v.addAction(self.demo_act)
        t = v.addMenu("&Theme")
        for a in self.theme_acts.values():
            t.addAction(a)
        r = mb.addMenu("&Run")
        r.addAction(self.run_act)
        self.stage_menu = r.addMenu("Run &Stage")
        self._fill_stages()
        r.addAction(self.cancel_act)
        h = mb.addMenu("&Help")
        h.addAction(self.doctor_act)
        h.addAction(self.shortcuts_act)
        h.addAction(self.about_act)

    def _fill_stages(self) -> None:
        """The Run Stage menu: each stage of the open project's kind (none without one)."""
        for a in self.stage_acts.values():
            self.removeAction(a)
            a.deleteLater()
        self.stage_menu.clear()
        self.stage_acts = {
            s: self._act(f"{s} — {stage_title(s)}", lambda s=s: self.run_stages([s]), None,
                         f"Run {s} and the stages it needs")
            for s in project_stages(self.ctl.project)
        }
        for a in self.stage_acts.values():
            self.stage_menu.addAction(a)
        self.stage_menu.setEnabled(bool(self.stage_acts))

    def _build_status(self) -> None:
        """The status bar: the newest notification at the left (``notifications``), the
        jobs and devices, and the notifications button at the right end. Its height is
        fixed: what it shows never moves the page above it."""
        sb = self.statusBar()
        self.notifications = NotificationArea()
        sb.addWidget(self.notifications, 1)
        self.jobs_label = label("No jobs running")
        self.jobs_bar = QProgressBar()
        self.jobs_bar.setMaximumWidth(120)
        self.jobs_bar.setMaximumHeight(14)
        self.jobs_bar.setTextVisible(False)
        self.jobs_bar.hide()
        self.device_label = label("Devices: …")
        sb.addPermanentWidget(self.jobs_label)
        sb.addPermanentWidget(self.jobs_bar)
        sb.addPermanentWidget(label(" | ", "muted"))
        sb.addPermanentWidget(self.device_label)
        sb.addPermanentWidget(self.notifications.button)
        self.notifications.show()
        tall = max(w.sizeHint().height() for w in (
            self.notifications, self.notifications.button, self.jobs_label))
        sb.setFixedHeight(max(sb.sizeHint().height(), tall + 6))

    # ---- pages ----------------------------------------------------------------------------------
    def page(self, name: str) -> Page:
        """The page with this key (or title), built on first use."""
        spec = page_spec(name)
        if spec.key not in self.pages:
            page = spec.load()(self.ctl)
            page.navigate.connect(self._navigate)
            page.layerActivated.connect(self.show_layer)
            page.runActivated.connect(self.show_run)
            page.graphActivated.connect(self.show_in_graph)
            page.start()
            self.pages[spec.key] = page
            self.stack.addWidget(page)
        return self.pages[spec.key]

    def show_page(self, name: str) -> QWidget:
        """Show the page with this key (or title); returns it (the welcome screen for the
        Overview while no project is open)."""
        spec = page_spec(name)
        row = PAGES.index(spec)
        if self.nav.currentRow() != row:
            self.nav.setCurrentRow(row)  # -> _nav_changed
        else:
            self._nav_changed(row)
        return self.pages.get(spec.key) or self.welcome

    def show_layer(self, name: str) -> QWidget:
        """Open the Precision page on a layer (a module path or a key-activation pseudo-layer)
        when the page can select one."""
        self.show_page("precision")
        page = self.page("precision")
        page.reveal_layer(name)
        return page

    def show_in_graph(self, name: str) -> QWidget:
        """Open the Model page's graph view on a layer's nodes."""
        page = self.show_page("model")
        if not page.reveal_layer(name):
            self.notify(f"{name} is not in a drawn graph yet: run the export stage, then pick "
                        "a graph on the Model page", "info", timeout_ms=8000)
        return page

    def show_run(self, run_id: int) -> QWidget:
        """Show a run of the history: on the Validation page when it has validation results,
        else its first failed (or first) job on the Jobs page."""
        studio = self.ctl.studio
        if studio is None:
            return self.welcome
        self.show_page("validation")
        page = self.page("validation")
        if page.reveal_run(run_id):
            return page
        jobs = studio.jobs.jobs(run_id=run_id)
        job = next((j for j in jobs if j.state == "failed"), jobs[0] if jobs else None)
        page = self.show_page("jobs")
        if job is not None:
            self.show_job_log(job.id)
            self.notify(f"Run {run_id} has no validation results: its jobs are on the Jobs "
                        "page.", "info", timeout_ms=10000)
        return page

    def current_page(self) -> str:
        """The title of the page shown."""
        return PAGES[max(0, self.nav.currentRow())].title

    def _nav_changed(self, row: int) -> None:
        if row < 0:
            return
        key = PAGES[row].key
        if key == "overview" and self.ctl.studio is None:
            self.welcome.refresh()
            self.stack.setCurrentWidget(self.welcome)
            return
        if key not in self.pages:
            # building a page reads the project (seconds on a big model, or while a run
            # keeps the cores busy): say so at once instead of leaving the old page up
            spec = PAGES[row]
            self.loading_page.title.setText(f"Loading {spec.title}…")
            self.loading_page.text.setText(spec.description)
            self.stack.setCurrentWidget(self.loading_page)
            self.stack.repaint()
        self.stack.setCurrentWidget(self.page(key))

    def _navigate(self, target: str) -> None:
        if target == "action:new":
            self.new_project()
        elif target == "action:open":
            self.open_dialog()
        elif target.startswith("action:open-path:"):
            self.open_project(Path(target.removeprefix("action:open-path:")))
        elif has_page(target):
            self.show_page(target)

    # ---- projects -----------------------------------------------------------------------------
    def new_project(self):
        if not self.maybe_close():
            return None

        wiz = NewProjectWizard(self.ctl, self.settings.last_folder, self)
        wiz.open()
        self._wizard = wiz
        return wiz

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open project",
            str(self.settings.last_folder),
            "QStudio projects (*.qstudio);;All files (*)",
        )
        if path:
            self.open_project(Path(path))

    def open_project(self, path: Path) -> bool:
        """Open a project file; a broken file gives a clear message and nothing changes."""
        path = Path(path)
        if self.ctl.studio is not None and Path(self.ctl.project.path) == path.resolve():
            self.show_page("Overview")
            return True
        try:
            # the file is read first: one that is no project (a text file, a corrupt or a
            # newer .qstudio) leaves the open project open, unasked
            projectfile.load(path)
        except StudioError as exc:
            self.notify(
                f"Could not open {path.name}: {exc.message}. The file was not changed"
                + (f"; {self.ctl.project.name} stays open." if self.ctl.studio is not None
                   else "."), "error")
            if self.ctl.studio is None:
                self.welcome.refresh()
            return False
        if not self.maybe_close():
            return False
        try:
            self.ctl.open(path)
        except StudioError as exc:
            self.notify(
                f"Could not open {path.name}: {exc.message}. The file was not changed.", "error"
            )
            self.welcome.refresh()
            return False
        return True

    def maybe_close(self) -> bool:
        """Close the open project after asking about unsaved edits; False when the user cancels."""
        if self.ctl.studio is None:
            return True
        # the project's runs and sweeps go on in the work queue (Queue page)
        unsaved = "keep"
        if self.ctl.dirty:
            choice = self.confirm_unsaved()
            if choice == "cancel":
                return False
            if choice == "save" and not self.save():
                return False
            unsaved = "discard" if choice == "discard" else "keep"
        self.ctl.close(unsaved)
        return True

    def close_project(self) -> bool:
        return self.maybe_close()

    # dialogs (tests replace these two methods)
    def confirm_unsaved(self) -> str:
        box = QMessageBox(
            QMessageBox.Icon.Warning,
            "Unsaved changes",
            f"{self.ctl.project.name} has unsaved changes.",
            QMessageBox.StandardButton.Save
            | QMessageBox.StandardButton.Discard
            | QMessageBox.StandardButton.Cancel,
            self,
        )
        box.setInformativeText("Save them before closing?")
        box.setDefaultButton(QMessageBox.StandardButton.Save)
        answer = box.exec()
        return {
            QMessageBox.StandardButton.Save: "save",
            QMessageBox.StandardButton.Discard: "discard",
        }.get(QMessageBox.StandardButton(answer), "cancel")

    def confirm_cancel_run(self) -> bool:
        running = self.ctl.queue.items(finished=False)
        running = [i for i in running if i.state == "running"]
        answer = QMessageBox.question(
            self,
            "Work is running",
            f"{len(running)} queued item(s) are running ("
            + ", ".join(i.label for i in running[:3]) + (" …" if len(running) > 3 else "")
            + "). Quit stops them; they wait in the queue for the next start (finished "
            "stages and sweep points are kept). Quit?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def save(self) -> bool:
        if self.ctl.studio is None:
            return False
        try:
            path = self.ctl.save()
        except SaveConflict as exc:
            n = self.notify(exc.message, "error")
            n.add_action("Reload from disk", self.reload)
            n.add_action("Save mine over it", lambda: self._force_save())
            return False
        except StudioError as exc:
            self.notify(f"Could not save: {exc.message}", "error")
            return False
        self.statusBar().showMessage(f"Saved {path}", 4000)
        return True

    def _force_save(self) -> None:
        try:
            self.ctl.save(force=True)
        except StudioError as exc:
            self.notify(f"Could not save: {exc.message}", "error")
            return
        self.statusBar().showMessage(
            "Saved; the version that was on disk is kept in the project folder (conflicts/)", 6000
        )

    def save_copy(self) -> None:
        if self.ctl.studio is None:
            return
        path, _ = QFileDialog.getSaveFileName(
            self, "Save a copy", str(self.settings.last_folder), "QStudio projects (*.qstudio)"
        )
        if path:
            out = self.ctl.save_copy(Path(path))
            self.statusBar().showMessage(f"Wrote a copy to {out}", 5000)

    def reload(self) -> None:
        try:
            self.ctl.reload()
        except StudioError as exc:
            self.notify(f"Could not reload: {exc.message}. The open version is kept.", "error")

    def undo(self) -> None:
        if self.ctl.studio is not None:
            self.ctl.undo()

    def redo(self) -> None:
        if self.ctl.studio is not None:
            self.ctl.redo()

    def run_stages(self, stages):
        if self.ctl.studio is None:
            self.notify("Open or create a project first", "error")
            return None
        try:
            task = self.ctl.run(stages)
        except StudioError as exc:
            self.notify(exc.message, "error")
            return None
        self.show_page("Jobs")
        return task

    # ---- controller events -------------------------------------------------------------------------
    def _update_nav(self) -> None:
        """List the pages of the open project's model kind (every page without a project)."""
        kind = self.ctl.project.model["kind"] if self.ctl.studio is not None else ""
        for row, spec in enumerate(PAGES):
            self.nav.item(row).setHidden(bool(kind and spec.kinds and kind not in spec.kinds))

    def _opened(self) -> None:
        self.notifications.clear()
        self._update_nav()
        self._fill_stages()
        self._update_title()
        self._update_project_actions()
        self.show_page(self._start_page if self._start_page else "Overview")
        self._start_page = ""

    def _closed(self) -> None:
        self.notifications.clear()
        self._update_nav()
        self._fill_stages()
        self._update_title()
        self._update_project_actions()
        self._update_jobs_status()
        self.welcome.refresh()
        if self.current_page() == "Overview":
            self.stack.setCurrentWidget(self.welcome)

    def _update_title(self, *_args) -> None:
        p = self.ctl.project
        if p is None:
            self.setWindowTitle("QStudio")
            self.setWindowModified(False)
            return
        self.setWindowTitle(f"{p.name}[*] — {p.path.name} — QStudio")
        self.setWindowModified(self.ctl.dirty)

    def _update_undo(self) -> None:
        s = self.ctl.studio
        self.undo_act.setEnabled(bool(s and s.commands.can_undo))
        self.redo_act.setEnabled(bool(s and s.commands.can_redo))
        self.undo_act.setText(
            f"&Undo {s.commands.undo_text}" if s and s.commands.can_undo else "&Undo"
        )
        self.redo_act.setText(
            f"&Redo {s.commands.redo_text}" if s and s.commands.can_redo else "&Redo"
        )

    def _update_project_actions(self) -> None:
        has = self.ctl.studio is not None
        running = self.ctl.running
        for a in (self.save_act, self.save_copy_act, self.reload_act, self.close_act):
            a.setEnabled(has)
        # a run while another runs is queued behind it (Queue page)
        self.run_act.setEnabled(has)
        for a in self.stage_acts.values():
            a.setEnabled(has)
        self.cancel_act.setEnabled(running)

    def _running_changed(self, running: bool) -> None:
        self._update_project_actions()
        self._update_jobs_status()

    def _job_event(self, job) -> None:
        self._update_jobs_status()

    def _update_jobs_status(self) -> None:
        """The open project's running job, then the queue's one count of items (the Queue
        page's: items running and waiting, never the jobs inside a run)."""
        jobs = self.ctl.active_jobs
        running = [j for j in jobs if j.state == "running"]
        if not self.ctl.running or not jobs:
            self.jobs_label.setText(self._queue_status())
            self.jobs_bar.hide()
            return
        done, total = self.ctl.run_jobs
        count = f" · Queue: {self.ctl.queue.counts().text()}"
        if running:
            j = running[0]
            self.jobs_label.setText(f"Running {j.label} {j.progress:.0%} (job "
                                    f"{min(done + 1, total)} of {total}){count}")
            self.jobs_bar.setValue(int(j.progress * 100))
        else:
            self.jobs_label.setText(f"Starting job {min(done + 1, total)} of {total}{count}")
            self.jobs_bar.setValue(0)
        self.jobs_bar.show()

    def _queue_status(self) -> str:
        """The status bar's line when the open project runs nothing: the queue's running
        items and its count."""
        counts = self.ctl.queue.counts()
        if not counts.total:
            return "No jobs running"
        running = [i for i in self.ctl.queue.items(finished=False) if i.state == "running"]
        now = ", ".join(f"#{i.id} {i.name} {i.progress}".rstrip() for i in running[:2])
        return f"Queue: {counts.text()}" + (f" · {now}" if now else "")

    def _job_failed(self, job) -> None:
        msg = job.error or job.message or "failed"
        if msg.startswith(f"{job.label}: "):
            msg = msg[len(job.label) + 2 :]
        n = self.notify(f"✖ {job.label} failed: {msg}", "error")
        n.add_action("Show log", lambda jid=job.id: self.show_job_log(jid))

    def show_job_log(self, job_id: int) -> None:
        if self.ctl.studio is None:
            return
        self.show_page("jobs")
        self.page("jobs").reveal_job(job_id)

    def _run_finished(self, summary) -> None:
        took = f"{summary.seconds:.1f} s"
        if summary.state == "succeeded":
            gates = "" if summary.gates_passed else " — an accuracy gate FAILED (see Validation)"
            self.statusBar().showMessage(f"Run {summary.run_id} succeeded in {took}{gates}", 10000)
            if not summary.gates_passed:
                n = self.notify(f"Run {summary.run_id}: an accuracy gate failed", "error")
                n.add_action("Show validation", lambda: self.show_page("Validation"))
        elif summary.state == "cancelled":
            self.statusBar().showMessage(f"Run {summary.run_id} cancelled after {took}", 10000)

    def _message(self, level: str, text: str) -> None:
        if level == "error":
            self.notify(text, "error")
        else:
            self.notify(text, "info", timeout_ms=15000)

    def notify(self, text: str, level: str = "info", timeout_ms: int = 0):
        """A notification in the status bar (and its list): ``level`` "info" or "error";
        ``timeout_ms``: how long it stays on the status line (0: until dismissed or a newer
        one comes). A temporary status message gives way to it."""
        self.statusBar().clearMessage()
        return self.notifications.notify(text, level, timeout_ms)

    def _disk_changed(self) -> None:
        p = self.ctl.project
        n = self.notify(f"{p.path.name} was changed outside QStudio.", "error")
        n.add_action("Reload from disk", self.reload)
        n.add_action("Keep my version", self.ctl.keep_mine)

    def _autosave_found(self, edits, when: float) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
        what = ", ".join(f"{c.section + '.' if c.section else ''}{c.key}" for c in edits[:4])
        more = f" and {len(edits) - 4} more" if len(edits) > 4 else ""
        n = self.notify(f"Unsaved edits from {stamp} were found ({what}{more}).", "info")

        def restore() -> None:
            refused = self.ctl.apply_edits(edits)
            if refused:
                self.notify("Some edits could not be restored: " + "; ".join(refused), "error")

        n.add_action("Restore them", restore)
        n.add_action("Discard", self._discard_autosave)

    def _discard_autosave(self) -> None:
        if self.ctl.project is not None:
            projects.discard_autosave(self.ctl.project)

    def _update_devices(self) -> None:
        st = devices.device_state()
        sim = st["htp_sim"]
        # short: the status bar's left part is the notifications' line
        sim_text = (f"HTP simulator {sim['version']}" if sim["available"]
                    else "no HTP simulator")
        self.device_label.setText(f"Host CPU ready · {sim_text}")
        self.device_label.setToolTip(
            f"Host CPU: {st['host']['cpus']} cores. "
            + (f"The HTP simulator of onnxruntime-qnn {sim['version']} is installed. "
               if sim["available"] else "The HTP simulator (onnxruntime-qnn) is not installed. ")
            + "Remote agents and phones over adb are added, checked and used on the Devices page"
        )

    # ---- preferences ------------------------------------------------------------------------------
    def set_theme(self, name: str) -> None:
        self.settings.theme = name
        apply_theme(QApplication.instance(), name)
        self.theme_acts[name].setChecked(True)
        for page in self.pages.values():
            page.apply_theme()

    def _toggle_autosave(self, on: bool) -> None:
        self.ctl.set_autosave(30 if on else 0)

    def _fill_recent(self) -> None:
        m = self.recent_menu
        m.clear()
        items = self.settings.recent_projects()
        for p in items:
            a = m.addAction(f"{p.name} — {p.parent}")
            a.setEnabled(p.exists())
            a.triggered.connect(lambda _c=False, p=p: self.open_project(p))
        if not items:
            a = m.addAction("No recent projects")
            a.setEnabled(False)
        else:
            m.addSeparator()
            m.addAction(
                "Clear list", lambda: (self.settings.clear_recent(), self.welcome.refresh())
            )

    def show_demo(self):
        """View → Demo: the open project's demo (its NAME.demo.toml) full screen."""
        self.demo_window = open_for_window(self)
        return self.demo_window

    def show_shortcuts(self) -> None:
        rows = [
            (
                a.text().replace("&", ""),
                a.shortcut().toString(QKeySequence.SequenceFormat.NativeText),
            )
            for a in (
                self.new_act,
                self.open_act,
                self.save_act,
                self.save_copy_act,
                self.close_act,
                self.quit_act,
                self.undo_act,
                self.redo_act,
                self.run_act,
                self.cancel_act,
                *self.page_acts,
            )
        ]
        text = (
            "<table>"
            + "".join(f"<tr><td>{n}</td><td>&nbsp;&nbsp;<b>{k}</b></td></tr>" for n, k in rows if k)
            + "</table>"
        )
        QMessageBox.information(self, "Keyboard shortcuts", text)

    def show_doctor(self) -> None:
        self.doctor_dialog = DoctorDialog(self.ctl, self)
        self.doctor_dialog.show()

    def show_about(self) -> None:
        QMessageBox.about(
            self,
            "About QStudio",
            "<b>QStudio</b><br>A deployment studio for language models on "
            "Snapdragon NPUs. The same service layer runs headless: "
            "<code>studio --batch project.qstudio</code>.",
        )

    # ---- closing --------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        if self.ctl.queue.running and not self.confirm_cancel_run():
            event.ignore()
            return
        if not self.maybe_close():
            event.ignore()
            return
        self.settings.save_window_state(self.saveGeometry(), self.saveState(), self.current_page())
        self.ctl.shutdown()
        event.accept()
