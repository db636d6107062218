"""The demo's scenes (:mod:`studio.ui.demo`): live generation, the waterfall, accuracy, the
share of time and the bundle, one view class each (:data:`VIEWS`)."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from studio.core import figures
from studio.core.catalog import get_chip
from studio.core.errors import Cancelled, StudioError
from studio.core.progress import EventProgress
from studio.core.units import format_bytes, signed
from studio.services import demo as demosvc
from studio.ui.demo_widgets import (
    ACCENT,
    GOOD,
    MUTED,
    TEXT,
    Bar,
    Gauge,
    badge,
    card,
    nice_ceiling,
    recorded,
    text_label,
)
from studio.ui.widgets import clear_layout


class DemoWindow(Protocol):
    """What a scene asks of the demo window (:class:`studio.ui.demo.DemoWindow`)."""

    demo: demosvc.Demo

    @property
    def base(self) -> float: ...

    def current_view(self) -> Any: ...


class SceneView(QWidget):
    """One scene: its title, its body (filled from a ``services.demo.Scene``), an empty state
    that says what to run, and the scene's recording line."""

    hints = ""

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__()
        self.kind = kind
        self.window_ = window
        self.scene: demosvc.Scene | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.title = text_label(title, "h1")
        lay.addWidget(self.title)
        self.subtitle = text_label("", "body", "muted", wrap=True)
        lay.addWidget(self.subtitle)
        self.body = QWidget()
        lay.addWidget(self.body, 1)
        self.empty = text_label("loading…", "h2", "muted", wrap=True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.empty, 1)
        self.body.hide()
        self.footer_rec = recorded("")
        self.footer_rec.hide()
        lay.addWidget(self.footer_rec)

    def set_scene(self, scene: demosvc.Scene) -> None:
        self.scene = scene
        self.title.setText(scene.title)
        if scene.empty:
            self.body.hide()
            self.empty.setText(f"Nothing to show here yet.\n{scene.empty}")
            self.empty.show()
            return
        self.empty.hide()
        self.body.show()
        self.fill(scene)
        self.rescale(self.window_.base or 16.0)
        if scene.recorded:
            self.footer_rec.setText(f"● {scene.recorded}")
            self.footer_rec.show()

    def fill(self, scene: demosvc.Scene) -> None:
        raise NotImplementedError

    def rescale(self, base: float) -> None:
        """Spacing that follows the type size (called on every resize of the window)."""
        lay = self.body.layout()
        if isinstance(lay, QGridLayout):
            lay.setVerticalSpacing(int(base * 0.7))
            lay.setHorizontalSpacing(int(base * 0.8))
        elif lay is not None:
            lay.setSpacing(int(base * 0.7))

    # what the window asks a scene
    def badge_texts(self) -> list[str]:
        return [w.text() for w in self.findChildren(QLabel)
                if w.property("badge") and w.isVisibleTo(self)]

    def recorded_texts(self) -> list[str]:
        return [w.text() for w in self.findChildren(QLabel)
                if w.property("recorded") and w.text().strip("● ") and w.isVisibleTo(self)]

    def advance(self) -> bool:
        """Consume a 'next' key inside the scene (True) or let the window move on."""
        return False

    def retreat(self) -> bool:
        return False

    def entered(self, forward: bool) -> None:
        pass

    def left(self) -> None:
        pass


