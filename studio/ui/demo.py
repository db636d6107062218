"""Demo mode: a full-screen, keyboard-driven stage for a stakeholder demo (``studio demo FILE``
and View → Demo).

The scenes come from the project's demo file (``core.demo``), their figures from
``services.demo``; each figure shows its source badge, and a recorded figure says which run,
on which device, when. The live generation runs in a thread (the playground's way: the UI only
receives queued signals) with a tok/s meter and the time to first token.

Keys: → / Space / PageDown next (the waterfall reveals one step per press first), ← / PageUp
back, Home first scene, End last, R runs the generation again, P the next prompt, F full
screen on/off, Esc leaves full screen (and then closes).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLayout,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core import thirdparty
from studio.core.demo import SCENES
from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.services import demo as demosvc
from studio.ui.demo_scenes import VIEWS, BuildBridge, GenerateView, SceneView
from studio.ui.demo_widgets import (
    demo_stylesheet,
    text_label,
)

QtCore = lazy_module("PySide6.QtCore")


# ---- the window -------------------------------------------------------------------------------
class DemoWindow(QWidget):
    """The stage: one scene at a time, a footer with the scene number and the keys."""

    def __init__(self, demo: demosvc.Demo, start: int = 0, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)

        self.demo = demo
        self.setObjectName("stage")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setWindowTitle(f"QStudio demo — {demo.title}")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.root = QVBoxLayout(self)
        # the type follows the window: the content never forces the window past the screen
        # (a minimum size above the screen's would drop full screen)
        self.root.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        top = QHBoxLayout()
        self.demo_title = text_label(demo.title, "small", "muted")
        top.addWidget(self.demo_title)
        top.addStretch(1)
        self.run_label = text_label(
            "no run recorded yet" if demo.run is None else
            f"recorded figures: run {demo.run.id}" if demo.spec.run is not None else
            f"recorded figures: run {demo.run.id}, the newest · each scene names its run",
            "small", "muted")
        top.addWidget(self.run_label)
        self.root.addLayout(top)
        self.stack = QStackedWidget()
        self.root.addWidget(self.stack, 1)
        self.views: list[SceneView] = []
        for kind in demo.spec.scenes:
            v = VIEWS[kind](kind, SCENES[kind], self)
            self.views.append(v)
            self.stack.addWidget(v)
        footer = QWidget()
        footer.setObjectName("footer")
        fl = QHBoxLayout(footer)
        fl.setContentsMargins(0, 0, 0, 0)
        self.position = text_label("", "small")
        fl.addWidget(self.position)
        fl.addStretch(1)
        self.keys = text_label("", "small")
        fl.addWidget(self.keys)
        self.root.addWidget(footer)
        self.index = -1
        self._base = 0.0
        self._build_thread: threading.Thread | None = None
        self.resize(1280, 720)
        self.go(max(0, min(start, len(self.views) - 1)))
        self._build()

    # ---- building the scenes off the UI thread ---------------------------------------------
    def _build(self) -> None:
        bridge = BuildBridge()
        bridge.ready.connect(self._scene_ready)
        self._build_bridge = bridge
        demo, kinds = self.demo, list(self.demo.spec.scenes)
        first = self.index

        def work() -> None:
            order = [first] + [i for i in range(len(kinds)) if i != first]
            for i in order:
                try:
                    scene = demosvc.build_scene(demo, kinds[i])
                except Exception as exc:  # noqa: BLE001 - shown in the scene, not lost

                    scene = demosvc.Scene(kinds[i], SCENES[kinds[i]],
                                          empty=f"this scene failed: {type(exc).__name__}: "
                                                f"{exc}")
                bridge.ready.emit(i, scene)

        self._build_thread = threading.Thread(target=work, name="demo-scenes", daemon=True)
        self._build_thread.start()

    def _scene_ready(self, i: int, scene: demosvc.Scene) -> None:
        self.views[i].set_scene(scene)
        self._update_footer()

    def ready(self) -> bool:
        return all(v.scene is not None for v in self.views)

    # ---- moving between scenes -------------------------------------------------------------
    @property
    def base(self) -> float:
        """The type size the scenes scale with (0 before the first resize)."""
        return self._base

    def current_view(self) -> SceneView | None:
        return self.views[self.index] if 0 <= self.index < len(self.views) else None

    def go(self, i: int, forward: bool = True) -> None:
        if not 0 <= i < len(self.views) or i == self.index:
            return
        old = self.current_view()
        if old is not None:
            old.left()
        self.index = i
        self.stack.setCurrentIndex(i)
        self.views[i].entered(forward)
        self._update_footer()

    def next(self) -> None:
        v = self.current_view()
        if v is not None and v.advance():
            return
        self.go(self.index + 1, True)

    def back(self) -> None:
        v = self.current_view()
        if v is not None and v.retreat():
            return
        self.go(self.index - 1, False)

    def _update_footer(self) -> None:
        v = self.current_view()
        n = len(self.views)
        self.position.setText(f"scene {self.index + 1} / {n} · {v.title.text() if v else ''}")
        hints = "→ / Space next · ← back · Home first · F full screen · Esc leave"
        if v is not None and v.hints and v.scene is not None and not v.scene.empty:
            hints = f"{v.hints} · {hints}"
        self.keys.setText(hints)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        k = event.key()
        K = Qt.Key
        if k in (K.Key_Right, K.Key_Space, K.Key_PageDown, K.Key_Down, K.Key_Return):
            self.next()
        elif k in (K.Key_Left, K.Key_PageUp, K.Key_Up, K.Key_Backspace):
            self.back()
        elif k == K.Key_Home:
            self.go(0, True)
        elif k == K.Key_End:
            self.go(len(self.views) - 1, False)
        elif k == K.Key_F:
            self.leave_full_screen() if self.isFullScreen() else self.full_screen()
        elif k == K.Key_Escape:
            if self.isFullScreen():
                self.leave_full_screen()
            else:
                self.close()
        elif k in (K.Key_R, K.Key_P) and isinstance(self.current_view(), GenerateView):
            view = self.current_view()
            assert isinstance(view, GenerateView)
            view.restart(next_prompt=k == K.Key_P)
        else:
            super().keyPressEvent(event)

    def full_screen(self) -> None:
        """Full screen on the window's screen (its geometry set too: without a window manager,
        e.g. on a bare X server, the full-screen state alone leaves the size as it was)."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            self.setGeometry(screen.geometry())
        self.showFullScreen()

    def leave_full_screen(self) -> None:
        self.showNormal()
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            g = screen.availableGeometry()
            w, h = min(1280, g.width()), min(720, g.height())
            self.setGeometry(g.x() + (g.width() - w) // 2, g.y() + (g.height() - h) // 2, w, h)

    # ---- type that follows the window's size -------------------------------------------------
    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        base = max(11.0, min(self.height() / 50.0, self.width() / 80.0))
        if abs(base - self._base) >= 0.5:
            self._base = base
            self.setStyleSheet(demo_stylesheet(base))
            m = int(base * 1.6)
            self.root.setContentsMargins(m, int(base * 0.8), m, int(base * 0.6))
            self.root.setSpacing(int(base * 0.5))
            for v in self.views:
                v.rescale(base)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        for v in self.views:
            if isinstance(v, GenerateView):
                v.cancel(wait=30.0)
        if self._build_thread is not None:
            self._build_thread.join(60)
        self.demo.close()
        super().closeEvent(event)


# ---- studio demo FILE ---------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="studio demo",
        description="Full-screen demo of a project: live generation, the optimization "
                    "waterfall, accuracy, the op breakdown, memory and the bundle. FILE is a "
                    "project (its NAME.demo.toml beside it is used when present) or a demo "
                    "file.")
    p.add_argument("file", metavar="FILE", help="NAME.qstudio or NAME.demo.toml")
    p.add_argument("--scene", default="1",
                   help="the scene to start on: its number (1 = the first) or its name")
    p.add_argument("--windowed", action="store_true", help="a window instead of full screen")
    return p.parse_args(argv)


