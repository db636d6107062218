"""Every figure the window shows, read off its widgets:
``python -m studio.ui.figure_walk FILE.qstudio [--markdown]``.

Each page (and each tab of it) is shown in turn and its figures are read: the figure cards
(which carry the catalogue key they show) and the tables of recorded figures (a title
column, a value column, a device column; the Validation page's FP32 / host QDQ / HTP table
through the catalogue key behind each cell). A figure is one catalogue title taken on one
device for one target; :func:`walk` gives, for each, the texts it was shown with and where.
The command prints the table — title, unit, key, device, value, pages — with ``studio info
--json``'s value beside it, so a figure shown with two values stands out. The test of "one
value per fact" (``tests/ui/test_one_value.py``) walks the window the same way.
Works offscreen (``QT_QPA_PLATFORM=offscreen``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QApplication, QTabWidget

from studio.core import figures
from studio.core.lazyimport import lazy_module
from studio.ui.main_window import MainWindow
from studio.ui.pages.cards import FigureCard
from studio.ui.pages.figures import FIGURE_TITLES, VALIDATION_KEYS
from studio.ui.pages.registry import PAGES
from studio.ui.settings import AppSettings

qasync = lazy_module("qasync")

#: a figure: (catalogue title, device kind, target)
Key = tuple[str, str, str]


@dataclass
class Walk:
    values: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    places: dict[Key, list[str]] = field(default_factory=lambda: defaultdict(list))
    keys: dict[Key, str] = field(default_factory=dict)  # the catalogue key of each figure
    jobs: dict[Key, set[int]] = field(default_factory=lambda: defaultdict(set))  # shown from
    sources: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    shown: int = 0  # figures read, counting repeats

    def add(self, key: Key, text: str, place: str, name: str, job: int | None = None,
            source: str = "") -> None:
        self.values[key].add(text)
        if source:
            self.sources[key].add(source)
        if job is not None:
            self.jobs[key].add(job)
        self.places[key].append(place)
        self.keys.setdefault(key, name)
        self.shown += 1

    def several(self) -> dict[Key, tuple[list[str], list[str]]]:
        """The figures shown with more than one value, and where."""
        return {k: (sorted(v), sorted(set(self.places[k]))) for k, v in self.values.items()
                if len(v) > 1}


def _views(page) -> list[QAbstractItemView]:
    return [v for v in page.findChildren(QAbstractItemView)
            if v.isVisible() and v.model() is not None]


def _heads(model) -> list[str]:
    return [str(model.headerData(c, Qt.Orientation.Horizontal) or "")
            for c in range(model.columnCount())]


def recorded_rows(view) -> list[tuple[str, str, str, str, str, str]]:
    """A table of recorded figures (title, value, device, target, source columns): (key,
    title, device, target, value, source) per row whose title is the catalogue's."""
    model = view.model()
    heads = [h.lower() for h in _heads(model)]
    if "value" not in heads or "device" not in heads:
        return []
    v, d = heads.index("value"), heads.index("device")
    t = heads.index("target") if "target" in heads else None
    src = heads.index("source") if "source" in heads else None
    rows = []
    for r in range(model.rowCount()):
        cell = [str(model.index(r, c).data() or "") for c in range(model.columnCount())]
        fig = figures.by_title(cell[0])
        if fig is None:
            continue
        target = cell[t] if t is not None and cell[t] != "—" else ""
        rows.append((fig.key, cell[0], cell[d], target, cell[v],
                     cell[src] if src is not None else ""))
    return rows


def validation_rows(view, target: str) -> list[tuple[str, str, str, str, str, str]]:
    """The Validation page's table (a figure per row, FP32 / host QDQ / HTP per column):
    each cell as the catalogue's figure behind it."""
    model = view.model()
    cols = {c: ("fp32" if h.startswith("FP32 ·") else "host_qdq" if h.startswith("host QDQ ·")
                else "htp" if h.startswith("HTP · simulator") else None)
            for c, h in enumerate(_heads(model))}
    if "htp" not in cols.values():
        return []
    fig_of = {t: f for f, t in FIGURE_TITLES.items()}
    rows = []
    for r in range(model.rowCount()):
        fig = fig_of.get(str(model.index(r, 0).data() or ""))
        for c, col in cols.items():
            key = VALIDATION_KEYS.get((fig, col)) if fig and col else None
            if key is None:
                continue
            text = str(model.index(r, c).data() or "").split("\n")[0]
            device, tgt = ("htp-sim", target) if col == "htp" else ("host-cpu", "")
            rows.append((key, figures.title(key), device, tgt, text, ""))
    return rows


def read_page(page, place: str, walk: Walk, target: str) -> None:
    for card in page.findChildren(FigureCard):
        fig = getattr(card, "figure", None)
        if fig is None or not card.isVisible():
            continue
        name, device, tgt = fig
        walk.add((card.title.text(), device, tgt), card.value.text(), place, name,
                 getattr(card, "job_id", None), getattr(card.badge, "source", ""))
    for view in _views(page):
        for name, title, device, tgt, value, source in (recorded_rows(view)
                                                        + validation_rows(view, target)):
            walk.add((title, device, tgt), value, place, name, source=source)


