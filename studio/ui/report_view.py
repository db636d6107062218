"""The studio's HTML reports read inside the window: a text browser that draws the report's
inline SVG charts (Qt's rich text does not know ``<svg>``) as images rendered by Qt's SVG
renderer, so no browser is needed ("no application could open …" on a machine without one).
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import QByteArray, QRectF, Qt, QUrl
from PySide6.QtGui import QImage, QPainter, QTextDocument
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QTextBrowser

from studio.core.units import format_bytes

_SVG = re.compile(r"<svg\b.*?</svg>", re.S)
#: files larger than this are not laid out here (Qt's text layout of some MB in one
#: paragraph takes minutes on the UI thread; the studio's reports are tens of KB)
MAX_READ_BYTES = 4 << 20
_SCHEME = "qstudio-chart"


def inline_charts(html: str) -> tuple[str, list[bytes]]:
    """The report's HTML with each inline ``<svg>`` replaced by an image reference, and the
    SVG documents in order."""
    charts: list[bytes] = []

    def swap(m: re.Match) -> str:
        charts.append(m.group(0).encode())
        w = re.search(r'width="(\d+)"', m.group(0))
        width = f' width="{w.group(1)}"' if w else ""
        return f'<img src="{_SCHEME}:{len(charts) - 1}"{width}>'

    return _SVG.sub(swap, html), charts


def render_svg(data: bytes, scale: float = 2.0) -> QImage:
    """An SVG document as an image (drawn at ``scale`` for a sharp picture)."""
    renderer = QSvgRenderer(QByteArray(data))
    size = renderer.defaultSize()
    image = QImage(max(1, int(size.width() * scale)), max(1, int(size.height() * scale)),
                   QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.white)
    painter = QPainter(image)
    renderer.render(painter, QRectF(0, 0, image.width(), image.height()))
    painter.end()
    image.setDevicePixelRatio(scale)
    return image


class ReportView(QTextBrowser):
    """Shows one report (HTML, or its JSON as text); links open outside."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self._charts: list[bytes] = []
        self.path: Path | None = None
        self.charts_drawn = 0

    def show_file(self, path: Path) -> None:
        self.path = Path(path)
        self.charts_drawn = 0
        size = self.path.stat().st_size
        if size > MAX_READ_BYTES:
            self._charts = []
            self.setPlainText(f"{self.path.name} is {format_bytes(size)}: too large to read "
                              "here (the studio's reports are tens of KB). Open it in your "
                              "browser.")
            return
        text = self.path.read_text(encoding="utf-8", errors="replace")
        if self.path.suffix == ".json":
            self._charts = []
            self.setPlainText(text)
            return
        html, self._charts = inline_charts(text)
        self.document().setBaseUrl(QUrl.fromLocalFile(str(self.path.parent) + "/"))
        self.setHtml(html)

    def loadResource(self, kind: int, url: QUrl):  # noqa: N802 - Qt's name
        if (kind == QTextDocument.ResourceType.ImageResource.value
                and url.scheme() == _SCHEME):
            try:
                data = self._charts[int(url.path())]
            except (ValueError, IndexError):
                return None
            self.charts_drawn += 1
            return render_svg(data)
        return super().loadResource(kind, url)
