"""Screenshot every page of the window: ``python -m studio.ui.screenshots OUT [FILE.qstudio]``.

Without a file, a small sample project is created in a temp folder. ``--run`` runs the
project's pipeline first (``--stages`` to choose), so the pages show real results.
Works offscreen (``QT_QPA_PLATFORM=offscreen``) and under Xvfb.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from studio.core.lazyimport import lazy_module
from studio.ui.main_window import MainWindow
from studio.ui.pages.registry import PAGES
from studio.ui.settings import AppSettings
from studio.ui.standalone import sample_project
from studio.ui.theme import apply_theme

QtWidgets = lazy_module("PySide6.QtWidgets")
qasync = lazy_module("qasync")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studio.ui.screenshots")
    ap.add_argument("out", help="folder for the PNG files")
    ap.add_argument("project", nargs="?", help="a .qstudio file (default: a new sample project)")
    ap.add_argument("--run", action="store_true", help="run the pipeline before the shots")
    ap.add_argument("--stages", default="", help="comma-separated stages for --run")
    ap.add_argument("--size", default="1360x860")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    tmp = Path(tempfile.mkdtemp(prefix="qstudio-shots-"))
    settings = AppSettings(tmp / "config")
    settings.theme = "light"
    apply_theme(app, "light")
    w, h = (int(x) for x in args.size.split("x"))

    async def pause(s: float = 0.4) -> None:
        await asyncio.sleep(s)
        app.processEvents()

    async def shoot() -> int:
        win = MainWindow(settings)
        win.resize(w, h)
        win.show()
        await pause()
        win.grab().save(str(out / "00-welcome.png"))
        wiz = win.new_project()
        await pause()
        for i in range(4):
            wiz.grab().save(str(out / f"01-wizard-{i + 1}.png"))
            if i < 3:
                wiz.next()
                await pause(0.2)
        wiz.reject()
        path = Path(args.project) if args.project else sample_project(tmp, "tiny-coder-demo")
        if not win.open_project(path):
            print("could not open", path, win.notifications.texts())
            return 1
        await pause(1.0)
        if args.run:
            stages = [s for s in args.stages.split(",") if s] or None
            task = win.run_stages(stages)
            if task is not None:
                await pause(3.0)
                win.grab().save(str(out / "02-jobs-running.png"))
                await task
            await pause(1.5)
        for i, title in enumerate(spec.title for spec in PAGES):
            win.show_page(title)
            await pause(1.2 if title in ("Model", "Overview") else 0.6)
            win.grab().save(str(out / f"{10 + i:02d}-{title.lower()}.png"))
        win.set_theme("dark")
        for title in ("Overview", "Jobs", "Profiler"):
            win.show_page(title)
            await pause(0.6)
            win.grab().save(str(out / f"30-dark-{title.lower()}.png"))
        win.set_theme("light")
        win.ctl.close()
        win.ctl.shutdown()
        print(f"screenshots in {out}")
        return 0

    try:
        with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
            return runner.run(shoot())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
