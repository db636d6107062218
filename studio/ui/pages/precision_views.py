"""Views of the Precision page besides the grid: the selection's details, the changes against
the plain scheme, and the before / after comparison of an applied recipe.

Every figure names its source: weight bytes are ``formula`` (parameters × bytes per
parameter), sensitivity figures ``measured`` on the host CPU, validation figures as the run
history recorded them (``measured`` on the host, ``simulated`` on the HTP simulator).
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QStackedWidget,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.modelinfo import ModelInfo, bytes_per_param
from studio.core.units import signed
from studio.services import history
from studio.services import sensitivity as sens
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.figures import (
    COLUMN_TITLES,
    DEVICE_TITLES,
    FIGURE_TIPS,
    FIGURE_TITLES,
    delta_color,
    fmt_delta,
    fmt_figure,
    run_label,
    setting_value,
)
from studio.ui.widgets import BadgeDelegate, EmptyState, SourceBadge, badge_html, human_bytes, label


def _esc(text: str) -> str:
    return html.escape(str(text))


def _signed_bytes(n: float) -> str:
    text = human_bytes(abs(n))
    return text if text == "0 B" else ("+" if n > 0 else "−") + text


# ---- the selection -----------------------------------------------------------------------------
def _sens_lines(entry: dict[str, Any], data: dict[str, Any]) -> list[str]:
    out = []
    for direction, verb in (("raise", "raised"), ("lower", "lowered")):
        d = entry.get(direction)
        if not d:
            continue
        delta = d.get("delta", {})
        out.append(
            f"{verb} alone to <b>{_esc(d.get('precision', '?'))}</b>: KL to FP32 "
            f"{signed(delta.get('kl_divergence', 0), '.3g', '−')} nats, perplexity "
            f"{signed(delta.get('perplexity', 0), '.3g', '−')}, logits cosine "
            f"{signed(delta.get('logits_cosine', 0), '.2e', '−')}"
        )
    htp = sens.htp_figures(data, entry["name"])
    if htp is not None:
        d = htp.get("delta", {})
        out.append(f"on the HTP simulator ({_esc(htp['chip'])}), raised to "
                   f"<b>{_esc(htp.get('precision', '?'))}</b>: KL to FP32 "
                   f"{signed(d.get('kl_divergence', 0), '.3g', '−')} nats "
                   f"{badge_html(htp['source'])}")
    held = data.get("heldout", {})
    out.append(f"{badge_html(data.get('source', 'measured'))} on {_esc(data.get('device', ''))}: "
               f"changes against {_esc(data.get('scheme', '?'))} with no overrides, "
               f"{held.get('tokens', '?')} held-out tokens, {data.get('graph', 'prefill')} graph")
    return out


def selection_html(rows: list[dict[str, Any]], info: ModelInfo | None,
                   result: dict[str, Any] | None) -> str:
    """What the side panel says about the selected cells (rich text)."""
    if not rows:
        return ("<i>Select cells to see their precision and the rule that set it: click a cell, "
                "drag or Ctrl-click for several, click a header for a whole column or block. "
                "Right-click for the precision menu.</i>")
    params = {lay.name: lay.params for lay in info.layers} if info is not None else {}
    data = (result or {}).get("data")
    if len(rows) == 1:
        r = rows[0]
        lines = [f"<b>{_esc(r['layer'])}</b>"]
        kind = r["kind"] + (f" — {_esc(r['description'])}" if r.get("description") else "")
        block = "outside the blocks" if r["block"] is None else f"block {r['block']}"
        lines.append(f"{_esc(kind)}, {block}")
        if r["weight"]:
            n = params.get(r["layer"], 0)
            size = (f"; {n:,} parameters = {human_bytes(n * bytes_per_param(r['weight']))} "
                    f"{badge_html('formula')}" if n else "")
            lines.append(f"weights <b>{r['weight']}</b> — set by {_esc(r['weight_rule'])}{size}")
        else:
            lines.append("weights: none (no weight tensor to quantize)")
        lines.append(f"activations <b>{r['activation']}</b> — set by "
                     f"{_esc(r['activation_rule'])}")
        if r.get("tied_to"):
            lines.append(f"shares its weight with {_esc(r['tied_to'])} (counted there)")
        if data is not None:
            entry = sens.layer_figures(data, r["layer"])
            if entry is not None:
                lines.append("<br><b>Sensitivity</b>")
                lines += _sens_lines(entry, data)
            else:
                lines.append("<br><i>Sensitivity: not analysed (the analysis varies the layers "
                             "with weights and the key activations)</i>")
        return "<br>".join(lines)
    combos: dict[str, int] = {}
    for r in rows:
        key = (f"W {r['weight']} · A {r['activation']}" if r["weight"]
               else f"A {r['activation']} (no weights)")
        combos[key] = combos.get(key, 0) + 1
    n_params = sum(params.get(r["layer"], 0) for r in rows if r["weight"])
    wbytes = sum(params.get(r["layer"], 0) * bytes_per_param(r["weight"])
                 for r in rows if r["weight"])
    ruled = sum(1 for r in rows if r["weight_rule"].startswith("override")
                or r["activation_rule"].startswith("override"))
    lines = [f"<b>{len(rows)} layers selected</b>"]
    lines += [f"{n} × {_esc(k)}" for k, n in sorted(combos.items(), key=lambda kv: -kv[1])]
    lines.append(f"{ruled} set by override rules, {len(rows) - ruled} by the scheme")
    if n_params:
        lines.append(f"weights: {n_params:,} parameters = {human_bytes(wbytes)} "
                     f"{badge_html('formula')}")
    names = [r["layer"] for r in rows]
    shown = ", ".join(_esc(n) for n in names[:6]) + (f", … ({len(names) - 6} more)"
                                                      if len(names) > 6 else "")
    lines.append(f"<span style='color:#7a7f87'>{shown}</span>")
    if data is not None:
        values = sens.heat(data)
        got = [values[n] for n in names if n in values]
        if got:
            lines.append(f"sensitivity (KL drop when raised): largest {max(got):.3g} nats, "
                         f"sum {sum(got):.3g} over {len(got)} analysed layer(s) "
                         f"{badge_html(data.get('source', 'measured'))}")
    return "<br>".join(lines)


# ---- changes against the plain scheme -----------------------------------------------------------
DIFF_COLUMNS = ["Layer", "Weights", "Activations", "Set by", "MatMul weight bytes"]


def diff_summary(diff: dict[str, Any]) -> str:
    """One line: how many layers differ from the scheme and what it does to weight bytes."""
    c, wb = diff["counts"], diff["weight_bytes"]
    if not c["layers"]:
        return f"Every layer has the plain {diff['scheme']} precisions (no override changes one)."
    return (f"{c['layers']} layer(s) differ from plain {diff['scheme']} ({c['weights']} in their "
            f"weights, {c['activations']} in their activations); MatMul weight bytes "
            f"{human_bytes(wb['recipe'])} vs {human_bytes(wb['base'])} "
            f"({_signed_bytes(wb['change'])})")


def diff_rows(diff: dict[str, Any]) -> list[Row]:
    rows = []
    for d in diff["layers"]:
        w = (f"{d['base_weight']} → {d['weight']}" if d["weight"] != d["base_weight"]
             else d["weight"] or "—")
        a = (f"{d['base_activation']} → {d['activation']}"
             if d["activation"] != d["base_activation"] else d["activation"])
        rules = {d["weight_rule"], d["activation_rule"]} - {""}
        rule = "; ".join(sorted(r for r in rules if r.startswith("override"))) or "scheme"
        change = d["weight_bytes_change"]
        rows.append(Row([d["layer"], w, a, rule, _signed_bytes(change) if change else "—"],
                        payload=d["layer"], align_right=(4,),
                        colors={4: "#1b8a3f" if change < 0 else "#c62828"} if change else {},
                        tip="MatMul weight bytes: the layer's parameters × bytes per "
                            "parameter (formula)"))
    return rows


class DiffView(QWidget):
    """The layers whose precision differs from the plain scheme (the grid marks them too)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        head = QHBoxLayout()
        self.summary = label("", wrap=True, selectable=True)
        head.addWidget(self.summary, 1)
        self.badge = SourceBadge("formula", "weight bytes = parameters × bytes per parameter "
                                 "of each layer's weight precision (studio.core.modelinfo)")
        head.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(head)
        self.model = RowsModel(DIFF_COLUMNS, self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.verticalHeader().hide()
        self.view.setWordWrap(False)
        self.view.setAlternatingRowColors(True)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.view.horizontalHeader().setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        lay.addWidget(self.view, 1)
        lay.addWidget(label("MatMul weight bytes count the MatMul weights the recipe sets (the "
                            "embedding table and the norms are not quantized as weights: the "
                            "Overview's checkpoint weights count every parameter, the Memory "
                            "tab's graph weights what a graph stores). Double-click a row to "
                            "select the layer in the grid.", "muted", wrap=True))

    def show_diff(self, diff: dict[str, Any]) -> None:
        self.summary.setText(diff_summary(diff))
        self.model.set_rows(diff_rows(diff))

    def layer_at(self, index) -> str | None:
        return index.data(PayloadRole)


# ---- before / after -------------------------------------------------------------------------------
COMPARE_COLUMNS = ["Target", "Figure", "Where", "Source", "Before", "After", "Change"]


def compare_rows(cmp: dict[str, Any], sources: dict[str, Any]) -> list[Row]:
    """The validation figures of two runs side by side (``history.validation_compare``)."""
    rows = []
    for target, items in cmp.get("targets", {}).items():
        for r in items:
            src = sources.get(target, {}).get(r["column"], {})
            device = src.get("device", "")
            where = f"{COLUMN_TITLES.get(r['column'], r['column'])} · " + DEVICE_TITLES.get(
                device.split(":", 1)[0], device)
            fig = r["figure"]
            rows.append(Row(
                [target, FIGURE_TITLES.get(fig, fig), where, src.get("source", ""),
                 fmt_figure(fig, r["previous"]), fmt_figure(fig, r["value"]),
                 fmt_delta(fig, r["delta"], r["relative"])],
                tip=FIGURE_TIPS.get(fig, fig), colors={6: delta_color(r["better"])},
                align_right=(4, 5, 6)))
    return rows


class BeforeAfterView(QWidget):
    """The validation figures of the last run before an edit next to the run that applied it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        self.stack = QStackedWidget()
        lay.addWidget(self.stack)
        self.empty = EmptyState(
            "Nothing applied yet",
            "Edit the recipe, then press <b>Apply</b>: it queues quantize → compile → validate "
            "(the cached export is reused) and shows here the validation figures of the last run "
            "before your edit next to the new run's, each with its source.")
        self.empty.text.setMinimumWidth(480)
        self.stack.addWidget(self.empty)
        page = QWidget()
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        self.runs = label("", wrap=True, selectable=True)
        self.runs.setTextFormat(Qt.TextFormat.RichText)
        pl.addWidget(self.runs)
        self.model = RowsModel(COMPARE_COLUMNS, self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.verticalHeader().hide()
        self.view.setWordWrap(False)
        self.view.setAlternatingRowColors(True)
        self.view.setItemDelegateForColumn(3, BadgeDelegate(self.view))
        self.view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.view.horizontalHeader().setStretchLastSection(False)
        pl.addWidget(self.view, 1)
        self.note = label("Before: the newest run with validation figures before the edit. "
                          "Change: after minus before (green better, red worse). HTP figures "
                          "come from the QNN HTP simulator: real HTP numerics on this machine, "
                          "not a device.", "muted", wrap=True)
        pl.addWidget(self.note)
        self.stack.addWidget(page)
        self.shown: tuple[int | None, int] | None = None

    def show_empty(self, text: str | None = None) -> None:
        if text:
            self.empty.set_text("Nothing to compare yet", text)
        self.stack.setCurrentIndex(0)
        self.shown = None

    def show_runs(self, project, jobs, after: int, before: int | None, why: str = "") -> None:
        cmp = history.validation_compare(jobs, after, before)
        sources = history.validation_sources(jobs, after)
        a = history.run_info(project, jobs, after)
        b = history.run_info(project, jobs, before) if before is not None else None
        lines = []
        if why:
            lines.append(f"<i>{_esc(why)}</i>")
        none = "no earlier run with validation figures (the After column stands alone)"
        lines.append("<b>Before:</b> " + (_esc(run_label(b)) if b else none))
        lines.append("<b>After:</b> " + (_esc(run_label(a)) if a else f"run {after}"))
        if cmp.get("settings"):
            changed = "; ".join(f"{_esc(s['key'])}: {_esc(setting_value(s['a']))} → "
                                f"{_esc(setting_value(s['b']))}" for s in cmp["settings"][:4])
            lines.append(f"<b>Settings changed:</b> {changed}")
        self.runs.setText("<br>".join(lines))
        self.model.set_rows(compare_rows(cmp, sources))
        self.stack.setCurrentIndex(1)
        self.shown = (before, after)
