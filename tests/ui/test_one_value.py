"""One value per fact: after a full run of the sample, every page (and each of its tabs) of
the window is walked, every figure it shows is read off the widgets (figure cards and the
tables of recorded figures), and each figure — one catalogue title, taken on one device for one
target — must show one value wherever it shows; ``studio info --json`` and the report's
headline must write the same figures the same way."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QTabWidget

from studio.core import figures
from studio.ui.pages.cards import FigureCard

pytestmark = pytest.mark.slow

Key = tuple[str, str, str]  # (title, device, target)


def _tables(page) -> list[tuple[str, QAbstractItemView]]:
    return [(v.objectName(), v) for v in page.findChildren(QAbstractItemView)
            if v.isVisible() and v.model() is not None]


def _read_table(view) -> list[Key | tuple[str, str, str, str]]:
    """Rows of a table of recorded figures: a title column, a value column, a device
    column and a target column (the Validation page's recorded figures, the Jobs page's)."""
    model = view.model()
    heads = [str(model.headerData(c, Qt.Orientation.Horizontal) or "").lower()
             for c in range(model.columnCount())]
    if "value" not in heads or "device" not in heads:
        return []
    v, d = heads.index("value"), heads.index("device")
    t = heads.index("target") if "target" in heads else None
    rows = []
    for r in range(model.rowCount()):
        cell = [str(model.index(r, c).data() or "") for c in range(model.columnCount())]
        if figures.by_title(cell[0]) is None:
            continue
        target = cell[t] if t is not None and cell[t] != "—" else ""
        rows.append((cell[0], cell[d], target, cell[v]))
    return rows


def _read_validation(view, win) -> list[tuple[str, str, str, str]]:
    """The Validation page's table (a figure per row, FP32 / host QDQ / HTP per column):
    each cell as the catalogue's figure behind it (``VALIDATION_KEYS``)."""
    from studio.ui.pages.figures import FIGURE_TITLES, VALIDATION_KEYS

    model = view.model()
    heads = [str(model.headerData(c, Qt.Orientation.Horizontal) or "")
             for c in range(model.columnCount())]
    cols = {c: ("fp32" if h.startswith("FP32 ·") else "host_qdq" if h.startswith("host QDQ ·")
                else "htp" if h.startswith("HTP · simulator") else None)
            for c, h in enumerate(heads)}
    if "htp" not in cols.values():
        return []
    fig_of = {t: f for f, t in FIGURE_TITLES.items()}
    target = win.ctl.project.targets[0]
    rows = []
    for r in range(model.rowCount()):
        fig = fig_of.get(str(model.index(r, 0).data() or ""))
        for c, col in cols.items():
            key = VALIDATION_KEYS.get((fig, col)) if fig and col else None
            if key is None:
                continue
            text = str(model.index(r, c).data() or "").split("\n")[0]
            device, tgt = ("htp-sim", target) if col == "htp" else ("host-cpu", "")
            rows.append((figures.title(key), device, tgt, text))
    return rows


def _walk(win, qtbot) -> tuple[dict[Key, set[str]], dict[Key, list[str]], int]:
    from studio.ui.pages.registry import PAGES

    values: dict[Key, set[str]] = defaultdict(set)
    where: dict[Key, list[str]] = defaultdict(list)
    shown = 0
    for row, spec in enumerate(PAGES):
        if win.nav.item(row).isHidden():
            continue
        page = win.show_page(spec.title)
        qtbot.wait(200)
        tabs = page.findChildren(QTabWidget)
        views = [(tabs[0], i) for i in range(tabs[0].count())] if tabs else [(None, -1)]
        for tab, i in views:
            if tab is not None:
                tab.setCurrentIndex(i)
                qtbot.wait(150)
            place = spec.title + (f" ▸ {tab.tabText(i)}" if tab is not None else "")
            for card in page.findChildren(FigureCard):
                fig = getattr(card, "figure", None)
                if fig is None or not card.isVisible():
                    continue
                name, device, target = fig
                key = (figures.title(name), device, target)
                # the card writes the catalogue's title
                assert card.title.text() == key[0], (place, card.title.text())
                values[key].add(card.value.text())
                where[key].append(place)
                shown += 1
            for _name, view in _tables(page):
                for title, device, target, value in (_read_table(view)
                                                     + _read_validation(view, win)):
                    key = (title, device, target)
                    values[key].add(value)
                    where[key].append(place)
                    shown += 1
    return values, where, shown


def test_every_figure_shows_one_value_on_every_page_and_output(
        make_window, small_project, batch_run, copy_project, tmp_path, qtbot):
    from tests.cli.conftest import studio

    path = copy_project(small_project, tmp_path / "p")
    win = make_window()
    win.resize(1600, 1000)
    assert win.open_project(path)
    qtbot.wait(500)
    # the Overview checks whether its figures are current in a thread: wait for its cards
    page = win.show_page("Overview")
    qtbot.waitUntil(lambda: bool(page.findChildren(FigureCard)), timeout=60_000)
    values, where, shown = _walk(win, qtbot)
    several = {k: (sorted(v), sorted(set(where[k]))) for k, v in values.items() if len(v) > 1}
    assert several == {}
    # the walk saw the run's figures, on more than one page
    assert shown >= 30 and len(values) >= 20, (shown, len(values))
    assert any(len(set(w)) > 1 for w in where.values())
    # the Jobs page's summaries write the figures they name as the cards do
    jobs = win.show_page("Jobs")
    qtbot.wait(300)
    said = 0
    for _name, view in _tables(jobs):
        model = view.model()
        heads = [str(model.headerData(c, Qt.Orientation.Horizontal) or "")
                 for c in range(model.columnCount())]
        if "Result" not in heads:
            continue
        for r in range(model.rowCount()):
            cell = {h: str(model.index(r, c).data() or "") for c, h in enumerate(heads)}
            kind, _, chip = cell["Target"].partition(":")
            device = {"cpu": "host-cpu"}.get(kind, kind)
            for (title, dev, tgt), shown_as in values.items():
                if dev != device or tgt != chip or f"{title} " not in cell["Result"]:
                    continue
                written = cell["Result"].split(f"{title} ", 1)[1]
                written = written.split(",")[0].split(";")[0].strip()
                assert {written} == shown_as, (title, dev, tgt, cell["Result"])
                said += 1
    assert said >= 4, said
    places = {p.split(" ▸ ")[0] for w in where.values() for p in w}
    assert {"Overview", "LLM", "Validation"} <= places, places

    # studio info --json writes each figure as the pages do
    data = json.loads(studio("info", path, "--json").stdout)
    agree = 0
    for m in data["latest_metrics"]:
        assert m["title"] == figures.title(m["name"])
        key = (m["title"], m["device"], m["target"])
        if key in values:
            assert values[key] == {m["text"]}, (key, where[key])
            agree += 1
    assert agree >= 15, agree

    # the report's headline too
    out = tmp_path / "report.json"
    r = studio("report", path, "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    head = json.loads(out.read_text())["headline"]
    assert head
    for h in head:
        assert h["title"] == figures.title(h["name"])
        key = (h["title"], h["device"], h["target"])
        if key in values:
            assert values[key] == {h["text"]}, key
