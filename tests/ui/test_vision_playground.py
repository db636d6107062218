"""The playground of a vision-language project: its picture box is shown (the project's own
picture in it), takes a dropped image, and a generation with it on the host CPU shows the
time to first token split into the vision encoder and the prefill; a text project has no
picture box."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import corpus_text
from tests.engine.vl_checkpoints import IMAGE, make_vl_checkpoint

pytestmark = pytest.mark.slow


def _drop(widget, path: Path) -> None:
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    enter = QDragEnterEvent(widget.rect().center(), Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    widget.dragEnterEvent(enter)
    assert enter.isAccepted()
    widget.dropEvent(QDropEvent(QPointF(widget.rect().center()), Qt.DropAction.CopyAction,
                                mime, Qt.MouseButton.LeftButton,
                                Qt.KeyboardModifier.NoModifier))


def test_the_playground_takes_an_image(make_window, tmp_path, qtbot):
    from studio.engine import vision_input
    from studio.services.session import Studio
    from tests.ui.conftest import wait_task

    ck = make_vl_checkpoint(tmp_path / "ck", "qwen2_5_vl", corpus_text())
    s = Studio.create(tmp_path / "vl.qstudio", str(ck), export={"image_size": IMAGE},
                      pipeline={"stages": ["export"]})
    s.close()
    win = make_window()
    win.resize(1280, 820)
    assert win.open_project(tmp_path / "vl.qstudio")
    summary = wait_task(qtbot, win.ctl.run(["export"]))
    assert summary.state == "succeeded", summary.to_dict()
    page = win.show_page("LLM")
    page.tabs.setCurrentWidget(page.playground)
    pg = page.playground
    assert pg.image_box.isVisible()
    assert pg.image.path == tmp_path / "vl-image.png"  # the picture studio new wrote
    other = tmp_path / "other.png"
    other.write_bytes(vision_input.png_bytes(vision_input.calibration_images(1, 200, seed=9)[0]))
    _drop(pg.image, other)
    assert pg.image.path == other and not pg.image.pixmap().isNull()

    pg.prompt.setPlainText("What is it?")
    pg.max_new.setValue(6)
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    out = pg.last
    assert out is not None and out["image"]["image_tokens"] == 16, pg.stats.text()
    assert "vision encoder" in pg.stats.text() and "+ prefill" in pg.stats.text()
    pg.image_clear.click()
    assert pg.image.path is None and "Drop an image" in pg.image.text()

    # a text project: no picture box
    Studio.create(tmp_path / "text.qstudio", "sample:tiny-coder").close()
    assert win.open_project(tmp_path / "text.qstudio")
    page = win.show_page("LLM")
    assert not page.playground.image_box.isVisible()
