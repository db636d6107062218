"""The Precision page's override rules: the table of glob rules (the last matching rule
wins) with add, edit in place, remove and reorder — each one undoable edit, refused with the
reason when the targets' HTP cannot run it (``services.precision.override_refusals``)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTableView,
    QToolButton,
    QVBoxLayout,
)

from studio.core.recipe import PRECISIONS, covers
from studio.services.precision import override_refusals, quantizable
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.widgets import label


class RulesMixin:
    """The override-rule table and its edits (for ``PrecisionPage``)."""

    def _build_rules(self) -> QGroupBox:
        over = QGroupBox("Override rules")  # the box's title never wraps: the rule below does
        ol = QVBoxLayout(over)
        ol.addWidget(label("The last rule that matches a layer wins.", "muted", wrap=True))
        self.overrides = RowsModel(["Pattern", "Precision", "Layers"], self)
        self.over_view = QTableView()
        self.over_view.setModel(self.overrides)
        self.over_view.verticalHeader().hide()
        self.over_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.over_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.over_view.setWordWrap(False)
        hh = self.over_view.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.over_view.setToolTip(
            "Glob patterns on module paths: *.down_proj, model.layers.0 (a whole block); INT8 / "
            "INT16 set activations, INT4 weights, FP16 / FP32 keep the layer in float; a pattern "
            "ending in .weight sets the weights. Select a rule to edit it and see its layers.")
        ol.addWidget(self.over_view, 1)
        add = QHBoxLayout()
        self.pattern = QLineEdit()
        self.pattern.setPlaceholderText("pattern, e.g. *.down_proj")
        self.pattern.returnPressed.connect(self.add_override)
        add.addWidget(self.pattern, 1)
        self.prec = QComboBox()
        self.prec.addItems(list(PRECISIONS))
        self.prec.setCurrentText("INT16")
        add.addWidget(self.prec)
        ol.addLayout(add)
        buttons = QHBoxLayout()
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("Add the rule after the others (or replace the rule with the "
                                   "same pattern)")
        self.add_button.clicked.connect(self.add_override)
        buttons.addWidget(self.add_button)
        self.update_button = QPushButton("Update")
        self.update_button.setToolTip("Replace the selected rule, in its place, by the pattern "
                                      "and precision above")
        self.update_button.clicked.connect(self.update_override)
        buttons.addWidget(self.update_button)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_override)
        buttons.addWidget(self.remove_button)
        self.up_button = QToolButton()
        self.up_button.setText("▲")
        self.up_button.setToolTip("Move the rule up (earlier: later rules win over it)")
        self.up_button.clicked.connect(lambda: self.move_override(-1))
        buttons.addWidget(self.up_button)
        self.down_button = QToolButton()
        self.down_button.setText("▼")
        self.down_button.setToolTip("Move the rule down (later: it wins over earlier rules)")
        self.down_button.clicked.connect(lambda: self.move_override(1))
        buttons.addWidget(self.down_button)
        buttons.addStretch(1)
        ol.addLayout(buttons)
        self.over_view.selectionModel().selectionChanged.connect(self._rule_selected)
        self._rule_buttons()
        return over

    def _selected_rule(self) -> str | None:
        rows = self.over_view.selectionModel().selectedRows()
        return rows[0].data(PayloadRole) if rows else None

    def _rule_buttons(self) -> None:
        rule = self._selected_rule()
        keys = list(self.ctl.project.quantization["overrides"]) if self.ctl.project else []
        for b in (self.update_button, self.remove_button):
            b.setEnabled(rule is not None)
        self.up_button.setEnabled(rule is not None and keys.index(rule) > 0)
        self.down_button.setEnabled(rule is not None and keys.index(rule) < len(keys) - 1)
        self.remove_button.setToolTip("Remove the selected rule" if rule else
                                      "Select a rule to remove it")

    def _rule_selected(self, *_args) -> None:
        rule = self._selected_rule()
        self._rule_buttons()
        if rule is None:
            return
        self.pattern.setText(rule)
        self.prec.setCurrentText(self.ctl.project.quantization["overrides"][rule])
        covered = [n for n in self.grid.model.layers() if covers(rule, n)]
        if covered:
            self.grid.select_layers(covered)

    def _check_rules(self, overrides: dict[str, str], changed: list[str]) -> bool:
        why = [w for w in override_refusals(self.ctl.project, self._info(),
                                            {k: overrides[k] for k in changed})]
        if why:
            self.show_status(f"Refused: {why[0]}. Nothing was changed.", error=True)
            self.error.setText(why[0])
            return False
        return True

    def add_override(self) -> bool:
        pattern = self.pattern.text().strip()
        if not pattern:
            self.error.setText("type a layer-name pattern first, e.g. *.down_proj")
            self.error.show()
            self.show_status("type a layer-name pattern first, e.g. *.down_proj", error=True)
            return False
        prec = self.prec.currentText()
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides.pop(pattern, None)  # added again: it goes last, and so wins
        overrides[pattern] = prec
        if not self._check_rules(overrides, [pattern]):
            return False
        if self._set("quantization", "overrides", overrides, f"Add rule {pattern} = {prec}"):
            self.pattern.clear()
            self.show_status(f"Rule {pattern} = {prec} added (last: it wins over the others).")
            return True
        return False

    def update_override(self) -> bool:
        old = self._selected_rule()
        pattern = self.pattern.text().strip()
        if old is None or not pattern:
            self.show_status("select a rule and type its new pattern first", error=True)
            return False
        prec = self.prec.currentText()
        overrides = {}
        for k, v in self.ctl.project.quantization["overrides"].items():
            if k == old:
                overrides[pattern] = prec
            elif k != pattern:
                overrides[k] = v
        if not self._check_rules(overrides, [pattern]):
            return False
        if self._set("quantization", "overrides", overrides,
                     f"Change rule {old} to {pattern} = {prec}"):
            self.show_status(f"Rule {old} is now {pattern} = {prec}.")
            self._select_rule(pattern)
            return True
        return False

    def remove_override(self) -> None:
        pattern = self._selected_rule()
        if pattern is None:
            return
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides.pop(pattern, None)
        if self._set("quantization", "overrides", overrides, f"Remove rule {pattern}"):
            self.show_status(f"Rule {pattern} removed.")

    def move_override(self, step: int) -> None:
        pattern = self._selected_rule()
        if pattern is None:
            return
        keys = list(self.ctl.project.quantization["overrides"])
        i = keys.index(pattern)
        j = i + step
        if not 0 <= j < len(keys):
            return
        keys[i], keys[j] = keys[j], keys[i]
        values = self.ctl.project.quantization["overrides"]
        if self._set("quantization", "overrides", {k: values[k] for k in keys},
                     f"Move rule {pattern} {'up' if step < 0 else 'down'}"):
            self._select_rule(pattern)

    def _select_rule(self, pattern: str) -> None:
        for r in range(self.overrides.rowCount()):
            if self.overrides.index(r, 0).data(PayloadRole) == pattern:
                self.over_view.selectRow(r)
                return

    def _layer_names(self) -> list[str]:
        info = self._info()
        return [name for name, *_ in quantizable(info)] if info is not None else []

    def _show_overrides(self) -> None:
        overrides = self.ctl.project.quantization["overrides"]
        keep = self._selected_rule()
        names = self._layer_names()
        info = self._info()
        refused = {}
        for pattern, prec in overrides.items():
            why = override_refusals(self.ctl.project, info, {pattern: prec})
            if why:
                refused[pattern] = why[0]
        rows = []
        for pattern, prec in overrides.items():
            n = sum(1 for name in names if covers(pattern, name))
            if pattern in refused:  # e.g. the targets changed since the rule was written
                rows.append(Row([pattern, prec + " ✕", str(n) if names else "?"],
                                payload=pattern, colors={0: "#c62828", 1: "#c62828"},
                                tip=f"The targets cannot run this rule: {refused[pattern]}"))
                continue
            rows.append(
                Row(
                    [pattern, prec, str(n) if names else "?"],
                    payload=pattern,
                    colors={2: "#b26a00"} if names and n == 0 else {},
                    tip="No layer matches; the pattern may still name ONNX nodes (quantize "
                    "fails with a clear message if it names nothing)"
                    if names and n == 0
                    else f"{pattern} = {prec}: covers {n} layer(s)",
                )
            )
        self.over_view.selectionModel().blockSignals(True)
        self.overrides.set_rows(rows)
        self.over_view.selectionModel().blockSignals(False)
        if keep in overrides:
            self._select_rule(keep)
        else:
            self.over_view.clearSelection()
        self._rule_buttons()
