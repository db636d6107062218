"""Entry point of the desktop app: ``studio`` with no arguments calls ``main([])``.

One QApplication, one qasync event loop (asyncio on top of Qt's loop, so the service layer's
coroutines and the pipeline's worker subprocesses run without blocking the UI), one settings
object and one window. Heavy libraries are not imported here: pages load what they need
when first shown.

``QSTUDIO_EXIT_AFTER_SHOW=1`` prints ``shown <seconds> <window title>`` once the window is
on screen and quits (the start-up benchmark uses it).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from pathlib import Path

from studio.core import thirdparty
from studio.core.lazyimport import lazy_module
from studio.core.resources import resources_dir

QtCore = lazy_module("PySide6.QtCore")
QtGui = lazy_module("PySide6.QtGui")
QtWidgets = lazy_module("PySide6.QtWidgets")
qasync = lazy_module("qasync")

_T0 = time.perf_counter()


#: what Qt's xcb platform plugin loads on a Linux desktop (or under Xvfb): the library and the
#: Debian package that has it (packaging/install-system-deps.sh installs them); Qt itself
#: aborts with a list of plugins when one is missing
_XCB_LIBRARIES = (("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxcb-icccm.so.4", "libxcb-icccm4"),
                  ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
                  ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"), ("libEGL.so.1", "libegl1"),
                  ("libfontconfig.so.1", "libfontconfig1"))


def _loadable(soname: str) -> bool:
    """Whether the dynamic loader finds ``soname`` (as Qt will load it)."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def _missing_window_libraries() -> list[str]:
    """The packages of the libraries Qt's window needs that this Linux machine lacks
    (nothing for an offscreen or non-xcb platform, nor off Linux)."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return []
    if not platform and not os.environ.get("DISPLAY"):
        return []  # Wayland: Qt's wayland plugin, not xcb
    return [pkg for lib, pkg in _XCB_LIBRARIES if not _loadable(lib)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    thirdparty.settle()  # before any library is imported: offline, no telemetry store
    if (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")):
        # Qt would abort with a list of plugins; say what to do instead
        print("error: no display to open the QStudio window on (DISPLAY is not set): run it "
              "in a desktop session, or use studio --batch FILE for headless runs",
              file=sys.stderr)
        return 2
    missing = _missing_window_libraries()
    if missing:
        print(f"error: the QStudio window needs the system libraries {', '.join(missing)}, "
              "which this machine lacks: run bash packaging/install-system-deps.sh (or install "
              "them with your package manager); studio --batch FILE needs none of them",
              file=sys.stderr)
        return 2

    # the window's modules import Qt's widgets: only after the checks above, since without
    # a display or the system libraries the import itself fails before any message
    from studio.ui.main_window import MainWindow
    from studio.ui.settings import AppSettings
    from studio.ui.theme import apply_theme

    QtWidgets.QApplication.setApplicationName("QStudio")
    QtWidgets.QApplication.setOrganizationName("QStudio")
    QtWidgets.QApplication.setApplicationDisplayName("QStudio")
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    app.setWindowIcon(QtGui.QIcon(str(resources_dir() / "icons" / "qstudio.png")))
    settings = AppSettings()
    apply_theme(app, settings.theme)
    exit_after_show = os.environ.get("QSTUDIO_EXIT_AFTER_SHOW") == "1"

    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
        runner.get_loop()  # the qasync loop exists before any widget schedules work
        window = MainWindow(settings)
        window.show()
        if argv:
            path = Path(argv[0])
            QtCore.QTimer.singleShot(0, lambda: window.open_project(path))

        async def until_quit() -> int:
            done = asyncio.get_running_loop().create_future()
            app.aboutToQuit.connect(lambda: done.done() or done.set_result(0))
            if exit_after_show:

                def shown() -> None:
                    print(f"shown {time.perf_counter() - _T0:.3f} {window.windowTitle()}",
                          flush=True)
                    app.quit()

                QtCore.QTimer.singleShot(0, shown)
            return await done

        return runner.run(until_quit())


if __name__ == "__main__":
    sys.exit(main())
