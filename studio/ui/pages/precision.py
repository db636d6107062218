"""Precision: the quantization recipe, per-layer overrides and the layers they touch.

Every control here is an undoable edit of the project (a ``SetValue`` on the command stack).
The sensitivity heat map and the automatic precision search come with the layer-precision
editor; the page says so where they will appear.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.project import STAGES
from studio.core.recipe import (
    BLOCK_SIZES,
    CALIBRATION_METHODS,
    GRANULARITIES,
    GRANULARITY_HELP,
    PRECISIONS,
    SCHEME_HELP,
    SCHEMES,
    covers,
)
from studio.services.precision import layer_precisions
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.base import Page, banner
from studio.ui.widgets import label

LAYER_COLUMNS = ["Layer", "Block", "Kind", "Weights", "Activations", "Rule"]


def rule_text(row: dict) -> str:
    """One cell for the rule(s) of a layer-precision row: the rule when one rule set both
    (or the layer has no weights), else which rule set the weights and which the activations."""
    w, a = row["weight_rule"], row["activation_rule"]
    if not w or w == a:
        return a
    return f"weights: {w}; activations: {a}"


class PrecisionPage(Page):
    title = "Precision"
    subtitle = "The quantization recipe and per-layer precision overrides (every edit is undoable)."

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        split = QSplitter(Qt.Orientation.Horizontal)
        lay.addWidget(split, 1)

        # -- left: recipe form --
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 8, 0)
        recipe = QGroupBox("Recipe")
        form = QFormLayout(recipe)
        self.scheme = QComboBox()
        for s in SCHEMES:
            self.scheme.addItem(s, s)
            self.scheme.setItemData(
                self.scheme.count() - 1, SCHEME_HELP[s], Qt.ItemDataRole.ToolTipRole
            )
        self.scheme.activated.connect(
            lambda _i: self._set("quantization", "scheme", self.scheme.currentData())
        )
        form.addRow("Scheme", self.scheme)
        self.granularity = QComboBox()
        for g in GRANULARITIES:
            self.granularity.addItem(g.replace("_", "-"), g)
        self.granularity.activated.connect(
            lambda _i: self._set(
                "quantization", "weight_granularity", self.granularity.currentData()
            )
        )
        for i, g in enumerate(GRANULARITIES):
            self.granularity.setItemData(i, GRANULARITY_HELP[g], Qt.ItemDataRole.ToolTipRole)
        form.addRow("Weight granularity", self.granularity)
        self.block_size = QComboBox()
        for b in BLOCK_SIZES:
            self.block_size.addItem(str(b), b)
        self.block_size.setToolTip("Input channels per scale for block-wise (per-block, LPBQ) "
                                   "4-bit weights")
        self.block_size.activated.connect(
            lambda _i: self._set("quantization", "block_size", self.block_size.currentData())
        )
        form.addRow("Block size (per-block)", self.block_size)
        self.method = QComboBox()
        for m in CALIBRATION_METHODS:
            self.method.addItem(m, m)
        self.method.setToolTip("How activation ranges are taken from the calibration data: "
                               "MinMax (full range), Entropy (KL), Percentile (clips outliers)")
        self.method.activated.connect(
            lambda _i: self._set("quantization", "calibration_method", self.method.currentData())
        )
        form.addRow("Calibration method", self.method)
        self.samples = QSpinBox()
        self.samples.setRange(1, 4096)
        self.samples.setKeyboardTracking(False)
        self.samples.setToolTip("Calibration windows of the calibration text fed to the FP32 model")
        self.samples.editingFinished.connect(
            lambda: self._set("quantization", "calibration_samples", self.samples.value())
        )
        form.addRow("Calibration samples", self.samples)
        calib = QHBoxLayout()
        self.calib_text = QLineEdit()
        self.calib_text.setReadOnly(True)
        calib.addWidget(self.calib_text, 1)
        choose = QPushButton("Choose…")
        choose.setToolTip("Use a text file of your own as calibration data")
        choose.clicked.connect(self._choose_calibration)
        calib.addWidget(choose)
        sample = QPushButton("Sample")
        sample.setToolTip("Use the shipped calibration text (Python source)")
        sample.clicked.connect(
            lambda: self._set("quantization", "calibration_text", "sample:calibration")
        )
        calib.addWidget(sample)
        form.addRow("Calibration text", calib)
        self.prompt_len = QSpinBox()
        self.prompt_len.setRange(1, 4095)
        self.prompt_len.setKeyboardTracking(False)
        self.prompt_len.setToolTip("P: the prefill graph's fixed prompt length")
        self.prompt_len.editingFinished.connect(
            lambda: self._set("export", "prompt_length", self.prompt_len.value())
        )
        form.addRow("Prompt length (P)", self.prompt_len)
        self.context_len = QSpinBox()
        self.context_len.setRange(2, 4096)
        self.context_len.setKeyboardTracking(False)
        self.context_len.setToolTip("C: the static KV cache length of the decode graph")
        self.context_len.editingFinished.connect(
            lambda: self._set("export", "context_length", self.context_len.value())
        )
        form.addRow("Context length (C)", self.context_len)
        ll.addWidget(recipe)

        gates = QGroupBox("Accuracy gates (a failing gate fails studio --batch)")
        gf = QFormLayout(gates)
        self.gate_spins: dict[str, QDoubleSpinBox] = {}
        for key, text, lo, hi in (
            ("min_logits_cosine", "Min logits cosine", 0.0, 1.0),
            ("max_perplexity_increase", "Max perplexity increase", 0.0, 100.0),
            ("min_top1_agreement", "Min top-1 agreement", 0.0, 1.0),
        ):
            spin = QDoubleSpinBox()
            spin.setRange(lo, hi)
            spin.setDecimals(4)
            spin.setSingleStep(0.01)
            spin.setKeyboardTracking(False)
            spin.editingFinished.connect(
                lambda k=key, s=spin: self._set("gates", k, round(s.value(), 6))
            )
            gf.addRow(text, spin)
            self.gate_spins[key] = spin
        ll.addWidget(gates)

        stages = QGroupBox("Pipeline stages (Run pipeline and studio --batch)")
        sl = QHBoxLayout(stages)
        self.stage_checks: dict[str, QCheckBox] = {}
        for s in STAGES:
            cb = QCheckBox(s)
            cb.clicked.connect(self._stages_clicked)
            sl.addWidget(cb)
            self.stage_checks[s] = cb
        sl.addStretch(1)
        ll.addWidget(stages)
        self.error = label("", "error", wrap=True)
        self.error.hide()
        ll.addWidget(self.error)
        ll.addStretch(1)
        split.addWidget(left)

        # -- right: overrides and layers --
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(8, 0, 0, 0)
        over = QGroupBox("Per-layer overrides")
        ol = QVBoxLayout(over)
        ol.addWidget(
            label(
                "Glob patterns on module paths, e.g. <code>*.down_proj</code> or "
                "<code>model.layers.0</code> (a whole block). INT8 / INT16 set the precision of the "
                "activations the matched nodes compute, FP16 / FP32 keep them in float; a pattern "
                "ending in <code>.weight</code> sets the weights' precision.",
                "muted",
                wrap=True,
            )
        )
        self.overrides = RowsModel(["Pattern", "Precision", "Layers matched"], self)
        self.over_view = QTableView()
        self.over_view.setModel(self.overrides)
        self.over_view.verticalHeader().hide()
        self.over_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.over_view.setWordWrap(False)
        self.over_view.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.over_view.setMaximumHeight(150)
        ol.addWidget(self.over_view)
        add = QHBoxLayout()
        self.pattern = QLineEdit()
        self.pattern.setPlaceholderText("pattern, e.g. *.down_proj")
        self.pattern.returnPressed.connect(self.add_override)
        add.addWidget(self.pattern, 1)
        self.prec = QComboBox()
        self.prec.addItems(list(PRECISIONS))
        self.prec.setCurrentText("INT16")
        add.addWidget(self.prec)
        self.add_button = QPushButton("Add")
        self.add_button.clicked.connect(self.add_override)
        add.addWidget(self.add_button)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_override)
        self.remove_button.setEnabled(False)
        self.remove_button.setToolTip("Select an override to remove it")
        self.over_view.selectionModel().selectionChanged.connect(
            lambda *_: self.remove_button.setEnabled(self.over_view.selectionModel().hasSelection())
        )
        add.addWidget(self.remove_button)
        ol.addLayout(add)
        rl.addWidget(over)

        layers = QGroupBox("Layers")
        lyl = QVBoxLayout(layers)
        lyl.addWidget(
            label(
                "What each layer gets under the recipe, and the rule that set it (the quantizer "
                "applies the same rule).",
                "muted",
                wrap=True,
            )
        )
        self.layers = RowsModel(LAYER_COLUMNS, self)
        self.layer_view = QTableView()
        self.layer_view.setModel(self.layers)
        self.layer_view.verticalHeader().hide()
        self.layer_view.setAlternatingRowColors(True)
        self.layer_view.setWordWrap(False)
        # full layer names, never elided: the column fits its longest name and the view
        # scrolls sideways when the names are wider than the page
        self.layer_view.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.layer_view.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        lh = self.layer_view.horizontalHeader()
        lh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        lh.setStretchLastSection(True)
        lyl.addWidget(self.layer_view, 1)
        rl.addWidget(layers, 1)
        rl.addWidget(
            banner(
                "<b>Sensitivity heat map and “auto” precision</b> will appear here with the "
                "layer-precision editor: a real per-layer analysis colours every layer by how much "
                "it hurts accuracy when quantized, and “auto” finds the fewest high-precision layers "
                "that meet your accuracy target. Until then: add overrides above, then run "
                "quantize → validate (Jobs page) and compare on the Validation page."
            )
        )
        split.addWidget(right)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)

        ctl.model_ready.connect(lambda _info: self._show_layers())

    # ---- session ------------------------------------------------------------------------------
    def on_open(self) -> None:
        self.error.hide()
        self._load_all()
        if self.ctl.model is not None:
            self._show_layers()
        else:
            self.ctl.load_model()

    def on_change(self, change) -> None:
        self._load_all(change)
        if any(
            ("quantization", k) in change for k in ("overrides", "scheme", "weight_granularity")
        ):
            self._show_layers()

    def _load_all(self, change=None) -> None:
        p = self.ctl.project

        def touched(section: str, key: str) -> bool:
            return change is None or (section, key) in change

        q, e = p.quantization, p.export
        if touched("quantization", "scheme"):
            self._quiet(
                self.scheme, lambda: self.scheme.setCurrentIndex(self.scheme.findData(q["scheme"]))
            )
        if touched("quantization", "weight_granularity"):
            self._quiet(
                self.granularity,
                lambda: self.granularity.setCurrentIndex(
                    self.granularity.findData(q["weight_granularity"])
                ),
            )
        if touched("quantization", "block_size"):
            self._quiet(self.block_size, lambda: self.block_size.setCurrentIndex(
                self.block_size.findData(q["block_size"])))
        if touched("quantization", "weight_granularity"):
            self.block_size.setEnabled(q["weight_granularity"] == "per_block")
        if touched("quantization", "calibration_method"):
            self._quiet(self.method, lambda: self.method.setCurrentIndex(
                self.method.findData(q["calibration_method"])))
        if touched("quantization", "calibration_samples"):
            self._quiet(self.samples, lambda: self.samples.setValue(q["calibration_samples"]))
        if touched("quantization", "calibration_text"):
            self.calib_text.setText(q["calibration_text"])
        if touched("export", "prompt_length"):
            self._quiet(self.prompt_len, lambda: self.prompt_len.setValue(e["prompt_length"]))
        if touched("export", "context_length"):
            self._quiet(self.context_len, lambda: self.context_len.setValue(e["context_length"]))
        for key, spin in self.gate_spins.items():
            if touched("gates", key):
                self._quiet(spin, lambda s=spin, k=key: s.setValue(float(p.gates[k])))
        if touched("pipeline", "stages"):
            for s, cb in self.stage_checks.items():
                self._quiet(cb, lambda c=cb, s=s: c.setChecked(s in p.pipeline["stages"]))
        if touched("quantization", "overrides"):
            self._show_overrides()

    @staticmethod
    def _quiet(widget, fn) -> None:
        widget.blockSignals(True)
        try:
            fn()
        finally:
            widget.blockSignals(False)

    # ---- edits ------------------------------------------------------------------------------------
    def _set(self, section: str, key: str, value) -> bool:
        p = self.ctl.project
        if p is None:
            return False
        current = getattr(p, section)[key] if section else getattr(p, key)
        if current == value:
            return True
        try:
            self.ctl.set(section, key, value)
        except StudioError as exc:
            self.error.setText(exc.message)
            self.error.show()
            self._load_all({(section, key)})  # show the project's value again
            return False
        self.error.hide()
        return True

    def _stages_clicked(self) -> None:
        stages = [s for s in STAGES if self.stage_checks[s].isChecked()]
        if not stages:
            self.error.setText("keep at least one stage in the pipeline")
            self.error.show()
            self._load_all({("pipeline", "stages")})
            return
        self._set("pipeline", "stages", stages)

    def _choose_calibration(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Calibration text",
            str(self.ctl.project.base_dir),
            "Text files (*.txt *.py *.md);;All files (*)",
        )
        if path:
            self._set("quantization", "calibration_text", path)

    def add_override(self) -> bool:
        pattern = self.pattern.text().strip()
        if not pattern:
            self.error.setText("type a layer-name pattern first, e.g. *.down_proj")
            self.error.show()
            return False
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides[pattern] = self.prec.currentText()
        if self._set("quantization", "overrides", overrides):
            self.pattern.clear()
            return True
        return False

    def remove_override(self) -> None:
        rows = self.over_view.selectionModel().selectedRows()
        if not rows:
            return
        pattern = rows[0].data(PayloadRole)
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides.pop(pattern, None)
        self._set("quantization", "overrides", overrides)

    # ---- tables ------------------------------------------------------------------------------------
    def _layer_names(self) -> list[str]:
        from studio.services.precision import quantizable

        info = self.ctl.model
        return [name for name, *_ in quantizable(info)] if isinstance(info, ModelInfo) else []

    def _show_overrides(self) -> None:
        overrides = self.ctl.project.quantization["overrides"]
        names = self._layer_names()
        rows = []
        for pattern, prec in overrides.items():
            n = sum(1 for name in names if covers(pattern, name))
            rows.append(
                Row(
                    [pattern, prec, str(n) if names else "?"],
                    payload=pattern,
                    colors={2: "#b26a00"} if names and n == 0 else {},
                    tip="No layer matches; the pattern may still name ONNX nodes (quantize "
                    "fails with a clear message if it names nothing)"
                    if names and n == 0
                    else "",
                )
            )
        self.overrides.set_rows(rows)

    def _show_layers(self) -> None:
        if self.ctl.studio is None:
            return
        info = self.ctl.model
        self._show_overrides()
        if not isinstance(info, ModelInfo):
            self.layers.set_rows([])
            return
        rows = []
        for r in layer_precisions(self.ctl.project, info):
            colors = {}
            if r["weight_rule"].startswith("override"):
                colors[3] = "#2f6fd6"
            if r["activation_rule"].startswith("override"):
                colors[4] = "#2f6fd6"
            if colors:
                colors[5] = "#2f6fd6"
            tip = (
                f"weights: {r['weight'] or 'none'} ({r['weight_rule'] or 'no weights'}); "
                f"activations: {r['activation']} ({r['activation_rule']})"
            )
            if r.get("tied_to"):
                tip += f"; shares its weight with {r['tied_to']}"
            rows.append(
                Row(
                    [
                        r["layer"],
                        "" if r["block"] is None else str(r["block"]),
                        r["kind"],
                        r["weight"] or "—",
                        r["activation"],
                        rule_text(r),
                    ],
                    payload=r,
                    tip=tip,
                    colors=colors,
                )
            )
        self.layers.set_rows(rows)


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(PrecisionPage)


if __name__ == "__main__":
    raise SystemExit(main())
