"""Demo mode: a full-screen, keyboard-driven stage for a stakeholder demo (``studio demo FILE``
and View → Demo).

The scenes come from the project's demo file (``core.demo``), their figures from
``services.demo``; each figure shows its source badge, and a recorded figure says which run,
on which device, when. The live generation runs in a thread (the playground's way: the UI only
receives queued signals) with a tok/s meter and the time to first token.

Keys: → / Space / PageDown next (the waterfall reveals one step per press first), ← / PageUp
back, Home first scene, End last, R runs the generation again, P the next prompt, F full
screen on/off, Esc leaves full screen (and then closes).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QKeyEvent, QPainter, QPen, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QPlainTextEdit,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core import figures, thirdparty
from studio.core.errors import Cancelled, StudioError
from studio.core.progress import EventProgress
from studio.core.units import signed
from studio.services import demo as demosvc
from studio.ui.theme import SOURCE_COLORS
from studio.ui.widgets import clear_layout

BG, PANEL, TEXT, MUTED = "#0d1117", "#161b22", "#eef1f5", "#9aa4b2"
ACCENT, GOOD, BAD, REC = "#3ea6ff", "#3fb950", "#ff6b6b", "#f0b429"
BADGE_COLORS = {**SOURCE_COLORS, "catalog": "#5b6570"}
FONT = "DejaVu Sans"
MONO = "DejaVu Sans Mono"


def _label(text: str = "", size: str = "body", color: str | None = None,
           wrap: bool = False) -> QLabel:
    w = QLabel(text)
    w.setProperty("fs", size)
    if color:
        w.setProperty("tone", color)
    w.setWordWrap(wrap)
    w.setTextFormat(Qt.TextFormat.PlainText)
    return w


def badge(source: str, where: str = "") -> QLabel:
    """A source badge on stage: ``measured · host CPU`` in the source's colour."""
    w = QLabel(f"{source} · {where}" if where else source)
    w.setProperty("badge", source if source in BADGE_COLORS else "catalog")
    w.setProperty("source", source)
    w.setTextFormat(Qt.TextFormat.PlainText)
    w.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
    return w


def recorded(text: str) -> QLabel:
    w = _label(f"● {text}", "small", "rec", wrap=True)
    w.setProperty("recorded", True)
    return w




def _stylesheet(base: float) -> str:
    px = lambda k: f"{max(8, round(base * k))}px"  # noqa: E731
    rules = [
        f"QWidget#stage {{ background: {BG}; }}",
        f"QWidget#stage QLabel {{ color: {TEXT}; font-family: '{FONT}'; font-size: {px(1)}; "
        "background: transparent; }",
        f"#stage QLabel[fs='hero'] {{ font-size: {px(3.4)}; font-weight: 700; }}",
        f"#stage QLabel[fs='big'] {{ font-size: {px(2.3)}; font-weight: 700; }}",
        f"#stage QLabel[fs='h1'] {{ font-size: {px(2.2)}; font-weight: 700; }}",
        f"#stage QLabel[fs='h2'] {{ font-size: {px(1.35)}; font-weight: 600; }}",
        f"#stage QLabel[fs='body'] {{ font-size: {px(1)}; }}",
        f"#stage QLabel[fs='small'] {{ font-size: {px(0.8)}; }}",
        f"#stage QLabel[tone='muted'] {{ color: {MUTED}; }}",
        f"#stage QLabel[tone='rec'] {{ color: {REC}; }}",
        f"#stage QLabel[tone='good'] {{ color: {GOOD}; }}",
        f"#stage QLabel[tone='bad'] {{ color: {BAD}; }}",
        f"#stage QLabel[tone='accent'] {{ color: {ACCENT}; }}",
        f"#stage QFrame[card='true'] {{ background: {PANEL}; border-radius: {px(0.6)}; }}",
        f"#stage QPlainTextEdit#output {{ background: {PANEL}; color: {TEXT}; border: none; "
        f"border-radius: {px(0.6)}; font-family: '{MONO}'; font-size: {px(1.25)}; "
        f"padding: {px(0.6)}; }}",
        f"QWidget#footer QLabel {{ color: {MUTED}; font-size: {px(0.8)}; }}",
    ]
    for source, color in BADGE_COLORS.items():
        rules.append(f"#stage QLabel[badge='{source}'] {{ background: {color}; color: white; "
                     f"border-radius: {px(0.45)}; padding: {px(0.12)} {px(0.5)}; "
                     f"font-size: {px(0.78)}; font-weight: 600; }}")
    return "\n".join(rules)


