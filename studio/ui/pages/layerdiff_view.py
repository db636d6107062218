"""The layer-wise diff in the window: FP32 vs host QDQ vs the HTP, tensor by tensor.

``LayerDiffView`` reads :func:`studio.services.layerdiff.layerdiff_result` for the project's
current settings (in a thread: it hashes the input files) and shows

- a plain-language finding computed from the result (where host QDQ and the HTP part, the
  first jumps, the final logits),
- the relative error of the three pairs along depth (log scale) with markers at the first
  jump and where host QDQ and the HTP part, and a legend naming each curve's source
  (measured / simulated) and device,
- the worst tensors (full names, sortable), and
- an empty state that says how to get a diff (and queues the stage), or the error line.

Double-clicking a table row or a point of the plot emits ``layerActivated(layer)`` with the
layer the recipe names (a module path or a key-activation pseudo-layer,
:func:`layer_of`). Open it alone: ``python -m studio.ui.pages.layerdiff_view [FILE]``.
"""

from __future__ import annotations

import asyncio
import html
import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QEvent, QSortFilterProxyModel, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QStackedWidget,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.layerdiff import PAIR_TITLES, bisect_verdict
from studio.services.layerdiff import NoLayerDiff, layerdiff_result
from studio.ui.loading import LatestLoad
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.pages.layerdiff_rows import (
    PAIR_SIDES,
    block_text,
    finding,
    layer_of,
    pair_source,
    pct,
    positions,
    short_name,
    sources,
    ticks,
    worst_rows,
)
from studio.ui.standalone import run_page
from studio.ui.widgets import EmptyState, badge_html, label, splitter, theme_plot

STAGE = "layerdiff"
#: one colour and line style per pair
PAIR_STYLE = {
    "qdq_vs_fp32": ("#2f6fd6", Qt.PenStyle.SolidLine),
    "htp_vs_fp32": ("#d9480f", Qt.PenStyle.SolidLine),
    "htp_vs_qdq": ("#8e5cc4", Qt.PenStyle.SolidLine),
    "htp_fp16_vs_fp32": ("#1b8a3f", Qt.PenStyle.DashLine),
}
SortRole = Qt.ItemDataRole.UserRole + 2
#: the table's column titles per pair (the full title is the header's tooltip)
PAIR_SHORT = {"qdq_vs_fp32": "QDQ/FP32", "htp_vs_fp32": "HTP/FP32", "htp_vs_qdq": "HTP/QDQ",
              "htp_fp16_vs_fp32": "HTP FP16/FP32"}


# ---------------------------------------------------------------------------- widgets
def _with_alpha(color, alpha: int):
    c = type(color)(color)
    c.setAlpha(alpha)
    return c


def _legend_entry(r: dict[str, Any], pair: str, title: str, color: str, style) -> str:
    """A swatch, the pair's title, its source badge(s) and device(s)."""
    src = sources(r)
    a, b = PAIR_SIDES.get(pair, ("htp", "fp32"))
    line = "┅┅" if style == Qt.PenStyle.DashLine else "━━"
    out = (
        f"<span style='color:{color}; font-weight:600'>{line}</span> {html.escape(title)} "
        f"{badge_html(src[a][0])}"
    )
    if b != "fp32" and src[b] != src[a]:
        out += f" vs {badge_html(src[b][0])}"
    else:
        out += f" <span style='color:gray'>{html.escape(src[a][1])}</span>"
    return out


class SortedRows(RowsModel):
    """Rows whose payload carries ``{"sort": [key per column], ...}``: sorts by value; the
    header has tooltips (``header_tips``)."""

    header_tips: list[str] = []

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return self.header_tips[section] if 0 <= section < len(self.header_tips) else None
        return super().headerData(section, orientation, role)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if role == SortRole and index.isValid():
            r = self.row(index.row())
            if r is not None and isinstance(r.payload, dict):
                keys = r.payload.get("sort") or []
                return keys[index.column()] if index.column() < len(keys) else None
        return super().data(index, role)


def _sup(n: int) -> str:
    return str(n).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