def start_index(demo: demosvc.Demo, scene: str) -> int:
    kinds = list(demo.spec.scenes)
    if scene in kinds:
        return kinds.index(scene)
    if scene.isdigit() and 1 <= int(scene) <= len(kinds):
        return int(scene) - 1
    raise StudioError(f"--scene {scene}: the demo has {len(kinds)} scenes "
                      f"({', '.join(kinds)}): give 1 to {len(kinds)} or a name")


def main(argv: list[str] | None = None) -> int:
    """``studio demo FILE [--scene N] [--windowed]``: bad input says so in one line and exits
    2 before any window opens."""
    argv = list(sys.argv[1:] if argv is None else argv)
    thirdparty.settle()  # before any library is imported: offline, no telemetry store
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        demo = demosvc.open_demo(Path(args.file))
        start = start_index(demo, args.scene)
    except StudioError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")):
        demo.close()
        print("error: no display to show the demo on (DISPLAY is not set): run it in a "
              "desktop session", file=sys.stderr)
        return 2
    QApplication.setApplicationName("QStudio")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    win = DemoWindow(demo, start)
    if args.windowed:
        win.show()
    else:
        win.full_screen()
    if os.environ.get("QSTUDIO_EXIT_AFTER_SHOW") == "1":
        QtCore.QTimer.singleShot(0, lambda: (print(f"shown {win.windowTitle()}", flush=True),
                                      win.close()))
    return int(app.exec())


def open_for_window(win, full_screen: bool = True) -> DemoWindow | None:
    """View → Demo: the open project's demo (as the window holds it, unsaved edits included)
    in a window of its own; a problem is a notification in the studio window instead."""
    old = getattr(win, "demo_window", None)
    if old is not None:
        old.close()
        old.deleteLater()
    if win.ctl.studio is None:
        win.notify("Open a project first: the demo shows a project's results.", "error")
        return None
    try:
        demo = demosvc.open_demo(win.ctl.project.path, project=win.ctl.project.copy())
    except StudioError as exc:
        win.notify(exc.message, "error")
        return None
    dw = DemoWindow(demo, parent=win)
    if full_screen:
        dw.full_screen()
    else:
        dw.show()
    dw.activateWindow()
    dw.setFocus()
    return dw
