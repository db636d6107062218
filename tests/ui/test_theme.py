"""What the window looks like, read from its pixels: progress bars fill left to right, plots and
check boxes follow the light and dark themes."""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QPalette
from PySide6.QtWidgets import QApplication, QCheckBox, QRadioButton

from studio.ui.models.jobs import C_PROGRESS
from studio.ui.theme import apply_theme
from studio.ui.widgets import ChipList


@pytest.fixture
def theme(qapp):
    """``theme(name)`` applies a theme; the light theme comes back at teardown."""
    yield lambda name: apply_theme(qapp, name)
    apply_theme(qapp, "light")


def _bluish(c: QColor) -> bool:
    """The progress chunk (the palette's highlight, blue in both themes), not grey."""
    return c.blue() - c.red() > 60


def _image(widget) -> QImage:
    QApplication.processEvents()
    return widget.grab().toImage()


@pytest.mark.parametrize("name", ["light", "dark"])
def test_progress_bars_fill_left_to_right(name, theme, window, project_path, qtbot):
    theme(name)
    assert window.open_project(project_path)
    page = window.show_page("Jobs")
    store = window.ctl.studio.jobs
    jid = store.add_job(store.create_run({}), "quantize")
    store.update_job(
        jid, state="failed", started=time.time() - 3, finished=time.time(), progress=0.3
    )
    page.model.upsert(store.job(jid))
    page._update_empty()
    qtbot.waitUntil(page.table.isVisible)
    idx = page.proxy.mapFromSource(page.model.index(page.model.row_of(jid), C_PROGRESS))
    assert idx.data() == "30%"
    cell = page.table.visualRect(idx)
    img = _image(page.table.viewport())
    dpr = img.devicePixelRatio()
    bar = cell.adjusted(3, 4, -3, -4)  # where ProgressDelegate draws the bar

    def filled(fx: float) -> int:
        """Chunk pixels in the column at ``fx`` of the bar's width."""
        x = int((bar.left() + fx * bar.width()) * dpr)
        ys = range(int((bar.top() + 2) * dpr), int((bar.bottom() - 1) * dpr))
        return sum(_bluish(img.pixelColor(x, y)) for y in ys)

    height = int((bar.height() - 3) * dpr)
    # 30 %: the left tenth of the bar is filled from top to bottom, the right part not at all
    # (a bar filling bottom-to-top fills the lower 30 % of every column instead)
    assert filled(0.1) >= 0.7 * height, (filled(0.1), height)
    assert filled(0.2) >= 0.7 * height
    assert filled(0.6) == 0 and filled(0.9) == 0, (filled(0.6), filled(0.9))


def _contrasting(img: QImage, rect, background: QColor, dpr: float) -> int:
    """Pixels of ``rect`` whose lightness differs from the background's by 40 or more."""
    bg = background.lightness()
    n = 0
    for x in range(int(rect.left() * dpr), int(rect.right() * dpr)):
        for y in range(int(rect.top() * dpr), int(rect.bottom() * dpr)):
            if abs(img.pixelColor(x, y).lightness() - bg) >= 40:
                n += 1
    return n


@pytest.mark.parametrize("name", ["light", "dark"])
def test_unchecked_chips_are_visible(name, theme, qtbot):
    """The chip checklist (wizard, targets dialog): every unchecked chip has a check box
    that stands out from the list's background."""
    theme(name)
    chips = ChipList(["snapdragon-8-gen-3"])
    qtbot.addWidget(chips)
    chips.resize(640, 420)
    chips.show()
    qtbot.waitExposed(chips)
    img = _image(chips.viewport())
    base = chips.palette().color(QPalette.ColorRole.Base)
    key = Qt.ItemDataRole.UserRole
    unchecked = [
        chips.item(i)
        for i in range(chips.count())
        if chips.item(i).data(key) != "snapdragon-8-gen-3"
    ]
    assert len(unchecked) == chips.count() - 1 > 3
    for item in unchecked:
        box = chips.visualItemRect(item)
        box.setWidth(20)  # the check box, left of the text
        seen = _contrasting(img, box, base, img.devicePixelRatio())
        assert seen >= 30, f"{name}: the check box of {item.text()!r} is invisible ({seen})"


@pytest.mark.parametrize("kind", [QCheckBox, QRadioButton])
@pytest.mark.parametrize("name", ["light", "dark"])
def test_unchecked_check_boxes_and_radio_buttons_are_visible(name, kind, theme, qtbot):
    """Plain check boxes too (the wizard's stages, the Jobs page's filters) and the wizard's
    radio buttons."""
    theme(name)
    box = kind("Latest run only")
    qtbot.addWidget(box)
    box.show()
    qtbot.waitExposed(box)
    img = _image(box)
    window = box.palette().color(QPalette.ColorRole.Window)
    r = box.rect()
    r.setWidth(18)  # the indicator, left of the text
    # a frame of a dozen pixels a side (a circle's antialiased ring counts fewer)
    assert _contrasting(img, r, window, img.devicePixelRatio()) >= 20


def _mean_lightness(img: QImage) -> float:
    step = 7
    vals = [
        img.pixelColor(x, y).lightness()
        for x in range(0, img.width(), step)
        for y in range(0, img.height(), step)
    ]
    return sum(vals) / len(vals)


def test_llm_chart_follows_the_theme(window, project_path, qtbot):
    assert window.open_project(project_path)
    store = window.ctl.studio.jobs
    jid = store.add_job(store.create_run({}), "run", "cpu")
    now = time.time()
    store.update_job(
        jid,
        state="succeeded",
        started=now - 2,
        finished=now,
        progress=1.0,
        result={"summary": "3 tokens", "text": "x = 1", "step_s": [0.01, 0.012, 0.011]},
    )
    try:
        window.set_theme("light")
        llm = window.show_page("LLM")  # the page is built in the light theme...
        qtbot.waitUntil(lambda: llm.content.isVisibleTo(llm))
        assert _mean_lightness(_image(llm.plot)) > 200
        window.set_theme("dark")  # ...and the user switches to the dark one
        dark = _mean_lightness(_image(llm.plot))
        assert dark < 90, f"the chart stays light in the dark theme ({dark:.0f})"
        axis = llm.plot.getAxis("left")
        assert axis.textPen().color().lightness() > 150, "light axis text on the dark chart"
        assert axis.pen().color().lightness() > 150
        window.set_theme("light")
        light = _mean_lightness(_image(llm.plot))
        assert light > 200, light
        assert axis.textPen().color().lightness() < 100
    finally:
        window.set_theme("light")