class _LogPercentAxis(pg.AxisItem):
    """The y axis of a log plot labelled in percent (0.01 %, 0.1 %, 1 %, 10 %)."""

    def tickStrings(self, values, scale, spacing):
        if not self.logMode:
            return super().tickStrings(values, scale, spacing)
        out = []
        for v in values:
            x = 10.0**v * 100
            if x >= 1:
                out.append(f"{x:.0f} %")
            elif x >= 1e-3:
                out.append(f"{x:.{max(1, round(-math.log10(x)))}f} %")
            else:
                out.append(f"10{_sup(round(math.log10(x)))} %")
        return out


class LayerDiffView(QWidget):
    """See the module docstring."""

    #: a layer (module path or key-activation pseudo-layer) the user double-clicked
    layerActivated = Signal(str)
    #: a load finished (content, empty or error state shown)
    loaded = Signal()

    def __init__(self, ctl, parent: QWidget | None = None):
        super().__init__(parent)
        self.ctl = ctl
        self._load = LatestLoad(ctl)
        self._got: dict[str, Any] | None = None
        self._shown: list[int] = []
        self._x: dict[str, float] = {}
        self.curves: dict[str, Any] = {}
        self.markers: list[Any] = []
        self.state = "none"  # none | loading | empty | error | content
        self.command = ""  # the batch command the empty state shows
        self._sorted = False  # the table got its first (worst-first) order

        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addLayout(self._build_head())
        self.stack = QStackedWidget()
        lay.addWidget(self.stack, 1)
        self._build_states()
        ctl.running_changed.connect(self._running_changed)
        self._reload_timer = QTimer(self)
        self._reload_timer.setSingleShot(True)
        self._reload_timer.timeout.connect(self.reload)

        cl = QVBoxLayout(self.content)
        cl.setContentsMargins(0, 0, 0, 0)
        self.finding = label("", wrap=True, selectable=True)
        self.finding.setTextFormat(Qt.TextFormat.RichText)
        cl.addWidget(self.finding)
        # the bisection's verdict (studio bisect reads the same result): the layer it names
        # opens in the layer grid
        vrow = QHBoxLayout()
        self.verdict = label("", wrap=True, selectable=True)
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        vrow.addWidget(self.verdict, 1)
        self.open_verdict = QPushButton("Open the layer")
        self.open_verdict.setToolTip("Select the layer the verdict names in the Precision "
                                     "page's layer grid")
        self.open_verdict.clicked.connect(self._open_verdict)
        vrow.addWidget(self.open_verdict)
        cl.addLayout(vrow)
        self._verdict_layer: str | None = None
        # the table gets room for several rows
        split = splitter(Qt.Orientation.Vertical, self._build_plot(), self._build_table(),
                         sizes=(10_000, 8_000))
        cl.addWidget(split, 1)
        self._apply_theme()

    # ---- building the view --------------------------------------------------------------------
    def _build_head(self) -> QHBoxLayout:
        """The target, the status, and which tensors to show."""
        head = QHBoxLayout()
        self.target_label = label("Target:")
        head.addWidget(self.target_label)
        self.target = QComboBox()
        self.target.setToolTip("The target chip whose HTP simulator the diff ran on")
        self.target.currentIndexChanged.connect(lambda *_: self.reload())
        head.addWidget(self.target)
        # a model exported in parts is diffed one part at a time (layerdiff.part): the other
        # parts run in FP32 around it
        self.part_label = label("Part:")
        head.addWidget(self.part_label)
        self.part = QSpinBox()
        self.part.setRange(1, 1024)
        self.part.setKeyboardTracking(False)
        self.part.setToolTip("The part of a model exported in parts whose layers are compared "
                             "(layerdiff.part): fed what the FP32 parts before it hand on, its "
                             "output run on to the logits by the FP32 parts after it")
        self.part.valueChanged.connect(self._part_changed)
        head.addWidget(self.part)
        self.status = label("", "muted")
        head.addWidget(self.status, 1)
        self.show_label = label("Show:")
        head.addWidget(self.show_label)
        self.mode_group = QButtonGroup(self)
        self.mode_buttons: dict[str, QRadioButton] = {}
        for mode, text, tip in (
            (
                "blocks",
                "Block boundaries",
                "The embedding, each decoder block's output, the final norm and the logits",
            ),
            (
                "modules",
                "Every module output",
                "Also every projection, norm, activation, the "
                "attention scores / softmax / context and the residual adds",
            ),
            ("all", "Every tensor", "Every computed float tensor the diff compared"),
        ):
            b = QRadioButton(text)
            b.setToolTip(tip)
            self.mode_group.addButton(b)
            self.mode_buttons[mode] = b
            b.toggled.connect(self._mode_toggled)
            head.addWidget(b)
        self.mode_buttons["modules"].setChecked(True)
        self._show_modes(False)
        return head

    def _build_states(self) -> None:
        """The empty and error states, and the content they stand in for."""
        self.empty = EmptyState("No layer diff yet", "")
        self.empty.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.run_button = self.empty.add_action(
            "Run the layer diff",
            self.run_layerdiff,
            "Queues the layerdiff stage (and what it needs: export, quantize, compile)",
        )
        self.stack.addWidget(self.empty)
        self.error = EmptyState("The layer diff cannot be shown", "")
        self.stack.addWidget(self.error)
        self.content = QWidget()
        self.stack.addWidget(self.content)

    def _build_plot(self) -> QWidget:
        """Each tensor's relative error along the model."""
        pbox = QWidget()
        pl = QVBoxLayout(pbox)
        pl.setContentsMargins(0, 4, 0, 0)
        pl.setSpacing(2)
        self.legend = label("", wrap=True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        pl.addWidget(self.legend)
        self.plot = pg.PlotWidget(axisItems={"left": _LogPercentAxis("left")})
        self.plot.setMenuEnabled(False)
        self.plot.setLogMode(x=False, y=True)
        self.plot.showGrid(x=False, y=True, alpha=0.25)
        self.plot.setLabel("left", "relative error ‖a − b‖ / ‖b‖")
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setMinimumHeight(160)
        self.plot.getPlotItem().hideButtons()
        self.plot.scene().sigMouseMoved.connect(self._hover)
        self.plot.scene().sigMouseClicked.connect(self._plot_clicked)
        pl.addWidget(self.plot, 1)
        self.hover = label(
            "Point at the plot to read a tensor's figures; double-click to open "
            "its layer on the Precision page.",
            "muted",
        )
        pl.addWidget(self.hover)
        return pbox

    def _build_table(self) -> QGroupBox:
        """The worst tensors (or every tensor shown)."""
        tbox = QGroupBox("Worst tensors")
        tl = QVBoxLayout(tbox)
        tl.setContentsMargins(6, 4, 6, 6)
        th = QHBoxLayout()
        self.table_note = label("", "muted", wrap=True)
        th.addWidget(self.table_note, 1)
        self.all_rows = QCheckBox("List every tensor shown in the plot")
        self.all_rows.toggled.connect(lambda *_: self._show_table())
        th.addWidget(self.all_rows)
        tl.addLayout(th)
        self.table = SortedRows([], self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.table)
        self.proxy.setSortRole(SortRole)
        self.table_view = QTableView()
        self.table_view.setModel(self.proxy)
        self.table_view.setSortingEnabled(True)
        self.table_view.verticalHeader().hide()
        self.table_view.setWordWrap(False)
        self.table_view.setTextElideMode(Qt.TextElideMode.ElideLeft)  # never the tail
        self.table_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table_view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table_view.verticalHeader().setDefaultSectionSize(
            self.table_view.fontMetrics().height() + 6
        )
        h = self.table_view.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        h.setStretchLastSection(True)
        self.table_view.activated.connect(self._row_activated)
        tl.addWidget(self.table_view, 1)
        return tbox

    # ---- theme ------------------------------------------------------------------------------
    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "plot"):
            self._apply_theme()

    def _apply_theme(self) -> None:
        theme_plot(self.plot, self.palette())

    # ---- loading ----------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return next((m for m, b in self.mode_buttons.items() if b.isChecked()), "modules")

    def clear(self) -> None:
        self._reload_timer.stop()
        self._load.drop()
        self._got = None
        self.state = "none"
        self.table.set_rows([])
        self.plot.clear()

    def schedule_reload(self, ms: int = 300) -> None:
        """Reload once a burst of edits is over."""
        self._reload_timer.start(ms)

    def reload(self) -> asyncio.Future | None:
        """Read the layer diff of the picked target for the current settings, in a thread;
        then show it (or the empty / error state). Returns the task (None without a loop)."""
        studio = self.ctl.studio
        if studio is None:
            self.clear()
            return None
        project = studio.project.copy()
        self._fill_targets(project.targets)
        self._fill_parts(project)
        target = self.target.currentData() or project.targets[0]
        self.status.setText("Reading the layer diff…")
        if self.state == "none":
            self.state = "loading"

        def done(got: dict[str, Any]) -> None:
            self.status.setText("")
            self.show_result(got)
            self.loaded.emit()

        def failed(exc: Exception) -> None:
            self.status.setText("")
            if isinstance(exc, NoLayerDiff):
                self._show_empty(project, target)
            else:
                self._show_error(exc.message if isinstance(exc, StudioError)
                                 else f"reading the layer diff failed: {exc!r}")
            self.loaded.emit()

        return self._load.start(layerdiff_result, project, target, done=done, failed=failed)

    def _fill_targets(self, targets: list[str]) -> None:
        current = self.target.currentData()
        if [self.target.itemData(i) for i in range(self.target.count())] != list(targets):
            self.target.blockSignals(True)
            self.target.clear()
            for t in targets:
                self.target.addItem(t, t)
            self.target.setCurrentIndex(max(0, self.target.findData(current)))
            self.target.blockSignals(False)
        several = len(targets) > 1
        self.target.setVisible(several)
        self.target_label.setVisible(several)

    def _fill_parts(self, project) -> None:
        """The part picker, shown for a project exported in parts (the setting's value)."""
        in_parts = project.export["parts"] not in (1, "1")
        for w in (self.part, self.part_label):
            w.setVisible(in_parts)
        if in_parts:
            self.part.blockSignals(True)
            self.part.setValue(max(1, int(project.layerdiff["part"])))
            self.part.blockSignals(False)

    def _part_changed(self, value: int) -> None:
        """Pick another part: the project's layerdiff.part (an undoable edit); its diff, when
        stored, shows at once."""
        if self.ctl.project is None:
            return
        try:
            self.ctl.set("layerdiff", "part", int(value), f"layer diff of part {value}")
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
        self.schedule_reload(0)

    def _show_empty(self, project, target: str) -> None:
        self.state = "empty"
        self._got = None
        cmd = f"studio --batch {project.path} --stages {STAGE}"
        if len(project.targets) > 1:
            cmd += f" --target {target}"
        self.command = cmd
        self.empty.set_text(
            "No layer diff for the current settings",
            f"Run the layer diff:<br><code>{html.escape(cmd)}</code><br><br>It runs the prefill "
            "graph on held-out windows as FP32, host QDQ and on "
            f"{html.escape(target)}'s HTP simulator with every block boundary and module "
            "output exposed, and shows here where the errors jump and where host QDQ and the "
            "HTP part. A diff of other settings is not shown as if it were current.",
        )
        self._running_changed(self.ctl.running)
        self._show_modes(False)
        self.stack.setCurrentWidget(self.empty)

    def _show_error(self, message: str) -> None:
        self.state = "error"
        self._got = None
        self.error.set_text("The layer diff cannot be shown", html.escape(message))
        self._show_modes(False)
        self.stack.setCurrentWidget(self.error)

    def _running_changed(self, running: bool) -> None:
        self.run_button.setToolTip(
            "A run is going: the layer diff is queued behind it (Queue page)"
            if running
            else "Queues the layerdiff stage (and what it needs: export, quantize, compile)"
        )

    def run_layerdiff(self):
        """Queue the layerdiff stage of the picked target through the controller (the Jobs
        page shows it). Returns the task, or None (the error is a message)."""
        project = self.ctl.project
        if project is None:
            return None
        if project.export["parts"] not in (1, "1") and not project.layerdiff["part"]:
            self._part_changed(self.part.value())  # a model in parts: the part shown
        targets = [self.target.currentData()] if len(project.targets) > 1 else None
        try:
            return self.ctl.run([STAGE], targets)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return None

    # ---- drawing ----------------------------------------------------------------------------
    def show_result(self, got: dict[str, Any]) -> None:
        """Draw a ``layerdiff_result``."""
        self._got = got
        self.state = "content"
        rows = got["rows"]
        kinds = {r["kind"] for r in rows}
        self.mode_buttons["modules"].setEnabled("module" in kinds)
        if (
            not self.mode_buttons[self.mode].isEnabled()
            or not self.mode_buttons[self.mode].isVisible()
            and self.mode == "all"
        ):
            self.mode_buttons["blocks"].setChecked(True)
        if "module" not in kinds:
            self.mode_buttons["modules"].setToolTip(
                "This diff compared block boundaries only (layerdiff.tensors = "
                f"{got['result'].get('tensors', 'blocks')}): set it to modules and run again"
            )
        self.finding.setText(finding(got["result"]))
        self._show_verdict(got)
        self._show_modes(True, "op" in kinds)
        self.stack.setCurrentWidget(self.content)
        self._draw()

    def _show_verdict(self, got: dict[str, Any]) -> None:
        """The bisection's verdict over this diff; step 1 (the HTP in FP16) when the diff
        ran it (``studio bisect``, or ``layerdiff.fp16_step``)."""
        v = bisect_verdict(got["result"], got["rows"])
        row = next((r for r in got["rows"] if r["name"] == v.get("tensor")), None)
        self._verdict_layer = layer_of(row) if row is not None else None
        step1 = v["steps"][0]["finding"]
        self.verdict.setText(f"<b>Verdict:</b> {html.escape(v['verdict'])}<br><span "
                             f"style='color:gray'>Step 1, FP32 vs the HTP unquantized: "
                             f"{html.escape(step1)}</span>")
        self.open_verdict.setVisible(self._verdict_layer is not None)
        if self._verdict_layer:
            self.open_verdict.setText(f"Open {short_name(self._verdict_layer)}")

    def _open_verdict(self) -> None:
        if self._verdict_layer:
            self.layerActivated.emit(self._verdict_layer)

    def _show_modes(self, show: bool, every_tensor: bool = False) -> None:
        """The Show: buttons, only over a diff (Every tensor only when it compared them)."""
        self.show_label.setVisible(show)
        for mode, b in self.mode_buttons.items():
            b.setVisible(show and (mode != "all" or every_tensor))

    def _mode_toggled(self, on: bool) -> None:
        if on and self._got is not None:
            self._draw()

    def _draw(self) -> None:
        got = self._got
        if got is None:
            return
        r, rows = got["result"], got["rows"]
        self._shown, self._x = positions(rows, self.mode)
        shown = [rows[i] for i in self._shown]
        self.plot.clear()
        self.curves = {}
        self.markers = []
        xs = list(range(len(shown)))
        legend = []
        titles = r.get("pair_titles") or PAIR_TITLES
        dense = len(shown) > 30
        for pair in r.get("pairs", []):
            color, style = PAIR_STYLE.get(pair, ("#5b6570", Qt.PenStyle.SolidLine))
            ys = [
                x[pair]["rel_error"] if pair in x and x[pair]["rel_error"] > 0 else float("nan")
                for x in shown
            ]
            title = titles.get(pair, pair)
            self.curves[pair] = self.plot.plot(
                xs,
                ys,
                pen=pg.mkPen(color, width=2, style=style),
                name=title,
                symbol="o",
                symbolSize=4 if dense else 7,
                symbolBrush=color,
                symbolPen=None,
                connect="finite",
            )
            legend.append(_legend_entry(r, pair, title, color, style))
        self.legend.setText("&nbsp;&nbsp;&nbsp; ".join(legend))
        ax = self.plot.getAxis("bottom")
        marks = ticks(shown, merge=self.mode != "blocks")
        ax.setTicks([marks, []])
        # room on the right for a label shared by the last boundaries (norm · lm_head)
        pad = 0.06 * len(shown) if marks and " · " in marks[-1][1] else 0.0
        left = 0.5 + (0.03 * len(shown) if marks and marks[0][0] == 0 else 0.0)  # "embed"
        self.plot.setXRange(-left, len(shown) - 0.5 + pad, padding=0)
        self.plot.setToolTip(
            "Relative error against the reference along the graph, in graph order; ticks at "
            "the block boundaries"
            + ("" if self.mode == "blocks" else ", points between them at the module outputs")
        )
        self._draw_markers(r)
        # the y range leaves a free band under the curves for the markers' labels
        ys = [
            math.log10(x[p]["rel_error"])
            for x in shown
            for p in r.get("pairs", [])
            if p in x and x[p]["rel_error"] > 0
        ]
        if ys:
            lo, hi = min(ys), max(ys)
            span = max(hi - lo, 1.0)
            self.plot.setYRange(lo - 0.3 * span, hi + 0.05 * span, padding=0)
        self._show_table()

    def _draw_markers(self, r: dict[str, Any]) -> None:
        """Vertical markers: the first jump (host QDQ and HTP against FP32; one marker when
        they jump at the same tensor) and where host QDQ and the HTP part."""
        found: dict[str, list[str]] = {}
        for pair, who in (("qdq_vs_fp32", "host QDQ"), ("htp_vs_fp32", "HTP")):
            fj = r.get("first_jump", {}).get(pair)
            if fj and fj["name"] in self._x:
                found.setdefault(fj["name"], []).append(who)
        marks = [
            (name, "first jump (" + " & ".join(who) + ")", "#7a808a", 0.07)
            for name, who in found.items()
        ]
        p = r.get("parting")
        if p and p["name"] in self._x:
            marks.append((p["name"], "host QDQ and HTP part", "#c62828", 0.17))
        for name, text, color, where in marks:
            line = pg.InfiniteLine(
                pos=self._x[name],
                angle=90,
                movable=False,
                pen=pg.mkPen(color, width=1.5, style=Qt.PenStyle.DashLine),
                label=f"{text}: {short_name(name)}",
                labelOpts={
                    "position": where,
                    "color": color,
                    "anchors": [(0, 0.5), (0, 0.5)],
                    "fill": pg.mkBrush(_with_alpha(self.palette().base().color(), 200)),
                },
            )
            line.setToolTip(f"{text}: {name}")
            self.plot.addItem(line, ignoreBounds=True)
            self.markers.append((name, text, line))

    def _show_table(self) -> None:
        got = self._got
        if got is None:
            return
        r, rows = got["result"], got["rows"]
        pairs = list(r.get("pairs", []))
        titles = r.get("pair_titles") or PAIR_TITLES
        listed = worst_rows(r, rows)
        reasons = {d["row"]["name"]: d["reasons"] for d in listed}
        if self.all_rows.isChecked():
            entries = [rows[i] for i in self._shown]
            self.table_note.setText(
                f"Every tensor shown in the plot ({len(entries)}). Double-click a row to open "
                "its layer on the Precision page."
            )
        else:
            entries = [d["row"] for d in listed]
            self.table_note.setText(
                "Per pair, the tensors that add the most error, and where host QDQ and the HTP "
                "differ most. Double-click a row: its layer on the Precision page."
            )
        self._set_columns(r, pairs, titles)
        order = {x["name"]: i for i, x in enumerate(rows)}
        self.table.set_rows([self._table_row(x, order, pairs, reasons.get(x["name"], []))
                             for x in entries])
        h = self.table_view.horizontalHeader()
        fm = self.table_view.fontMetrics()
        width = max(fm.horizontalAdvance(t) for t in ("QDQ/FP32", "0.999999", "100 %")) + 26
        for c in range(3, 3 + 2 * len(pairs)):  # compact figures: the names keep their room
            h.setSectionResizeMode(c, QHeaderView.ResizeMode.Interactive)
            h.resizeSection(c, width)
        if not self._sorted:
            # worst first: by the HTP's error against FP32 (else the first pair's)
            k = pairs.index("htp_vs_fp32") if "htp_vs_fp32" in pairs else 0
            self.table_view.sortByColumn(3 + 2 * k, Qt.SortOrder.DescendingOrder)
            self._sorted = True

    def _set_columns(self, r: dict[str, Any], pairs: list[str], titles: dict) -> None:
        """The table's columns: the tensor, its layer and block, two figures per pair."""
        columns = ["Tensor", "Layer", "Block"]
        tips = [
            "The compared tensor (the studio's name for it)",
            "The layer the recipe names (a module, or a key activation such as "
            "….self_attn.scores or ….residual; '= tensor': the tensor's own name): "
            "double-click to open it on the Precision page",
            "The decoder block (embed: before the first, head: after the last)",
        ]
        for pair in pairs:
            t, short = titles.get(pair, pair), PAIR_SHORT.get(pair, pair)
            src = pair_source(r, pair)
            columns += [f"{short}\nerror", f"{short}\ncosine"]
            tips += [
                f"{t}: ‖a − b‖ / ‖b‖ over every element of the windows ({src})",
                f"{t}: cosine similarity ({src})",
            ]
        columns.append("Why listed")
        tips.append("Per pair, how much the tensor amplifies the error it receives (its gain)")
        if columns != self.table.columns:
            self.table.beginResetModel()
            self.table.columns = columns
            self.table.header_tips = tips
            self.table.endResetModel()

    def _table_row(self, x: dict[str, Any], order: dict[str, int], pairs: list[str],
                   why: list[str]) -> Row:
        """One tensor's row: its figures per pair, the sort keys, why it is listed."""
        layer = layer_of(x)
        cells = [x["name"], "= tensor" if layer == x["name"] else layer, block_text(x)]
        sort: list[Any] = [order[x["name"]], layer, x["block"]]
        for pair in pairs:
            f = x.get(pair) or {}
            cells += [
                pct(f.get("rel_error")),
                "—" if f.get("cosine") is None else f"{f['cosine']:.6f}",
            ]
            sort += [f.get("rel_error", -1.0), f.get("cosine", -1.0)]
        cells.append("; ".join(why))
        sort.append(len(why))
        tip = (
            f"{x['name']}\nlayer: {layer}\nmodule: {x['module']}\nop: {x['op']} "
            f"(tensor {x['tensor']})"
        )
        if why:
            tip += "\nlisted: " + "; ".join(why)
        tip += "\nDouble-click: open the layer on the Precision page"
        return Row(
            cells,
            colors={1: "#7a7f87"} if layer == x["name"] else {},
            tip=tip,
            payload={"row": x, "layer": layer, "sort": sort},
            align_right=tuple(range(3, 3 + 2 * len(pairs))),
        )

    # ---- reading and activating ---------------------------------------------------------------
    def table_rows(self) -> list[list[str]]:
        """The table as shown (sorted), header first."""
        m = self.proxy
        out = [list(self.table.columns)]
        for i in range(m.rowCount()):
            out.append([m.index(i, c).data() for c in range(m.columnCount())])
        return out

    def _row_activated(self, index) -> None:
        payload = self.proxy.data(index, PayloadRole)
        if isinstance(payload, dict) and payload.get("layer"):
            self.layerActivated.emit(payload["layer"])

    def point_at(self, scene_pos) -> dict[str, Any] | None:
        """The shown tensor nearest the plot's x at a scene position (None outside)."""
        if self._got is None or not self._shown:
            return None
        vb = self.plot.getPlotItem().vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        x = vb.mapSceneToView(scene_pos).x()
        k = round(x)
        if not 0 <= k < len(self._shown) or abs(x - k) > 0.5:
            return None
        return self._got["rows"][self._shown[k]]

    def activate_point(self, k: int) -> str:
        """Emit ``layerActivated`` for the ``k``-th shown point; returns the layer."""
        row = self._got["rows"][self._shown[k]]
        layer = layer_of(row)
        self.layerActivated.emit(layer)
        return layer

    def _hover(self, pos) -> None:
        row = self.point_at(pos)
        if row is None:
            return
        titles = self._got["result"].get("pair_titles") or PAIR_TITLES
        figs = ", ".join(
            f"{titles.get(p, p)} {pct(row[p]['rel_error'])}"
            for p in self._got["result"].get("pairs", [])
            if p in row
        )
        self.hover.setText(
            f"<b>{html.escape(row['name'])}</b> ({html.escape(row['op'])}): "
            f"{html.escape(figs)} — double-click to open "
            f"{html.escape(layer_of(row))} on the Precision page"
        )
        self.plot.setToolTip(row["name"])

    def _plot_clicked(self, ev) -> None:
        if not ev.double():
            return
        row = self.point_at(ev.scenePos())
        if row is not None:
            ev.accept()
            self.layerActivated.emit(layer_of(row))


def main() -> int:
    class LayerDiffPage(Page):
        title = "Layer diff"
        subtitle = "FP32 vs host QDQ vs the HTP simulator, tensor by tensor"

        def __init__(self, ctl, parent=None):
            super().__init__(ctl, parent)
            self.view = LayerDiffView(ctl)
            QVBoxLayout(self.body).addWidget(self.view)

        def on_open(self) -> None:
            self.view.reload()

    return run_page(LayerDiffPage)


if __name__ == "__main__":
    raise SystemExit(main())
