"""The new-project wizard: model source → target chips → recipe → name and folder.

The wizard only collects answers: ``spec()`` returns a ``NewProjectSpec`` and ``accept()``
hands it to ``ProjectController.create`` (``projects.create_project``), the same call a
test or a script makes.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QButtonGroup,
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
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from studio.core import samples
from studio.core.catalog import default_chip_key
from studio.core.errors import StudioError
from studio.core.project import ENCODER_CALIBRATION_SAMPLES
from studio.core.recipe import (
    DEFAULT_GATES,
    GATE_HELP,
    GRANULARITIES,
    PLACEMENT_HELP,
    PLACEMENTS,
    SCHEMES,
)
from studio.core.stagegraph import MODEL_KIND_HELP, STAGE_NAMES, default_stages, kind_stages
from studio.services.graphs import check_graph_samples, graph_inputs
from studio.services.projects import NewProjectSpec, file_stem, free_project_name, path_taken
from studio.ui.widgets import ChipList, label


class SourcePage(QWizardPage):
    def __init__(self, wizard: NewProjectWizard):
        super().__init__()
        self.setTitle("Model")
        self.setSubTitle(
            "Start from a shipped sample, a Hugging Face checkpoint folder on this "
            "machine, or an ONNX file. Nothing is downloaded."
        )
        lay = QGridLayout(self)
        self.group = QButtonGroup(self)
        self.sample_radio = QRadioButton("Sample model")
        self.ckpt_radio = QRadioButton("Hugging Face checkpoint folder")
        self.onnx_radio = QRadioButton("ONNX file")
        for i, r in enumerate((self.sample_radio, self.ckpt_radio, self.onnx_radio)):
            self.group.addButton(r, i)
        self.sample = QComboBox()
        # the box names the sample; its description is the line under it (in the box it
        # was cut at the wizard's width) and the item's tool tip
        self.sample.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.sample.setMinimumContentsLength(24)

        for s in samples.SAMPLES.values():
            if not s.draft_for:
                self.sample.addItem(s.name, s.name)
                self.sample.setItemData(self.sample.count() - 1, s.description,
                                        Qt.ItemDataRole.ToolTipRole)
        self.sample_note = label("", "muted", wrap=True)
        self.sample.currentIndexChanged.connect(self._show_sample)
        self.ckpt = QLineEdit()
        self.ckpt.setPlaceholderText("folder with config.json and *.safetensors")
        self.ckpt.setToolTip("A Hugging Face checkpoint folder: config.json and *.safetensors "
                             "(Qwen2/Qwen2.5, Llama, Mistral)")
        ckpt_browse = QPushButton("Browse…")
        ckpt_browse.clicked.connect(self._browse_ckpt)
        self.onnx = QLineEdit()
        self.onnx.setPlaceholderText("model.onnx")
        self.onnx.setToolTip("Any network as ONNX: calibrated on .npz samples, placed on the "
                             "NPU")
        onnx_browse = QPushButton("Browse…")
        onnx_browse.clicked.connect(self._browse_onnx)
        lay.addWidget(self.sample_radio, 0, 0)
        lay.addWidget(self.sample, 0, 1, 1, 2)
        lay.addWidget(self.sample_note, 1, 1, 1, 2)
        lay.addWidget(self.ckpt_radio, 2, 0)
        lay.addWidget(self.ckpt, 2, 1)
        lay.addWidget(ckpt_browse, 2, 2)
        lay.addWidget(self.onnx_radio, 3, 0)
        lay.addWidget(self.onnx, 3, 1)
        lay.addWidget(onnx_browse, 3, 2)
        self.kind_label = label("", "muted", wrap=True)
        lay.addWidget(self.kind_label, 4, 0, 1, 3)
        self.error = label("", "error", wrap=True)
        lay.addWidget(self.error, 5, 0, 1, 3)
        lay.setRowStretch(6, 1)
        lay.setColumnStretch(1, 1)
        self.sample_radio.setChecked(True)
        self.ckpt.textChanged.connect(lambda: self.ckpt_radio.setChecked(True))
        self.onnx.textChanged.connect(lambda: self.onnx_radio.setChecked(True))
        self.group.idToggled.connect(lambda *_: self.completeChanged.emit())
        self.ckpt.textChanged.connect(lambda: self.completeChanged.emit())
        self.onnx.textChanged.connect(lambda: self.completeChanged.emit())
        self.sample.currentIndexChanged.connect(lambda *_: self.completeChanged.emit())
        self.completeChanged.connect(self._show_kind)
        self._show_kind()
        self._show_sample()

    def _show_sample(self, *_args) -> None:
        self.sample_note.setText(str(self.sample.currentData(Qt.ItemDataRole.ToolTipRole)
                                     or ""))

    def model_kind(self) -> str:
        """The project kind this source makes (model.kind)."""
        return NewProjectSpec(Path("."), self.kind(), self.source()).model_kind

    def _show_kind(self) -> None:
        k = self.model_kind()
        self.kind_label.setText(f"Project kind: {k} — {MODEL_KIND_HELP[k]}.")

    def nextId(self) -> int:
        """Encoders and ONNX graphs have a page of their own: inputs, samples, placement."""
        return 1 if self.model_kind() != "causal-lm" else 2

    def kind(self) -> str:
        return ("sample", "checkpoint", "onnx")[max(0, self.group.checkedId())]

    def source(self) -> str:
        k = self.kind()
        if k == "sample":
            return str(self.sample.currentData() or "")
        return (self.ckpt if k == "checkpoint" else self.onnx).text().strip()

    def isComplete(self) -> bool:
        return bool(self.source())

    def validatePage(self) -> bool:
        """Cheap checks here; the full check (headers, ONNX checker) runs on Finish."""
        k, src = self.kind(), self.source()
        msg = ""
        if k == "sample":
            try:
                samples.sample_path(src)
            except StudioError as exc:
                msg = exc.message
        elif k == "checkpoint":
            p = Path(src).expanduser()
            if not p.is_dir():
                msg = f"{p} is not a folder"
            elif not (p / "config.json").is_file():
                msg = f"{p} has no config.json: choose a Hugging Face checkpoint folder"
        else:
            p = Path(src).expanduser()
            if not p.is_file() or p.suffix.lower() != ".onnx":
                msg = f"{p} is not an .onnx file"
        self.error.setText(msg)
        return not msg

    def _browse_ckpt(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Hugging Face checkpoint folder")
        if d:
            self.ckpt.setText(d)

    def _browse_onnx(self) -> None:
        f, _ = QFileDialog.getOpenFileName(self, "ONNX model", "", "ONNX models (*.onnx)")
        if f:
            self.onnx.setText(f)


class GraphPage(QWizardPage):
    """Encoders and ONNX graphs: fixed shapes for dynamic inputs, the calibration and
    validation samples, the encoder's sequence length, the way past refused ops."""

    def __init__(self, wizard: NewProjectWizard):
        super().__init__()
        self._wizard = wizard
        self.setTitle("Graph")
        form = QFormLayout(self)
        self.form = form
        self.inputs_box = QGroupBox("Inputs")
        self.inputs_form = QFormLayout(self.inputs_box)
        form.addRow(self.inputs_box)
        self.shape_edits: dict[str, QLineEdit] = {}
        self.file_rows: list[QWidget] = []
        self.seq_len = QSpinBox()
        self.seq_len.setRange(2, 512)
        self.seq_len.setValue(128)
        self.seq_len.setToolTip("graph.seq_len: the encoder is exported at [1, seq_len]")
        form.addRow("Sequence length", self.seq_len)
        self.calibration = self._file_row("Calibration samples", "graph.calibration: a .npz "
                                          "with one array per input ([N, ...] stacks samples)")
        self.calibration_note = label(
            "Without calibration samples the graph opens for inspection; a run asks for them "
            "(graph.calibration in the project file).", "muted", wrap=True)
        self.form.addRow(self.calibration_note)
        self.validation = self._file_row("Validation samples (optional)", "graph.validation: "
                                         "held-out samples; without them the last calibration "
                                         "samples stand in")
        box = QGroupBox("Nodes the HTP refuses (quantization.placement)")
        lay = QVBoxLayout(box)
        self.placement = QButtonGroup(self)
        for i, p in enumerate(PLACEMENTS):
            r = QRadioButton(f"{p} — {PLACEMENT_HELP[p]}")
            r.setObjectName(p)
            self.placement.addButton(r, i)
            lay.addWidget(r)
        self.placement.button(0).setChecked(True)
        form.addRow(box)
        self.error = label("", "error", wrap=True)
        form.addRow(self.error)

    def _file_row(self, text: str, tip: str) -> QLineEdit:
        row = QWidget()
        lay = QHBoxLayout(row)
        lay.setContentsMargins(0, 0, 0, 0)
        edit = QLineEdit()
        edit.setPlaceholderText("samples.npz")
        edit.setToolTip(tip)
        lay.addWidget(edit, 1)
        browse = QPushButton("Browse…")

        def pick() -> None:
            f, _ = QFileDialog.getOpenFileName(self, text, "", "NumPy data (*.npz *.npy)")
            if f:
                edit.setText(f)

        browse.clicked.connect(pick)
        lay.addWidget(browse)
        self.form.addRow(text, row)
        self.file_rows.append(row)
        edit.textChanged.connect(lambda: self.completeChanged.emit())
        return edit

    def _onnx(self) -> bool:
        return self._wizard.source_page.model_kind() == "onnx-graph"

    def initializePage(self) -> None:
        onnx = self._onnx()
        self.setSubTitle(
            "The network's inputs and the samples it is calibrated and checked on; the way "
            "forward when the HTP refuses an op." if onnx else
            "The encoder is exported from its PyTorch weights at a fixed sequence length and "
            "calibrated on the shipped English sentences (quantization.calibration_text).")
        self.form.setRowVisible(self.seq_len, not onnx)
        self.form.setRowVisible(self.inputs_box, onnx)
        for row in self.file_rows:
            self.form.setRowVisible(row, onnx)
        self.form.setRowVisible(self.calibration_note, onnx)
        while self.inputs_form.rowCount():
            self.inputs_form.removeRow(0)
        self.shape_edits.clear()
        self.error.setText("")
        if not onnx:
            return

        try:
            inputs = graph_inputs(Path(self._wizard.source_page.source()).expanduser())
        except StudioError as exc:
            self.error.setText(exc.message)
            return
        for i in inputs:
            dims = ", ".join(str(d) for d in i["shape"])
            edit = QLineEdit()
            dynamic = not all(isinstance(d, int) and d > 0 for d in i["shape"])
            edit.setPlaceholderText("fixed shape, e.g. " + ", ".join(
                str(d) if isinstance(d, int) and d > 0 else "1" for d in i["shape"]))
            if not dynamic:
                edit.setText(dims)
                edit.setEnabled(False)
            edit.setToolTip(f"{i['name']}: {i['dtype']} [{dims}]"
                            + (" — the HTP compiles static shapes: fix the dynamic dimensions"
                               if dynamic else ""))
            self.shape_edits[i["name"]] = edit
            self.inputs_form.addRow(f"{i['name']} ({i['dtype']}, [{dims}])", edit)
            edit.textChanged.connect(lambda: self.completeChanged.emit())

    def shapes(self) -> dict[str, list[int]]:
        """The shapes the user fixed (dynamic inputs only); a StudioError for bad text."""
        out = {}
        for name, edit in self.shape_edits.items():
            if not edit.isEnabled():
                continue
            try:
                out[name] = [int(d) for d in re.split(r"[,\s]+", edit.text().strip()) if d]
            except ValueError:
                raise StudioError(f"the shape of {name!r} must be whole numbers, e.g. "
                                  "1, 3, 224, 224") from None
        return out

    def placement_value(self) -> str:
        return PLACEMENTS[max(0, self.placement.checkedId())]

    def isComplete(self) -> bool:
        if not self._onnx():
            return True
        return all(e.text().strip() for e in self.shape_edits.values())

    def validatePage(self) -> bool:
        """The shapes and the sample files against the graph (seconds for small graphs)."""
        if not self._onnx():
            return True

        if not self.calibration.text().strip():  # inspect now, calibrate later
            self.error.setText("")
            return True
        try:
            val = self.validation.text().strip()
            n = check_graph_samples(Path(self._wizard.source_page.source()).expanduser(),
                                    self.shapes(), Path(self.calibration.text().strip()),
                                    Path(val) if val else None)
        except StudioError as exc:
            self.error.setText(exc.message)
            return False
        self.error.setText("")
        self._wizard.recipe_page.samples.setValue(min(max(n, 1), 4096))
        return True

    def nextId(self) -> int:
        return 2


