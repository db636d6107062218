"""The demo window's building blocks: labels at the demo's type scale, source badges, bars,
the gauge and the figure card (:mod:`studio.ui.demo`)."""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from studio.services import demo as demosvc
from studio.ui.theme import SOURCE_COLORS

BG, PANEL, TEXT, MUTED = "#0d1117", "#161b22", "#eef1f5", "#9aa4b2"
ACCENT, GOOD, BAD, REC = "#3ea6ff", "#3fb950", "#ff6b6b", "#f0b429"
BADGE_COLORS = {**SOURCE_COLORS, "catalog": "#5b6570"}
FONT = "DejaVu Sans"
MONO = "DejaVu Sans Mono"


def text_label(text: str = "", size: str = "body", color: str | None = None,
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
    w = text_label(f"● {text}", "small", "rec", wrap=True)
    w.setProperty("recorded", True)
    return w




def demo_stylesheet(base: float) -> str:
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
    lay.addWidget(text_label(title, "small", "muted", wrap=True))
    lay.addWidget(text_label(value, value_size, tone))
    if fig is not None:
        lay.addWidget(badge(fig.source, fig.where))
        if fig.recorded and with_recording:
            lay.addWidget(recorded(fig.recorded))
    lay.addStretch(1)
    return f