class GenerateView(SceneView):
    """Live generation: the prompt and the text as it streams, a big tok/s meter, the time
    to first token, the device and its source; the speeds the run recorded beside it."""

    hints = "R run again · P next prompt"

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__(kind, title, window)
        self.prompt_i = 0
        self._thread: threading.Thread | None = None
        self._cancel: EventProgress | None = None
        self._t0 = 0.0
        self._first: float | None = None
        self._chunks = 0
        self.last: dict[str, Any] | None = None
        self.error = ""
        row = QHBoxLayout(self.body)
        row.setContentsMargins(0, 0, 0, 0)
        left = QVBoxLayout()
        row.addLayout(left, 3)
        self.prompt_label = text_label("", "small", "muted")
        left.addWidget(self.prompt_label)
        self.output = QPlainTextEdit()
        self.output.setObjectName("output")
        self.output.setReadOnly(True)
        self.output.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.output.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left.addWidget(self.output, 1)
        right = QVBoxLayout()
        row.addLayout(right, 2)
        self.status = text_label("", "h2", "accent")
        right.addWidget(self.status)
        self.gauge = Gauge()
        right.addWidget(self.gauge, 3)
        self.live_badge = badge("measured")
        right.addWidget(self.live_badge, 0, Qt.AlignmentFlag.AlignHCenter)
        self.ttft = text_label("", "h2")
        self.ttft.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        right.addWidget(self.ttft)
        self.detail = text_label("", "small", "muted", wrap=True)
        self.detail.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        right.addWidget(self.detail)
        self.note = text_label("", "body", "rec", wrap=True)
        self.note.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        right.addWidget(self.note)
        self.recorded_box = QGridLayout()
        right.addLayout(self.recorded_box)
        right.addStretch(1)

    def fill(self, scene: demosvc.Scene) -> None:
        ex = scene.extra
        self.source = ex["source"]
        self.device_name = ex["device_name"]
        self.prompts = list(ex["prompts"])
        self.live_badge.setText(f"{self.source} · live · {self.device_name}")
        self.live_badge.setProperty("badge", self.source)
        self.live_badge.setProperty("source", self.source)
        self.live_badge.style().unpolish(self.live_badge)
        self.live_badge.style().polish(self.live_badge)
        self.note.setText(scene.note)
        same = [f.value for f in scene.figures
                if f.name == "decode speed" and f.where == self.device_name and f.value]
        self.gauge.floor = max(same, default=0.0)
        self.gauge.scale = nice_ceiling(self.gauge.floor * 1.1) if same else 1.0
        self.subtitle.setText(f"{self.window_.demo.project.name} · {self.device_name} · up to "
                              f"{ex['max_new_tokens']} new tokens, greedy")
        clear_layout(self.recorded_box, hide=True)
        row = 0
        if scene.figures:
            self.recorded_box.addWidget(text_label("Recorded earlier — not live", "small", "muted"),
                                        row, 0, 1, 3)
            row += 1
        groups: dict[str, list[demosvc.Figure]] = {}
        live_first = sorted(scene.figures, key=lambda f: f.where != self.device_name)
        for fig in live_first:
            groups.setdefault(fig.recorded, []).append(fig)
        for rec, figs in groups.items():
            for fig in figs:
                self.recorded_box.addWidget(text_label(fig.name, "small"), row, 0)
                self.recorded_box.addWidget(text_label(fig.text, "small"), row, 1)
                self.recorded_box.addWidget(badge(fig.source, fig.where), row, 2)
                row += 1
            self.recorded_box.addWidget(recorded(rec), row, 0, 1, 3)
            row += 1
        if self.window_.current_view() is self and self._thread is None and self.last is None:
            self.start()

    # ---- the live generation ----------------------------------------------------------------
    def entered(self, forward: bool) -> None:
        if self.scene is not None and not self.scene.empty and self._thread is None \
                and self.last is None:
            self.start()

    def left(self) -> None:
        self.cancel()

    def running(self) -> bool:
        return self._thread is not None

    def start(self, next_prompt: bool = False) -> None:
        if self.scene is None or self.scene.empty or self._thread is not None:
            return
        if next_prompt:
            self.prompt_i = (self.prompt_i + 1) % len(self.prompts)
        prompt = self.prompts[self.prompt_i]
        demo = self.window_.demo
        self.last, self.error = None, ""
        self._cancel = cancel = EventProgress()
        self._t0, self._first, self._chunks = time.perf_counter(), None, 0
        self.prompt_label.setText(f"prompt {self.prompt_i + 1} of {len(self.prompts)}")
        self.output.clear()
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(MUTED))
        self.output.textCursor().insertText(prompt, fmt)
        self.gauge.set_value(None, self.source)
        for w in (self.gauge, self.live_badge, self.ttft):
            w.show()
        self.detail.setProperty("fs", "small")
        self._tone(self.detail, "muted")
        self._tone(self.status, "accent")
        self.status.setText(f"● LIVE on {self.device_name} — loading the model…")
        self.ttft.setText("time to first token: –")
        self.detail.setText("")
        bridge = _GenBridge()
        bridge.text.connect(self._on_text)
        bridge.finished.connect(self._on_finished)
        bridge.failed.connect(self._on_failed)
        self._bridge = bridge

        def work() -> None:
            try:
                bridge.finished.emit(demosvc.live_generate(demo, prompt, bridge.text.emit,
                                                           cancel))
            except Cancelled:
                bridge.failed.emit("stopped")
            except StudioError as exc:
                bridge.failed.emit(exc.message)
            except Exception as exc:  # noqa: BLE001 - shown on stage, not swallowed
                bridge.failed.emit(f"generation failed: {type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=work, name="demo-generate", daemon=True)
        self._thread.start()

    def rescale(self, base: float) -> None:
        super().rescale(base)
        self.gauge.setMaximumHeight(int(base * 13))
        self.gauge.setMinimumHeight(int(base * 8))

    def restart(self, next_prompt: bool = False) -> None:
        """R / P: stop a generation that is still going (between tokens) and start again."""
        if self._thread is not None:
            self.cancel(wait=30.0)
            QApplication.processEvents()  # its 'stopped' arrives and clears the thread
            self._thread = None
        self.start(next_prompt=next_prompt)

    def cancel(self, wait: float = 0.0) -> None:
        if self._cancel is not None:
            self._cancel.event.set()
        t = self._thread
        if t is not None and wait:
            t.join(wait)

    def _on_text(self, text: str) -> None:
        now = time.perf_counter()
        if self._first is None:
            self._first = now
            self.ttft.setText(f"first token after {(now - self._t0) * 1e3:,.0f} ms")
            self.detail.setText("(including loading the model)")
            self.status.setText(f"● LIVE on {self.device_name}")
        self._chunks += 1
        c = self.output.textCursor()
        c.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(TEXT))
        c.insertText(text, fmt)
        self.output.setTextCursor(c)
        self.output.ensureCursorVisible()
        if now > self._first and self._chunks > 3:
            self.gauge.set_value((self._chunks - 1) / (now - self._first), self.source)

    def _on_finished(self, out: dict) -> None:
        self._thread = None
        self.last = out
        tps, ttft = out.get("decode_tokens_per_s"), out.get("time_to_first_token_ms")
        self.gauge.set_value(tps, out["source"], rescale=True)
        self.status.setText(f"● LIVE run done on {out['device_name']}")
        self.live_badge.setText(f"{out['source']} · live · {out['device_name']}")
        self.ttft.setText(f"time to first token {ttft:,.1f} ms" if ttft is not None
                          else "time to first token: not timed")
        n = len(out.get("tokens") or [])
        self.detail.setText(f"{n} tokens · {out['decode_ms_per_token']:.2f} ms per token "
                            f"(median) · model load {out['load_s']:.1f} s"
                            if out.get("decode_ms_per_token") else
                            f"{n} tokens · model load {out['load_s']:.1f} s")

    def _on_failed(self, message: str) -> None:
        self._thread = None
        self.error = message
        if message == "stopped":
            self.status.setText("stopped — R runs it again")
            return
        self.status.setText("● the live generation could not run")
        self._tone(self.status, "bad")
        for w in (self.gauge, self.live_badge, self.ttft):  # nothing was measured
            w.hide()
        self.detail.setProperty("fs", "h2")
        self._tone(self.detail, "muted")
        self.detail.setText(message)

    @staticmethod
    def _tone(w: QLabel, tone: str) -> None:
        w.setProperty("tone", tone)
        w.style().unpolish(w)
        w.style().polish(w)


