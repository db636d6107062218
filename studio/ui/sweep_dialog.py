"""A new recipe sweep from the window: a name, up to three axes picked from the recipe's
settings (each with its values; a setting with a closed set of values starts with all of
them), how the best point is chosen. The table is checked as the project file's
``[[sweeps]]`` tables are (:func:`studio.core.sweep.parse_spec`, and each value on its own
against its setting) while it is written, and the point count shown (a combination the
recipe refuses is recorded as an invalid point when the sweep runs, as from the file); OK
adds it to the project as one undoable edit."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGridLayout,
    QLineEdit,
    QVBoxLayout,
)

from studio.core.errors import StudioError
from studio.core.project import Project, apply_point
from studio.core.settings import SECTIONS
from studio.core.sweep import BEST_RULES, parse_axis_arg, parse_spec
from studio.ui.widgets import label

#: the sections whose settings a sweep from the window varies (the recipe and the shapes)
SWEPT_SECTIONS = ("quantization", "export")
#: settings a sweep does not vary from here (texts, tables, and what the HTP refuses)
NOT_OFFERED = {"calibration_text", "overrides", "activation_granularity", "parts",
               "max_part_mb"}
AXIS_ROWS = 3


def axis_choices(project: Project) -> dict[str, tuple[Any, ...] | None]:
    """``section.key`` -> its closed set of values (None: any number) for the settings a
    sweep from the window offers: those with a closed set or a number."""
    out: dict[str, tuple[Any, ...] | None] = {}
    for section in SWEPT_SECTIONS:
        for key, (spec, hint) in SECTIONS[section].specs().items():
            if key in NOT_OFFERED:
                continue
            allowed = spec.allowed()
            if allowed:
                out[f"{section}.{key}"] = tuple(allowed)
            elif hint in (int, float):
                out[f"{section}.{key}"] = None
    return out


def values_text(values: tuple[Any, ...] | list[Any]) -> str:
    return ", ".join(str(v) for v in values)


class NewSweepDialog(QDialog):
    """See the module docstring; :meth:`table` is the ``[[sweeps]]`` table made."""

    def __init__(self, project: Project, parent=None):
        super().__init__(parent)
        self.setWindowTitle("New sweep")
        self.project = project
        self.choices = axis_choices(project)
        lay = QVBoxLayout(self)
        lay.addWidget(label(
            "Variants of the recipe, run through the pipeline and compared (accuracy against "
            "size, the Pareto front, the best point to apply). Every combination of the "
            "axes' values is a point.", "muted", wrap=True))
        form = QFormLayout()
        taken = {t["name"] for t in project.sweeps}
        n = 1
        while f"sweep{n}" in taken:
            n += 1
        self.name = QLineEdit(f"sweep{n}")
        form.addRow("Name", self.name)
        self.best = QComboBox()

        for rule in BEST_RULES:
            self.best.addItem(rule, rule)
        self.best.setToolTip("Which point is the best, among those that pass every gate")
        form.addRow("Best point", self.best)
        lay.addLayout(form)
        grid = QGridLayout()
        grid.addWidget(label("Setting", "muted"), 0, 0)
        grid.addWidget(label("Values (comma-separated)", "muted"), 0, 1)
        self.keys: list[QComboBox] = []
        self.values: list[QLineEdit] = []
        for i in range(AXIS_ROWS):
            combo = QComboBox()
            combo.addItem("—", "")
            for key in self.choices:
                combo.addItem(key, key)
            edit = QLineEdit()
            edit.setPlaceholderText("e.g. W8A16, W8A8" if i == 0 else "")
            combo.currentIndexChanged.connect(lambda _i, c=combo, e=edit: self._key_chosen(c, e))
            edit.textChanged.connect(self._check)
            grid.addWidget(combo, i + 1, 0)
            grid.addWidget(edit, i + 1, 1)
            self.keys.append(combo)
            self.values.append(edit)
        grid.setColumnStretch(1, 1)
        lay.addLayout(grid)
        self.verdict = label("", "muted", wrap=True)
        lay.addWidget(self.verdict)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.name.textChanged.connect(self._check)
        self.best.currentIndexChanged.connect(self._check)
        self.keys[0].setCurrentIndex(max(0, self.keys[0].findData("quantization.scheme")))
        self.resize(640, self.sizeHint().height())
        self._check()

    def _key_chosen(self, combo: QComboBox, edit: QLineEdit) -> None:
        key = combo.currentData()
        allowed = self.choices.get(key) if key else None
        edit.setText(values_text(allowed) if allowed else "")
        if key and not allowed:
            section, leaf = key.split(".", 1)
            edit.setPlaceholderText(f"numbers, e.g. {getattr(self.project, section)[leaf]}")
        self._check()

    def table(self) -> dict[str, Any]:
        """The ``[[sweeps]]`` table as written (not checked)."""
        axes: dict[str, list[Any]] = {}
        for combo, edit in zip(self.keys, self.values, strict=True):
            key, text = combo.currentData(), edit.text().strip()
            if key and text:
                axes[key] = parse_axis_arg(f"{key}={text}")[1]
        return {"name": self.name.text().strip(), "axes": axes,
                "best": self.best.currentData()}

    def check(self) -> str:
        """"" when the table is a valid new sweep, else why not (one line)."""
        try:
            table = self.table()
            if not table["axes"]:
                return "choose at least one setting and its values"
            keys = [c.currentData() for c in self.keys if c.currentData()]
            if len(set(keys)) != len(keys):
                return "each setting can be one axis only"
            if table["name"] in {t["name"] for t in self.project.sweeps}:
                return f"the project already has a sweep named {table['name']!r}"
            spec = parse_spec(table, self.project, where="the sweep")
            for key, values in table["axes"].items():  # each value one the setting takes
                for value in values:
                    try:
                        apply_point(self.project, {key: value})
                    except StudioError as exc:
                        return f"{key} = {value!r}: {exc.message}"
        except StudioError as exc:
            return exc.message
        self.points = spec.size()
        return ""

    def _check(self, *_args) -> None:
        why = self.check()
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setEnabled(not why)
        self.verdict.setText(why or f"{self.points} point{'s' if self.points != 1 else ''}: "
                                    "OK adds the sweep to the project (Undo removes it); run "
                                    "it from the Sweeps page.")
        self.verdict.setProperty("role", "error" if why else "muted")
