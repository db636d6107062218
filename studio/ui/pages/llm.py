"""LLM: generation on each device of the latest run jobs (tok/s with their source, the text,
per-token step times), the playground, the optimization waterfall and the block ablation."""

from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import (
    QGroupBox,
    QPlainTextEdit,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.lazyimport import lazy_module
from studio.ui.pages.base import StagePage
from studio.ui.pages.cards import CardGrid, FigureCard
from studio.ui.pages.figures import fmt_metric, metric_tip, metric_title
from studio.ui.pages.llm_playground import PlaygroundPanel
from studio.ui.pages.llm_tuning import PruningPanel, WaterfallPanel
from studio.ui.stages import role_of
from studio.ui.standalone import run_page
from studio.ui.widgets import clear_layout, label, plot_axes, plot_message, theme_plot

pg = lazy_module("pyqtgraph")

COLORS = ["#2f6fd6", "#8a5a00", "#1b8a3f", "#6b3fa0", "#c62828"]


class LLMPage(StagePage):
    key = "llm"

    role = "run"

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No generation yet",
            "Run the run stage to generate from the project's prompt on each of its devices: the "
            "host CPU (FP32, measured), the HTP simulator per target (quantized, simulated), and "
            "the remote agents and phones over adb it lists (Devices page; measured): prefill "
            "time, decode tokens per second and the generated text appear here, each figure "
            "with its source.",
            parent,
        )

        self.pg = pg
        #: the drawn figures and texts of each shown job (marked when it is stale)
        self._job_cards: dict[int, list[FigureCard]] = {}
        self._job_boxes: dict[int, QGroupBox] = {}
        self.add_run_action(
            "Run generation",
            "Runs the run stage and what it needs (export, quantize, compile)",
        )
        cl = self.content_layout
        self.prompt_label = label("", "muted", wrap=True, selectable=True)
        cl.addWidget(self.prompt_label)
        # per device: its name, then its figures as cards in as many columns as fit
        self.cards = QVBoxLayout()
        cl.addLayout(self.cards)
        split = QSplitter()
        self.texts = QWidget()
        self.text_layout = QVBoxLayout(self.texts)
        self.text_layout.setContentsMargins(0, 0, 0, 0)
        split.addWidget(self.texts)
        plot_box = QGroupBox("Decode step time per token (simulator times follow the host CPU)")
        pl = QVBoxLayout(plot_box)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=False, y=True, alpha=0.3)
        self.plot.setLabel("left", "ms / token (log)")
        self.plot.setLogMode(x=False, y=True)
        self.plot.setLabel("bottom", "token")
        self.legend = label("", "muted", wrap=True)
        pl.addWidget(self.legend)
        pl.addWidget(self.plot)
        split.addWidget(plot_box)
        cl.addWidget(split, 1)

        # tabs: the run stage's results (empty state or content), then the tuning tools, which
        # do not wait for a run job
        runs = QWidget()
        rl = QVBoxLayout(runs)
        rl.setContentsMargins(0, 0, 0, 0)
        for w in (self.empty, self.content):
            self.body_layout.removeWidget(w)
            rl.addWidget(w, 1 if w is self.content else 0)
        self.tabs = QTabWidget()
        self.tabs.addTab(runs, "Runs")
        self.playground = PlaygroundPanel(self)
        self.tabs.addTab(self.playground, "Playground")
        self.waterfall = WaterfallPanel(self)
        self.tabs.addTab(self.waterfall, "Waterfall")
        self.pruning = PruningPanel(self)
        self.tabs.addTab(self.pruning, "Pruning")
        self.body_layout.addWidget(self.tabs, 1)
        self.apply_theme()

    def on_open(self) -> None:
        super().on_open()
        for panel in (self.playground, self.waterfall, self.pruning):
            panel.on_open()

    def on_change(self, change) -> None:
        keys = {f"{s}.{k}" for s, k in change} if change else set()
        if any(k.startswith(("pruning.", "waterfall.", "model.", "validation.",
                             "quantization.", "export.")) for k in keys):
            self.later(self._refresh_tuning, 300)
        if "targets" in {s for s, _ in change or ()} or "export.context_length" in keys:
            self.playground.on_open()

    def _refresh_tuning(self) -> None:
        self.waterfall.refresh()
        self.pruning.refresh()

    def on_job_event(self, job) -> None:
        super().on_job_event(job)  # the run stage's jobs
        role = role_of(job.stage) if job.state == "succeeded" else ""
        if role == "waterfall":
            self.waterfall.refresh()
        if role == "ablation":
            self.pruning.refresh()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "plot"):
            self.apply_theme()

    def apply_theme(self) -> None:
        """The plot in the theme's colours (on every palette change: the theme, the system's
        light/dark switch)."""
        theme_plot(self.plot, self.palette())

    def sort_key(self, job):
        return (job.target != "cpu", job.target)  # the host first

    def show_jobs(self, jobs) -> None:
        self.prompt_label.setText(
            f"Prompt: {self.ctl.project.run['prompt']!r} · "
            f"{self.ctl.project.run['max_new_tokens']} new tokens"
        )
        clear_layout(self.cards)
        clear_layout(self.text_layout)
        self.plot.clear()
        legend = []
        self._job_cards, self._job_boxes = {}, {}
        for r, job in enumerate(jobs):
            res = job.result or {}
            self.cards.addWidget(label(
                f"<b>{job.target}</b> <span style='color:gray'>· run {job.run_id} · "
                f"job #{job.id}</span>"))
            cards = []
            for m in self.ctl.studio.jobs.metrics(job_id=job.id):
                where = m.device + (f" · {m.target}" if m.target else "")
                card = FigureCard(metric_title(m.name), fmt_metric(m.name, m.value, m.unit),
                                  m.source, where, m.detail)
                card.figure = (m.name, m.device, m.target)  # the catalogue's key, and where
                card.job_id = job.id
                card.setToolTip(metric_tip(m.name) + (f"\n{m.detail}" if m.detail else ""))
                self._job_cards.setdefault(job.id, []).append(card)
                cards.append(card)
            grid = CardGrid()
            grid.set_cards(cards)
            self.cards.addWidget(grid)
            box = QGroupBox(f"{job.target} ({res.get('source', '')})")
            self._job_boxes[job.id] = box
            bl = QVBoxLayout(box)
            text = QPlainTextEdit(res.get("text", ""))
            text.setReadOnly(True)
            bl.addWidget(text)
            self.text_layout.addWidget(box)
            steps = [s * 1e3 for s in res.get("step_s", [])]
            if steps:
                color = COLORS[r % len(COLORS)]
                pen = self.pg.mkPen(color, width=2)
                self.plot.plot(list(range(1, len(steps) + 1)), steps, pen=pen)
                legend.append(
                    f"<span style='color:{color}'>━━</span> {job.target} ({res.get('source', '')})"
                )
        self.legend.setText("&nbsp;&nbsp;&nbsp;".join(legend))
        if legend:
            plot_axes(self.plot)
        else:
            plot_message(self.plot, "No step times recorded: the run jobs kept none")
        self.mark_stale(self.stale)

    def mark_stale(self, reasons: dict[int, str]) -> None:
        """Each job's cards and generated text say when the project changed since it ran."""
        for jid, cards in self._job_cards.items():
            why = reasons.get(jid, "")
            for card in cards:
                card.set_stale(f"{why}: re\u2011run" if why else "")
        for jid, box in self._job_boxes.items():
            title = box.title().removeprefix("⚠ stale · ")
            box.setTitle(f"⚠ stale · {title}" if jid in reasons else title)


def main() -> int:
    return run_page(LLMPage)


if __name__ == "__main__":
    raise SystemExit(main())