class _GenBridge(QObject):
    text = Signal(str)
    finished = Signal(object)
    failed = Signal(str)


class WaterfallView(SceneView):
    """The optimization waterfall, one step per key press: the chip's estimated decode speed
    as bars, the host CPU's measured speed and the perplexity each step costs beside it."""

    hints = "→ reveals the next step"

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__(kind, title, window)
        self.grid = QGridLayout(self.body)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.rows: list[list[QWidget]] = []
        self.shown = 0
        self.chip_name = ""
        self.subtitle.setProperty("fs", "h2")
        self.subtitle.setProperty("tone", "accent")

    def fill(self, scene: demosvc.Scene) -> None:
        clear_layout(self.grid, hide=True)
        self.rows = []
        chip = scene.extra.get("chip_name", "")
        self.chip_name = chip
        heads = ["step", f"{chip} (estimated)", "", "", "host CPU (measured)",
                 "perplexity"]
        for c, h in enumerate(heads):
            self.grid.addWidget(text_label(h, "small", "muted"), 0, c)
        top = max((r["estimated"].value for r in scene.rows if r["estimated"]), default=1.0)
        for i, r in enumerate(scene.rows, 1):
            est = r["estimated"]
            cells: list[QWidget] = [text_label(r["label"], "h2")]
            cells.append(Bar((est.value or 0) / top if est else 0, ACCENT))
            cells.append(text_label(est.text if est else "–", "h2"))
            cells.append(badge("estimated", chip) if est else text_label(""))
            m, ppl = r["measured"], r["perplexity"]
            mw = QWidget()
            ml = QHBoxLayout(mw)
            ml.setContentsMargins(0, 0, 0, 0)
            ml.addWidget(text_label(m.text, "body"))
            ml.addWidget(badge(m.source, m.where))
            cells.append(mw)
            first = scene.rows[0]["perplexity"].value or 0.0
            tone = "bad" if ppl.value and first and ppl.value > first * 1.05 else None
            cells.append(text_label(ppl.text, "body", tone))
            for c, w in enumerate(cells):
                self.grid.addWidget(w, i, c)
            self.rows.append(cells)
        self.grid.setColumnStretch(1, 1)
        self.note_label = text_label(scene.note, "small", "muted", wrap=True)
        self.grid.addWidget(self.note_label, len(scene.rows) + 1, 0, 1, 6)
        self.grid.setRowStretch(len(scene.rows) + 2, 1)
        self.reveal(1 if self.shown == 0 else self.shown)

    def reveal(self, n: int) -> None:
        self.shown = max(0, min(n, len(self.rows)))
        for i, cells in enumerate(self.rows):
            for w in cells:
                w.setVisible(i < self.shown)
        self.subtitle.setText(self.so_far())

    def so_far(self) -> str:
        """The headline: decode speed on the chip from the first step to the last shown."""
        if self.scene is None or not self.shown:
            return ""
        rows = self.scene.rows
        a, b = rows[0]["estimated"], rows[self.shown - 1]["estimated"]
        if a is None or b is None or not a.value:
            return f"decode speed on {self.chip_name}, step by step"
        if self.shown == 1:
            return (f"decode speed on {self.chip_name}, step by step, each on top of the last: "
                    f"{rows[0]['label']} {a.text}")
        last = rows[self.shown - 1]["label"]
        return (f"on {self.chip_name}: {rows[0]['label']} {a.text} → {last} {b.text}  "
                f"(×{(b.value or 0) / a.value:.2f}, estimated)")

    def rescale(self, base: float) -> None:
        super().rescale(base)
        for i in range(1, len(self.rows) + 1):
            self.grid.setRowMinimumHeight(i, int(base * 2.6))

    def entered(self, forward: bool) -> None:
        if self.rows:
            self.reveal(1 if forward else len(self.rows))

    def advance(self) -> bool:
        if self.rows and self.shown < len(self.rows):
            self.reveal(self.shown + 1)
            return True
        return False

    def retreat(self) -> bool:
        if self.rows and self.shown > 1:
            self.reveal(self.shown - 1)
            return True
        return False


