"""The LLM playground: a prompt, streaming output, live tok/s and time to first token, with
device, KV cache, window and speculative decoding chosen per run. Generation runs in a thread
(the UI only receives queued signals) and Stop cancels it between tokens."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from studio.core.devices import device
from studio.core.errors import Cancelled, StudioError
from studio.core.fsutil import IMAGE_SUFFIXES
from studio.core.progress import EventProgress
from studio.core.sampling import SamplingConfig
from studio.services.bundle import genie_generate
from studio.services.generate import generate
from studio.services.prompts import checkpoint_format
from studio.services.registry import Registry
from studio.services.vision import vision_project
from studio.ui.widgets import SourceBadge, label


def live_source(device_id: str, runtime: str = "studio", chips: list[str] | None = None
                ) -> tuple[str, str]:
    """(source label, device name) of what a generation on ``device_id`` produces, as the
    device labels its result (Genie runs the bundle on the HTP simulator here); the label is
    "" for a device that cannot be named (the generation then says why)."""
    try:
        dev = device(device_id, chips)
    except StudioError:
        return "", device_id
    return ("simulated" if runtime == "genie" else dev.source), dev.name


def _runs_genie(device_id: object) -> bool:
    """Whether Genie runs a bundle on the device a list entry names (the HTP simulator)."""
    try:
        return device(str(device_id or "")).runs_genie
    except StudioError:
        return False



class ImageDrop(QLabel):
    """A vision-language model's picture: dropped here (or chosen), shown as a thumbnail."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.path: Path | None = None
        self.setAcceptDrops(True)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setFixedSize(120, 120)
        self.setStyleSheet("QLabel { border: 1px dashed #9e9e9e; border-radius: 4px; }")
        self.set_path(None)

    def set_path(self, path: Path | None) -> None:
        self.path = path
        pix = QPixmap(str(path)) if path is not None else QPixmap()
        if path is not None and not pix.isNull():
            self.setPixmap(pix.scaled(116, 116, Qt.AspectRatioMode.KeepAspectRatio,
                                      Qt.TransformationMode.SmoothTransformation))
            self.setToolTip(str(path))
        else:
            self.setPixmap(QPixmap())
            self.setText("Drop an image\nhere" if path is None else path.name)
            self.setToolTip("the picture the prompt is about (PNG or JPEG)")
        self.changed.emit()

    @staticmethod
    def _local_image(event) -> Path | None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        for url in urls:
            p = Path(url.toLocalFile())
            if url.isLocalFile() and p.suffix.lower() in IMAGE_SUFFIXES:
                return p
        return None

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self._local_image(event) is not None:
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt's name
        path = self._local_image(event)
        if path is not None:
            self.set_path(path)
            event.acceptProposedAction()


class _Bridge(QObject):
    """Signals from the generation thread (queued to the UI thread)."""

    text = Signal(str)
    fed = Signal(str)  # the prompt as the model reads it (through the chat template)
    passed = Signal(int, int)
    finished = Signal(object)
    failed = Signal(str)