class Bar(QWidget):
    """A horizontal bar: ``fraction`` of the width in ``color`` (a painted widget)."""

    def __init__(self, fraction: float, color: str = ACCENT, parent: QWidget | None = None):
        super().__init__(parent)
        self.fraction = max(0.0, min(1.0, fraction))
        self.color = QColor(color)
        self.setMinimumHeight(8)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        base = float(getattr(self.window(), "_base", 0.0) or 16.0)
        h = min(self.height() * 0.62, base * 1.3)
        y = (self.height() - h) / 2
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(QColor(PANEL))
        p.drawRoundedRect(QRectF(0, y, self.width(), h), h / 4, h / 4)
        w = max(h / 2, self.width() * self.fraction) if self.fraction > 0 else 0
        p.setBrush(self.color)
        p.drawRoundedRect(QRectF(0, y, w, h), h / 4, h / 4)
        p.end()


def nice_ceiling(x: float) -> float:
    """The next 1 / 2 / 5 × 10^k at or above ``x`` (a gauge's full scale)."""
    if x <= 0:
        return 1.0
    k = 10 ** math.floor(math.log10(x))
    return next(m * k for m in (1, 2, 5, 10) if m * k >= x)


class Gauge(QWidget):
    """The tok/s meter: an arc filled to ``value / scale``, the number in the middle."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.value: float | None = None
        self.scale = 1.0
        self.floor = 0.0  # the scale never goes below this (a recorded speed of the device)
        self.unit = "tok/s"
        self.color = QColor(ACCENT)
        self.setMinimumSize(120, 100)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def set_value(self, value: float | None, source: str = "measured",
                  rescale: bool = False) -> None:
        """``rescale``: fit the full scale to the value (the final figure); otherwise the
        scale only grows (the live estimate while tokens stream)."""
        self.value = value
        if value is not None and (rescale or value > self.scale):
            self.scale = nice_ceiling(max(value * 1.1, self.floor))
        self.color = QColor(BADGE_COLORS.get(source, ACCENT)).lighter(150)
        self.update()

    def text(self) -> str:
        v = self.value
        if v is None:
            return "–"
        return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt's name
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        side = min(self.width(), self.height() * 1.25)
        pen_w = side * 0.07
        r = QRectF((self.width() - side) / 2 + pen_w, pen_w, side - 2 * pen_w, side - 2 * pen_w)
        pen = QPen(QColor(PANEL), pen_w, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
        p.setPen(pen)
        p.drawArc(r, 210 * 16, -240 * 16)
        if self.value:
            pen.setColor(self.color)
            p.setPen(pen)
            frac = max(0.0, min(1.0, self.value / self.scale))
            p.drawArc(r, 210 * 16, int(-240 * 16 * frac))
        p.setPen(QColor(TEXT))
        f = QFont(FONT)
        f.setPixelSize(max(10, int(side * 0.2)))
        f.setBold(True)
        p.setFont(f)
        c = r.center()
        box = QRectF(r.left(), c.y() - side * 0.16, r.width(), side * 0.24)
        p.drawText(box, Qt.AlignmentFlag.AlignCenter, self.text())
        f.setPixelSize(max(9, int(side * 0.08)))
        f.setBold(False)
        p.setFont(f)
        p.setPen(QColor(MUTED))
        p.drawText(QRectF(r.left(), c.y() + side * 0.08, r.width(), side * 0.1),
                   Qt.AlignmentFlag.AlignCenter, self.unit)
        p.end()


def card(title: str, value: str, fig: demosvc.Figure | None = None, value_size: str = "big",
         tone: str | None = None, with_recording: bool = True) -> QFrame:
    """A figure on stage: what it is, the value large, its source badge, its recording (left
    out where the scene shows one recording line for all its cards)."""
    f = QFrame()
    f.setProperty("card", True)
    lay = QVBoxLayout(f)
    lay.setSpacing(4)
    lay.addWidget(_label(title, "small", "muted", wrap=True))
    lay.addWidget(_label(value, value_size, tone))
    if fig is not None:
        lay.addWidget(badge(fig.source, fig.where))
        if fig.recorded and with_recording:
            lay.addWidget(recorded(fig.recorded))
    lay.addStretch(1)
    return f


# ---- scenes -----------------------------------------------------------------------------------
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
        self.title = _label(title, "h1")
        lay.addWidget(self.title)
        self.subtitle = _label("", "body", "muted", wrap=True)
        lay.addWidget(self.subtitle)
        self.body = QWidget()
        lay.addWidget(self.body, 1)
        self.empty = _label("loading…", "h2", "muted", wrap=True)
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
        self.rescale(self.window_._base or 16.0)
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
        self.prompt_label = _label("", "small", "muted")
        left.addWidget(self.prompt_label)
        self.output = QPlainTextEdit()
        self.output.setObjectName("output")
        self.output.setReadOnly(True)
        self.output.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.output.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left.addWidget(self.output, 1)
        right = QVBoxLayout()
        row.addLayout(right, 2)
        self.status = _label("", "h2", "accent")
        right.addWidget(self.status)
        self.gauge = Gauge()
        right.addWidget(self.gauge, 3)
        self.live_badge = badge("measured")
        right.addWidget(self.live_badge, 0, Qt.AlignmentFlag.AlignHCenter)
        self.ttft = _label("", "h2")
        self.ttft.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        right.addWidget(self.ttft)
        self.detail = _label("", "small", "muted", wrap=True)
        self.detail.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        right.addWidget(self.detail)
        self.note = _label("", "body", "rec", wrap=True)
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
            self.recorded_box.addWidget(_label("Recorded earlier — not live", "small", "muted"),
                                        row, 0, 1, 3)
            row += 1
        groups: dict[str, list[demosvc.Figure]] = {}
        live_first = sorted(scene.figures, key=lambda f: f.where != self.device_name)
        for fig in live_first:
            groups.setdefault(fig.recorded, []).append(fig)
        for rec, figs in groups.items():
            for fig in figs:
                self.recorded_box.addWidget(_label(fig.name, "small"), row, 0)
                self.recorded_box.addWidget(_label(fig.text, "small"), row, 1)
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
            self.grid.addWidget(_label(h, "small", "muted"), 0, c)
        top = max((r["estimated"].value for r in scene.rows if r["estimated"]), default=1.0)
        for i, r in enumerate(scene.rows, 1):
            est = r["estimated"]
            cells: list[QWidget] = [_label(r["label"], "h2")]
            cells.append(Bar((est.value or 0) / top if est else 0, ACCENT))
            cells.append(_label(est.text if est else "–", "h2"))
            cells.append(badge("estimated", chip) if est else _label(""))
            m, ppl = r["measured"], r["perplexity"]
            mw = QWidget()
            ml = QHBoxLayout(mw)
            ml.setContentsMargins(0, 0, 0, 0)
            ml.addWidget(_label(m.text, "body"))
            ml.addWidget(badge(m.source, m.where))
            cells.append(mw)
            first = scene.rows[0]["perplexity"].value or 0.0
            tone = "bad" if ppl.value and first and ppl.value > first * 1.05 else None
            cells.append(_label(ppl.text, "body", tone))
            for c, w in enumerate(cells):
                self.grid.addWidget(w, i, c)
            self.rows.append(cells)
        self.grid.setColumnStretch(1, 1)
        self.note_label = _label(scene.note, "small", "muted", wrap=True)
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
            self.lay.addWidget(_label("The project's accuracy gates", "h2"))
            for g in scene.rows:
                mark = "✔ pass" if g["passed"] else "✘ fail"
                val = (signed(g["value"], ".2%", "−") if "increase" in g["gate"]
                       else f"{g['value']:.4g}")
                op = "≤" if g["gate"].startswith("max") else "≥"
                thr = (signed(g["threshold"], ".0%", "−") if "increase" in g["gate"]
                       else f"{g['threshold']:g}")
                self.lay.addWidget(_label(f"{mark}   {g['label']}: {val} {op} {thr}", "body",
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
            box.setSpacing(int((self.window_._base or 16) * 0.8))
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
        head.addWidget(_label(f"{ops:,} {figures.title('profiled_ops')} — share of the step by op "
                              "type" if ops else "share of one decode step by op type", "h2"))
        head.addStretch(1)
        head.addWidget(badge(src, where))
        self.grid.addLayout(head, 0, 0, 1, 4)
        row = 1
        top = max((r["share"] for r in scene.rows), default=1.0) or 1.0
        for r in scene.rows:
            self.grid.addWidget(_label(r["name"], "h2"), row, 0)
            self.grid.addWidget(Bar(r["share"] / top, ACCENT), row, 1)
            self.grid.addWidget(_label(f"{r['share']:.1%}", "h2"), row, 2)
            self.grid.addWidget(_label(f"{r['count']} op{'s' if r['count'] != 1 else ''}",
                                       "small", "muted"), row, 3)
            self.bar_rows.append(row)
            row += 1
        blocks = scene.extra.get("blocks") or []
        if blocks:
            text = " · ".join(f"{b['name']} {b['share']:.0%}" for b in blocks[:8])
            self.grid.addWidget(_label(f"by block of the transformer: {text}", "body", "muted",
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
            self.grid.addWidget(_label(r["name"], "h2"), row, 0)
            self.grid.addWidget(Bar(r["bytes"] / top, colors[i % len(colors)]), row, 1)
            self.grid.addWidget(_label(r["text"], "h2"), row, 2)
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
            v.addWidget(_label(r["name"], "h2"))
            v.addWidget(_label(" · ".join(x for x in (r["htp"], r["vtcm"], r["ddr"]) if x),
                               "body", "muted", wrap=True))
            cb = badge("catalog", "chip figures")
            cb.setToolTip(r.get("catalog_source", ""))
            v.addWidget(cb)
            if r["compiled"]:
                npu = {True: "all ops on the NPU", False: "some ops leave the NPU",
                       None: ""}[r["on_npu"]]
                v.addWidget(_label(f"✔ compiled · QNN SDK {r['sdk']}" + (f" · {npu}" if npu
                                                                        else ""),
                                   "body", "good" if r["on_npu"] is not False else None,
                                   wrap=True))
                v.addWidget(recorded(r["recorded"]))
            else:
                v.addWidget(_label("not compiled yet", "body", "muted"))
            v.addStretch(1)
            f.setMinimumWidth(int((self.window_._base or 16) * 24))
            chips.addWidget(f, 1)
        if len(scene.rows) < 3:
            chips.addStretch(3 - len(scene.rows))
        self.lay.addLayout(chips)
        self.lay.addSpacing(8)
        b = scene.extra.get("bundle")
        if b:
            from studio.core.catalog import get_chip
            from studio.core.units import format_bytes

            self.lay.addWidget(_label(f"Genie bundle for {get_chip(b['target']).name} — "
                                      f"{len(b['files'])} files, "
                                      f"{format_bytes(b['total_bytes'])}", "h2"))
            if b.get("summary"):
                self.lay.addWidget(_label(b["summary"], "body", "muted", wrap=True))
            files = sorted(b["files"], key=lambda f: -f["bytes"])
            grid = QGridLayout()
            for i, fl in enumerate(files[:6]):
                grid.addWidget(_label(fl["name"], "body"), i // 2, (i % 2) * 2)
                grid.addWidget(_label(format_bytes(fl["bytes"]), "body", "muted"), i // 2,
                               (i % 2) * 2 + 1)
            if len(files) > 6:
                grid.addWidget(_label(f"and {len(files) - 6} more", "small", "muted"), 3, 0)
            self.lay.addLayout(grid)
            for fig in scene.figures:
                row = QHBoxLayout()
                row.addWidget(_label(f"{fig.name}: {fig.text}", "body"))
                row.addWidget(badge(fig.source, fig.where))
                row.addStretch(1)
                self.lay.addLayout(row)
        elif scene.note:
            self.lay.addWidget(_label(scene.note, "h2", "muted", wrap=True))
        self.lay.addStretch(1)


VIEWS: dict[str, type[SceneView]] = {
    "generate": GenerateView, "waterfall": WaterfallView, "accuracy": AccuracyView,
    "profile": ShareView, "memory": ShareView, "bundle": BundleView,
}


class _BuildBridge(QObject):
    ready = Signal(int, object)


# ---- the window -------------------------------------------------------------------------------
class DemoWindow(QWidget):
    """The stage: one scene at a time, a footer with the scene number and the keys."""

    def __init__(self, demo: demosvc.Demo, start: int = 0, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        from studio.core.demo import SCENES

        self.demo = demo
        self.setObjectName("stage")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setWindowTitle(f"QStudio demo — {demo.title}")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.root = QVBoxLayout(self)
        # the type follows the window: the content never forces the window past the screen
        # (a minimum size above the screen's would drop full screen)
        self.root.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        top = QHBoxLayout()
        self.demo_title = _label(demo.title, "small", "muted")
        top.addWidget(self.demo_title)
        top.addStretch(1)
        self.run_label = _label(
            "no run recorded yet" if demo.run is None else
            f"recorded figures: run {demo.run.id}" if demo.spec.run is not None else
            f"recorded figures: run {demo.run.id}, the newest · each scene names its run",
            "small", "muted")
        top.addWidget(self.run_label)
        self.root.addLayout(top)
        self.stack = QStackedWidget()
        self.root.addWidget(self.stack, 1)
        self.views: list[SceneView] = []
        for kind in demo.spec.scenes:
            v = VIEWS[kind](kind, SCENES[kind], self)
            self.views.append(v)
            self.stack.addWidget(v)
        footer = QWidget()
        footer.setObjectName("footer")
        fl = QHBoxLayout(footer)
        fl.setContentsMargins(0, 0, 0, 0)
        self.position = _label("", "small")
        fl.addWidget(self.position)
        fl.addStretch(1)
        self.keys = _label("", "small")
        fl.addWidget(self.keys)
        self.root.addWidget(footer)
        self.index = -1
        self._base = 0.0
        self._build_thread: threading.Thread | None = None
        self.resize(1280, 720)
        self.go(max(0, min(start, len(self.views) - 1)))
        self._build()

    # ---- building the scenes off the UI thread ---------------------------------------------
    def _build(self) -> None:
        bridge = _BuildBridge()
        bridge.ready.connect(self._scene_ready)
        self._build_bridge = bridge
        demo, kinds = self.demo, list(self.demo.spec.scenes)
        first = self.index

        def work() -> None:
            order = [first] + [i for i in range(len(kinds)) if i != first]
            for i in order:
                try:
                    scene = demosvc.build_scene(demo, kinds[i])
                except Exception as exc:  # noqa: BLE001 - shown in the scene, not lost
                    from studio.core.demo import SCENES

                    scene = demosvc.Scene(kinds[i], SCENES[kinds[i]],
                                          empty=f"this scene failed: {type(exc).__name__}: "
                                                f"{exc}")
                bridge.ready.emit(i, scene)

        self._build_thread = threading.Thread(target=work, name="demo-scenes", daemon=True)
        self._build_thread.start()

    def _scene_ready(self, i: int, scene: demosvc.Scene) -> None:
        self.views[i].set_scene(scene)
        self._update_footer()

    def ready(self) -> bool:
        return all(v.scene is not None for v in self.views)

    # ---- moving between scenes -------------------------------------------------------------
    def current_view(self) -> SceneView | None:
        return self.views[self.index] if 0 <= self.index < len(self.views) else None

    def go(self, i: int, forward: bool = True) -> None:
        if not 0 <= i < len(self.views) or i == self.index:
            return
        old = self.current_view()
        if old is not None:
            old.left()
        self.index = i
        self.stack.setCurrentIndex(i)
        self.views[i].entered(forward)
        self._update_footer()

    def next(self) -> None:
        v = self.current_view()
        if v is not None and v.advance():
            return
        self.go(self.index + 1, True)

    def back(self) -> None:
        v = self.current_view()
        if v is not None and v.retreat():
            return
        self.go(self.index - 1, False)

    def _update_footer(self) -> None:
        v = self.current_view()
        n = len(self.views)
        self.position.setText(f"scene {self.index + 1} / {n} · {v.title.text() if v else ''}")
        hints = "→ / Space next · ← back · Home first · F full screen · Esc leave"
        if v is not None and v.hints and v.scene is not None and not v.scene.empty:
            hints = f"{v.hints} · {hints}"
        self.keys.setText(hints)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        k = event.key()
        K = Qt.Key
        if k in (K.Key_Right, K.Key_Space, K.Key_PageDown, K.Key_Down, K.Key_Return):
            self.next()
        elif k in (K.Key_Left, K.Key_PageUp, K.Key_Up, K.Key_Backspace):
            self.back()
        elif k == K.Key_Home:
            self.go(0, True)
        elif k == K.Key_End:
            self.go(len(self.views) - 1, False)
        elif k == K.Key_F:
            self.leave_full_screen() if self.isFullScreen() else self.full_screen()
        elif k == K.Key_Escape:
            if self.isFullScreen():
                self.leave_full_screen()
            else:
                self.close()
        elif k in (K.Key_R, K.Key_P) and isinstance(self.current_view(), GenerateView):
            view = self.current_view()
            assert isinstance(view, GenerateView)
            view.restart(next_prompt=k == K.Key_P)
        else:
            super().keyPressEvent(event)

    def full_screen(self) -> None:
        """Full screen on the window's screen (its geometry set too: without a window manager,
        e.g. on a bare X server, the full-screen state alone leaves the size as it was)."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            self.setGeometry(screen.geometry())
        self.showFullScreen()

    def leave_full_screen(self) -> None:
        self.showNormal()
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            g = screen.availableGeometry()
            w, h = min(1280, g.width()), min(720, g.height())
            self.setGeometry(g.x() + (g.width() - w) // 2, g.y() + (g.height() - h) // 2, w, h)

    # ---- type that follows the window's size -------------------------------------------------
    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        base = max(11.0, min(self.height() / 50.0, self.width() / 80.0))
        if abs(base - self._base) >= 0.5:
            self._base = base
            self.setStyleSheet(_stylesheet(base))
            m = int(base * 1.6)
            self.root.setContentsMargins(m, int(base * 0.8), m, int(base * 0.6))
            self.root.setSpacing(int(base * 0.5))
            for v in self.views:
                v.rescale(base)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        for v in self.views:
            if isinstance(v, GenerateView):
                v.cancel(wait=30.0)
        if self._build_thread is not None:
            self._build_thread.join(60)
        self.demo.close()
        super().closeEvent(event)


# ---- studio demo FILE ---------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="studio demo",
        description="Full-screen demo of a project: live generation, the optimization "
                    "waterfall, accuracy, the op breakdown, memory and the bundle. FILE is a "
                    "project (its NAME.demo.toml beside it is used when present) or a demo "
                    "file.")
    p.add_argument("file", metavar="FILE", help="NAME.qstudio or NAME.demo.toml")
    p.add_argument("--scene", default="1",
                   help="the scene to start on: its number (1 = the first) or its name")
    p.add_argument("--windowed", action="store_true", help="a window instead of full screen")
    return p.parse_args(argv)


