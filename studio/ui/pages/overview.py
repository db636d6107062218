"""Overview: the model card, the targets, the recipe and the latest results with their source."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.project import STAGES
from studio.services import ui_support
from studio.ui.pages.base import Page
from studio.ui.widgets import (
    ChipList,
    MetricCard,
    SourceBadge,
    fmt_value,
    human_bytes,
    human_count,
    label,
)

METRIC_TITLES = {
    "export_seconds": "export time",
    "quantize_seconds": "quantize time",
    "compile_seconds": "compile time",
    "logits_cosine_mean": "logits cosine vs FP32",
    "logits_max_abs_error": "max logit error",
    "top1_agreement": "top-1 agreement",
    "perplexity_quantized": "perplexity (quantized)",
    "perplexity_fp32": "perplexity (FP32)",
    "perplexity_host_qdq": "perplexity (host QDQ)",
    "greedy_agreement": "greedy token agreement",
    "prefill_ms": "prefill",
    "decode_ms_per_token": "decode per token",
    "decode_tokens_per_s": "decode speed",
    "profiled_ops": "profiled ops",
}


def metric_title(name: str) -> str:
    return METRIC_TITLES.get(name, name.replace("_", " "))


def _clear(layout) -> None:
    while layout.count():
        item = layout.takeAt(0)
        w = item.widget()
        if w is not None:
            w.deleteLater()
        elif item.layout() is not None:
            _clear(item.layout())


class TargetsDialog(QDialog):
    """Pick the project's target chips from the catalog."""

    def __init__(self, current: list[str], parent=None):
        super().__init__(parent)
        self.setWindowTitle("Target chips")
        lay = QVBoxLayout(self)
        lay.addWidget(label("Compile, validate, run and profile for these chips:", wrap=True))
        self.list = ChipList(current)
        lay.addWidget(self.list)
        box = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        lay.addWidget(box)
        self.resize(520, 420)

    def chosen(self) -> list[str]:
        return self.list.checked()