class PlaygroundPanel(QWidget):
    """Interactive generation on the project's deployed model."""

    def __init__(self, page, parent: QWidget | None = None):
        super().__init__(parent)
        self.page = page
        self.ctl = page.ctl
        self.bridge = _Bridge()
        self.bridge.text.connect(self._on_text)
        self.bridge.fed.connect(self.output_prompt)
        self.bridge.passed.connect(self._on_pass)
        self.bridge.finished.connect(self._on_finished)
        self.bridge.failed.connect(self._on_failed)
        self._cancel: EventProgress | None = None
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._first: float | None = None
        self.last: dict[str, Any] | None = None  # the newest finished generation
        self._chunks = 0
        self._passes: list[tuple[int, int]] = []

        outer = QHBoxLayout(self)
        outer.addLayout(self._build_prompt(), 3)
        outer.addWidget(self._build_settings(), 1)
        self._studio_only = (self.kv, self.window, self.spec, self.k, self.overlap,
                             self.temperature, self.seed)


    # ---- building the panel -----------------------------------------------------------------
    def _build_prompt(self) -> QVBoxLayout:
        """The prompt, generate / stop, the figures and the streamed text."""
        left = QVBoxLayout()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("A prompt, e.g. def fibonacci(n):")
        self.prompt.setMaximumHeight(150)
        left.addWidget(label("Prompt", "muted"))
        row = QHBoxLayout()
        row.addWidget(self.prompt, 1)
        # a vision-language model's picture (shown for those models only)
        self.image_box = QWidget()
        col = QVBoxLayout(self.image_box)
        col.setContentsMargins(0, 0, 0, 0)
        self.image = ImageDrop()
        col.addWidget(self.image)
        picks = QHBoxLayout()
        self.image_pick = QPushButton("Choose…")
        self.image_pick.clicked.connect(self._choose_image)
        self.image_clear = QPushButton("Clear")
        self.image_clear.clicked.connect(lambda: self.image.set_path(None))
        picks.addWidget(self.image_pick)
        picks.addWidget(self.image_clear)
        col.addLayout(picks)
        self.image_box.setVisible(False)
        row.addWidget(self.image_box)
        left.addLayout(row)
        buttons = QHBoxLayout()
        self.go = QPushButton("Generate")
        self.go.setDefault(True)
        self.go.clicked.connect(self.start)
        self.stop = QPushButton("Stop")
        self.stop.setEnabled(False)
        self.stop.clicked.connect(self.cancel)
        self.export_btn = QPushButton("Run export")
        self.export_btn.setToolTip("The playground runs the export (host CPU) or the compiled "
                                   "graphs (HTP simulator): run the stages it needs")
        self._missing_stage = "export"
        self.export_btn.clicked.connect(lambda: self.page.run_stages([self._missing_stage]))
        self.export_btn.setVisible(False)
        buttons.addWidget(self.go)
        buttons.addWidget(self.stop)
        buttons.addWidget(self.export_btn)
        buttons.addStretch(1)
        self.badge = SourceBadge("measured")
        self.badge.setVisible(False)
        buttons.addWidget(self.badge)
        left.addLayout(buttons)
        self.stats = label("", "muted", wrap=True, selectable=True)
        left.addWidget(self.stats)
        self.accept = label("", "muted", wrap=True)
        left.addWidget(self.accept)
        self.output = QPlainTextEdit()
        self.output.setReadOnly(True)
        self.output.setPlaceholderText("The prompt and the generated text stream here.")
        left.addWidget(self.output, 1)

        return left

    def _build_settings(self) -> QGroupBox:
        """Runtime, device, KV cache, window, speculative decoding, sampling, length."""
        box = QGroupBox("Run settings")
        form = QFormLayout(box)
        self.runtime = QComboBox()
        self.runtime.addItem("studio", "studio")
        self.runtime.addItem("Genie (the Deploy page's bundle)", "genie")
        self.runtime.setToolTip("the studio's own runtime, or Qualcomm's Genie running the "
                                "project's Genie bundle on the HTP simulator (greedy)")
        self.runtime.currentIndexChanged.connect(self._runtime_changed)
        form.addRow("Runtime", self.runtime)
        self.chat = QCheckBox("the checkpoint's")
        self.chat.setChecked(True)
        self.chat.setToolTip("the prompt as one user message in the checkpoint's chat "
                             "template, the assistant's turn opened; cleared: as written")
        form.addRow("Chat template", self.chat)
        self.device = QComboBox()
        self.device.setToolTip("host CPU: the FP32 export (measured); HTP simulator: the "
                               "compiled graphs (simulated, not device timings)")
        form.addRow("Device", self.device)
        self.kv = QComboBox()
        self.kv.addItems(["project's", "float", "int8"])
        self.kv.setToolTip("the KV cache: int8 holds it as uint8 graph I/O (a quarter of FP32)")
        form.addRow("KV cache", self.kv)
        self.window = QSpinBox()
        self.window.setRange(0, 1 << 16)
        self.window.setSpecialValueText("off")
        self.window.setToolTip("attend to the last W tokens through a ring buffer: generation "
                               "runs past the context")
        form.addRow("Window", self.window)
        self.spec = QComboBox()
        self.spec.addItems(["off", "prompt lookup", "draft model"])
        form.addRow("Speculative", self.spec)
        self.k = QSpinBox()
        self.k.setRange(1, 8)
        self.k.setValue(4)
        form.addRow("Drafted k", self.k)
        self.overlap = QCheckBox("draft ahead")
        self.overlap.setToolTip("a draft model drafts the next window on the CPU in a thread "
                                "of its own while the target checks this one (the project's "
                                "run.speculative_overlap); the tokens are the same")
        form.addRow("Overlap", self.overlap)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        self.temperature.setSpecialValueText("greedy")
        form.addRow("Temperature", self.temperature)
        self.seed = QSpinBox()
        self.seed.setRange(0, 1 << 30)
        form.addRow("Seed", self.seed)
        self.max_new = QSpinBox()
        self.max_new.setRange(1, 4096)
        self.max_new.setValue(64)
        form.addRow("New tokens", self.max_new)
        box.setMinimumWidth(340)
        return box

    def _runtime_changed(self) -> None:
        """Genie runs the bundle's greedy dialog on the HTP simulator: the settings only the
        studio's runtime has are off while it is chosen."""
        genie = self.runtime.currentData() == "genie"
        for w in self._studio_only:
            w.setEnabled(not genie)
        if genie and not _runs_genie(self.device.currentData()):
            i = next((k for k in range(self.device.count())
                      if _runs_genie(self.device.itemData(k))), -1)
            if i >= 0:
                self.device.setCurrentIndex(i)

    def _choose_image(self) -> None:
        name, _ = QFileDialog.getOpenFileName(
            self, "An image for the prompt", str(self.ctl.project.folder)
            if self.ctl.project is not None else "",
            "Images (" + " ".join(f"*{s}" for s in IMAGE_SUFFIXES) + ")")
        if name:
            self.image.set_path(Path(name))

    # ---- project ----------------------------------------------------------------------------
    def on_open(self) -> None:
        p = self.ctl.project
        vl = vision_project(p)
        self.image_box.setVisible(vl)
        if vl and self.image.path is None and p.run.get("image"):
            try:
                self.image.set_path(p.input_path(p.run["image"]))
            except StudioError:
                pass  # the project's picture is gone: the box says to drop one
        current = self.device.currentData()
        self.device.clear()
        self.device.addItem("host CPU (FP32, measured)", "cpu")
        for t in p.targets:
            self.device.addItem(f"HTP simulator · {t} (simulated)", f"htp-sim:{t}")
        try:
            agents = Registry().agents()
        except StudioError:
            agents = []
        for a in agents:  # registered agents: plain decoding there (see Devices)
            self.device.addItem(f"agent {a.name} · host CPU", f"agent:{a.name}")
            for t in p.targets:
                self.device.addItem(f"agent {a.name} · HTP simulator {t}",
                                    f"agent:{a.name}@htp-sim:{t}")
        i = self.device.findData(current)
        self.device.setCurrentIndex(max(0, i))

        try:  # the checkpoint's template: its source in the tooltip; none: the box is off
            fmt = checkpoint_format(p)
            line = fmt.line() if fmt is not None else ""
            usable = fmt is not None and fmt.applied
        except StudioError as exc:
            line, usable = f"chat template: {exc.message}", False
        self.chat.setEnabled(usable)
        self.chat.setChecked(usable)
        self.chat.setToolTip(line or "this model takes no chat template")
        C = int(p.export["context_length"])
        self.window.setRange(0, C)
        self.overlap.setChecked(bool(p.run["speculative_overlap"]))
        if not self.prompt.toPlainText():
            self.prompt.setPlainText(p.run["prompt"])

    # ---- generation -------------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        spec = {"off": None, "prompt lookup": "lookup", "draft model": "draft"}[
            self.spec.currentText()]
        kv = self.kv.currentText()
        return {"runtime": self.runtime.currentData() or "studio",
                "device_name": self.device.currentData() or "cpu",
                "kv": None if kv == "project's" else kv,
                "window": self.window.value() or None, "speculative": spec,
                "raw": not (self.chat.isEnabled() and self.chat.isChecked()),
                "k": self.k.value(), "max_new_tokens": self.max_new.value(),
                "overlap": self.overlap.isChecked() and spec == "draft",
                "temperature": self.temperature.value(), "seed": self.seed.value()}

    def start(self) -> None:
        if self._thread is not None or self.ctl.project is None:
            return

        prompt = self.prompt.toPlainText()
        s = self.settings()
        image = self.image.path if self.image_box.isVisible() else None
        project = self.ctl.project.copy()
        sampling = SamplingConfig(s["temperature"], 0, 1.0, s["seed"])
        self._cancel = cancel = EventProgress()
        # the live figures' source, as the device will label its result: the badge follows
        # the output now streaming, not the one of the device chosen before
        self._live_source, where = live_source(s["device_name"], s["runtime"],
                                               list(project.targets))
        self.badge.set_source(self._live_source, f"live: generating on {where}")
        self.badge.setVisible(bool(self._live_source))
        self._t0, self._first, self._chunks, self._passes = time.perf_counter(), None, 0, []
        self.output.setPlainText(prompt)
        self.stats.setText("loading the model…")
        self.accept.setText("")
        self.export_btn.setVisible(False)
        self.go.setEnabled(False)
        self.stop.setEnabled(True)
        bridge = self.bridge

        def on_format(_fmt, text: str) -> None:  # the output starts with what the model reads
            bridge.fed.emit(text)

        def work() -> None:
            try:
                if s["runtime"] == "genie":
                    dev = s["device_name"]
                    if image is not None:
                        raise StudioError("Genie runs the bundle's text dialog: run an image "
                                          "prompt with the studio runtime")
                    if not _runs_genie(dev):
                        raise StudioError("Genie runs the bundle on the HTP simulator here: "
                                          "choose an HTP simulator device")
                    bridge.finished.emit(genie_generate(
                        project, prompt, dev.partition(":")[2], s["max_new_tokens"],
                        on_text=bridge.text.emit, build=False, progress=cancel,
                        raw=s["raw"], on_format=on_format))
                    return
                out = generate(project, prompt, s["device_name"], s["max_new_tokens"], sampling,
                               on_text=bridge.text.emit, speculative=s["speculative"],
                               k=s["k"], kv=s["kv"], window=s["window"], progress=cancel,
                               on_pass=bridge.passed.emit, image=image, raw=s["raw"],
                               on_format=on_format, overlap=s["overlap"])
                bridge.finished.emit(out)
            except Cancelled:
                bridge.failed.emit("stopped")
            except StudioError as exc:
                bridge.failed.emit(exc.message)
            except Exception as exc:  # noqa: BLE001 - shown, not swallowed: a bug to report
                bridge.failed.emit(f"generation failed: {type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=work, name="playground", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.event.set()
            self.stats.setText("stopping after the current token…")

    def output_prompt(self, text: str) -> None:
        """The output starts with the prompt as the model reads it."""
        self.output.setPlainText(text)

    def is_running(self) -> bool:
        return self._thread is not None

    def _done(self) -> None:
        self._thread = None
        self._cancel = None
        self.go.setEnabled(True)
        self.stop.setEnabled(False)

    def _on_text(self, text: str) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
        self._chunks += 1
        cursor = self.output.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        cursor.insertText(text)
        self.output.setTextCursor(cursor)
        ttft = (self._first - self._t0) * 1e3
        rate = (self._chunks - 1) / (now - self._first) if now > self._first else 0.0
        self.stats.setText(f"live: {self._chunks} tokens · first token after {ttft:.0f} ms "
                           f"(with loading) · {rate:.1f} tok/s ({self._live_source})")

    def _on_pass(self, drafted: int, kept: int) -> None:
        self._passes.append((drafted, kept))
        d = sum(p[0] for p in self._passes)
        a = sum(p[1] for p in self._passes)
        last = "".join("●" if i < kept else "○" for i in range(drafted))
        self.accept.setText(f"pass {len(self._passes)}: {last} {kept}/{drafted} drafted tokens "
                            f"accepted · overall {a}/{d} ({a / d:.0%})" if d else
                            f"pass {len(self._passes)}: nothing drafted")

    def _on_finished(self, out: dict) -> None:
        self._done()
        self.last = out
        self.badge.set_source(out["source"], f"{out['device_name']}\n"
                                             f"{out.get('timing_note') or ''}".strip())
        self.badge.setVisible(True)
        if out.get("runtime") == "genie":
            tps, ttft = out.get("decode_tokens_per_s"), out.get("time_to_first_token_ms")
            self.stats.setText(" · ".join([
                f"Genie: {out['tokens_out']} tokens",
                f"time to first token {ttft:.0f} ms" if ttft is not None else "no text",
                f"decode {tps:.1f} tok/s" if tps else "no decode steps",
                f"{out['source']} on {out['device_name']}",
                f"bundle loaded in {out['load_s']:.2f} s"]))
            self.accept.setText(out.get("timing_note", ""))
            return
        tps = out.get("decode_tokens_per_s")
        kvc = out["kv_cache"]
        parts = [f"{len(out['tokens'])} tokens ({out['stopped']})",
                 f"time to first token {out['time_to_first_token_ms']:.1f} ms",
                 f"decode {tps:.1f} tok/s" if tps else "no decode steps",
                 f"{out['source']} on {out['device_name']}",
                 f"prompt {out['prompt_tokens']} tokens in {out['prompt_chunks']} pass(es)"
                 + (" (chat template)" if (out.get("prompt_format") or {}).get("applied")
                    else "")]
        img = out.get("image")
        if img:  # the first token came after the encoder and the prefill
            parts[1] += (f" (vision encoder {img['encoder_ms']:.1f} ms + prefill "
                         f"{img['prefill_ms']:.1f} ms, {img['image_tokens']} image tokens)")
        if kvc:
            parts.append(f"KV {kvc['dtype']} {kvc['bytes_measured'] / 1024:.0f} KiB"
                         + (f", window {kvc['window']}" if kvc["window"] else ""))
        self.stats.setText(" · ".join(parts))
        sp = out.get("speculative")
        if sp:
            text = (f"{sp['proposer']}: acceptance {sp['acceptance_rate']:.0%}, "
                    f"{sp['tokens_per_target_pass']:.2f} tokens per target pass "
                    f"({sp['target_passes']} passes)")
            if sp.get("overlap"):
                wait = sp["waiting_s"]
                text += (f" · overlapped: {sp['busy_s']['both'] * 1e3:.0f} ms both busy, the "
                         f"target waited {wait['target'] * 1e3:.0f} ms")
            est = sp.get("estimated")
            if est:
                text += (f" · estimated on {est['chip']}: {est['speedup']:.2f}× "
                         "(performance model)")
            if sp.get("draft_table"):  # the target's token table or its own, and why
                text += f" · {sp['draft_table']['line']}"
            self.accept.setText(text)

    def _on_failed(self, message: str) -> None:
        self._done()
        # text that streamed before the stop keeps its label; with none there is no result
        self.badge.setVisible(self._chunks > 0)
        self.stats.setText(f"<span style='color:#c62828'>{message}</span>")

        m = re.search(r"--stages (\w+)", message)
        self._missing_stage = m.group(1) if m else "export"
        self.export_btn.setText(f"Run {self._missing_stage}")
        self.export_btn.setVisible(m is not None)
