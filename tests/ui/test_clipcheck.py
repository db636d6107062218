"""The clip check itself: each kind of cut text it must see (real widgets, offscreen), and
what it must let pass (an elided line with its text in a tool tip, a scroll area's content)."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from studio.ui.clipcheck import clipped_texts
from studio.ui.pages.cards import FigureCard
from studio.ui.pages.layergrid import PrecisionLegend
from studio.ui.widgets import ElidedLabel


def _root(qtbot, width: int = 400, height: int = 300) -> tuple[QWidget, QVBoxLayout]:
    root = QWidget()
    qtbot.addWidget(root)
    root.resize(width, height)
    return root, QVBoxLayout(root)


def test_a_card_cut_by_the_row_it_sits_in(qtbot):
    """The card is as wide as it needs, but wider than the row it sits in: cut at the row's
    edge (the LLM page's cards ran off the window), its badge with it."""
    root, lay = _root(qtbot, 240)
    row = QWidget()
    row.setFixedWidth(150)
    card = FigureCard("decode speed", "588.7 tok/s", "measured", "host-cpu", parent=row)
    card.setGeometry(0, 0, card.minimumSizeHint().width(), 80)
    lay.addWidget(row)
    root.show()
    qtbot.wait(20)
    cut = clipped_texts(root)
    assert any(c.startswith("FigureCard 'decode speed: 588.7 tok/s'") for c in cut), cut
    assert any(c.startswith("SourceBadge 'measured'") for c in cut), cut
    row.setFixedWidth(card.width())
    qtbot.wait(20)
    assert clipped_texts(root) == []


def test_a_card_is_never_narrower_than_its_value_and_badge(qtbot):
    root, lay = _root(qtbot, 600)
    card = FigureCard("Graph weights (stored)", "–", "estimated", "–", reserve="888.8 MiB")
    lay.addWidget(card)
    root.show()
    qtbot.wait(20)
    before = card.minimumSizeHint().width()
    card.value.setText("15.3 MiB")  # the figure arrives: the card had room for it already
    assert card.minimumSizeHint().width() == before
    card.setFixedWidth(before)
    qtbot.wait(20)
    assert clipped_texts(root) == []
    fm = card.value.fontMetrics()
    assert card.value.width() >= fm.horizontalAdvance("15.3 MiB")


def test_a_legend_that_paints_its_text_flows_instead_of_being_cut(qtbot):
    root, lay = _root(qtbot, 300, 200)
    legend = PrecisionLegend()
    lay.addWidget(legend)
    root.show()
    qtbot.wait(20)
    assert legend.sizeHint().width() > 300  # one line would not fit
    assert clipped_texts(root) == []
    assert legend.heightForWidth(legend.width()) >= 2 * legend.LINE  # it wrapped
    legend.setFixedWidth(legend.minimumSizeHint().width() - 20)  # narrower than an entry
    qtbot.wait(20)
    assert any(c.startswith("PrecisionLegend") for c in clipped_texts(root))


def test_titles_placeholders_combo_boxes_and_list_items(qtbot):
    root, lay = _root(qtbot, 700)
    box = QGroupBox("Override rules (the last matching rule wins)")
    box.setFixedWidth(150)
    QVBoxLayout(box).addWidget(QLabel("x"))
    search = QLineEdit()
    search.setPlaceholderText("Find op by name…")
    search.setFixedWidth(40)
    combo = QComboBox()
    combo.addItem("tiny-coder — tiny Qwen2 Python code model (4 layers, hidden 256)")
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(10)
    combo.setFixedWidth(160)
    items = QListWidget()
    items.setFixedWidth(120)
    items.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    items.addItem("Snapdragon 8 Gen 3   [snapdragon-8-gen-3]")
    tipped = QListWidgetItem("Snapdragon 8 Elite   [snapdragon-8-elite]")
    tipped.setToolTip("Snapdragon 8 Elite   [snapdragon-8-elite]: v79")
    items.addItem(tipped)  # cut too, but its text is in its tool tip
    row = QHBoxLayout()
    for w in (box, search, combo, items):
        row.addWidget(w)
    lay.addLayout(row)
    root.show()
    qtbot.wait(20)
    cut = clipped_texts(root)
    assert [c.split(" ")[0] for c in cut] == ["QGroupBox", "QLineEdit", "QComboBox",
                                              "QListWidget"], cut
    assert "8 Gen 3" in cut[3] and "Elite" not in " ".join(cut)
    search.setText("gate")  # typed text scrolls in its box: not a cut
    assert not any(c.startswith("QLineEdit") for c in clipped_texts(root))


def test_an_elided_line_with_its_text_in_a_tool_tip_and_a_scroll_area_pass(qtbot):
    root, lay = _root(qtbot, 300)
    line = ElidedLabel()
    line.set_full_text("✖ export failed: context_length 4096 is beyond the model's 1,024 "
                       "positions; lower it on the Precision page")
    lay.addWidget(line)
    scroll = QScrollArea()
    wide = QLabel("a label wider than the scroll area that shows it, scrolled into view " * 2)
    scroll.setWidget(wide)
    lay.addWidget(scroll)
    root.show()
    qtbot.wait(20)
    assert line.text().endswith("…") and line.width() < line.sizeHint().width()
    assert clipped_texts(root) == []
    line.setToolTip("")
    assert any("elided without its text" in c for c in clipped_texts(root))


def test_chart_axis_titles_and_messages(qtbot):
    from studio.ui.widgets import plot_message

    root, lay = _root(qtbot, 500, 220)
    plot = pg.PlotWidget()
    plot.setLabel("left", "logits cosine vs FP32 (simulated), the accuracy the gates check →")
    lay.addWidget(plot)
    root.show()
    qtbot.wait(50)
    cut = clipped_texts(root)
    assert len(cut) == 1 and cut[0].startswith("PlotWidget left axis 'logits cosine"), cut
    plot.setLabel("left", "cosine")
    plot_message(plot, "No memory plan: no export or quantize result for the current "
                       "settings: run studio --batch /tmp/a/long/path/tiny-coder.qstudio "
                       "--stages export")
    qtbot.wait(50)
    assert clipped_texts(root) == []  # the message wrapped to the chart's width
