"""LLM tuning views: the optimization waterfall (each step measured on the host CPU beside the
performance model's estimate for a chip, with its perplexity) and the block ablation (the
ranked table and a pruned checkpoint written out as a new project)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.catalog import load_catalog
from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.units import signed
from studio.services import waterfall as wfs
from studio.services.pruning import ablation_result, prune
from studio.ui.loading import LatestLoad
from studio.ui.theme import SOURCE_COLORS
from studio.ui.widgets import SourceBadge, label, plot_axes, plot_message, theme_plot

pg = lazy_module("pyqtgraph")

# the bars in the colours of their source badges
MEASURED, ESTIMATED = SOURCE_COLORS["measured"], SOURCE_COLORS["estimated"]


def _item(text: str, align_right: bool = False) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    it.setFlags(it.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if align_right:
        it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return it


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    return t


class WaterfallPanel(QWidget):
    """FP32 -> W8A16 -> W4A16 -> INT8 KV -> window -> speculative -> pruned."""

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)

        self.pg = pg
        self.page = page
        self.ctl = page.ctl
        self._load = LatestLoad(self.ctl)
        self.data: dict[str, Any] | None = None
        self._raw: dict[str, Any] | None = None
        lay = QVBoxLayout(self)
        head = QHBoxLayout()
        self.run_btn = QPushButton("Measure the waterfall")
        self.run_btn.setToolTip("Runs the waterfall stage (and the ablation it needs): every "
                                "step's graphs are built and measured on the host CPU")
        self.run_btn.clicked.connect(lambda: self.page.run_role("waterfall"))
        head.addWidget(self.run_btn)
        head.addWidget(label("Estimate for", "muted"))
        self.chip = QComboBox()
        self.chip.currentIndexChanged.connect(self._redraw)
        head.addWidget(self.chip)
        head.addStretch(1)
        head.addWidget(SourceBadge("measured", "host CPU, ONNX Runtime"))
        head.addWidget(SourceBadge("estimated", "the performance model for the chip"))
        lay.addLayout(head)
        self.info = label("No waterfall yet: measure it (a few minutes on the sample).",
                          "muted", wrap=True)
        lay.addWidget(self.info)
        split = QSplitter(Qt.Orientation.Vertical)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=False, y=True, alpha=0.3)
        self.plot.setLabel("left", "decode tok/s")
        self.plot.setMinimumHeight(220)
        self.plot.addLegend(offset=(10, 5))
        theme_plot(self.plot, self.palette())
        split.addWidget(self.plot)
        self.table = _table(["step", "host CPU tok/s (measured)", "chip tok/s (estimated)",
                             "perplexity (measured)", "change vs FP32", "note"])
        split.addWidget(self.table)
        lay.addWidget(split, 1)

    def on_open(self) -> None:
        p = self.ctl.project
        self.chip.blockSignals(True)
        current = self.chip.currentText()
        self.chip.clear()

        keys = list(load_catalog())
        self.chip.addItems(list(dict.fromkeys([*p.targets, *keys])))
        if current:
            self.chip.setCurrentText(current)
        self.chip.blockSignals(False)
        self.refresh()

    def refresh(self) -> None:
        project = self.ctl.project.copy()

        def done(raw) -> None:
            self._raw = raw
            self._redraw()

        self._load.start(wfs.stored, project, False, done=done, failed=self._failed)

    def _failed(self, exc: Exception) -> None:
        if not isinstance(exc, StudioError):
            raise exc
        self.info.setText(exc.message)

    def _redraw(self, *_args) -> None:
        self.plot.clear()
        self.table.setRowCount(0)
        if self._raw is None:
            self.info.setText("No waterfall for the current settings: measure it (the stage "
                              "quantizes the model twice and exports the pruned one: a few "
                              "minutes on the sample).")
            plot_message(self.plot, "No waterfall for the current settings yet")
            return
        plot_axes(self.plot)
        try:
            data = wfs.with_estimate(self._raw, self.chip.currentText())
        except StudioError as exc:
            self.info.setText(exc.message)
            return
        self.data = data
        steps = data["steps"]
        xs = list(range(len(steps)))
        host = [r["tokens_per_s"] for r in steps]
        est = [r.get("estimated_tokens_per_s") or 0.0 for r in steps]
        pg = self.pg
        self.plot.addItem(pg.BarGraphItem(x=[x - 0.2 for x in xs], height=host, width=0.38,
                                          brush=MEASURED, name="host CPU (measured)"))
        self.plot.addItem(pg.BarGraphItem(x=[x + 0.2 for x in xs], height=est, width=0.38,
                                          brush=ESTIMATED,
                                          name=f"{data['chip_name']} (estimated)"))
        ax = self.plot.getAxis("bottom")
        ax.setTicks([[(x, f"{r['label']}\nppl {r['ppl']:.1f}") for x, r in zip(xs, steps,
                                                                                strict=True)]])
        self.plot.setLabel("bottom", "step (each on top of the last) · held-out perplexity")
        for x, h in zip(xs, host, strict=True):
            t = pg.TextItem(f"{h:.0f}", anchor=(0.5, 1.0), color=MEASURED)
            t.setPos(x - 0.2, h)
            self.plot.addItem(t)
        for x, h in zip(xs, est, strict=True):
            t = pg.TextItem(f"{h:.0f}", anchor=(0.5, 1.0), color=ESTIMATED)
            t.setPos(x + 0.2, h)
            self.plot.addItem(t)
        self.plot.setYRange(0, max(host + est) * 1.15)
        self.table.setRowCount(len(steps))
        for i, r in enumerate(steps):
            e = r.get("estimated_tokens_per_s")
            cells = [r["label"], f"{r['tokens_per_s']:.1f}", f"{e:.1f}" if e else "–",
                     f"{r['ppl']:.2f}", signed(r["ppl_change"], ".1%", "−"), r.get("note", "")]
            for j, c in enumerate(cells):
                self.table.setItem(i, j, _item(c, 0 < j < 5))
        self.info.setText(
            f"Window {data['window']} of {data['context']} tokens · speculative: prompt lookup, "
            f"k ≤ {data['k']}, {data['tokens_per_pass']:.2f} tokens per target pass (measured) · "
            f"pruned without block(s) {data['dropped_blocks']} · the host CPU runs the "
            "quantized steps as QDQ graphs in float (slower here; their gain is on the NPU) · "
            + data["estimate_note"])

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if hasattr(self, "plot"):
            theme_plot(self.plot, self.palette())


class PruningPanel(QWidget):
    """Block ablation: the held-out perplexity without each block, ranked."""

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)
        self.page = page
        self.ctl = page.ctl
        self._load = LatestLoad(self.ctl)
        self.table_data: dict[str, Any] | None = None
        lay = QVBoxLayout(self)
        head = QHBoxLayout()
        self.run_btn = QPushButton("Run the ablation")
        self.run_btn.setToolTip("Drops each block in turn and measures the held-out perplexity "
                                "(host CPU, FP32)")
        self.run_btn.clicked.connect(lambda: self.page.run_role("ablation"))
        head.addWidget(self.run_btn)
        head.addWidget(label("Blocks to drop", "muted"))
        self.drop = QSpinBox()
        self.drop.setRange(1, 64)
        self.drop.valueChanged.connect(self._set_drop)
        head.addWidget(self.drop)
        self.write_btn = QPushButton("Write pruned checkpoint…")
        self.write_btn.setToolTip("Copies the checkpoint without the dropped blocks to a folder "
                                  "and writes a project file that uses it")
        self.write_btn.clicked.connect(self.write_checkpoint)
        self.write_btn.setEnabled(False)
        head.addWidget(self.write_btn)
        head.addStretch(1)
        head.addWidget(SourceBadge("measured", "host CPU, FP32 in transformers"))
        lay.addLayout(head)
        self.info = label("", "muted", wrap=True, selectable=True)
        lay.addWidget(self.info)
        self.table = _table(["rank", "block", "perplexity without it", "change",
                             "in the pruned checkpoint"])
        lay.addWidget(self.table, 1)

    def on_open(self) -> None:
        self.drop.blockSignals(True)
        self.drop.setValue(int(self.ctl.project.pruning["drop_blocks"]))
        self.drop.blockSignals(False)
        self.refresh()

    def _set_drop(self, value: int) -> None:
        if self.ctl.project and value != self.ctl.project.pruning["drop_blocks"]:
            self.ctl.set("pruning", "drop_blocks", int(value), "blocks to drop")

    def refresh(self) -> None:
        project = self.ctl.project.copy()

        self._load.start(ablation_result, project, None, False,
                         done=lambda got: self.show_table(got[0] if got else None),
                         failed=self._failed)

    def _failed(self, exc: Exception) -> None:
        if not isinstance(exc, StudioError):
            raise exc
        self.info.setText(exc.message)

    def show_table(self, t: dict[str, Any] | None) -> None:
        self.table_data = t
        self.write_btn.setEnabled(t is not None)
        if t is None:
            self.table.setRowCount(0)
            self.info.setText("No ablation for the current settings: run it to rank the "
                              "blocks by what dropping each costs in held-out perplexity.")
            return
        self.info.setText(
            f"Perplexity over {t['tokens']} held-out tokens: {t['baseline_ppl']:.2f} with all "
            f"{t['num_blocks']} blocks. The pruned checkpoint leaves out {t['dropped']}: "
            f"perplexity {t['pruned_ppl']:.2f} ({signed(t['pruned_delta'], '.1%', '−')}).")
        self.table.setRowCount(len(t["blocks"]))
        for i, r in enumerate(t["blocks"]):
            cells = [str(i + 1), f"block {r['block']}", f"{r['ppl']:.2f}", signed(r["delta"], ".1%", "−"),
                     "dropped" if r["block"] in t["dropped"] else "kept"]
            for j, c in enumerate(cells):
                it = _item(c, j in (2, 3))
                if r["block"] in t["dropped"]:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                self.table.setItem(i, j, it)

    def write_checkpoint(self, folder: str | None = None) -> None:
        if folder is None:
            start = str(self.ctl.project.base_dir)
            folder = QFileDialog.getSaveFileName(self, "Pruned checkpoint folder",
                                                 str(Path(start) / "pruned"))[0]
        if not folder:
            return
        project = self.ctl.project.copy()
        out = Path(folder)

        async def go() -> None:
            try:
                got = await self.ctl.in_thread(prune, project, None, out)
            except StudioError as exc:
                self.ctl.message.emit("error", exc.message)
                return
            self.ctl.message.emit("info", f"wrote {got['checkpoint']} and {got['project']}: "
                                          "open that project to run the pruned model")

        asyncio.ensure_future(go())
