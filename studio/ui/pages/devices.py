"""Devices: what can run jobs here (host CPU, the QNN HTP simulator per chip) and what will come."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QTableView,
    QVBoxLayout,
)

from studio.core.errors import StudioError
from studio.core.units import format_bytes
from studio.services import devices
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import Page, banner
from studio.ui.widgets import label

NUMERICS_TEXT = {
    "verified": (
        "verified",
        "#1b8a3f",
        "The simulator's numerics matched FP32 on the reference test.",
    ),
    "unverified": ("not verified", "#9a6700", "Not checked yet: validate accuracy on this target."),
    "wrong-on-simulator": (
        "wrong on simulator",
        "#c62828",
        "The simulator gave wrong results for this HTP version: validate on a real device.",
    ),
}


def chip_rows(targets: list[str]) -> list[Row]:
    from studio.core.catalog import load_catalog

    rows = []
    for key, chip in load_catalog().items():
        text, color, tip = NUMERICS_TEXT.get(chip.numerics, (chip.numerics, "#777", ""))
        mark = "✓ target" if key in targets else ""
        rows.append(
            Row(
                [
                    mark,
                    chip.name,
                    chip.soc,
                    f"v{chip.htp_arch}",
                    str(chip.soc_model),
                    format_bytes(chip.vtcm_mb * 1024**2),
                    "yes" if chip.fp16 else "no",
                    text,
                    chip.notes,
                ],
                tip=f"{chip.label}\n{tip}\nsource: {chip.source}".strip(),
                colors={7: color, 0: "#2f6fd6"},
                payload=key,
            )
        )
    return rows


class DevicesPage(Page):
    title = "Devices"
    subtitle = "Where jobs run: this machine's CPU and the QNN HTP simulator for each target chip."

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        # Devices do not depend on a project: show them with or without one.
        self.stack.setCurrentWidget(self.body)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        top = QHBoxLayout()
        self.host_box = QGroupBox("Host CPU")
        hl = QVBoxLayout(self.host_box)
        self.host_label = label("", wrap=True, selectable=True)
        hl.addWidget(self.host_label)
        top.addWidget(self.host_box, 1)
        self.sim_box = QGroupBox("QNN HTP simulator")
        sl = QVBoxLayout(self.sim_box)
        self.sim_label = label("", wrap=True, selectable=True)
        self.sim_label.setTextFormat(Qt.TextFormat.RichText)
        sl.addWidget(self.sim_label)
        top.addWidget(self.sim_box, 1)
        lay.addLayout(top)

        chips = QGroupBox("Target chips (catalog)")
        cl = QVBoxLayout(chips)
        self.chips = RowsModel(
            ["", "Chip", "SoC", "HTP", "SoC model", "VTCM", "FP16", "Simulator numerics", "Notes"],
            self,
        )
        self.chip_view = QTableView()
        self.chip_view.setModel(self.chips)
        self.chip_view.verticalHeader().hide()
        self.chip_view.setAlternatingRowColors(True)
        self.chip_view.setWordWrap(False)
        hh = self.chip_view.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(8, QHeaderView.ResizeMode.Stretch)
        cl.addWidget(self.chip_view)
        cl.addWidget(
            label(
                "Change the project's targets on the Overview page. Simulator "
                "timings follow the host CPU; only its numerics are the HTP's.",
                "muted",
                wrap=True,
            )
        )
        lay.addWidget(chips, 1)

        lay.addWidget(
            banner(
                "<b>Remote devices</b> will be listed here with their health and capabilities: a "
                "Snapdragon laptop or dev kit running the QStudio agent, and Android phones over adb "
                "with your QAIRT SDK. Figures measured on them will carry the “measured” badge and "
                "the device's name. Until then, jobs run on this machine: FP32 and host timings on "
                "the CPU, HTP numerics on the simulator."
            )
        )
        self.refresh()

    def _on_closed(self) -> None:  # devices stay visible without a project
        self.stack.setCurrentWidget(self.body)
        self.refresh()

    def on_open(self) -> None:
        self.refresh()

    def on_change(self, change) -> None:
        if ("", "targets") in change:
            self.refresh()

    def refresh(self) -> None:
        state = devices.device_state()
        h = state["host"]
        self.host_label.setText(
            f"{h['name']} — {h['system']} {h['machine']}, {h['cpus']} CPU cores\n"
            f"Python {h['python']}, onnxruntime {h['onnxruntime'] or 'not installed'}\n"
            "Status: ready (export, quantize, FP32 and host runs; one job at a time)"
        )
        sim = state["htp_sim"]
        if sim["available"]:
            self.sim_label.setText(
                f"onnxruntime-qnn {sim['version']} (QNN HTP backend on x86): "
                "<span style='color:#1b8a3f'><b>ready</b></span><br>"
                "Compiles context binaries per chip and runs them with the HTP's real kernels. "
                "Its timings follow this CPU and are never shown as device latency."
            )
        else:
            self.sim_label.setText(
                "<span style='color:#c62828'><b>not installed</b></span>: compile, validate, "
                "run and profile on the HTP need it. Install it with "
                "<code>pip install onnxruntime-qnn</code>."
            )
        targets = list(self.ctl.project.targets) if self.ctl.project else []
        try:
            self.chips.set_rows(chip_rows(targets))
        except StudioError as exc:
            self.sim_label.setText(exc.message)


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(DevicesPage)


if __name__ == "__main__":
    raise SystemExit(main())