class TargetsPage(QWizardPage):
    def __init__(self, wizard: NewProjectWizard):
        super().__init__()
        self.setTitle("Target chips")
        self.setSubTitle(
            "The Snapdragon chips to compile, validate, run and profile for "
            "(QNN HTP simulator per chip generation). You can change them later."
        )

        lay = QVBoxLayout(self)
        self.list = ChipList([default_chip_key()])
        self.list.itemChanged.connect(lambda *_: self.completeChanged.emit())
        lay.addWidget(self.list)
        lay.addWidget(
            label(
                "Hover a chip for its notes (e.g. chips whose simulator numerics are "
                "known to be wrong).",
                "muted",
                wrap=True,
            )
        )

    def targets(self) -> list[str]:
        return self.list.checked()

    def set_targets(self, keys: list[str]) -> None:
        self.list.set_checked(keys)

    def isComplete(self) -> bool:
        return bool(self.targets())


GATE_LABELS = {
    "min_logits_cosine": "Logits cosine vs FP32 ≥",
    "max_perplexity_increase": "Perplexity increase ≤",
    "min_top1_agreement": "Top-1 agreement ≥",
    "min_output_cosine": "Worst output cosine vs FP32 ≥",
    "min_ranking_top1": "Retrieval top-1 agreement ≥",
}
# key -> (minimum, maximum, step, decimals); the project file takes 0..1 except the
# perplexity increase, a ratio (0.05 = +5 %)
GATE_RANGES = {
    "min_logits_cosine": (0.0, 1.0, 0.001, 4),
    "max_perplexity_increase": (0.0, 10.0, 0.01, 3),
    "min_top1_agreement": (0.0, 1.0, 0.01, 3),
}