def start_index(demo: demosvc.Demo, scene: str) -> int:
    kinds = list(demo.spec.scenes)
    if scene in kinds:
        return kinds.index(scene)
    if scene.isdigit() and 1 <= int(scene) <= len(kinds):
        return int(scene) - 1
    raise StudioError(f"--scene {scene}: the demo has {len(kinds)} scenes "
                      f"({', '.join(kinds)}): give 1 to {len(kinds)} or a name")


def main(argv: list[str] | None = None) -> int:
    """``studio demo FILE [--scene N] [--windowed]``: bad input says so in one line and exits
    2 before any window opens."""
    argv = list(sys.argv[1:] if argv is None else argv)
    thirdparty.settle()  # before any library is imported: offline, no telemetry store
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        demo = demosvc.open_demo(Path(args.file))
        start = start_index(demo, args.scene)
    except StudioError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")):
        demo.close()
        print("error: no display to show the demo on (DISPLAY is not set): run it in a "
              "desktop session", file=sys.stderr)
        return 2
    QApplication.setApplicationName("QStudio")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    win = DemoWindow(demo, start)
    if args.windowed:
        win.show()
    else:
        win.full_screen()
    if os.environ.get("QSTUDIO_EXIT_AFTER_SHOW") == "1":
        from PySide6.QtCore import QTimer

        QTimer.singleShot(0, lambda: (print(f"shown {win.windowTitle()}", flush=True),
                                      win.close()))
    return int(app.exec())


def open_for_window(win, full_screen: bool = True) -> DemoWindow | None:
    """View → Demo: the open project's demo (as the window holds it, unsaved edits included)
    in a window of its own; a problem is a notification in the studio window instead."""
    old = getattr(win, "demo_window", None)
    if old is not None:
        old.close()
        old.deleteLater()
    if win.ctl.studio is None:
        win.notify("Open a project first: the demo shows a project's results.", "error")
        return None
    try:
        demo = demosvc.open_demo(win.ctl.project.path, project=win.ctl.project.copy())
    except StudioError as exc:
        win.notify(exc.message, "error")
        return None
    dw = DemoWindow(demo, parent=win)
    if full_screen:
        dw.full_screen()
    else:
        dw.show()
    dw.activateWindow()
    dw.setFocus()
    return dw
