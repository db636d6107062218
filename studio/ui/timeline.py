"""A profile timeline: one row per track (host thread, HTP core ...), events as rectangles
coloured by category, wheel zoom and drag pan along time, hover details, a selectable time
window with its totals, a minimap of the whole profile, and a search by op name (the
matches drawn in full colour over the others dimmed, stepped through one by one).

Drawing stays fast for 200 000 events: one graphics item paints only the level-of-detail
rectangles of the visible window (:meth:`studio.core.timeline.TimelineData.lod`), recomputed
when the view moves. Tracks whose source is ``estimated`` (the performance model's schedule)
say so in their label and are drawn lighter.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QGraphicsRectItem,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.timeline import TimelineData
from studio.ui.widgets import label, theme_plot

ROWS_PER_TRACK = 10  # image rows per track: 8 drawn, 1 gap above and below

PALETTE = ("#2f6fd6", "#1f8a4c", "#d68a00", "#6a4fb3", "#d64545", "#0f8a8a", "#8a5a00",
           "#b5489b", "#5b6570", "#7aa32b", "#c25f1f", "#3b9bd6")


def _fmt(v: float, unit: str) -> str:
    if unit == "us":
        if v >= 1e6:
            return f"{v / 1e6:.3g} s"
        if v >= 1e3:
            return f"{v / 1e3:.3g} ms"
        return f"{v:.3g} µs"
    return f"{v:,.0f} {unit}"


class TimelineView(QWidget):
    """``set_data(TimelineData | None)``; ``selection_totals`` holds the last selection."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.data: TimelineData | None = None
        self.selection_totals: dict | None = None
        self.redraws = 0
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self._build_tools(lay)
        self._build_plot(lay)
        self._build_minimap(lay)
        self._build_status(lay)
        self._syncing = False
        self.plot.getViewBox().sigXRangeChanged.connect(self._range_changed)
        self.plot.scene().sigMouseMoved.connect(self._mouse_moved)
        self.apply_theme()
        self.set_data(None)

    def _build_tools(self, lay: QVBoxLayout) -> None:
        """The search box with its steps and count, Select a window, and the legend under them."""
        # the tools on one row (the search box as wide as its text), the legend under them,
        # wrapped: a long legend never squeezes the search box
        top = QHBoxLayout()
        self.legend = QLabel("")
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        self.select_button = QPushButton("Select a window")
        self.select_button.setCheckable(True)
        self.select_button.setToolTip("Show a time window on the timeline: drag its edges to "
                                      "see the totals inside it")
        self.select_button.toggled.connect(self._toggle_selection)
        self.find_box = QLineEdit()
        self.find_box.setPlaceholderText("Find op by name…")
        # a fixed width: the count beside it changes as one types, the box does not move
        self.find_box.setFixedWidth(max(220, self.find_box.fontMetrics().horizontalAdvance(
            "Find op by name…") + 40))
        self.find_box.setClearButtonEnabled(True)
        self.find_box.setToolTip("Ops whose name holds this text: drawn in full colour, the "
                                 "others dimmed; Enter goes to the next one")
        self.find_box.textChanged.connect(self.find)
        self.find_box.returnPressed.connect(lambda: self.step(1))
        self.prev_button = QPushButton("◀")
        self.prev_button.setToolTip("The previous match")
        self.prev_button.clicked.connect(lambda: self.step(-1))
        self.next_button = QPushButton("▶")
        self.next_button.setToolTip("The next match")
        self.next_button.clicked.connect(lambda: self.step(1))
        self.find_label = label("", "muted")
        for b in (self.prev_button, self.next_button):  # as wide as their arrows
            b.setFixedWidth(b.fontMetrics().horizontalAdvance("◀") + 24)
        top.addWidget(self.find_box)
        for w in (self.prev_button, self.next_button, self.find_label):
            top.addWidget(w)
        top.addStretch(1)
        top.addWidget(self.select_button)
        lay.addLayout(top)
        lay.addWidget(self.legend)

    def _build_plot(self, lay: QVBoxLayout) -> None:
        """The empty-profile line and the timeline plot: its image, the current match's mark
        and the selection region (shown when selecting)."""
        self.empty = label("No events with start times to draw.", "muted", wrap=True)
        lay.addWidget(self.empty)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=True, y=False)
        self.plot.getPlotItem().invertY(True)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=False, alpha=0.25)
        self.image = pg.ImageItem()
        self.plot.addItem(self.image)
        self.mark = QGraphicsRectItem()  # the current match
        self.mark.setPen(pg.mkPen("#d64545", width=2, cosmetic=True))
        self.mark.setZValue(20)
        self.mark.hide()
        self.plot.addItem(self.mark)
        self.matches: dict | None = None
        self.match_at = -1
        self._found = ""  # what the search found, in words
        self.region = pg.LinearRegionItem(brush=(47, 111, 214, 40))
        self.region.setZValue(10)
        self.region.sigRegionChanged.connect(self._region_changed)
        lay.addWidget(self.plot, 1)

    def _build_minimap(self, lay: QVBoxLayout) -> None:
        """The minimap of the whole profile with the view's region on it."""
        self.minimap = pg.PlotWidget()
        self.minimap.setMenuEnabled(False)
        self.minimap.setMouseEnabled(x=False, y=False)
        self.minimap.hideAxis("left")
        self.minimap.hideButtons()
        self.minimap.setFixedHeight(70)
        self.mini_region = pg.LinearRegionItem(brush=(120, 120, 120, 60))
        self.mini_region.sigRegionChanged.connect(self._mini_moved)
        self.minimap.addItem(self.mini_region)
        lay.addWidget(self.minimap)

    def _build_status(self, lay: QVBoxLayout) -> None:
        """The hover details and the selection's totals."""
        bottom = QHBoxLayout()
        self.hover = label("", "muted")
        bottom.addWidget(self.hover, 1)
        self.totals = label("", wrap=True)
        bottom.addWidget(self.totals, 1)
        lay.addLayout(bottom)

    def apply_theme(self) -> None:
        theme_plot(self.plot, self.palette())
        theme_plot(self.minimap, self.palette())

    # ---- data ---------------------------------------------------------------------------
    def set_data(self, data: TimelineData | None) -> None:
        self.data = data if data is not None and len(data) else None
        has = self.data is not None
        self.empty.setVisible(not has)
        for w in (self.plot, self.minimap, self.select_button, self.find_box, self.prev_button,
                  self.next_button, self.find_label, self.legend):
            w.setVisible(has)
        self.select_button.setChecked(False)
        self.matches, self.match_at = None, -1
        self.mark.hide()
        self.totals.setText("")
        self.hover.setText("")
        if not has:
            self.image.clear()
            if data is not None and data.untimed:
                self.empty.setText(f"{data.untimed} events, none with start times: this "
                                   "profile has no timeline (see the op table).")
            return
        d = self.data
        self._colors = np.array([QColor(PALETTE[i % len(PALETTE)]).getRgb()[:3]
                                 for i in range(max(len(d.categories), 1))], np.uint8)
        ticks = [(i, t.label) for i, t in enumerate(d.tracks)]
        self.plot.getAxis("left").setTicks([ticks])
        self.plot.setLabel("bottom", "time", units="s" if d.unit == "us" else d.unit)
        self.minimap.setLabel("bottom", "whole profile", units="s" if d.unit == "us" else d.unit)
        if d.unit == "us":
            self.plot.getAxis("bottom").setScale(1e-6)
            self.minimap.getAxis("bottom").setScale(1e-6)
        else:
            self.plot.getAxis("bottom").setScale(1.0)
            self.minimap.getAxis("bottom").setScale(1.0)
        totals = self._category_totals()
        shown = sorted(totals, key=lambda k: -totals[k])[:10]
        self.legend.setText("  ".join(
            f"<span style='color:{PALETTE[i % len(PALETTE)]}'>■</span> {d.categories[i] or '–'}"
            for i in shown))
        t0, t1 = d.extent()
        span = (t1 - t0) or 1.0
        self._draw_minimap(t0, t1)
        self.plot.setYRange(-0.6, len(d.tracks) - 0.4, padding=0)
        self.plot.getViewBox().setLimits(xMin=t0 - span * 0.05, xMax=t1 + span * 0.05,
                                         minXRange=span * 1e-7)
        self.plot.setXRange(t0, t1, padding=0.01)
        if self.find_box.text().strip():
            self.find(self.find_box.text())  # the search carries over to the new data
        self._redraw()
        if self.data.untimed:
            self.hover.setText(f"{self.data.untimed} events without start times are not drawn")

    def _category_totals(self) -> dict[int, float]:
        acc: dict[int, float] = {}
        for t in self.data.tracks:
            sums = np.bincount(t.category, weights=t.end - t.start,
                               minlength=len(self.data.categories))
            for i in np.nonzero(sums)[0]:
                acc[int(i)] = acc.get(int(i), 0.0) + float(sums[i])
        return acc

    def _draw_minimap(self, t0: float, t1: float) -> None:
        self.minimap.clear()
        self.minimap.addItem(self.mini_region)
        bins = np.linspace(t0, t1 if t1 > t0 else t0 + 1, 401)
        dens = np.zeros(400)
        for t in self.data.tracks:
            h, _ = np.histogram(t.start, bins=bins, weights=t.end - t.start)
            dens += h
        self.minimap.plot(bins, dens, stepMode="center", fillLevel=0,
                          brush=(47, 111, 214, 120), pen=pg.mkPen((47, 111, 214), width=1))
        self.minimap.setXRange(t0, t1, padding=0.01)

    # ---- drawing ------------------------------------------------------------------------
    def _range_changed(self, *_args) -> None:
        if self.data is None:
            return
        self._redraw()
        x0, x1 = self.plot.getViewBox().viewRange()[0]
        self._syncing = True
        self.mini_region.setRegion((x0, x1))
        self._syncing = False

    def _redraw(self) -> None:
        """Rasterise the visible window: one image column per screen pixel, a band of rows
        per track; colour = the category with the most time in the column, opacity = how
        busy the column is (estimated tracks at half opacity)."""
        d = self.data
        vb = self.plot.getViewBox()
        x0, x1 = vb.viewRange()[0]
        pixels = max(int(vb.width()), 200)
        rows = ROWS_PER_TRACK
        img = np.zeros((pixels, len(d.tracks) * rows, 4), np.uint8)
        only = self.matches["codes"] if self.matches is not None else None
        for ti, track in enumerate(d.tracks):
            cat, busy = d.raster(ti, x0, x1, pixels)
            on = cat >= 0
            rgba = np.zeros((pixels, 4), np.uint8)
            rgba[on, :3] = self._colors[cat[on] % len(self._colors)]
            alpha = 90 + 165 * busy[on]
            if track.source == "estimated":
                alpha = alpha * 0.5
            if only is not None:  # a search: everything dimmed, its matches drawn over
                alpha = alpha * 0.15
            rgba[on, 3] = alpha.astype(np.uint8)
            if only is not None and len(only):
                mcat, mbusy = d.raster(ti, x0, x1, pixels, only=only)
                hit = mcat >= 0
                rgba[hit, :3] = self._colors[mcat[hit] % len(self._colors)]
                rgba[hit, 3] = (120 + 135 * mbusy[hit]).astype(np.uint8)
            img[:, ti * rows + 1: (ti + 1) * rows - 1, :] = rgba[:, None, :]
        self.image.setImage(img, autoLevels=False, levels=(0, 255))
        self.image.setRect(QRectF(x0, -0.5, x1 - x0, len(d.tracks)))
        self.redraws += 1

    def _mini_moved(self) -> None:
        if self._syncing or self.data is None:
            return
        x0, x1 = self.mini_region.getRegion()
        if x1 > x0:
            self.plot.setXRange(x0, x1, padding=0)

    # ---- search -------------------------------------------------------------------------
    def find(self, text: str) -> int:
        """Show the events whose name holds ``text``; returns how many there are."""
        self.mark.hide()
        self.match_at = -1
        if self.data is None or not text.strip():
            self.matches = None
            self.find_label.setText("")
            if self.data is not None:
                self._redraw()
            return 0
        m = self.data.find(text)
        self.matches = m
        n = len(m["start"])
        names = len(m["codes"])
        self._found = (
            f"no op named like {text.strip()!r}" if not n else
            f"{n:,} match{'es' if n != 1 else ''} ({names} name{'s' if names != 1 else ''}), "
            f"{_fmt(m['total'], self.data.unit)} in all")
        self.find_label.setText(self._found)
        for b in (self.prev_button, self.next_button):
            b.setEnabled(n > 0)
        self._redraw()
        return n

    def step(self, delta: int) -> str:
        """Go to the next (``delta`` 1) or previous (-1) match: the view zooms to it, it is
        framed and described in the hover line. Returns its description."""
        m = self.matches
        if self.data is None or m is None or not len(m["start"]):
            return ""
        n = len(m["start"])
        self.match_at = (self.match_at + delta) % n if self.match_at >= 0 else \
            (0 if delta > 0 else n - 1)
        k = self.match_at
        s, e, ti = float(m["start"][k]), float(m["end"][k]), int(m["track"][k])
        x0, x1 = self.plot.getViewBox().viewRange()[0]
        width = max(x1 - x0, 1e-12)
        if e - s > width * 0.5 or not (x0 <= s and e <= x1) or e - s < width * 1e-3:
            pad = max((e - s) * 20, 1e-9)
            self.plot.setXRange(s - pad, e + pad, padding=0)
        self.mark.setRect(QRectF(s, ti - 0.45, max(e - s, 0.0), 0.9))
        self.mark.show()
        self.find_label.setText(f"{k + 1:,} of {n:,} · {self._found}")
        return self.describe_at((s + e) / 2, ti)

    # ---- hover and selection ------------------------------------------------------------
    def _mouse_moved(self, pos) -> None:
        if self.data is None:
            return
        vb = self.plot.getViewBox()
        if not vb.sceneBoundingRect().contains(pos):
            return
        pt = vb.mapSceneToView(pos)
        self.describe_at(pt.x(), pt.y())

    def describe_at(self, x: float, y: float) -> str:
        """The event under (x, track y), shown in the hover line and as a tooltip."""
        d = self.data
        ti = int(round(y))
        text = ""
        if d is not None and 0 <= ti < len(d.tracks):
            t = d.tracks[ti]
            i = int(np.searchsorted(t.start, x, side="right")) - 1
            if 0 <= i < len(t.start) and t.end[i] >= x:
                text = (f"{d.names[t.name_code[i]]} · {d.categories[t.category[i]] or '–'} · "
                        f"{t.label} · start {_fmt(t.start[i], d.unit)}, duration "
                        f"{_fmt(t.end[i] - t.start[i], d.unit)}")
        self.hover.setText(text)
        self.plot.setToolTip(text)
        return text

    def _toggle_selection(self, on: bool) -> None:
        if on and self.data is not None:
            x0, x1 = self.plot.getViewBox().viewRange()[0]
            third = (x1 - x0) / 3
            self.region.setRegion((x0 + third, x1 - third))
            self.plot.addItem(self.region)
            self._region_changed()
        else:
            if self.region.scene() is not None:
                self.plot.removeItem(self.region)
            self.totals.setText("")
            self.selection_totals = None

    def select(self, t0: float, t1: float) -> dict:
        """Select [t0, t1] (as dragging the window's edges does)."""
        if not self.select_button.isChecked():
            self.select_button.setChecked(True)
        self.region.setRegion((t0, t1))
        self._region_changed()
        return self.selection_totals or {}

    def _region_changed(self) -> None:
        if self.data is None or not self.select_button.isChecked():
            return
        t0, t1 = self.region.getRegion()
        s = self.data.select(t0, t1)
        self.selection_totals = s
        unit = self.data.unit
        top = ", ".join(f"{k or '–'} {_fmt(v, unit)}" for k, v in
                        list(s["by_category"].items())[:4])
        self.totals.setText(
            f"<b>Selection</b> {_fmt(t1 - t0, unit)}: {s['events']:,} events, "
            f"{_fmt(s['total'], unit)} busy · {top}")
