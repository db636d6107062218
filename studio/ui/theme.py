"""Light and dark themes (Fusion + a palette + a small style sheet) and shared colours."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle

#: one colour per source of a number (the same as the HTML report's badges)
SOURCE_COLORS = {
    "measured": "#1b7f3b",
    "simulated": "#8a5a00",
    "estimated": "#2f5da8",
    "imported": "#6b3fa0",
    "formula": "#5b6570",
    "checkpoint": "#5b6570",
}
SOURCE_TIPS = {
    "measured": "Measured on the named device.",
    "simulated": (
        "QNN HTP simulator on this x86 machine: real HTP numerics, but its timings follow the "
        "host CPU and are not device latency."
    ),
    "estimated": "The studio's performance model for the named SoC.",
    "imported": "Read from a file you brought.",
    "formula": "Computed from the model's shape by formula (no run involved).",
    "checkpoint": "Counted from the checkpoint's config and weight headers.",
}
STATE_COLORS = {
    "queued": "#7a7f87",
    "running": "#2f6fd6",
    "succeeded": "#1b8a3f",
    "failed": "#c62828",
    "cancelled": "#9a6700",
    "interrupted": "#9a6700",
    "skipped": "#7a7f87",
}


def effective_theme(name: str) -> str:
    if name in ("light", "dark"):
        return name
    hints = QGuiApplication.styleHints()
    try:
        if hints.colorScheme() == Qt.ColorScheme.Dark:
            return "dark"
    except AttributeError:  # pragma: no cover - older Qt
        pass
    return "light"


def _palette(dark: bool) -> QPalette:
    p = QPalette()
    if dark:
        base, window, text = QColor("#1f2226"), QColor("#2a2e33"), QColor("#e6e8eb")
        alt, button, mid = QColor("#262a2f"), QColor("#33383e"), QColor("#4a5058")
        highlight, link = QColor("#3d7bd9"), QColor("#7fb2ff")
        disabled = QColor("#7c838c")
    else:
        base, window, text = QColor("#ffffff"), QColor("#f3f4f6"), QColor("#1d2025")
        alt, button, mid = QColor("#f7f8fa"), QColor("#e9ebef"), QColor("#c3c8cf")
        highlight, link = QColor("#2f6fd6"), QColor("#1f5bbf")
        disabled = QColor("#8a9099")
    roles = QPalette.ColorRole
    p.setColor(roles.Window, window)
    p.setColor(roles.WindowText, text)
    p.setColor(roles.Base, base)
    p.setColor(roles.AlternateBase, alt)
    p.setColor(roles.ToolTipBase, window)
    p.setColor(roles.ToolTipText, text)
    p.setColor(roles.PlaceholderText, disabled)
    p.setColor(roles.Text, text)
    p.setColor(roles.Button, button)
    p.setColor(roles.ButtonText, text)
    p.setColor(roles.BrightText, QColor("#ff5555"))
    p.setColor(roles.Mid, mid)
    p.setColor(roles.Highlight, highlight)
    p.setColor(roles.HighlightedText, QColor("#ffffff"))
    p.setColor(roles.Link, link)
    for role in (roles.Text, roles.WindowText, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return p


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """The colour ``t`` of the way from ``a`` to ``b``."""
    return QColor(
        round(a.red() + (b.red() - a.red()) * t),
        round(a.green() + (b.green() - a.green()) * t),
        round(a.blue() + (b.blue() - a.blue()) * t),
    )


def indicator_border(palette: QPalette, enabled: bool = True) -> QColor:
    """The frame of a check box: between the field and the text, visible on both themes."""
    roles = QPalette.ColorRole
    group = QPalette.ColorGroup.Active if enabled else QPalette.ColorGroup.Disabled
    return mix(palette.color(group, roles.Base), palette.color(group, roles.Text), 0.45)


class StudioStyle(QProxyStyle):
    """Fusion, with check boxes (those of list items too) and radio buttons framed in
    :func:`indicator_border`: Fusion frames them in the window colour made darker, which
    vanishes on a dark base, so unchecked ones could not be seen in the dark theme."""

    def __init__(self) -> None:
        super().__init__("Fusion")

    def drawPrimitive(self, element, option, painter, widget=None) -> None:
        super().drawPrimitive(element, option, painter, widget)
        pe = QStyle.PrimitiveElement
        if element not in (pe.PE_IndicatorCheckBox, pe.PE_IndicatorRadioButton):
            return
        enabled = bool(option.state & QStyle.StateFlag.State_Enabled)
        painter.save()
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.setPen(QPen(indicator_border(option.palette, enabled), 1))
        if element == pe.PE_IndicatorCheckBox:
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
            painter.drawRect(option.rect.adjusted(0, 0, -1, -1))
        else:
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.drawEllipse(QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5))
        painter.restore()


def _style_sheet(dark: bool) -> str:
    nav_bg = "#24282d" if dark else "#e8eaee"
    nav_sel = "#3d7bd9" if dark else "#2f6fd6"
    muted = "#9aa1ab" if dark else "#5f6670"
    card = "#262a2f" if dark else "#ffffff"
    border = "#3a3f46" if dark else "#d5d9df"
    banner = "#3a2f1a" if dark else "#fff4dc"
    banner_err = "#3d2224" if dark else "#fde8e8"
    note_err = "#ff8a80" if dark else "#b3261e"
    window = "#2a2e33" if dark else "#f3f4f6"
    return f"""
