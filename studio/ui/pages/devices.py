"""Devices: what can run jobs (host CPU, the QNN HTP simulator per chip, remote agents from the
user's device registry with their health, phones over adb), adding and removing agents, the
QAIRT SDK phones run from, and running the project's model on one with live progress."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from studio.core.catalog import load_catalog
from studio.core.devices import device
from studio.core.errors import Cancelled, StudioError
from studio.core.progress import EventProgress
from studio.core.units import format_bytes
from studio.services import devices
from studio.services.generate import generate
from studio.services.registry import Registry
from studio.ui.loading import LatestLoad
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.standalone import run_page
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
                    chip.ddr_type,
                    f"{chip.ddr_gbps:g}" if chip.ddr_gbps is not None else "unknown",
                    str(chip.htp_cores) if chip.htp_cores is not None else "unknown",
                    f"{chip.htp_tops:g}" if chip.htp_tops is not None else "unknown",
                    text,
                    chip.notes,
                ],
                tip=(f"{chip.label}\n{tip}\nsource: {chip.source}\nDDR: {chip.ddr_source}\n"
                     f"HTP cores / TOPS: {chip.htp_source}").strip(),
                colors={11: color, 0: "#2f6fd6"},
                payload=key,
            )
        )
    return rows


class DevicesPage(Page):
    key = "devices"
    needs_project = False  # this machine's devices, with or without a project

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        # Devices do not depend on a project: show them with or without one.
        self.stack.setCurrentWidget(self.body)
        self._probe_load = LatestLoad(ctl)
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
            ["", "Chip", "SoC", "HTP", "SoC model", "VTCM", "FP16", "DDR", "GB/s", "HTP cores",
             "TOPS", "Simulator numerics", "Notes"],
            self,
        )
        self.chip_view = QTableView()
        self.chip_view.setModel(self.chips)
        self.chip_view.verticalHeader().hide()
        self.chip_view.setAlternatingRowColors(True)
        self.chip_view.setWordWrap(False)
        hh = self.chip_view.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(12, QHeaderView.ResizeMode.Stretch)
        cl.addWidget(self.chip_view)
        cl.addWidget(
            label(
                "Change the project's targets on the Overview page. Simulator "
                "timings follow the host CPU; only its numerics are the HTP's.",
                "muted",
                wrap=True,
            )
        )
        lay.addWidget(chips, 2)
        lay.addWidget(self._agents_box(), 1)
        self.health: dict[str, str] = {}
        self.details: dict[str, str] = {}
        self.probed: list[dict[str, Any]] = []  # devices of kinds found by a program (adb)
        self.last_result: dict[str, Any] | None = None
        self._cancel: Any = None
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check_agents)
        self.timer.start(30_000)
        self.refresh()

    # ---- remote agents ------------------------------------------------------------------------
    def _agents_box(self) -> QGroupBox:
        box = QGroupBox("Remote agents (studio agent serve on a target machine) and phones "
                        "over adb")
        v = QVBoxLayout(box)
        self.agents = QTableWidget(0, 4)
        self.agents.setHorizontalHeaderLabels(["", "Agent", "URL", "Status"])
        self.agents.verticalHeader().hide()
        self.agents.setMaximumHeight(150)
        self.agents.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        hh = self.agents.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setStretchLastSection(True)
        v.addWidget(self.agents)
        row = QHBoxLayout()
        self.add_btn = QPushButton("Add agent…")
        self.add_btn.clicked.connect(self.add_agent)
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.clicked.connect(self.remove_agent)
        self.check_btn = QPushButton("Check now")
        self.check_btn.clicked.connect(self.check_agents)
        row.addWidget(self.add_btn)
        row.addWidget(self.remove_btn)
        row.addWidget(self.check_btn)
        row.addStretch(1)
        v.addLayout(row)
        # running on a device: a row of its own (side by side with the agent buttons it
        # asked for more than a 1280-px window gives the page)
        row = QHBoxLayout()
        row.addWidget(label("Run on", "muted"))
        self.run_device = QComboBox()
        self.run_device.setMinimumWidth(320)
        row.addWidget(self.run_device, 1)
        self.run_tokens = QSpinBox()
        self.run_tokens.setRange(1, 512)
        self.run_tokens.setValue(16)
        row.addWidget(self.run_tokens)
        self.run_btn = QPushButton("Run on device")
        self.run_btn.setToolTip("Generates from the project's prompt on the chosen device: an "
                                "agent's CPU runs the FP32 export, an HTP backend or a phone the "
                                "compiled context")
        self.run_btn.clicked.connect(self.run_on_device)
        row.addWidget(self.run_btn)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.stop_btn.clicked.connect(self.stop_run)
        row.addWidget(self.stop_btn)
        self.run_progress = QProgressBar()
        self.run_progress.setRange(0, 1)
        self.run_progress.setValue(0)
        self.run_progress.setFormat("idle")
        self.run_progress.setMinimumWidth(160)
        row.addWidget(self.run_progress)
        v.addLayout(row)
        sdk_row = QHBoxLayout()
        sdk_row.addWidget(label("QAIRT SDK for phones", "muted"))
        self.sdk_label = label("", wrap=True, selectable=True)
        sdk_row.addWidget(self.sdk_label, 1)
        self.sdk_btn = QPushButton("Choose…")
        self.sdk_btn.setToolTip("The folder a QAIRT SDK unpacked into: qnn-net-run and the HTP "
                                "libraries go from it to the phone")
        self.sdk_btn.clicked.connect(self.choose_sdk)
        sdk_row.addWidget(self.sdk_btn)
        v.addLayout(sdk_row)
        self.run_result = QPlainTextEdit()
        self.run_result.setReadOnly(True)
        self.run_result.setMaximumHeight(110)
        self.run_result.setPlaceholderText("Add an agent or attach a phone, then run the "
                                           "project's model on it: the text, the speed and "
                                           "its source appear here.")
        v.addWidget(self.run_result)
        self.adb_label = label("", "muted", wrap=True)
        v.addWidget(self.adb_label)
        v.addWidget(label("Figures from an agent carry the source its backend reports: measured "
                          "on real hardware, simulated on an x86 agent's HTP simulator.", "muted",
                          wrap=True))
        return box

    def registry(self):
        return Registry()

    def refresh_agents(self) -> None:
        try:
            reg = self.registry()
            agents = reg.agents()
            # what the project runs on, of the kinds whose devices are other machines
            listed = devices.device_rows(reg, probe=False, elsewhere=True) + self.probed
        except StudioError as exc:
            self.run_result.setPlainText(exc.message)
            agents, listed = [], []
        self.agents.setRowCount(len(agents))
        current = self.run_device.currentData()
        self.run_device.clear()
        for i, a in enumerate(agents):
            status = self.health.get(a.name, "not checked yet")
            details = self.details.get(a.name, "")
            ok = status.startswith("ok")
            light = QTableWidgetItem("●")
            light.setForeground(Qt.GlobalColor.darkGreen if ok else (
                Qt.GlobalColor.gray if status == "not checked yet" else Qt.GlobalColor.red))
            light.setToolTip("reachable" if ok else status)
            for j, item in enumerate([light, QTableWidgetItem(a.name), QTableWidgetItem(a.url),
                                      QTableWidgetItem(status)]):
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
                if details:
                    item.setToolTip(details)
                self.agents.setItem(i, j, item)
        targets = list(self.ctl.project.targets) if self.ctl.project else []
        for text, dev in devices.run_choices(listed, targets):
            self.run_device.addItem(text, dev)
        i = self.run_device.findData(current)
        self.run_device.setCurrentIndex(max(0, i))
        self.run_btn.setEnabled(self.run_device.count() > 0 and not self.stop_btn.isEnabled())

    def check_agents(self) -> None:
        reg = self.registry()

        async def go() -> None:
            try:
                agents = reg.agents()
            except StudioError:
                return
            for a in agents:
                self.health[a.name], self.details[a.name] = await self.ctl.in_thread(
                    _agent_status, reg, a.name)
            self.refresh_agents()

        try:
            self._check_task = asyncio.ensure_future(go())
        except RuntimeError:  # no event loop (a bare QApplication, or shutting down)
            self._check_task = None

    def add_agent(self, name: str | None = None, url: str | None = None,
                  token: str | None = None, cafile: str = "") -> None:
        if name is None:
            dlg = AddAgentDialog(self)
            if dlg.exec() != QDialog.DialogCode.Accepted:
                return
            name, url, token, cafile = dlg.values()
        try:
            self.registry().add(name, url or "", token or "", cafile)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return
        self.refresh_agents()
        self.check_agents()

    def remove_agent(self) -> None:
        row = self.agents.currentRow()
        if row < 0:
            return
        name = self.agents.item(row, 1).text()
        try:
            self.registry().remove(name)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
        self.health.pop(name, None)
        self.refresh_agents()

    def choose_sdk(self, folder: str | None = None) -> None:
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "The QAIRT SDK folder")
            if not folder:
                return
        try:
            self.registry().set_sdk_root(folder)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
        self.show_sdk()

    def show_sdk(self) -> None:
        try:
            root, where = self.registry().sdk_root()
        except StudioError as exc:
            self.sdk_label.setText(exc.message)
            return
        self.sdk_label.setText(f"{root} (from {where})" if root else
                               "not set: choose the folder a QAIRT SDK unpacked into (or set "
                               "QNN_SDK_ROOT) to run on phones")

    def run_on_device(self) -> None:
        dev = self.run_device.currentData()
        if not dev or self.ctl.project is None:
            self.run_result.setPlainText("Open a project and add an agent first.")
            return
        project = self.ctl.project.copy()
        n = self.run_tokens.value()
        self.run_btn.setEnabled(False)
        self.stop_btn.setEnabled(True)
        self.run_progress.setRange(0, 0)  # busy until the first token
        self.run_progress.setFormat("loading…")
        where = ("uploading to and loading on" if device(dev).remote is not None
                 else "loading on")
        self.run_result.setPlainText(f"{where} {dev}…\n{project.run['prompt']}")
        self.last_result = None
        stream = _Stream(self)
        stream.text.connect(self._append)
        self._stream = stream  # kept alive while the job runs
        self._tokens = 0
        self._cancel = threading.Event()
        progress = EventProgress(self._cancel)
        self.run_progress.setMaximum(0)
        self._run_n = n

        async def go() -> None:
            try:
                out = await self.ctl.in_thread(lambda: generate(
                    project, project.run["prompt"], dev, n, on_text=stream.text.emit,
                    progress=progress))
            except Cancelled:
                self.run_result.appendPlainText("\n— stopped")
                self.run_progress.setFormat("stopped")
            except StudioError as exc:
                self.run_result.setPlainText(f"failed: {exc.message}")
                self.run_progress.setRange(0, 1)
                self.run_progress.setValue(0)
                self.run_progress.setFormat("failed")
            else:
                self.last_result = out
                tps, ttft = out.get("decode_tokens_per_s"), out.get("time_to_first_token_ms")
                self.run_progress.setRange(0, n)
                self.run_progress.setValue(len(out["tokens"]))
                self.run_progress.setFormat(f"{len(out['tokens'])}/{n} tokens")
                self.run_result.setPlainText(
                    f"{out['prompt']}{out['text']}\n— {len(out['tokens'])} tokens · "
                    + (f"time to first token {ttft:.1f} ms · " if ttft is not None else "")
                    + (f"decode {tps:.1f} tok/s · " if tps else "")
                    + f"{out['source']} on {out['device_name']} ({out['timing_note']})")
            finally:
                self.run_btn.setEnabled(True)
                self.stop_btn.setEnabled(False)

        asyncio.ensure_future(go())

    def stop_run(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.stop_btn.setEnabled(False)
            self.run_progress.setFormat("stopping…")

    def _append(self, text: str) -> None:
        self._tokens += 1  # one piece of text per generated token
        self.run_progress.setRange(0, self._run_n)
        self.run_progress.setValue(min(self._tokens, self._run_n))
        self.run_progress.setFormat(f"{self._tokens}/{self._run_n} tokens")
        cursor = self.run_result.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        cursor.insertText(text)
        self.run_result.setTextCursor(cursor)

    def on_close(self) -> None:
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
        self.refresh_agents()
        self.show_sdk()
        kinds = devices.probed_kinds()
        self.adb_label.setText(probed_text(kinds, "looking…"))

        def found(rows: list[dict[str, Any]]) -> None:
            self.probed = [r for r in rows if not r.get("note")]
            self.adb_label.setText(probed_text(kinds, rows=rows))
            self.refresh_agents()

        def failed(exc: Exception) -> None:
            self.adb_label.setText(probed_text(
                kinds, exc.message if isinstance(exc, StudioError) else repr(exc)))

        # a program (adb) may take seconds to answer: off the UI thread
        reg = self.registry()
        if self._probe_load.start(lambda: devices.device_rows(reg, probe=True, elsewhere=True),
                                   done=found, failed=failed) is None:
            self.adb_label.setText(probed_text(kinds, "not looked for"))  # no event loop


def probed_text(kinds: list[str], said: str = "", rows: list[dict[str, Any]] | None = None
                ) -> str:
    """One line per kind found by a program ("Phones over adb: …"): ``said`` for each, or
    its listed ``rows`` (a note row says why it lists none)."""
    lines = []
    for k in kinds:
        mine = [r for r in rows or [] if r["kind"] == k]
        text = said or "; ".join(r["status"] if r.get("note") else f"{r['id']} {r['status']}"
                                 for r in mine) or "none"
        lines.append(f"{devices.group(k)}: {text}")
    return "\n".join(lines)


def agent_details(info: dict[str, Any]) -> str:
    """An agent's capabilities as text (the Devices page's tooltip and details)."""
    m = info.get("machine", {})
    mem = m.get("memory_bytes")
    lines = [f"{m.get('name')}: {m.get('system')} {m.get('release', '')} {m.get('machine')}, "
             f"{m.get('cpus')} CPUs" + (f", {format_bytes(mem)} memory" if mem else ""),
             f"Python {m.get('python')}, onnxruntime {m.get('onnxruntime') or 'none'}, "
             f"onnxruntime-qnn {m.get('onnxruntime_qnn') or 'none'}",
             f"jobs: {info.get('running', 0)} running of {info.get('max_jobs', 1)}; uploads up to "
             f"{format_bytes(info.get('max_upload') or 0)}"]
    sdk = {b.get("qnn_sdk_build") for b in info.get("backends", []) if b.get("qnn_sdk_build")}
    if sdk:
        lines.append(f"QNN SDK {', '.join(sorted(sdk))}")
    lines.append("backends: " + ", ".join(f"{b['id']} ({b['source']})"
                                          for b in info.get("backends", [])))
    return "\n".join(lines)


def _agent_status(reg, name: str) -> tuple[str, str]:
    """One line — reachable with its round trip and machine, or why not — and the agent's
    capabilities as text ("" when it did not answer). Off the UI thread."""
    try:
        c = reg.client(name)
        h = c.health()
        info = c.info()
    except StudioError as exc:
        if getattr(exc, "status", None) == 401:
            return f"auth failed: {exc.message}", ""
        return f"unreachable: {exc.message}", ""
    m = info.get("machine", {})
    kinds = sorted({b["kind"] for b in info.get("backends", [])})
    return (f"ok · {h['rtt_ms']:.1f} ms · {m.get('name')} ({m.get('system')} {m.get('machine')}, "
            f"{m.get('cpus')} CPUs) · onnxruntime-qnn {m.get('onnxruntime_qnn') or 'none'} · "
            f"backends: {', '.join(kinds)} · last seen {time.strftime('%H:%M:%S')}",
            agent_details(info))


class _Stream(QObject):
    """Text from the generation thread, queued to the UI thread."""

    text = Signal(str)


class AddAgentDialog(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Add a remote agent")
        form = QFormLayout(self)
        self.name = QLineEdit()
        self.name.setPlaceholderText("lab-kit")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://192.168.1.20:8765")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("the pairing token the agent printed")
        self.cafile = QLineEdit()
        self.cafile.setPlaceholderText("https only: the agent's certificate or its CA (optional)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        cert = QHBoxLayout()
        cert.addWidget(self.cafile, 1)
        cert.addWidget(browse)
        form.addRow("Name", self.name)
        form.addRow("URL", self.url)
        form.addRow("Token", self.token)
        form.addRow("Certificate", cert)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "The agent's certificate", "",
                                              "Certificates (*.pem *.crt *.cer);;All files (*)")
        if path:
            self.cafile.setText(path)

    def values(self) -> tuple[str, str, str, str]:
        return (self.name.text().strip(), self.url.text().strip(), self.token.text().strip(),
                self.cafile.text().strip())


def main() -> int:
    return run_page(DevicesPage)


if __name__ == "__main__":
    raise SystemExit(main())
