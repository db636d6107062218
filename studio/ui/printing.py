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

from studio.core.lazyimport import lazy_module

QtCore = lazy_module("PySide6.QtCore")
QtGui = lazy_module("PySide6.QtGui")
QtSvg = lazy_module("PySide6.QtSvg")

_APP = None  # the application made here for the command line (kept alive)


def ensure_app():
    """The running Qt application, or a new offscreen ``QGuiApplication``."""
    global _APP

    app = QtGui.QGuiApplication.instance()
    if app is None:
        if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
            os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        app = _APP = QtGui.QGuiApplication(["studio"])
    return app


def svg_image(svg: str, scale: float = 2.0):
    """``svg`` drawn into a white ``QImage`` at ``scale`` times its own size (sharp when the
    PDF is zoomed)."""
    renderer = QtSvg.QSvgRenderer(QtCore.QByteArray(svg.encode("utf-8")))
    size = renderer.defaultSize()
    if not renderer.isValid() or size.isEmpty():
        size = QtCore.QSize(640, 240)
    image = QtGui.QImage(int(size.width() * scale), int(size.height() * scale),
                   QtGui.QImage.Format.Format_ARGB32)
    image.fill(QtGui.QColor("white"))
    painter = QtGui.QPainter(image)
    try:
        painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        painter.setRenderHint(QtGui.QPainter.RenderHint.TextAntialiasing)
        renderer.render(painter)
    finally:
        painter.end()
    return image


def print_pdf(html: str, charts: dict[str, str], title: str = "QStudio report") -> bytes:
    """The report's print HTML as an A4 PDF (the file's bytes)."""
    ensure_app()

    data = QtCore.QByteArray()
    buf = QtCore.QBuffer(data)
    buf.open(QtCore.QIODevice.OpenModeFlag.WriteOnly)
    writer = QtGui.QPdfWriter(buf)
    writer.setTitle(title)
    writer.setCreator("QStudio")
    writer.setResolution(300)
    writer.setPageLayout(QtGui.QPageLayout(QtGui.QPageSize(QtGui.QPageSize.PageSizeId.A4),
                                           QtGui.QPageLayout.Orientation.Portrait,
                                           QtCore.QMarginsF(14, 14, 14, 14),
                                           QtGui.QPageLayout.Unit.Millimeter))
    doc = QtGui.QTextDocument()
    doc.setDocumentMargin(0)
    # paginated at the page's own text area (px at 96 dpi): Qt prints it as laid out, so
    # tables and charts (at most 620 px wide) keep to the margins set above
    area = writer.pageLayout().paintRect(QtGui.QPageLayout.Unit.Inch)
    doc.setPageSize(QtCore.QSizeF(area.width() * 96, area.height() * 96))
    for name, svg in charts.items():
        doc.addResource(QtGui.QTextDocument.ResourceType.ImageResource,
                        QtCore.QUrl(f"chart:{name}"), svg_image(svg))
    doc.setHtml(html)
    doc.print_(writer)
    del writer  # finishes the PDF
    buf.close()
    return bytes(data.data())
