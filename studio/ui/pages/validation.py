"""Validation: the latest validate job per target — metrics with their source, the gates, and
FP32 vs HTP greedy text."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QPlainTextEdit,
    QTableView,
    QVBoxLayout,
)

from studio.core.errors import StudioError
from studio.core.gates import evaluate_gates
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import TargetStagePage
from studio.ui.pages.overview import metric_title
from studio.ui.widgets import BadgeDelegate, fmt_value, label

GATE_TITLES = {
    "min_logits_cosine": "logits cosine ≥",
    "max_perplexity_increase": "perplexity increase ≤",
    "min_top1_agreement": "top-1 agreement ≥",
}


class ValidationPage(TargetStagePage):
    title = "Validation"
    subtitle = (
        "FP32 on the CPU vs the quantized model on the host vs the HTP simulator: logits, "
        "top-1, perplexity, greedy text."
    )

    stage = "validate"

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No validation yet",
            "Run the validate stage to compare, per target chip, the FP32 model (CPU) with the "
            "quantized model on the host and on the HTP simulator: logits cosine, max error, "
            "top-1 agreement, perplexity on held-out text and greedy-token agreement, checked "
            "against the project's gates. Layer-wise diffs that name the first diverging op, "
            "and runs on real devices, come in later releases.",
            parent,
        )
        self.empty.add_action(
            "Run validate",
            self.run_stage,
            "Runs validate and what it needs (export, quantize, compile)",
        )
        cl = self.content_layout
        self.summary = label("", wrap=True, selectable=True)
        cl.addWidget(self.summary)
        self.warning = label("", "error", wrap=True)
        cl.addWidget(self.warning)
        row = QHBoxLayout()
        mbox = QGroupBox("Metrics")
        ml = QVBoxLayout(mbox)
        self.metrics = RowsModel(["Metric", "Value", "Source", "Device", "Target"], self)
        self.metric_view = QTableView()
        self.metric_view.setModel(self.metrics)
        self.metric_view.setItemDelegateForColumn(2, BadgeDelegate(self.metric_view))
        self.metric_view.verticalHeader().hide()
        self.metric_view.setWordWrap(False)
        mh = self.metric_view.horizontalHeader()
        mh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        mh.setStretchLastSection(True)
        ml.addWidget(self.metric_view)
        row.addWidget(mbox, 3)
        gbox = QGroupBox("Gates")
        gl = QVBoxLayout(gbox)
        self.gates = RowsModel(["Gate", "Threshold", "Value", "Result"], self)
        self.gate_view = QTableView()
        self.gate_view.setModel(self.gates)
        self.gate_view.verticalHeader().hide()
        self.gate_view.setWordWrap(False)
        gh = self.gate_view.horizontalHeader()
        gh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        gh.setStretchLastSection(True)
        gl.addWidget(self.gate_view)
        gl.addWidget(label("Thresholds are edited on the Precision page.", "muted"))
        row.addWidget(gbox, 2)
        cl.addLayout(row, 1)
        tbox = QGroupBox("Greedy continuation of the run prompt")
        tl = QHBoxLayout(tbox)
        self.fp32_text = QPlainTextEdit()
        self.fp32_text.setReadOnly(True)
        self.htp_text = QPlainTextEdit()
        self.htp_text.setReadOnly(True)
        for title, w in (
            ("FP32 (CPU)", self.fp32_text),
            ("quantized (HTP simulator)", self.htp_text),
        ):
            box = QVBoxLayout()
            box.addWidget(label(title, "muted"))
            box.addWidget(w)
            tl.addLayout(box)
        cl.addWidget(tbox, 1)

    def on_change(self, change) -> None:
        if any(s == "gates" for s, _ in change):
            self.show_current()

    def show_job(self, job) -> None:
        res = job.result or {}
        self.job_label.setText(f"job #{job.id}" + (" (cached)" if job.cached else ""))
        self.summary.setText(res.get("summary", job.message))
        from studio.core.catalog import get_chip

        try:
            warns = get_chip(job.target).warnings()
        except StudioError:
            warns = []
        self.warning.setText("\n".join(warns))
        self.warning.setVisible(bool(warns))
        rows = []
        for m in self.ctl.studio.jobs.metrics(job_id=job.id):
            rows.append(
                Row(
                    [
                        metric_title(m.name),
                        fmt_value(m.value, m.unit),
                        m.source,
                        m.device,
                        m.target or "—",
                    ],
                    tip=m.detail or m.name,
                    align_right=(1,),
                )
            )
        self.metrics.set_rows(rows)
        grows = []
        for g in evaluate_gates(self.ctl.project.gates, res):
            ok = g["passed"]
            grows.append(
                Row(
                    [
                        GATE_TITLES.get(g["gate"], g["gate"]),
                        f"{g['threshold']:.4g}",
                        f"{g['value']:.4g}",
                        "pass" if ok else "FAIL",
                    ],
                    colors={3: "#1b8a3f" if ok else "#c62828"},
                )
            )
        self.gates.set_rows(grows)
        self.fp32_text.setPlainText(res.get("greedy_fp32", ""))
        self.htp_text.setPlainText(res.get("greedy_htp", ""))


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(ValidationPage)


if __name__ == "__main__":
    raise SystemExit(main())