# the gates each kind's validation measures
KIND_GATES = {
    "causal-lm": ("min_logits_cosine", "max_perplexity_increase", "min_top1_agreement"),
    "encoder": ("min_output_cosine", "min_ranking_top1"),
    "onnx-graph": ("min_output_cosine",),
}


class RecipePage(QWizardPage):
    def __init__(self, wizard: NewProjectWizard):
        super().__init__()
        self._wizard = wizard
        self.setTitle("Recipe")
        self.setSubTitle(
            "How to export and quantize. Every setting can be changed (and undone) "
            "later on the Precision page."
        )
        form = QFormLayout(self)
        self.scheme = QComboBox()
        self.scheme.addItems(list(SCHEMES))
        form.addRow("Quantization scheme", self.scheme)
        self.granularity = QComboBox()
        for g in GRANULARITIES:
            self.granularity.addItem(g.replace("_", "-"), g)
        self.granularity.setCurrentIndex(self.granularity.findData("per_channel"))
        form.addRow("Weight granularity", self.granularity)
        self.samples = QSpinBox()
        self.samples.setRange(1, 4096)
        self.samples.setValue(8)
        form.addRow("Calibration samples", self.samples)
        self.form = form
        self.prompt = QSpinBox()
        self.prompt.setRange(1, 4095)
        self.prompt.setValue(32)
        form.addRow("Prompt length (P)", self.prompt)
        self.context = QSpinBox()
        self.context.setRange(2, 4096)
        self.context.setValue(128)
        form.addRow("Context length (C)", self.context)
        # the stages in rows of a few (one row of every stage asked for 1,800 px and pushed
        # the wizard off the screen); initializePage lays out those of the project's kind
        self.stages_grid = QGridLayout()
        self.stages_grid.setHorizontalSpacing(12)
        self.stage_checks = {}
        for s in STAGE_NAMES:
            cb = QCheckBox(s)
            cb.setChecked(s in default_stages("causal-lm"))  # optional analyses run by name
            self.stage_checks[s] = cb
        self._lay_out_stages(list(STAGE_NAMES))
        form.addRow("Pipeline stages", self.stages_grid)

        box = QGroupBox("Accuracy gates")
        box.setToolTip(
            "Validation checks the quantized model against FP32 with these thresholds; "
            "a run that misses one fails its gate (studio --batch exits with code 1)."
        )
        gates = QFormLayout(box)
        self.gates_form = gates
        self._kind = ""
        self.gates: dict[str, QDoubleSpinBox] = {}
        for key, default in DEFAULT_GATES.items():
            spin = QDoubleSpinBox()
            lo, hi, step, decimals = GATE_RANGES.get(key, (0.0, 1.0, 0.01, 3))
            spin.setRange(lo, hi)
            spin.setDecimals(decimals)
            spin.setSingleStep(step)
            spin.setValue(default)
            spin.setToolTip(f"{GATE_HELP.get(key, key)} (default {default:g})")
            spin.setObjectName(key)
            text = label(GATE_LABELS.get(key, key))
            text.setToolTip(spin.toolTip())
            gates.addRow(text, spin)
            self.gates[key] = spin
        form.addRow(box)

    def initializePage(self) -> None:
        """The rows of the project's kind: a causal LM's lengths and gates, or a graph's."""
        kind = self._wizard.source_page.model_kind()
        llm = kind == "causal-lm"
        self.form.setRowVisible(self.prompt, llm)
        self.form.setRowVisible(self.context, llm)
        mine, default = kind_stages(kind), default_stages(kind)
        for s, cb in self.stage_checks.items():
            cb.setVisible(s in mine)
            cb.setChecked(s in default)
        self._lay_out_stages([s for s in self.stage_checks if s in mine])
        for key, spin in self.gates.items():
            shown = key in KIND_GATES[kind]
            self.gates_form.setRowVisible(spin, shown)
        if kind == "encoder" and self._kind != kind:
            self.samples.setValue(ENCODER_CALIBRATION_SAMPLES)
        elif llm and self._kind not in ("", kind):
            self.samples.setValue(8)
        self._kind = kind

    #: stage check boxes per row
    STAGE_COLUMNS = 4

    def _lay_out_stages(self, shown: list[str]) -> None:
        """The shown stages' boxes in rows of :data:`STAGE_COLUMNS`, in pipeline order."""
        grid = self.stages_grid
        for cb in self.stage_checks.values():
            grid.removeWidget(cb)
        for i, s in enumerate(shown):
            grid.addWidget(self.stage_checks[s], i // self.STAGE_COLUMNS, i % self.STAGE_COLUMNS)

    def gate_values(self) -> dict[str, float]:
        return {key: spin.value() for key, spin in self.gates.items()}


class LocationPage(QWizardPage):
    def __init__(self, wizard: NewProjectWizard):
        super().__init__()
        self._wizard = wizard
        self.setTitle("Name and folder")
        self.setSubTitle(
            "The project is one .qstudio file (TOML) with a folder beside it for "
            "artifacts, run history and reports."
        )
        form = QFormLayout(self)
        self._proposed = ""  # the name the page proposed (replaced when the source changes)
        self._base = "project"  # what it is proposed from: the model's name
        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. tiny-coder on 8 Gen 3")
        form.addRow("Project name", self.name)
        row = QHBoxLayout()
        self.folder = QLineEdit(str(wizard.default_folder))
        row.addWidget(self.folder, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row.addWidget(browse)
        form.addRow("Folder", row)
        self.result = label("", "muted", wrap=True)
        form.addRow("", self.result)
        self.error = label("", "error", wrap=True)
        form.addRow("", self.error)
        self.name.textChanged.connect(self._update)
        self.folder.textChanged.connect(self._folder_changed)

    def initializePage(self) -> None:
        """Propose a name free in the folder (its file and its project folder): the model's,
        numbered when taken; a name the user typed is kept."""
        src = self._wizard.source_page.source()
        self._base = Path(src).stem if src else "project"
        self._propose()
        self._update()

    def _propose(self) -> None:
        if not self.name.text() or self.name.text() == self._proposed:
            self._proposed = free_project_name(self._folder(), self._base)
            self.name.setText(self._proposed)

    def _folder_changed(self) -> None:
        self._propose()  # another folder: the proposed name free there
        self._update()

    def _folder(self) -> Path:
        return Path(self.folder.text().strip() or ".").expanduser()

    def path(self) -> Path:
        return self._folder() / f"{file_stem(self.name.text())}.qstudio"

    def _update(self) -> None:
        p = self.path()
        taken = path_taken(p)
        self.result.setText(f"Creates {p}" + (f"  — {taken}: choose another name" if taken
                                              else ""))
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return bool(self.name.text().strip()) and not path_taken(self.path())

    def _browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Project folder", self.folder.text())
        if d:
            self.folder.setText(d)


class NewProjectWizard(QWizard):
    def __init__(self, ctl, default_folder: Path, parent=None):
        super().__init__(parent)
        self.ctl = ctl
        self.default_folder = Path(default_folder)
        self.setWindowTitle("New project")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.source_page = SourcePage(self)
        self.graph_page = GraphPage(self)
        self.targets_page = TargetsPage(self)
        self.recipe_page = RecipePage(self)
        self.location_page = LocationPage(self)
        for i, p in enumerate((self.source_page, self.graph_page, self.targets_page,
                               self.recipe_page, self.location_page)):
            self.setPage(i, p)
        self.resize(720, 520)
        self.created = None

    def spec(self) -> NewProjectSpec:
        r, g = self.recipe_page, self.graph_page
        return NewProjectSpec(
            path=self.location_page.path(),
            source_kind=self.source_page.kind(),
            source=self.source_page.source(),
            targets=self.targets_page.targets(),
            name=self.location_page.name.text().strip(),
            scheme=r.scheme.currentText(),
            weight_granularity=r.granularity.currentData(),
            calibration_samples=r.samples.value(),
            prompt_length=r.prompt.value(),
            context_length=r.context.value(),
            stages=[s for s, cb in r.stage_checks.items()
                    if cb.isChecked() and s in kind_stages(self.source_page.model_kind())],
            gates=r.gate_values(),
            placement=g.placement_value(),
            calibration=g.calibration.text().strip(),
            validation=g.validation.text().strip(),
            shapes=g.shapes(),
            seq_len=g.seq_len.value(),
        )

    def accept(self) -> None:
        """Create the project through the controller; on a bad answer say why and stay open."""
        self.location_page.error.setText("")
        try:
            self.ctl.create(self.spec())
        except StudioError as exc:
            self.location_page.error.setText(exc.message)
            return
        self.created = self.ctl.project.path
        super().accept()
