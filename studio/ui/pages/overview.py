"""Overview: the model card, the targets, the recipe and the latest results with their source."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt, QTimer
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

from studio.core import figures
from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.services import history, projects
from studio.ui.loading import LatestLoad
from studio.ui.pages.base import Page
from studio.ui.pages.cards import CardGrid, FigureCard
from studio.ui.pages.figures import fmt_card, metric_tip, metric_title, when
from studio.ui.stages import places_nodes, project_stages
from studio.ui.standalone import run_page
from studio.ui.theme import STATE_COLORS
from studio.ui.widgets import (
    ChipList,
    SourceBadge,
    clear_layout,
    human_bytes,
    human_count,
    label,
)


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
    key = "overview"

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
        top.addWidget(self._build_model_box(), 3)
        top.addLayout(self._build_side(), 2)
        lay.addLayout(top)
        lay.addWidget(self._build_results())
        lay.addStretch(1)
        self.scroll = scroll
        self._run: history.RunInfo | None = None
        self._card_jobs: list = []
        self._keys: dict[str, str] | None = None
        self._keys_error = ""
        self._keys_load = LatestLoad(ctl)
        self._keys_timer = QTimer(self)
        self._keys_timer.setSingleShot(True)
        self._keys_timer.setInterval(300)
        self._keys_timer.timeout.connect(self.check_stale)

        ctl.model_ready.connect(self._show_model)
        ctl.run_state.connect(self._on_run_state)

    # ---- building the page ----------------------------------------------------------------
    def _build_model_box(self) -> QGroupBox:
        """The model card: what the checkpoint or graph holds, and its bytes."""
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
        return self.model_box

    def _build_side(self) -> QVBoxLayout:
        """The targets and the recipe."""
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
        self.edit_recipe.clicked.connect(lambda: self.navigate.emit("precision"))
        rl.addWidget(self.edit_recipe, 0, Qt.AlignmentFlag.AlignLeft)
        right.addWidget(self.recipe_box)
        right.addStretch(1)
        return right

    def _build_results(self) -> QGroupBox:
        """The project's current figures (the newest of each stage), one card each, with
        their sources and runs."""
        self.results_box = QGroupBox("Results")
        rl = self.results_layout = QVBoxLayout(self.results_box)
        self.run_label = label("", wrap=True)
        self.run_label.setTextFormat(Qt.TextFormat.RichText)
        rl.addWidget(self.run_label)
        rl.addWidget(self._build_stale_banner())
        self.keys_note = label("", "muted", wrap=True)
        self.keys_note.hide()
        rl.addWidget(self.keys_note)
        self.cards = CardGrid()
        rl.addWidget(self.cards)
        rl.addWidget(self._build_no_results())
        self.legend = label(
            "measured: timed on the named device · simulated: QNN HTP simulator on this x86 "
            "machine — real HTP numerics, but its times follow the host CPU and are not device "
            "latency · estimated: the studio's performance model · imported: from your files. "
            "Each card names the run it comes from: the newest figure of its stage for the "
            "current settings; runs are compared on the Validation page.",
            "muted",
            wrap=True,
        )
        rl.addWidget(self.legend)
        return self.results_box

    def _build_stale_banner(self) -> QFrame:
        """Shown when the project changed since the run the cards come from."""
        self.stale_banner = QFrame()
        self.stale_banner.setProperty("role", "banner")
        sb = QHBoxLayout(self.stale_banner)
        sb.setContentsMargins(8, 4, 8, 4)
        self.stale_text = label("", wrap=True)
        sb.addWidget(self.stale_text, 1)
        self.rerun_button = QPushButton("Run again")
        self.rerun_button.setToolTip("Run the stages whose figures no longer match the project "
                                     "(unchanged ones are cached)")
        self.rerun_button.clicked.connect(self.run_again)
        sb.addWidget(self.rerun_button, 0, Qt.AlignmentFlag.AlignVCenter)
        self.stale_banner.hide()
        return self.stale_banner

    def _build_no_results(self) -> QWidget:
        """Before the first run with figures: what each stage will show."""
        self.no_results = QWidget()
        nl = QVBoxLayout(self.no_results)
        nl.setContentsMargins(0, 0, 0, 0)
        nl.addWidget(
            label(
                "No results yet. Run the pipeline (Jobs page, or Run ▸ Run Pipeline, F5): export "
                "and quantize report their times (measured on this machine), validate reports "
                "accuracy on the HTP simulator (simulated), run reports the speed (tokens per "
                "second, or time per inference for a graph; measured on the CPU, on remote agents "
                "and on phones over adb, simulated on the HTP simulator). Every figure shows its "
                "source and the run it comes from.",
                "empty-text",
                wrap=True,
            )
        )
        go = QPushButton("Go to Jobs")
        go.clicked.connect(lambda: self.navigate.emit("jobs"))
        nl.addWidget(go, 0, Qt.AlignmentFlag.AlignLeft)
        return self.no_results

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
        clear_layout(self.model_grid)
        clear_layout(self.bytes_grid)
        self._show_targets()
        self._show_recipe()
        self._show_results()
        if self.ctl.model is not None:
            self._show_model(self.ctl.model)
        else:
            self.ctl.load_model()

    def on_close(self) -> None:
        self.title_label.setText(self.title)
        self._keys_load.drop()
        self._keys = None
        self._run = None

    def on_change(self, change) -> None:
        self._keys_timer.start()  # the project changed: are the figures still its own?
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

    def _on_run_state(self, _run_id: int, _state: str) -> None:
        """A run that starts or ends (even one that recorded nothing) changes the run line."""
        self.later(self._show_results, 300)

    def on_job_event(self, job) -> None:
        if job.state == "succeeded":
            self.later(self._show_results, 300)

    # ---- model card -------------------------------------------------------------------------
    def _show_model(self, info) -> None:
        if self.ctl.studio is None:
            return
        clear_layout(self.model_grid)
        clear_layout(self.bytes_grid)
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
        title = label("<b>Checkpoint weights</b> by precision")
        title.setToolTip(figures.tip("checkpoint_weight_bytes"))
        head.addWidget(title)
        head.addWidget(SourceBadge("formula", "parameters × bytes per parameter"))
        head.addStretch(1)
        b.addLayout(head, 0, 0, 1, 5)
        for c, (prec, n) in enumerate(info.weight_bytes_by_precision().items()):
            b.addWidget(label(prec, "muted"), 1, c)
            v = label(human_bytes(n), selectable=True)
            v.setToolTip(f"{n:,} bytes")
            b.addWidget(v, 2, c)
        p = self.ctl.project
        ctx = int(p.export["context_length"])
        io, kvq = p.htp["graph_io"], p.quantization["kv_cache"]
        dtype, nbytes = figures.kv_cache_dtype(io, kvq)
        deployed = info.kv_cache_bytes(ctx, nbytes)
        mha = 2 * info.num_layers * info.num_heads * info.head_dim * ctx * nbytes
        kv = QHBoxLayout()
        kv_title = label(f"<b>{figures.title('kv_cache_device_bytes')}</b> at the project's "
                         f"context length {ctx}")
        kv_title.setToolTip(figures.tip("kv_cache_device_bytes"))
        kv.addWidget(kv_title)
        kv.addWidget(SourceBadge("formula", "2 × layers × KV heads × head dim × context × bytes"))
        kv.addStretch(1)
        b.addLayout(kv, 3, 0, 1, 5)
        how = ("INT8 KV cache" if kvq == "int8" else
               "quantized graph I/O" if io == "quantized" else "float graph I/O")
        b.addWidget(label(f"{dtype} ({how})", "muted"), 4, 0, 1, 2)
        b.addWidget(label(f"without GQA ({dtype})", "muted"), 4, 2, 1, 2)
        value = label(figures.fmt("kv_cache_device_bytes", deployed), selectable=True)
        value.setObjectName("kv_cache_device_bytes")
        b.addWidget(value, 5, 0, 1, 2)
        b.addWidget(label(human_bytes(mha), selectable=True), 5, 2, 1, 2)
        formula = label(
            f"2 (K,V) × {info.num_layers} layers × {info.num_kv_heads} KV heads × "
            f"{info.head_dim} head dim × {ctx} tokens × {nbytes} byte"
            f"{'s' if nbytes > 1 else ''} ({dtype}) = {deployed:,} bytes; the host runtime "
            "holds its own (the Playground says which)",
            "muted",
            wrap=True,
            selectable=True,
        )
        b.addWidget(formula, 6, 0, 1, 5)

    def _onnx_card(self, graph: projects.OnnxGraph) -> None:
        self.model_status.setText(
            f"ONNX model {graph.path.name} (opset {graph.opset}): quantized on its calibration "
            "samples and placed on each target's NPU (the Placement page); its nodes are on "
            "the Model page."
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
        clear_layout(self.targets_layout)
        for key in self.ctl.project.targets:
            try:
                chip = get_chip(key)
            except StudioError as exc:
                self.targets_layout.addWidget(label(exc.message, "error", wrap=True))
                continue
            row = label(
                f"<b>{chip.name}</b> — {chip.soc or key}, HTP v{chip.htp_arch}, "
                f"{chip.vtcm_mb} MiB VTCM",
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
        kind = p.model["kind"]
        if not places_nodes(p):
            shape = (f"{q['calibration_samples']} calibration windows"
                     f"{f', {n_over} per-layer override(s)' if n_over else ''}<br>"
                     f"prompt length {e['prompt_length']}, context length "
                     f"{e['context_length']}<br>")
        else:
            g = p.graph
            shape = (f"up to {q['calibration_samples']} calibration samples, placement "
                     f"<b>{q['placement']}</b><br>{kind}: "
                     + (f"sequence length {g['seq_len']}" if kind == "encoder" else
                        ", ".join(f"{k} {v}" for k, v in g["shapes"].items())
                        or "the shapes the file declares") + "<br>")
        self.recipe_label.setText(
            f"<b>{q['scheme']}</b>, {q['weight_granularity'].replace('_', '-')} weights, "
            + shape + f"stages: {', '.join(s for s in project_stages(p) if s in p.pipeline['stages'])}"
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
        """The project's current figures, then whether they still match it (the keys are
        computed in a thread; the cards are assembled again with them)."""
        self._assemble()
        self.check_stale()

    def _assemble(self) -> None:
        """The newest figures of each stage (and target) for the current settings, each card
        naming its run (:func:`studio.services.history.current_results`): a one-stage run
        leaves the other stages' figures in place."""
        studio = self.ctl.studio
        rows = history.current_results(studio.jobs, self._keys, studio.store)
        newest = studio.jobs.runs(1)
        run = runs_of = None
        if rows:
            runs_of = sorted({job.run_id for job, _ in rows}, reverse=True)
            run = history.run_info(studio.project, studio.jobs, runs_of[0])
        self._run = run
        has = bool(rows)
        self.no_results.setVisible(not has)
        self.cards.setVisible(has)
        self.legend.setVisible(has)
        latest = ""
        if newest:
            r = newest[0]
            info = history.run_info(studio.project, studio.jobs, r["id"])
            asked = ", ".join(info.stages) if info and info.stages else "the project's stages"
            latest = (f"Newest run: Run {r['id']} {self._state(r['state'])}, started "
                      f"{when(r['created'])}, asked for {asked}"
                      + ("" if runs_of and r["id"] in runs_of else
                         " — it recorded no figures; details on the Jobs page"))
        if not has:
            self.results_box.setTitle("Results")
            self._card_jobs = []
            self.cards.set_cards([])
            self.stale_banner.hide()
            self.run_label.setText(latest)
            self.run_label.setVisible(bool(newest))
            return
        assert runs_of is not None
        if len(runs_of) == 1:
            self.results_box.setTitle(f"Results of run {runs_of[0]}")
        else:
            self.results_box.setTitle("Results of runs " + ", ".join(map(str, runs_of))
                                      + ": the newest of each stage")
        self.run_label.setText(
            "Each card is its stage's newest figure for the project as it is now, and names "
            "the run it comes from.<br>" + latest)
        self.run_label.show()
        cards, jobs = [], []
        for job, recorded in rows:
            for m in recorded:
                where = f"run {job.run_id} · {job.stage}"
                if job.target:
                    where += f" · {job.target}"
                if m.device not in job.target:
                    where += f" · {m.device}"
                if job.cached:
                    where += " · cached"
                card = FigureCard(
                    metric_title(m.name), fmt_card(m.name, m.value, m.unit), m.source, where,
                    m.detail,
                )
                card.figure = (m.name, m.device, m.target)  # the catalogue's key, and where
                card.job_id = job.id
                tip = (f"{metric_tip(m.name)}\nFrom job #{job.id} ({job.label}) of run "
                       f"{job.run_id}")
                if job.cached:
                    tip += " (cached: its inputs and settings were those of an earlier run)"
                card.setToolTip(tip + (f"\n{m.detail}" if m.detail else ""))
                cards.append(card)
                jobs.append(job)
        self._card_jobs = jobs
        self.cards.set_cards(cards)
        self._mark_stale()

    @staticmethod
    def _state(state: str) -> str:
        color = STATE_COLORS.get(state, "#9a6700")
        return f"<span style='color:{color}'><b>{state}</b></span>"

    def check_stale(self) -> asyncio.Future | None:
        """Compute the keys the project would give each job now, in a thread (it hashes the
        input files), then mark the cards whose job's key differs. Returns the task."""
        studio = self.ctl.studio
        if studio is None:
            return None
        project = studio.project.copy()

        def done(keys: dict[str, str]) -> None:
            self._keys, self._keys_error = keys, ""
            self._assemble()  # the figures that match these keys, where there are such

        def failed(exc: Exception) -> None:
            self._keys = None
            self._keys_error = exc.message if isinstance(exc, StudioError) else str(exc)
            self._mark_stale()

        return self._keys_load.start(history.current_keys, project, done=done, failed=failed)

    def _mark_stale(self) -> None:
        keys = self._keys
        stale_labels: list[str] = []
        reasons: set[str] = set()
        studio = self.ctl.studio
        # the one rule of every page (a measurement taken again under the current plan key
        # is current)
        stale = (history.stale_reasons(studio.project, studio.jobs, self._card_jobs, keys,
                                       studio.store)
                 if keys is not None and studio is not None else {})
        for job, card in zip(self._card_jobs, self.cards.cards, strict=True):
            why = stale.get(job.id, "")
            # a non-breaking hyphen: "re-" and "run" never end up on two lines of a card
            card.set_stale(f"{why}: re\u2011run" if why else "")
            if why:
                reasons.add(why.split(" since ")[0])
                if job.stage not in stale_labels:
                    stale_labels.append(job.stage)
        run = self._run
        if stale_labels and run is not None:
            ids = sorted({j.run_id for j, c in zip(self._card_jobs, self.cards.cards,
                                                   strict=True) if c.stale}, reverse=True)
            since = f"run {ids[0]}: its" if len(ids) == 1 else (
                "runs " + ", ".join(map(str, ids)) + ": their")
            what = " / ".join(sorted(reasons)).replace("settings changed", "Settings changed")
            what = what[0].upper() + what[1:]
            self.stale_text.setText(
                f"{what} since {since} {', '.join(stale_labels)} figures "
                "no longer match the project. Run again to update them (stages whose inputs "
                "did not change come from the cache)."
            )
        self.stale_banner.setVisible(bool(stale_labels) and run is not None)
        self.keys_note.setText(
            f"Cannot tell whether these figures match the project now: {self._keys_error}"
            if self._keys_error
            else ""
        )
        self.keys_note.setVisible(bool(self._keys_error) and run is not None)

    def stale_cards(self) -> list[FigureCard]:
        return [c for c in self.cards.cards if c.stale]

    def run_again(self) -> None:
        """Run the stages whose figures no longer match the project (or, with none, those
        the newest shown run asked for), with the project as it is now."""
        stale = [j.stage for j, c in zip(self._card_jobs, self.cards.cards, strict=True)
                 if c.stale]
        run = self._run
        stages = list(dict.fromkeys(stale)) or (run.stages if run is not None else None)
        self.run_stages(stages)


def main() -> int:
    return run_page(OverviewPage)


if __name__ == "__main__":
    raise SystemExit(main())