QListWidget#nav {{ background: {nav_bg}; border: none; padding-top: 6px; font-size: 10.5pt;
                  outline: 0; }}
QListWidget#nav::item {{ padding: 7px 14px; border-radius: 4px; margin: 1px 6px; }}
QListWidget#nav::item:selected {{ background: {nav_sel}; color: white; }}
QLabel[role="title"] {{ font-size: 15pt; font-weight: 600; }}
QLabel[role="subtitle"] {{ color: {muted}; }}
QLabel[role="muted"] {{ color: {muted}; }}
QLabel[role="heading"] {{ font-weight: 600; margin-top: 4px; }}
QLabel[role="empty-title"] {{ font-size: 13pt; font-weight: 600; }}
QLabel[role="empty-text"] {{ color: {muted}; font-size: 10.5pt; }}
QLabel[role="metric-value"] {{ font-size: 14pt; font-weight: 600; }}
QLabel[role="error"] {{ color: #d64545; }}
QFrame[role="card"] {{ background: {card}; border: 1px solid {border}; border-radius: 6px; }}
QFrame[role="banner"] {{ background: {banner}; border: 1px solid {border}; border-radius: 4px; }}
QFrame[role="banner-ok"] {{ background: {card}; border: 1px solid {border}; border-radius: 4px; }}
QFrame[role="banner-error"] {{ background: {banner_err}; border: 1px solid #d64545;
                               border-radius: 4px; }}
QGroupBox {{ font-weight: 600; }}
QFrame[role="note-error"] {{ background: {banner_err}; border-radius: 3px; }}
QFrame[role="note-error"] QLabel {{ color: {note_err}; }}
QToolButton#notifications-button[role="has-errors"] {{ color: {note_err}; font-weight: 600; }}
QFrame#notification-list {{ background: {window}; border: 1px solid {border}; }}
"""


def apply_theme(app: QApplication, name: str) -> str:
    """Apply ``light``, ``dark`` or ``system``; returns the theme in effect."""
    which = effective_theme(name)
    if not isinstance(app.style(), StudioStyle):
        # once per application: the style reads its colours from the palette, and replacing
        # an application style while widgets hold on to it crashed a second theme switch
        app.setStyle(StudioStyle())
    app.setPalette(_palette(which == "dark"))
    app.setStyleSheet(_style_sheet(which == "dark"))
    app.setProperty("qstudio_theme", which)
    return which
