"""Open one page alone, on a real project: ``python -m studio.ui.pages.jobs [FILE.qstudio]``.

Without a file, a fresh sample project (tiny-coder, small shapes) is created in a temp
folder. Options: ``--run STAGES`` runs those stages first (e.g. ``--run export,quantize``),
``--theme light|dark``, ``--screenshot PNG`` saves the page and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from studio.core import thirdparty
from studio.core.lazyimport import lazy_module
from studio.services.projects import NewProjectSpec, create_project
from studio.ui.controller import ProjectController
from studio.ui.settings import AppSettings
from studio.ui.theme import apply_theme

QtWidgets = lazy_module("PySide6.QtWidgets")
qasync = lazy_module("qasync")


def sample_project(folder: Path, name: str = "sample"):
    """Write a small sample project (the spec the tests use) and return its path."""
    spec = NewProjectSpec(
        path=Path(folder) / f"{name}.qstudio",
        source_kind="sample",
        source="tiny-coder",
        prompt_length=16,
        context_length=64,
        calibration_samples=2,
        name=name,
    )
    studio = create_project(spec)
    path = studio.project.path
    studio.close()
    return path


def run_page(page_cls, argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {page_cls.__module__}")
    ap.add_argument("project", nargs="?", help="a .qstudio file (default: a new sample project)")
    ap.add_argument("--run", default="", help="comma-separated stages to run first")
    ap.add_argument("--theme", default="light", choices=("light", "dark", "system"))
    ap.add_argument("--screenshot", default="", help="save the page as PNG and exit")
    ap.add_argument("--tab", default="", help="show the page's tab with this title first")
    ap.add_argument("--wait", type=float, default=0.6,
                    help="seconds to wait before the screenshot (pages that load in the "
                         "background)")
    ap.add_argument("--size", default="1200x780")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    apply_theme(app, args.theme)
    tmp = tempfile.mkdtemp(prefix="qstudio-page-")
    settings = AppSettings(Path(tmp) / "config")
    ctl = ProjectController(settings)
    w, h = (int(x) for x in args.size.split("x"))

    async def main() -> int:
        path = Path(args.project) if args.project else sample_project(Path(tmp))
        ctl.open(path)
        page = page_cls(ctl)
        page.setWindowTitle(f"QStudio — {page.title} ({path.name})")
        page.resize(w, h)
        page.start()
        page.show()
        if args.run:
            task = ctl.run([s.strip() for s in args.run.split(",") if s.strip()])
            await task
            await asyncio.sleep(0.5)
        if args.tab:
            for tabs in page.findChildren(QtWidgets.QTabWidget):
                titles = [tabs.tabText(i) for i in range(tabs.count())]
                if args.tab in titles:
                    tabs.setCurrentIndex(titles.index(args.tab))
        if args.screenshot:
            await asyncio.sleep(args.wait)
            page.grab().save(args.screenshot)
            print(f"saved {args.screenshot}")
            ctl.shutdown()
            return 0
        done = asyncio.get_running_loop().create_future()
        app.aboutToQuit.connect(lambda: done.done() or done.set_result(0))
        await done
        ctl.shutdown()
        return 0

    thirdparty.settle()  # before any library is imported: offline, no telemetry store
    try:
        with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
            return runner.run(main())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the sample project and settings made here