async def walk(win, pause: Callable[[float], Awaitable[None]]) -> Walk:
    """Show every page of ``win`` (and each tab of it) and read its figures."""
    out = Walk()
    target = win.ctl.project.targets[0] if win.ctl.project and win.ctl.project.targets else ""
    for row, spec in enumerate(PAGES):
        if win.nav.item(row).isHidden():
            continue
        page = win.show_page(spec.title)
        await pause(0.2)
        tabs = page.findChildren(QTabWidget)
        views = [(tabs[0], i) for i in range(tabs[0].count())] if tabs else [(None, -1)]
        for tab, i in views:
            if tab is not None:
                tab.setCurrentIndex(i)
                await pause(0.15)
            place = spec.title + (f" ▸ {tab.tabText(i)}" if tab is not None else "")
            for _ in range(60):  # a page that loads its figures in a thread: up to 12 s
                if not any(c.isVisible() and c.value.text() in ("–", "—", "")
                           for c in page.findChildren(FigureCard)):
                    break
                await pause(0.2)
            read_page(page, place, out, target)
    return out


def jobs_said(win, walk_: Walk) -> list[tuple[Key, str, str]]:
    """The figures the Jobs page's summaries name: (figure, the text written, the row's
    summary) for each catalogue title the Result of a job the pages show it from names (the
    Jobs page lists every run's jobs: another run's summary is another run's figure)."""
    page = win.show_page("Jobs")
    out = []
    for view in _views(page):
        model = view.model()
        heads = _heads(model)
        if "Result" not in heads or "Target" not in heads:
            continue
        for r in range(model.rowCount()):
            cell = {h: str(model.index(r, c).data() or "") for c, h in enumerate(heads)}
            kind, _, chip = cell["Target"].partition(":")
            device = {"cpu": "host-cpu"}.get(kind, kind)
            job = int(re.sub(r"\D", "", cell.get("Job", "")) or -1)
            for key in walk_.values:
                title, dev, tgt = key
                if dev != device or tgt != chip or f"{title} " not in cell["Result"]:
                    continue
                if walk_.jobs.get(key) and job not in walk_.jobs[key]:
                    continue
                written = cell["Result"].split(f"{title} ", 1)[1]
                out.append((key, written.split(",")[0].split(";")[0].strip(), cell["Result"]))
    return out


def table(walk_: Walk, info_metrics: list[dict], markdown: bool = False) -> str:
    """The figures as a table: title, unit, key, where, the value(s) shown, their source (the
    cards' badges; else what ``studio info`` records), the pages, and what ``studio info
    --json`` writes for it."""
    info = {(m["title"], m["device"], m["target"]): m["text"] for m in info_metrics}
    info_src = {(m["title"], m["device"], m["target"]): m["source"] for m in info_metrics}
    rows = []
    for key in sorted(walk_.values, key=lambda k: (k[0], k[1], k[2])):
        title, device, target = key
        name = walk_.keys[key]
        fig = figures.get(name)
        rows.append([title, fig.unit if fig else "", name,
                     figures.where(device, target), " | ".join(sorted(walk_.values[key])),
                     " | ".join(sorted(walk_.sources.get(key) or {info_src.get(key, "—")})),
                     ", ".join(sorted(set(walk_.places[key]))), info.get(key, "—")])
    head = ["figure", "unit", "key", "where", "value", "source", "pages", "studio info"]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                     for r in [head, *rows])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m studio.ui.figure_walk")
    ap.add_argument("project", help="a .qstudio file with runs")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--size", default="1600x1000")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("qstudio-figure-walk")
    w, h = (int(x) for x in args.size.split("x"))

    async def pause(s: float = 0.4) -> None:
        await asyncio.sleep(s)  # the Qt event loop runs meanwhile (qasync)

    async def go() -> int:
        with tempfile.TemporaryDirectory(prefix="qstudio-walk-") as tmp:
            win = MainWindow(AppSettings(Path(tmp)))
            win.resize(w, h)
            win.show()
            if not win.open_project(Path(args.project)):
                print("could not open", args.project, file=sys.stderr)
                return 2
            await pause(2.0)
            got = await walk(win, pause)
            said = jobs_said(win, got)
            win.ctl.close()
            win.ctl.shutdown()
        r = subprocess.run([sys.executable, "-m", "studio", "info", args.project, "--json"],
                           capture_output=True, text=True)
        metrics = json.loads(r.stdout).get("latest_metrics", []) if r.returncode == 0 else []
        print(table(got, metrics, args.markdown))
        print(f"\n{len(got.values)} figures, {got.shown} shown; the Jobs summaries name "
              f"{len(said)}; shown with more than one value: {len(got.several())}")
        for key, (vals, places) in got.several().items():
            print(f"  {key}: {vals} on {places}")
        return 1 if got.several() else 0

    with asyncio.Runner(loop_factory=qasync.QEventLoop) as runner:
        return runner.run(go())


if __name__ == "__main__":
    raise SystemExit(main())