class AccuracyView(SceneView):
    """FP32 against the deployed model: the figures as badges, the gates passed or failed."""

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__(kind, title, window)
        self.lay = QVBoxLayout(self.body)
        self.lay.setContentsMargins(0, 0, 0, 0)

    def fill(self, scene: demosvc.Scene) -> None:
        clear_layout(self.lay, hide=True)
        self.subtitle.setText(scene.note)
        cards = QGridLayout()
        figs = scene.figures
        change = scene.extra.get("perplexity_change")
        for i, fig in enumerate(figs):
            value = fig.text
            tone = None
            if fig.name == figures.title("perplexity_quantized") and change is not None:
                value = f"{fig.text}  ({signed(change, '.1%', '−')})"
                tone = "good" if change <= 0.02 else ("bad" if change > 0.05 else None)
            # the badges on stage: the recording line is once per scene, below
            cards.addWidget(card(fig.name, value, fig, "hero", tone, with_recording=False),
                            i // 3, i % 3)
        self.lay.addLayout(cards)
        if scene.rows:
            self.lay.addSpacing(8)
            self.lay.addWidget(text_label("The project's accuracy gates", "h2"))
            for g in scene.rows:
                mark = "✔ pass" if g["passed"] else "✘ fail"
                val = (signed(g["value"], ".2%", "−") if "increase" in g["gate"]
                       else f"{g['value']:.4g}")
                op = "≤" if g["gate"].startswith("max") else "≥"
                thr = (signed(g["threshold"], ".0%", "−") if "increase" in g["gate"]
                       else f"{g['threshold']:g}")
                self.lay.addWidget(text_label(f"{mark}   {g['label']}: {val} {op} {thr}", "body",
                                          "good" if g["passed"] else "bad"))
        self.lay.addStretch(1)


class ShareView(SceneView):
    """Bars of shares (the op breakdown) or of bytes (the memory picture)."""

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__(kind, title, window)
        self.grid = QGridLayout(self.body)
        self.grid.setContentsMargins(0, 0, 0, 0)

    def fill(self, scene: demosvc.Scene) -> None:
        clear_layout(self.grid, hide=True)
        self.bar_rows: list[int] = []
        if self.kind == "profile":
            self._profile(scene)
        else:
            self._memory(scene)

    def _header(self, scene: demosvc.Scene, row: int) -> int:
        if scene.figures:
            box = QHBoxLayout()
            box.setSpacing(int((self.window_.base or 16) * 0.8))
            for fig in scene.figures:
                box.addWidget(card(fig.name, fig.text, fig, "big", with_recording=False))
            box.addStretch(1)
            self.grid.addLayout(box, row, 0, 1, 4)
            row += 1
        return row

    def _profile(self, scene: demosvc.Scene) -> None:
        src = scene.extra.get("source", "simulated")
        where = scene.figures[0].where if scene.figures else ""
        self.subtitle.setText(scene.note)
        head = QHBoxLayout()
        ops = scene.extra.get("ops")
        head.addWidget(text_label(f"{ops:,} {figures.title('profiled_ops')} — share of the step by op "
                              "type" if ops else "share of one decode step by op type", "h2"))
        head.addStretch(1)
        head.addWidget(badge(src, where))
        self.grid.addLayout(head, 0, 0, 1, 4)
        row = 1
        top = max((r["share"] for r in scene.rows), default=1.0) or 1.0
        for r in scene.rows:
            self.grid.addWidget(text_label(r["name"], "h2"), row, 0)
            self.grid.addWidget(Bar(r["share"] / top, ACCENT), row, 1)
            self.grid.addWidget(text_label(f"{r['share']:.1%}", "h2"), row, 2)
            self.grid.addWidget(text_label(f"{r['count']} op{'s' if r['count'] != 1 else ''}",
                                       "small", "muted"), row, 3)
            self.bar_rows.append(row)
            row += 1
        blocks = scene.extra.get("blocks") or []
        if blocks:
            text = " · ".join(f"{b['name']} {b['share']:.0%}" for b in blocks[:8])
            self.grid.addWidget(text_label(f"by block of the transformer: {text}", "body", "muted",
                                       wrap=True), row, 0, 1, 4)
            row += 1
        self.grid.setColumnStretch(1, 1)
        self.grid.setRowStretch(row, 1)

    def _memory(self, scene: demosvc.Scene) -> None:
        self.subtitle.setText(scene.note)
        row = self._header(scene, 0)
        top = max((r["bytes"] for r in scene.rows), default=1) or 1
        colors = [MUTED, ACCENT, "#b083f0", "#d29922", GOOD]
        for i, r in enumerate(scene.rows):
            self.grid.addWidget(text_label(r["name"], "h2"), row, 0)
            self.grid.addWidget(Bar(r["bytes"] / top, colors[i % len(colors)]), row, 1)
            self.grid.addWidget(text_label(r["text"], "h2"), row, 2)
            self.grid.addWidget(badge(r["source"], "graph shapes"), row, 3)
            self.bar_rows.append(row)
            row += 1
        self.grid.setColumnStretch(1, 1)
        self.grid.setRowStretch(row, 1)


    def rescale(self, base: float) -> None:
        super().rescale(base)
        for r in getattr(self, "bar_rows", []):
            self.grid.setRowMinimumHeight(r, int(base * (2.4 if self.kind == "memory" else 2.0)))


class BundleView(SceneView):
    """The target chips (what each is, whether the run compiled for it) and the deployment
    bundle's files."""

    def __init__(self, kind: str, title: str, window: DemoWindow):
        super().__init__(kind, title, window)
        self.lay = QVBoxLayout(self.body)
        self.lay.setContentsMargins(0, 0, 0, 0)

    def fill(self, scene: demosvc.Scene) -> None:
        clear_layout(self.lay, hide=True)
        self.subtitle.setText("where the model goes, and what ships")
        chips = QHBoxLayout()
        for r in scene.rows:
            f = QFrame()
            f.setProperty("card", True)
            v = QVBoxLayout(f)
            v.addWidget(text_label(r["name"], "h2"))
            v.addWidget(text_label(" · ".join(x for x in (r["htp"], r["vtcm"], r["ddr"]) if x),
                               "body", "muted", wrap=True))
            cb = badge("catalog", "chip figures")
            cb.setToolTip(r.get("catalog_source", ""))
            v.addWidget(cb)
            if r["compiled"]:
                npu = {True: "all ops on the NPU", False: "some ops leave the NPU",
                       None: ""}[r["on_npu"]]
                v.addWidget(text_label(f"✔ compiled · QNN SDK {r['sdk']}" + (f" · {npu}" if npu
                                                                        else ""),
                                   "body", "good" if r["on_npu"] is not False else None,
                                   wrap=True))
                v.addWidget(recorded(r["recorded"]))
            else:
                v.addWidget(text_label("not compiled yet", "body", "muted"))
            v.addStretch(1)
            f.setMinimumWidth(int((self.window_.base or 16) * 24))
            chips.addWidget(f, 1)
        if len(scene.rows) < 3:
            chips.addStretch(3 - len(scene.rows))
        self.lay.addLayout(chips)
        self.lay.addSpacing(8)
        b = scene.extra.get("bundle")
        if b:
            self.lay.addWidget(text_label(f"Genie bundle for {get_chip(b['target']).name} — "
                                      f"{len(b['files'])} files, "
                                      f"{format_bytes(b['total_bytes'])}", "h2"))
            if b.get("summary"):
                self.lay.addWidget(text_label(b["summary"], "body", "muted", wrap=True))
            files = sorted(b["files"], key=lambda f: -f["bytes"])
            grid = QGridLayout()
            for i, fl in enumerate(files[:6]):
                grid.addWidget(text_label(fl["name"], "body"), i // 2, (i % 2) * 2)
                grid.addWidget(text_label(format_bytes(fl["bytes"]), "body", "muted"), i // 2,
                               (i % 2) * 2 + 1)
            if len(files) > 6:
                grid.addWidget(text_label(f"and {len(files) - 6} more", "small", "muted"), 3, 0)
            self.lay.addLayout(grid)
            for fig in scene.figures:
                row = QHBoxLayout()
                row.addWidget(text_label(f"{fig.name}: {fig.text}", "body"))
                row.addWidget(badge(fig.source, fig.where))
                row.addStretch(1)
                self.lay.addLayout(row)
        elif scene.note:
            self.lay.addWidget(text_label(scene.note, "h2", "muted", wrap=True))
        self.lay.addStretch(1)


VIEWS: dict[str, type[SceneView]] = {
    "generate": GenerateView, "waterfall": WaterfallView, "accuracy": AccuracyView,
    "profile": ShareView, "memory": ShareView, "bundle": BundleView,
}


class BuildBridge(QObject):
    ready = Signal(int, object)