class OverviewPage(Page):
    title = "Overview"
    subtitle = "The model, where it goes, how it is quantized, and what the last runs measured."

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        outer = QVBoxLayout(self.body)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        outer.addWidget(scroll)
        inner = QWidget()
        scroll.setWidget(inner)
        lay = QVBoxLayout(inner)
        lay.setContentsMargins(0, 8, 4, 8)

        self.file_label = label("", "muted", wrap=True, selectable=True)
        lay.addWidget(self.file_label)

        top = QHBoxLayout()
        # model card
        self.model_box = QGroupBox("Model")
        ml = QVBoxLayout(self.model_box)
        self.model_status = label("Reading the model…", "muted", wrap=True)
        ml.addWidget(self.model_status)
        self.model_grid = QGridLayout()
        self.model_grid.setHorizontalSpacing(18)
        ml.addLayout(self.model_grid)
        self.bytes_grid = QGridLayout()
        self.bytes_grid.setHorizontalSpacing(18)
        ml.addLayout(self.bytes_grid)
        ml.addStretch(1)
        top.addWidget(self.model_box, 3)

        right = QVBoxLayout()
        self.targets_box = QGroupBox("Targets")
        tl = QVBoxLayout(self.targets_box)
        self.targets_layout = QVBoxLayout()
        tl.addLayout(self.targets_layout)
        self.targets_button = QPushButton("Change targets…")
        self.targets_button.setToolTip("Choose the target chips from the catalog (undoable)")
        self.targets_button.clicked.connect(self.change_targets)
        tl.addWidget(self.targets_button, 0, Qt.AlignmentFlag.AlignLeft)
        right.addWidget(self.targets_box)
        self.recipe_box = QGroupBox("Recipe")
        rl = QVBoxLayout(self.recipe_box)
        self.recipe_label = label("", wrap=True)
        self.recipe_label.setTextFormat(Qt.TextFormat.RichText)
        rl.addWidget(self.recipe_label)
        self.edit_recipe = QPushButton("Edit on the Precision page")
        self.edit_recipe.clicked.connect(lambda: self.navigate.emit("Precision"))
        rl.addWidget(self.edit_recipe, 0, Qt.AlignmentFlag.AlignLeft)
        right.addWidget(self.recipe_box)
        right.addStretch(1)
        top.addLayout(right, 2)
        lay.addLayout(top)

        self.results_box = QGroupBox("Latest results")
        self.results_layout = QVBoxLayout(self.results_box)
        lay.addWidget(self.results_box)
        lay.addStretch(1)

        ctl.model_ready.connect(self._show_model)
        ctl.job_event.connect(self._on_job)

    # ---- session --------------------------------------------------------------------------
    def on_show(self) -> None:
        self._show_results()

    def on_open(self) -> None:
        p = self.ctl.project
        self.title_label.setText(p.name)
        self.subtitle_label.setText(self.subtitle)
        self.file_label.setText(f"{p.path}   ·   model: {p.model['source']}")
        self.model_status.setText("Reading the model…")
        self.model_status.show()
        _clear(self.model_grid)
        _clear(self.bytes_grid)
        self._show_targets()
        self._show_recipe()
        self._show_results()
        if self.ctl.model is not None:
            self._show_model(self.ctl.model)
        else:
            self.ctl.load_model()

    def on_close(self) -> None:
        self.title_label.setText(self.title)

    def on_change(self, change) -> None:
        sections = {s for s, _ in change}
        keys = {k for _, k in change}
        if "" in sections and "targets" in keys:
            self._show_targets()
        if "" in sections and "name" in keys:
            self.title_label.setText(self.ctl.project.name)
        if sections & {"quantization", "export", "pipeline"}:
            self._show_recipe()
        if "export" in sections and isinstance(self.ctl.model, ModelInfo):
            self._show_model(self.ctl.model)

    def _on_job(self, job) -> None:
        if job.state == "succeeded":
            self.later(self._show_results, 300)

    # ---- model card -------------------------------------------------------------------------
    def _show_model(self, info) -> None:
        if self.ctl.studio is None:
            return
        _clear(self.model_grid)
        _clear(self.bytes_grid)
        if isinstance(info, StudioError):
            self.model_status.setProperty("role", "error")
            self.model_status.setText(f"Cannot read the model: {info.message}")
            self.model_status.style().polish(self.model_status)
            self.model_status.show()
            return
        self.model_status.setProperty("role", "muted")
        self.model_status.style().polish(self.model_status)
        if isinstance(info, ModelInfo):
            self._model_card(info)
        else:
            self._onnx_card(info)

    def _row(self, grid: QGridLayout, r: int, name: str, value: str, tip: str = "") -> None:
        k = label(name, "muted")
        v = label(value, selectable=True)
        if tip:
            v.setToolTip(tip)
        grid.addWidget(k, r, 0)
        grid.addWidget(v, r, 1)

    def _model_card(self, info: ModelInfo) -> None:
        self.model_status.setText(
            f"{info.architecture} ({info.family}) — counted from the checkpoint's config and "
            "weight headers; no weights loaded."
        )
        g = self.model_grid
        rows = [
            (
                "Parameters",
                f"{info.parameters:,} ({human_count(info.parameters)})",
                "tied embedding / lm_head counted once" if info.tied_embeddings else "",
            ),
            ("Layers (blocks)", str(info.num_layers), ""),
            ("Hidden / MLP size", f"{info.hidden_size} / {info.intermediate_size}", ""),
            (
                "Heads / KV heads",
                f"{info.num_heads} / {info.num_kv_heads}"
                + (
                    f"  (GQA: {info.gqa_group} query heads per KV head)"
                    if info.gqa_group > 1
                    else ""
                ),
                "",
            ),
            ("Head dim", str(info.head_dim), ""),
            ("Vocabulary", f"{info.vocab_size:,}", ""),
            ("Max positions", f"{info.max_positions:,}", ""),
            ("Stored dtype", info.dtype or "?", ""),
        ]
        for r, (k, v, tip) in enumerate(rows):
            self._row(g, r, k, v, tip)
        g.setColumnStretch(1, 1)
        b = self.bytes_grid
        head = QHBoxLayout()
        head.addWidget(label("<b>Weight bytes</b> by precision"))
        head.addWidget(SourceBadge("formula", "parameters × bytes per parameter"))
        head.addStretch(1)
        b.addLayout(head, 0, 0, 1, 5)
        for c, (prec, n) in enumerate(info.weight_bytes_by_precision().items()):
            b.addWidget(label(prec, "muted"), 1, c)
            v = label(human_bytes(n), selectable=True)
            v.setToolTip(f"{n:,} bytes")
            b.addWidget(v, 2, c)
        ctx = int(self.ctl.project.export["context_length"])
        fp16 = info.kv_cache_bytes(ctx, 2)
        int8 = info.kv_cache_bytes(ctx, 1)
        mha = 2 * info.num_layers * info.num_heads * info.head_dim * ctx * 2
        kv = QHBoxLayout()
        kv.addWidget(label(f"<b>KV cache</b> at the project's context length {ctx}"))
        kv.addWidget(SourceBadge("formula", "2 × layers × KV heads × head dim × context × bytes"))
        kv.addStretch(1)
        b.addLayout(kv, 3, 0, 1, 5)
        b.addWidget(label("FP16", "muted"), 4, 0)
        b.addWidget(label("INT8", "muted"), 4, 1)
        b.addWidget(label("without GQA (FP16)", "muted"), 4, 2, 1, 2)
        b.addWidget(label(human_bytes(fp16), selectable=True), 5, 0)
        b.addWidget(label(human_bytes(int8), selectable=True), 5, 1)
        b.addWidget(label(human_bytes(mha), selectable=True), 5, 2, 1, 2)
        formula = label(
            f"2 (K,V) × {info.num_layers} layers × {info.num_kv_heads} KV heads × "
            f"{info.head_dim} head dim × {ctx} tokens × 2 bytes = {fp16:,} bytes",
            "muted",
            wrap=True,
            selectable=True,
        )
        b.addWidget(formula, 6, 0, 1, 5)

    def _onnx_card(self, graph: ui_support.OnnxGraph) -> None:
        self.model_status.setText(
            f"ONNX model {graph.path.name} (opset {graph.opset}). The LLM pipeline starts from a "
            "Hugging Face checkpoint; this model can be inspected on the Model page."
        )
        ops: dict[str, int] = {}
        for n in graph.nodes:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
        rows = [
            ("Parameters", f"{graph.parameters:,} ({human_count(graph.parameters)})"),
            ("Nodes", f"{len(graph.nodes):,}"),
            ("Most common ops", top),
            ("Inputs", ", ".join(f"{n} {s}" for n, s in graph.inputs[:4])),
            ("Outputs", ", ".join(f"{n} {s}" for n, s in graph.outputs[:4])),
        ]
        for r, (k, v) in enumerate(rows):
            self._row(self.model_grid, r, k, v)

    # ---- targets and recipe -----------------------------------------------------------------
    def _show_targets(self) -> None:
        from studio.core.catalog import get_chip

        _clear(self.targets_layout)
        for key in self.ctl.project.targets:
            try:
                chip = get_chip(key)
            except StudioError as exc:
                self.targets_layout.addWidget(label(exc.message, "error", wrap=True))
                continue
            row = label(
                f"<b>{chip.name}</b> — {chip.soc or key}, HTP v{chip.htp_arch}, "
                f"{chip.vtcm_mb} MB VTCM",
                wrap=True,
            )
            row.setToolTip(chip.notes)
            self.targets_layout.addWidget(row)
            for w in chip.warnings():
                warn = label("⚠ " + w.split(": ", 1)[-1], "muted", wrap=True)
                self.targets_layout.addWidget(warn)

    def _show_recipe(self) -> None:
        p = self.ctl.project
        q, e = p.quantization, p.export
        n_over = len(q["overrides"])
        self.recipe_label.setText(
            f"<b>{q['scheme']}</b>, {q['weight_granularity'].replace('_', '-')} weights, "
            f"{q['calibration_samples']} calibration windows"
            f"{f', {n_over} per-layer override(s)' if n_over else ''}<br>"
            f"prompt length {e['prompt_length']}, context length {e['context_length']}<br>"
            f"stages: {', '.join(s for s in STAGES if s in p.pipeline['stages'])}"
        )

    def change_targets(self) -> None:
        dlg = TargetsDialog(list(self.ctl.project.targets), self)
        if dlg.exec() != QDialog.DialogCode.Accepted:
            return
        chosen = dlg.chosen()
        if chosen == list(self.ctl.project.targets):
            return
        try:
            self.ctl.set("", "targets", chosen)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)

    # ---- results ------------------------------------------------------------------------------
    def _show_results(self) -> None:
        _clear(self.results_layout)
        runs = self.ctl.studio.jobs.runs(1)
        if runs:
            r = runs[0]
            color = {"succeeded": "#1b8a3f", "failed": "#c62828"}.get(r["state"], "#9a6700")
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
            self.results_layout.addWidget(
                label(
                    f"Last run: #{r['id']} <span style='color:{color}'><b>{r['state']}</b></span>, "
                    f"started {when} — details on the Jobs page"
                )
            )
        pairs = ui_support.latest_metrics(self.ctl.studio.jobs)
        if not pairs:
            self.results_layout.addWidget(
                label(
                    "No results yet. Run the pipeline (Jobs page, or Run ▸ Run Pipeline, F5): export "
                    "and quantize report their times (measured on this machine), validate reports "
                    "accuracy on the HTP simulator (simulated), run reports tokens per second "
                    "(measured on the CPU, simulated on the HTP simulator). Every figure shows its "
                    "source.",
                    "empty-text",
                    wrap=True,
                )
            )
            go = QPushButton("Go to Jobs")
            go.clicked.connect(lambda: self.navigate.emit("Jobs"))
            self.results_layout.addWidget(go, 0, Qt.AlignmentFlag.AlignLeft)
            return
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(8)
        cols = 4
        for i, (job, m) in enumerate(pairs):
            where = job.label + (" (cached)" if job.cached else "") + f" · {m.device}"
            card = MetricCard(
                metric_title(m.name), fmt_value(m.value, m.unit), m.source, where, m.detail
            )
            card.setToolTip(
                f"{m.name} from job #{job.id} ({job.label})" + (f"\n{m.detail}" if m.detail else "")
            )
            grid.addWidget(card, i // cols, i % cols)
        for c in range(cols):
            grid.setColumnStretch(c, 1)
        self.results_layout.addLayout(grid)
        self.results_layout.addWidget(
            label(
                "measured: timed on the named device · simulated: QNN HTP simulator on this x86 "
                "machine — real HTP numerics, but its times follow the host CPU and are not device "
                "latency · estimated: the studio's performance model · imported: from your files. "
                "Each card shows the newest job of its stage.",
                "muted",
                wrap=True,
            )
        )


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(OverviewPage)


if __name__ == "__main__":
    raise SystemExit(main())
