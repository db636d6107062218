"""The Precision page's recipe tab: scheme, weight granularity, calibration, the exported
shapes, the accuracy gates and the pipeline's stages — each control one undoable edit
(``PrecisionPage._set``)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from studio.core.project import STAGES
from studio.core.recipe import (
    BLOCK_SIZES,
    CALIBRATION_METHODS,
    GRANULARITIES,
    GRANULARITY_HELP,
    SCHEME_HELP,
    SCHEMES,
    WEIGHT_ROUNDING_HELP,
    WEIGHT_ROUNDINGS,
    is_float_scheme,
    scheme_refusal,
)
from studio.core.settings import NOT_EXPOSED, PERFORMANCE_MODES, spec_of
from studio.ui.stages import project_stages, stage_title
from studio.ui.widgets import label

#: the pipeline stages' check boxes per row
STAGE_COLUMNS = 7


class RecipeFormMixin:
    """Builds the recipe form and shows the project's values in it (for ``PrecisionPage``)."""

    def _build_recipe(self) -> QWidget:
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(6, 6, 6, 6)
        ll.addWidget(self._build_recipe_form())
        ll.addWidget(self._build_htp())
        ll.addWidget(self._build_gates())
        ll.addWidget(self._build_stage_checks())
        self.error = label("", "error", wrap=True)
        self.error.hide()
        ll.addWidget(self.error)
        ll.addStretch(1)
        return left

    def _build_recipe_form(self) -> QGroupBox:
        """Scheme, granularity, block size, calibration, the graphs' shapes."""
        recipe = QGroupBox("Recipe")
        form = QFormLayout(recipe)
        self.scheme = QComboBox()
        for s in SCHEMES:
            self.scheme.addItem(s, s)
            self.scheme.setItemData(
                self.scheme.count() - 1, SCHEME_HELP[s], Qt.ItemDataRole.ToolTipRole
            )
        self.scheme.activated.connect(lambda _i: self._set_scheme(self.scheme.currentData()))
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
        self.rounding = QComboBox()
        for i, r in enumerate(WEIGHT_ROUNDINGS):
            self.rounding.addItem(r.replace("_", " + "), r)
            self.rounding.setItemData(i, WEIGHT_ROUNDING_HELP[r], Qt.ItemDataRole.ToolTipRole)
        self.rounding.setToolTip("How per-channel integer weights are chosen: nearest on "
                                 "MinMax scales, or fitted on calibration inputs per layer")
        self.rounding.activated.connect(
            lambda _i: self._set("quantization", "weight_rounding", self.rounding.currentData())
        )
        form.addRow("Weight rounding", self.rounding)
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
        form.addRow("Calibration text", self._build_calibration_text())
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
        return recipe

    def _build_htp(self) -> QGroupBox:
        """The HTP compiler's options this wheel's QNN EP exposes ([htp]), and the seed's
        knobs it does not, each with what it would need."""
        box = QGroupBox("HTP: compiler and run time")
        form = QFormLayout(box)
        self.opt_level = QComboBox()
        for level, text in ((0, "backend default (2)"), (1, "1 · fastest preparation"),
                            (2, "2 · optimized"), (3, "3 · most optimized")):
            self.opt_level.addItem(text, level)
        self.opt_level.setToolTip(spec_of("htp.optimization_level").doc)
        self.opt_level.activated.connect(
            lambda _i: self._set("htp", "optimization_level", self.opt_level.currentData()))
        form.addRow("Optimization level", self.opt_level)
        self.vtcm = QSpinBox()
        self.vtcm.setRange(0, 64)
        self.vtcm.setSpecialValueText("the chip's whole VTCM")
        self.vtcm.setSuffix(" MB")
        self.vtcm.setKeyboardTracking(False)
        self.vtcm.setToolTip(spec_of("htp.vtcm_mb").doc)
        self.vtcm.editingFinished.connect(lambda: self._set("htp", "vtcm_mb", self.vtcm.value()))
        form.addRow("VTCM budget", self.vtcm)
        self.fp16_relax = QCheckBox("float ops in FP16")
        self.fp16_relax.setToolTip(spec_of("htp.fp16_relaxation").doc)
        self.fp16_relax.toggled.connect(lambda on: self._set("htp", "fp16_relaxation", on))
        form.addRow("FP16 relaxation", self.fp16_relax)
        self.graph_io = QComboBox()
        for value, text in (("float", "float (the NPU converts at every edge)"),
                            ("quantized", "quantized (the NPU's 16-bit integers)")):
            self.graph_io.addItem(text, value)
        self.graph_io.setToolTip(spec_of("htp.graph_io").doc)
        self.graph_io.activated.connect(
            lambda _i: self._set("htp", "graph_io", self.graph_io.currentData()))
        form.addRow("Graph I/O", self.graph_io)

        self.perf_mode = QComboBox()
        for mode in PERFORMANCE_MODES:
            self.perf_mode.addItem(mode.replace("_", " ") if mode else "backend default", mode)
        self.perf_mode.setToolTip(spec_of("htp.performance_mode").doc)
        self.perf_mode.activated.connect(
            lambda _i: self._set("htp", "performance_mode", self.perf_mode.currentData()))
        form.addRow("Performance mode (run)", self.perf_mode)
        note = label("Judged by the compiler's own figures (Profiler and studio compare: DRAM "
                     "and VTCM bytes per decode step, deterministic). Not exposed by the QNN "
                     "EP here: " + ", ".join(NOT_EXPOSED) + " (hover for what each needs).",
                     "muted", wrap=True)
        note.setToolTip("\n".join(f"{k}: {v}" for k, v in NOT_EXPOSED.items()))
        form.addRow(note)
        return box

    def _build_gates(self) -> QGroupBox:
        """The accuracy gates a run is judged by."""
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
        return gates

    def _build_stage_checks(self) -> QGroupBox:
        """Which stages Run pipeline runs (those of the project's kind are shown)."""
        stages = QGroupBox("Pipeline stages (Run pipeline and studio --batch)")
        self.stage_grid = QGridLayout(stages)
        self.stage_checks: dict[str, QCheckBox] = {}
        for s in STAGES:
            cb = QCheckBox(s)
            cb.setToolTip(stage_title(s))
            cb.clicked.connect(self._stages_clicked)
            self.stage_checks[s] = cb
        self._place_stage_checks(STAGES)
        return stages

    def _place_stage_checks(self, shown) -> None:
        """The check boxes of the stages ``shown``, in rows of STAGE_COLUMNS; the others
        hidden."""
        for cb in self.stage_checks.values():
            self.stage_grid.removeWidget(cb)
        i = 0
        for s, cb in self.stage_checks.items():
            cb.setVisible(s in shown)
            if s in shown:
                self.stage_grid.addWidget(cb, i // STAGE_COLUMNS, i % STAGE_COLUMNS)
                i += 1

    def _build_calibration_text(self) -> QHBoxLayout:
        """The calibration text file: yours, or the shipped sample."""
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
        return calib

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
        if touched("quantization", "weight_rounding"):
            self._quiet(self.rounding, lambda: self.rounding.setCurrentIndex(
                self.rounding.findData(q["weight_rounding"])))
        if touched("quantization", "weight_granularity") or touched("quantization", "scheme"):
            self.rounding.setEnabled(q["weight_granularity"] == "per_channel"
                                     and not is_float_scheme(q["scheme"]))
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
        h = p.htp
        if touched("htp", "optimization_level"):
            self._quiet(self.opt_level, lambda: self.opt_level.setCurrentIndex(
                self.opt_level.findData(h["optimization_level"])))
        if touched("htp", "vtcm_mb"):
            self._quiet(self.vtcm, lambda: self.vtcm.setValue(h["vtcm_mb"]))
        if touched("htp", "fp16_relaxation"):
            self._quiet(self.fp16_relax, lambda: self.fp16_relax.setChecked(h["fp16_relaxation"]))
        if touched("htp", "performance_mode"):
            self._quiet(self.perf_mode, lambda: self.perf_mode.setCurrentIndex(
                self.perf_mode.findData(h["performance_mode"])))
        if touched("htp", "graph_io"):
            self._quiet(self.graph_io, lambda: self.graph_io.setCurrentIndex(
                self.graph_io.findData(h["graph_io"])))
        for key, spin in self.gate_spins.items():
            if touched("gates", key):
                self._quiet(spin, lambda s=spin, k=key: s.setValue(float(p.gates[k])))
        if touched("pipeline", "stages"):
            self._place_stage_checks(project_stages(p))
            for s, cb in self.stage_checks.items():
                self._quiet(cb, lambda c=cb, s=s: c.setChecked(s in p.pipeline["stages"]))
        if touched("quantization", "overrides"):
            self._show_overrides()

    def _set_scheme(self, scheme: str) -> bool:
        """The scheme, unless the targets cannot run it (FP16 on a chip without float)."""
        why = scheme_refusal(scheme, self._chips())
        if why:
            self.error.setText(why)
            self.error.show()
            self.show_status(f"Refused: {why}. Nothing was changed.", error=True)
            self._load_all({("quantization", "scheme")})
            return False
        return self._set("quantization", "scheme", scheme)

    @staticmethod
    def _quiet(widget, fn) -> None:
        widget.blockSignals(True)
        try:
            fn()
        finally:
            widget.blockSignals(False)

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
