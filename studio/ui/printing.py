"""Printing a report to PDF with Qt: ``QTextDocument`` lays out the report's print HTML
(tables, text, images) and ``QPdfWriter`` paginates it. Qt's rich text takes no inline SVG,
so each chart is drawn from its SVG markup into an image by QtSvg's ``QSvgRenderer`` and
handed to the document as the resource its ``<img src="chart:NAME">`` names.

``print_pdf`` is the printer ``studio.services.reports.write`` takes; ``studio/__main__.py``
hands it to the command line (which may not import Qt), the Reports page uses it directly.
It needs a ``QGuiApplication``: without one (the command line) it makes one, offscreen when
there is no display.
"""

from __future__ import annotations

import os

_APP = None  # the application made here for the command line (kept alive)


def ensure_app():
    """The running Qt application, or a new offscreen ``QGuiApplication``."""
    global _APP
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance()
    if app is None:
        if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = _APP = QGuiApplication(["studio"])
    return app


def svg_image(svg: str, scale: float = 2.0):
    """``svg`` drawn into a white ``QImage`` at ``scale`` times its own size (sharp when the
    PDF is zoomed)."""
    from PySide6.QtCore import QByteArray, QSize
    from PySide6.QtGui import QColor, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    size = renderer.defaultSize()
    if not renderer.isValid() or size.isEmpty():
        size = QSize(640, 240)
    image = QImage(int(size.width() * scale), int(size.height() * scale),
                   QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    try:
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        renderer.render(painter)
    finally:
        painter.end()
    return image


def print_pdf(html: str, charts: dict[str, str], title: str = "QStudio report") -> bytes:
    """The report's print HTML as an A4 PDF (the file's bytes)."""
    ensure_app()
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMarginsF, QSizeF, QUrl
    from PySide6.QtGui import QPageLayout, QPageSize, QPdfWriter, QTextDocument

    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    writer = QPdfWriter(buf)
    writer.setTitle(title)
    writer.setCreator("QStudio")
    writer.setResolution(300)
    writer.setPageLayout(QPageLayout(QPageSize(QPageSize.PageSizeId.A4),
                                     QPageLayout.Orientation.Portrait,
                                     QMarginsF(14, 14, 14, 14), QPageLayout.Unit.Millimeter))
    doc = QTextDocument()
    doc.setDocumentMargin(0)
    # paginated at the page's own text area (px at 96 dpi): Qt prints it as laid out, so
    # tables and charts (at most 620 px wide) keep to the margins set above
    area = writer.pageLayout().paintRect(QPageLayout.Unit.Inch)
    doc.setPageSize(QSizeF(area.width() * 96, area.height() * 96))
    for name, svg in charts.items():
        doc.addResource(QTextDocument.ResourceType.ImageResource, QUrl(f"chart:{name}"),
                        svg_image(svg))
    doc.setHtml(html)
    doc.print_(writer)
    del writer  # finishes the PDF
    buf.close()
    return bytes(data.data())
