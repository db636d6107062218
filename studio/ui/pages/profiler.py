"""Profiler: where one decode step spends its time.

The page shows one profile job per target (or a file the user imported):

- a reliability line: median of N runs, the spread, the host load each run ran under — and
  an amber warning when the spread or the load make the totals unreliable;
- **Op table**: the seed's table (QKV projection, attention QK / softmax / AV, o_proj,
  gate/up, down_proj, RMSNorm, RoPE, data movement / Q-DQ ...), or by op type, by layer, or
  layer x block; bars with the min-max over runs and a table with shares;
- **Compare**: this profile against another profile job (another run, chip or recipe):
  a diff table and delta bars.

While a profile job runs, the op table fills in live, run by run.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core import figures
from studio.core.errors import StudioError
from studio.core.events import BLOCKS
from studio.core.lazyimport import lazy_module
from studio.core.profile import SOURCE_NOTES
from studio.core.units import format_bytes, signed
from studio.services import profile_view as pv
from studio.services import profiles
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import TargetStagePage
from studio.ui.pages.profiler_memory import MemoryTab
from studio.ui.pages.profiler_roofline import RooflineTab
from studio.ui.standalone import run_page
from studio.ui.widgets import fmt_value, label, plot_axes, plot_message, theme_plot

pg = lazy_module("pyqtgraph")

TOP_N = 16
BAR = {"simulated": "#8a5a00", "estimated": "#6a4fb3", "imported": "#2f6fd6",
       "measured": "#1f8a4c"}


def _num(v: float, unit: str, with_unit: bool = True) -> str:
    if v != v:  # NaN
        return "–"
    if unit == "cycles":
        return f"{v:,.0f} cycles" if with_unit else f"{v:,.0f}"
    return fmt_value(v, unit) if with_unit else fmt_value(v, "")


def _count(v: float, kind: str) -> str:
    if kind == "dram_read":
        return format_bytes(int(v)) if v else "–"
    for factor, prefix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if v >= factor:
            return f"{v / factor:.3g}{prefix}"
    return f"{v:.0f}" if v else "–"


def _table_view(model: RowsModel) -> QTableView:
    view = QTableView()
    view.setModel(model)
    view.verticalHeader().hide()
    view.setWordWrap(False)
    view.setAlternatingRowColors(True)
    view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    view.horizontalHeader().setStretchLastSection(True)
    return view


class ProfilerPage(TargetStagePage):
    key = "profiler"

    role = "profile"

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No profile yet",
            "Run the profile stage to profile one decode step of the compiled model on the QNN "
            "HTP simulator, several times: the seed's op table (QKV projection, attention, "
            "MLP, norms, RoPE, data movement) appears here live, run by run, with the median, "
            "the spread and the host load of each run. Simulator cycles follow the host CPU: "
            "they show where the time goes, not device latency. The project's remote agents "
            "and phones over adb (Devices page) are profiled on their own NPU.",
            parent,
        )

        self.pg = pg
        self.add_run_action(
            "Run profile",
            "Runs profile and what it needs (export, quantize, compile)",
        )
        self.data: pv.ProfileData | None = None
        self.other: pv.ProfileData | None = None
        self._live_job: int | None = None
        cl = self.content_layout
        self.reliability = QFrame()
        self.reliability.setProperty("role", "banner")
        rl = QVBoxLayout(self.reliability)
        rl.setContentsMargins(8, 4, 8, 4)
        self.reliability_text = label("", wrap=True)
        rl.addWidget(self.reliability_text)

        rl_row = QHBoxLayout()
        rl_row.addWidget(self.reliability, 1)
        self.again = QPushButton("Profile again")
        self.again.setToolTip("Profile the decode step again (the simulator's figures follow "
                              "host load: re-measure when the host is quiet)")
        self.again.clicked.connect(self.profile_again)
        rl_row.addWidget(self.again)
        files = QVBoxLayout()
        self.import_button = QPushButton("Import…")
        self.import_button.setToolTip("Open a profile another tool wrote: a QNN profiling "
                                      "CSV, an optrace schematic, ONNX Runtime profiling JSON, "
                                      "a device's chrome trace, an AI Hub profile JSON")
        self.import_button.clicked.connect(self.import_dialog)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Save the shown profile as chrome-trace JSON (Perfetto, "
                                      "chrome://tracing) or CSV")
        self.export_button.clicked.connect(self.export_dialog)
        files.addWidget(self.import_button)
        files.addWidget(self.export_button)
        rl_row.addLayout(files)
        cl.addLayout(rl_row)
        self.tabs = QTabWidget()
        cl.addWidget(self.tabs, 1)
        self._build_op_tab()
        # the timeline draws with pyqtgraph (about a second to import): loaded with this
        # page, not with the window
        from studio.ui.pages.profiler_timeline import TimelineTab

        self.timeline = TimelineTab(ctl)
        self.tabs.addTab(self.timeline, "Timeline")
        self._build_compare_tab()

        self.memory = MemoryTab(ctl, pg)
        self.tabs.addTab(self.memory, "Memory")

        self.roofline = RooflineTab(ctl, pg)
        self.tabs.addTab(self.roofline, "DDR && roofline")
        self.tabs.currentChanged.connect(self._tab_changed)
        self.apply_theme()
        ctl.job_partial.connect(self._on_partial)

    # ---- layout -------------------------------------------------------------------------
    def _new_plot(self, y_labels: bool = True):
        plot = self.pg.PlotWidget()
        plot.setMenuEnabled(False)
        plot.showGrid(x=True, y=False, alpha=0.3)
        if y_labels:
            plot.getPlotItem().invertY(True)
        plot.setMouseEnabled(x=True, y=False)
        return plot

    def _build_op_tab(self) -> None:
        tab = QWidget()
        lay = QVBoxLayout(tab)
        row = QHBoxLayout()
        row.addWidget(label("Group by:"))
        self.group = QComboBox()
        for key, text in pv.GROUPS.items():
            self.group.addItem(text, key)
        self.group.addItem("Layer × block (shares)", "layer_block")
        self.group.currentIndexChanged.connect(self._draw_ops)
        row.addWidget(self.group)
        # wrapped, with room for two lines from the start: another grouping's note does not
        # move the chart under it
        self.op_note = label("", "muted", wrap=True)
        self.op_note.setMinimumHeight(2 * self.op_note.fontMetrics().lineSpacing())
        row.addWidget(self.op_note, 1)
        lay.addLayout(row)
        split = QSplitter()
        self.plot = self._new_plot()
        split.addWidget(self.plot)
        self.table = RowsModel(["Group", "Median", "Share", "Min – max over runs", "Ops"], self)
        self.table_view = _table_view(self.table)
        split.addWidget(self.table_view)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([520, 640])
        lay.addWidget(split, 1)
        self.tabs.addTab(tab, "Op table")

    def _build_compare_tab(self) -> None:
        tab = QWidget()
        lay = QVBoxLayout(tab)
        row = QHBoxLayout()
        row.addWidget(label("Compare with:"))
        self.against = QComboBox()
        self.against.setMinimumWidth(320)
        self.against.currentIndexChanged.connect(self._compare)
        row.addWidget(self.against)
        row.addWidget(label("by"))
        self.compare_group = QComboBox()
        for key, text in pv.GROUPS.items():
            self.compare_group.addItem(text, key)
        self.compare_group.currentIndexChanged.connect(self._compare)
        row.addWidget(self.compare_group)
        self.compare_note = label("", "muted", wrap=True)
        row.addWidget(self.compare_note, 1)
        lay.addLayout(row)
        split = QSplitter()
        self.delta_plot = self._new_plot()
        split.addWidget(self.delta_plot)
        self.diff = RowsModel(["Group", "A (shown)", "B (other)", "Δ", "B / A", "Share A",
                               "Share B"], self)
        split.addWidget(_table_view(self.diff))
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([480, 680])
        lay.addWidget(split, 1)
        self.tabs.addTab(tab, "Compare")

    def apply_theme(self) -> None:
        for p in (self.plot, self.delta_plot):
            theme_plot(p, self.palette())
        if hasattr(self, "roofline"):
            self.memory.apply_theme()
            self.roofline.apply_theme()
            self.timeline.apply_theme()

    def _tab_changed(self, index: int) -> None:
        """Tabs that read more than the profile load when first shown."""
        if self.tabs.widget(index) is self.timeline and self.timeline.result is None:
            self.timeline.load()
        if self.tabs.widget(index) is self.memory and self.memory.result is None:
            self.memory.load()
        if self.tabs.widget(index) is self.roofline and self.roofline.result is None:
            chip = (self.data.profile.target or {}).get("chip") if self.data else None
            if chip:
                self.roofline.select_chip(chip)
            self.roofline.load()

    def on_open(self) -> None:
        if hasattr(self, "roofline"):
            self.memory.result = None
            self.roofline.result = None
        super().on_open()

    def changeEvent(self, event) -> None:  # theme switches repaint the plots
        super().changeEvent(event)
        if hasattr(self, "delta_plot"):
            self.apply_theme()

    # ---- data ---------------------------------------------------------------------------
    def show_job(self, job) -> None:
        try:
            data = pv.load(self.ctl.studio, job)
        except StudioError as exc:
            self.job_label.setText(f"job #{job.id} · {exc.message}")
            return
        self._live_job = None
        self.set_profile(data)
        self._fill_against()
        graphs = pv.job_graphs(self.ctl.studio, job)
        for tab in (self.memory, self.roofline):
            if tab.graphs != graphs:
                tab.graphs, tab.result = graphs, None
        self.roofline.compiler_bytes = pv.compiler_bytes_by_layer(data)
        decode = (graphs.get("quantize") or {}).get("decode")
        self.timeline.set_sources(pv.host_timeline(self.ctl.studio, job), decode,
                                  (data.profile.target or {}).get("chip", ""))
        self._tab_changed(self.tabs.currentIndex())

    def set_profile(self, data: pv.ProfileData) -> None:
        """Show ``data`` (a stored job or an imported file)."""
        self.data = data
        src = data.source
        self.badge.set_source(src, SOURCE_NOTES.get(src, ""))
        job = data.job
        where = f" · run {job.run_id}" if job is not None else ""
        self.job_label.setText(f"{data.title.split(' · ')[0]}{where} · "
                               f"{len(data.profile.ops)} {figures.title('profiled_ops')}")
        self._show_stats(data.stats, len(data.profile.ops), src, data.unit)
        self._draw_ops()
        self._compare()

    def _show_stats(self, stats: dict, ops: int, source: str, unit: str, live: str = "") -> None:
        if not stats:
            self.reliability_text.setText(
                f"{live}{ops} ops · {SOURCE_NOTES.get(source, '')}".strip(" ·"))
            self.reliability.setProperty("role", "banner")
        else:
            load = stats.get("median_other_load")
            parts = [
                f"{live}median of {stats.get('runs', 0)} runs: "
                f"<b>{_num(stats.get('median', float('nan')), unit)}</b>",
                f"±{stats.get('spread', 0):.1%} median deviation "
                f"(range {stats.get('range', 0):.0%})",
            ]
            if load is not None:
                parts.append(f"other processes used {load:.0%} of the host CPUs")
            parts.append(f"{ops} ops")
            text = " · ".join(parts)
            if stats.get("reliable", True):
                text += f"<br><span style='color: gray'>{SOURCE_NOTES.get(source, '')}</span>"
                self.reliability.setProperty("role", "banner-ok")
            else:
                text = ("⚠ <b>These totals are unreliable.</b> "
                        + "; ".join(stats.get("warnings", [])) + "<br>" + text)
                self.reliability.setProperty("role", "banner")
            self.reliability_text.setText(text)
        self.reliability.style().unpolish(self.reliability)
        self.reliability.style().polish(self.reliability)

    def _rows(self) -> list[pv.GroupRow]:
        assert self.data is not None
        return pv.breakdown(self.data, self.group.currentData())

    def _draw_ops(self, *_args) -> None:
        if self.data is None:
            return
        unit = self.data.unit
        if self.group.currentData() == "layer_block":
            self._draw_layer_block()
            return
        rows = self._rows()
        self.table.columns = ["Group", f"Median ({unit})", "Share", "Min – max", "Ops"]
        extra = [k for k in ("macs", "dram_read") if any(k in r.extra for r in rows)]
        self.table.columns += [{"macs": "MACs", "dram_read": "Bytes"}[k]
                               for k in extra]
        self.table.set_rows([
            Row([r.name, _num(r.value, unit, False), f"{r.share:.1%}",
                 f"{_num(r.low, unit, False)} – {_num(r.high, unit, False)}", str(r.count)]
                + [_count(r.extra.get(k, 0), k) for k in extra],
                align_right=(1, 2, 3, 4, 5, 6))
            for r in rows
        ])
        self.table.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, len(self.table.columns))
        self._bars(self.plot, [(r.name, r.value, r.low, r.high) for r in rows], unit,
                   self.data.source)
        compiler = self.data.stats.get("bytes_source") == "compiler (optrace)"
        self.op_note.setText(
            "bars: median over the profiled runs; whiskers: min – max"
            + (("; MACs: analytic, from the graph; bytes moved: the HTP compiler's own DRAM "
                "traffic (optrace)" if compiler else
                "; MACs and bytes moved: analytic, from the graph")
               + " (they do not depend on the host's load)" if extra else ""))

    def _draw_layer_block(self) -> None:
        assert self.data is not None
        layers, blocks, m = pv.layer_block_table(self.data)
        short = {b: b.replace("attention: ", "attn ").replace("data movement / Q-DQ", "data/QDQ")
                 .replace("embedding / lm_head", "embed/head") for b in blocks}
        self.table.columns = ["Layer"] + [short[b] for b in blocks] + ["Total"]
        self.table.set_rows([
            Row([name] + [f"{v:.1%}" if v else "" for v in m[i]] + [f"{m[i].sum():.1%}"],
                align_right=tuple(range(1, len(blocks) + 2)))
            for i, name in enumerate(layers)
        ])
        self.table.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, len(self.table.columns))
        totals = m.sum(axis=1)
        self._bars(self.plot, [(n, float(t), float("nan"), float("nan"))
                               for n, t in zip(layers, totals, strict=True)], "share",
                   self.data.source)
        self.op_note.setText("share of the step's total per layer and block (the seed's table)")

    def _bars(self, plot, items: list[tuple[str, float, float, float]], unit: str,
              source: str) -> None:
        pg = self.pg
        plot.clear()
        items = [it for it in items if it[1] > 0]
        if len(items) > TOP_N:
            rest = items[TOP_N:]
            items = items[:TOP_N] + [(f"{len(rest)} more", sum(r[1] for r in rest),
                                      float("nan"), float("nan"))]
        if not items:
            plot_message(plot, "No op took any time in this profile")
            return
        plot_axes(plot)
        ys = list(range(len(items)))
        plot.addItem(pg.BarGraphItem(x0=[0] * len(items), y=ys, height=0.7,
                                     width=[v for _, v, _, _ in items],
                                     brush=BAR.get(source, "#2f6fd6"), pen=None))
        lows = [(i, lo, hi) for i, (_, _, lo, hi) in enumerate(items) if lo == lo and hi == hi]
        if lows:
            for i, lo, hi in lows:
                plot.plot([lo, hi], [i, i], pen=pg.mkPen(self.palette().text().color(),
                                                           width=1.5))
        plot.getAxis("left").setTicks([[(i, name) for i, (name, *_rest) in enumerate(items)]])
        if unit == "share":
            plot.setLabel("bottom", f"share of the step ({source})")
        else:
            plot.setLabel("bottom", source, units=unit)
        plot.setYRange(-0.6, len(items) - 0.4, padding=0)
        top = max(max(v, hi if hi == hi else 0) for _, v, _, hi in items)
        plot.setXRange(0, top * 1.05, padding=0)

    # ---- files --------------------------------------------------------------------------
    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Import a profile", "",
            "Profiles (*.csv *.json *.bin);;All files (*)")
        if path:
            self.import_file(path)

    def import_file(self, path: str) -> asyncio.Future:
        """Read ``path`` off the UI thread and show it (an error becomes a message)."""
        async def go() -> None:
            try:
                data = await self.ctl.in_thread(profiles.import_profile_file, path)
            except StudioError as exc:
                self.ctl.message.emit("error", exc.message)
                return
            self.show_imported(data)

        self._import_task = asyncio.ensure_future(go())
        return self._import_task

    def show_imported(self, data: pv.ProfileData) -> None:
        self.set_has_content(True)
        self._live_job = None
        self.set_profile(data)
        self._fill_against()
        timed = data.table if data.table.has("start") else None
        self.timeline.set_sources(None, None, "", imported=timed)
        for tab in (self.memory, self.roofline):
            tab.graphs, tab.result = {}, None
        self.roofline.compiler_bytes = {}
        self._tab_changed(self.tabs.currentIndex())

    def export_dialog(self) -> None:
        if self.data is None:
            return
        path, chosen = QFileDialog.getSaveFileName(
            self, "Export the profile", "profile.json",
            "Chrome trace / Perfetto (*.json);;CSV (*.csv)")
        if path:
            self.export_file(path, "csv" if path.endswith(".csv") or "CSV" in chosen
                             else "chrome")

    def export_file(self, path: str, fmt: str) -> None:
        try:
            out = profiles.export(self.data, fmt, path)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return
        self.ctl.message.emit("info", f"Saved {out.name} ({fmt}, {len(self.data.table):,} "
                                      f"events, {self.data.source})")

    def profile_again(self) -> None:
        """A new measurement of the shown target's profile (not the cached one)."""
        try:
            self.ctl.run([self.stage], remeasure=True)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)

    # ---- live -----------------------------------------------------------------------------
    def _on_partial(self, job_id: int, data: dict) -> None:
        if self.ctl.studio is None or "by_block" not in data:
            return
        try:
            job = self.ctl.studio.jobs.job(job_id)
        except Exception:  # noqa: BLE001 - a job of another session: ignore
            return
        if job.stage != self.stage:
            return
        self._live_job = job_id
        self.set_has_content(True)
        unit = data.get("unit", "cycles")
        by_block = data["by_block"]
        order = {b: i for i, b in enumerate(BLOCKS)}
        items = sorted(by_block.items(), key=lambda kv: order.get(kv[0], 99))
        total = sum(by_block.values()) or 1.0
        self.table.columns = ["Group", f"Median so far ({unit})", "Share", "Min – max over runs",
                              "Ops"]
        self.table.set_rows([
            Row([name, _num(v, unit, False), f"{v / total:.1%}", "", ""], align_right=(1, 2))
            for name, v in items
        ])
        self._bars(self.plot, [(n, v, float("nan"), float("nan")) for n, v in items], unit,
                   "simulated")
        live = f"<b>live</b>, run {data.get('repeat')}/{data.get('repeats')} of job #{job_id} · "
        self.job_label.setText(f"job #{job_id} · profiling {job.target} (live)")
        self._show_stats(data.get("stats") or {}, 0, "simulated", unit, live)
        if not self.isVisible():  # never switch the tab one is reading
            self.tabs.setCurrentIndex(0)

    # ---- compare --------------------------------------------------------------------------
    def _fill_against(self) -> None:
        current = self.against.currentData()
        self.against.blockSignals(True)
        self.against.clear()
        mine = self.data.job.id if self.data is not None and self.data.job is not None else None
        for j in pv.comparable_jobs(self.ctl.studio):
            if j.id == mine:
                continue
            self.against.addItem(f"job #{j.id} · run {j.run_id} · {j.target}", j.id)
        idx = self.against.findData(current)
        self.against.setCurrentIndex(idx if idx >= 0 else (0 if self.against.count() else -1))
        self.against.blockSignals(False)
        self._compare()

    def _compare(self, *_args) -> None:
        if self.data is None or self.ctl.studio is None:
            return
        jid = self.against.currentData()
        self.delta_plot.clear()
        if jid is None:
            self.diff.set_rows([])
            self.compare_note.setText(
                "No other profile to compare with yet: change the recipe or the target and "
                "run the profile stage again.")
            plot_message(self.delta_plot, "No other profile to compare with yet")
            return
        plot_axes(self.delta_plot)
        try:
            other = pv.load(self.ctl.studio, self.ctl.studio.jobs.job(jid))
        except StudioError as exc:
            self.compare_note.setText(exc.message)
            return
        self.other = other
        by = self.compare_group.currentData()
        rows = pv.compare(self.data, other, by)
        unit = self.data.unit
        # changes read from the older profile to the newer, whichever is shown: red where the
        # newer takes more, green where it takes less (an improvement is never red)
        a_newer = (self.data.job is not None and other.job is not None
                   and self.data.job.id > other.job.id)
        sign = -1 if a_newer else 1  # CompareRow.delta is B - A
        change = "A − B" if a_newer else "B − A"  # one name for the column and the bars
        self.diff.columns = ["Group", f"A ({unit})", f"B ({other.unit})",
                             f"Δ {change}", "B / A", "Share A", "Share B"]

        def colour(change: float) -> dict[int, str]:
            # as written: a change that rounds to 0 is not coloured
            return {3: "#d64545" if change > 0 else "#1f8a4c"} if round(change) else {}

        self.diff.set_rows([
            Row([r.name, _num(r.a, unit, False), _num(r.b, unit, False),
                 signed(sign * r.delta, ",.0f", "−"),
                 f"{r.ratio:.2f}×" if r.ratio is not None else "new",
                 f"{r.share_a:.1%}", f"{r.share_b:.1%}"],
                colors=colour(sign * r.delta), align_right=(1, 2, 3, 4, 5, 6))
            for r in rows
        ])
        newer, older = ("A", "B") if a_newer else ("B", "A")
        note = (f"A: {self.data.title} ({self.data.source}) · B: {other.title} "
                f"({other.source}). Δ and bars: from the older profile ({older}) to the newer "
                f"({newer}), red where the newer takes more; bars are the change in share of "
                "the step (percentage points): shares stay comparable when the host load "
                "differs between the two profiles.")
        if self.data.unit != other.unit:
            note += f" Units differ ({self.data.unit} vs {other.unit}): compare the shares."
        self.compare_note.setText(note)
        pg = self.pg
        shown = rows[:TOP_N]
        deltas = [100 * sign * (r.share_b - r.share_a) for r in shown]
        ys = list(range(len(shown)))
        brushes = ["#d64545" if d > 0 else "#1f8a4c" for d in deltas]
        self.delta_plot.addItem(pg.BarGraphItem(x0=[min(0, d) for d in deltas], y=ys,
                                                height=0.7, width=[abs(d) for d in deltas],
                                                brushes=brushes, pen=None))
        self.delta_plot.getAxis("left").setTicks([[(i, r.name) for i, r in enumerate(shown)]])
        self.delta_plot.setLabel("bottom", f"Δ share, percentage points ({change})")
        if shown:
            self.delta_plot.setYRange(-0.6, len(shown) - 0.4, padding=0)
            span = max(abs(d) for d in deltas) or 1.0
            self.delta_plot.setXRange(-span * 1.1, span * 1.1, padding=0)


def main() -> int:
    return run_page(ProfilerPage)


if __name__ == "__main__":
    raise SystemExit(main())
