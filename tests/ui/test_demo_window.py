"""Demo mode's window on a finished sample project: the keys step through the scenes (the
waterfall one step per press), every scene shows source badges, recorded figures say which
run, device and date, the live scene generates on the host CPU with its tok/s and source, Esc
leaves full screen and then closes; View → Demo opens the open project's demo.

The project's run (validate, run, profile and the waterfall, small shapes) runs once for the
module on the real engine, from the session's exported sample project."""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from studio.ui.clipcheck import clipped_texts
from tests.conftest import copy_store

pytestmark = pytest.mark.slow
RECORDED = re.compile(r"^● recorded: run (\d+), (.+), \d{4}-\d\d-\d\d \d\d:\d\d")


def _copy(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest_dir / src.name)
    copy_store(src.with_suffix(".studio"), dest_dir / src.with_suffix(".studio").name)
    return dest_dir / src.name


@pytest.fixture(scope="module")
def finished(compiled_template, tmp_path_factory) -> tuple[Path, int]:
    """(project file, run id) after one run of validate, run, profile and waterfall (the
    quantized graph, its compile and profile from the session's store)."""
    from studio.services.session import Studio

    path = _copy(compiled_template, tmp_path_factory.mktemp("demo"))
    studio = Studio.open(path)
    out: dict = {}
    try:
        studio.set("validation", "heldout_tokens", 16)
        studio.set("validation", "greedy_tokens", 2)
        studio.set("waterfall", "new_tokens", 8)
        studio.save()

        def go() -> None:
            try:
                out["summary"] = asyncio.run(studio.run_pipeline(
                    ["validate", "run", "profile", "waterfall"]))
            except BaseException as exc:  # noqa: BLE001 - raised below
                out["error"] = exc

        t = threading.Thread(target=go)
        t.start()
        t.join(900)
    finally:
        studio.close()
    if "error" in out:
        raise out["error"]
    assert out["summary"].state == "succeeded", out["summary"].to_dict()
    return path, out["summary"].run_id


def _demo_window(path: Path, qtbot, size=(1280, 720)):
    from studio.services import demo as demosvc
    from studio.ui.demo import DemoWindow

    win = DemoWindow(demosvc.open_demo(path))
    qtbot.addWidget(win)
    win.resize(*size)
    win.show()
    qtbot.waitUntil(win.ready, timeout=120_000)
    qtbot.wait(100)  # widgets added to a shown layout are shown by a queued call
    return win


def test_keys_step_through_scenes_with_badges_and_live_generation(finished, copy_project,
                                                                  tmp_path, qtbot):
    from studio.ui.demo_scenes import GenerateView, WaterfallView

    src, run_id = finished
    path = copy_project(src, tmp_path / "p")
    path.with_name(path.stem + ".demo.toml").write_text(
        'max_new_tokens = 6\nprompts = ["def __init__(self", "import os"]\n')
    win = _demo_window(path, qtbot)
    assert [v.kind for v in win.views] == ["generate", "waterfall", "accuracy", "profile",
                                           "memory", "bundle"]
    assert f"run {run_id}" in win.run_label.text()

    # the live scene: real tokens on the host CPU, tok/s and time to first token, its source
    gen = win.current_view()
    assert isinstance(gen, GenerateView)
    qtbot.waitUntil(lambda: gen.last is not None or bool(gen.error), timeout=120_000)
    assert not gen.error, gen.error
    out = gen.last
    assert out["source"] == "measured" and 1 <= len(out["tokens"]) <= 6
    assert gen.gauge.value == pytest.approx(out["decode_tokens_per_s"]) and gen.gauge.value > 0
    assert "measured · live · host CPU" in gen.badge_texts()
    assert gen.ttft.text().startswith("time to first token")
    text = gen.output.toPlainText()
    assert text.startswith("def __init__(self") and len(text) > len("def __init__(self")
    # beside it, the speeds the run recorded, each saying run, device and date
    recs = [RECORDED.match(t) for t in gen.recorded_texts()]
    assert recs and all(recs), gen.recorded_texts()
    assert {m.group(2) for m in recs} >= {"host CPU"}
    assert any("simulator" in m.group(2) for m in recs)
    assert "simulated · HTP simulator (Snapdragon 8 Gen 3)" in gen.badge_texts()

    # P: the next prompt, live again
    qtbot.keyClick(win, Qt.Key.Key_P)
    qtbot.waitUntil(lambda: gen.last is not None and not gen.running(), timeout=120_000)
    assert gen.output.toPlainText().startswith("import os")

    # → into the waterfall: one step shown, each press reveals the next, then the next scene
    qtbot.keyClick(win, Qt.Key.Key_Right)
    wf = win.current_view()
    assert isinstance(wf, WaterfallView) and not gen.running()
    assert wf.shown == 1 and len(wf.rows) == 8  # FP32 .. + quantized I/O .. + pruned
    assert "estimated · Snapdragon 8 Gen 3" in wf.badge_texts()
    assert "measured · host CPU" in wf.badge_texts()
    for n in range(2, 9):
        qtbot.keyClick(win, Qt.Key.Key_Space)
        assert win.current_view() is wf and wf.shown == n
        assert sum(w.isVisibleTo(wf) for w in wf.rows[n - 1]) == len(wf.rows[n - 1])
    assert "→ + pruned" in wf.subtitle.text() and "estimated" in wf.subtitle.text()
    assert RECORDED.match(wf.footer_rec.text())
    qtbot.keyClick(win, Qt.Key.Key_Right)
    assert win.current_view().kind == "accuracy"
    qtbot.keyClick(win, Qt.Key.Key_Left)  # back into the waterfall: every step shown
    assert win.current_view() is wf and wf.shown == 8
    qtbot.keyClick(win, Qt.Key.Key_Left)
    assert wf.shown == 7
    qtbot.keyClick(win, Qt.Key.Key_PageDown)
    qtbot.keyClick(win, Qt.Key.Key_PageDown)

    # the recorded scenes: badges, and a recording with run, device and date
    for kind in ("accuracy", "profile", "memory", "bundle"):
        v = win.current_view()
        assert v.kind == kind and not v.scene.empty, (kind, v.scene.empty)
        badges = v.badge_texts()
        assert badges, kind
        assert all(b.split(" · ")[0] in ("measured", "simulated", "estimated", "catalog")
                   for b in badges), badges
        assert f"scene {win.index + 1} / 6" in win.position.text()
        qtbot.wait(50)  # the footer's new text laid out
        assert clipped_texts(win) == [], kind  # no card or label cut short
        qtbot.keyClick(win, Qt.Key.Key_Right)
    assert win.current_view().kind == "bundle"  # the last scene stays
    acc = win.views[2]
    assert "measured · host CPU" in acc.badge_texts()
    assert "simulated · HTP simulator (Snapdragon 8 Gen 3)" in acc.badge_texts()
    m = RECORDED.match(acc.footer_rec.text())
    assert m and int(m.group(1)) == run_id and "simulator" in m.group(2)
    assert RECORDED.match(win.views[3].footer_rec.text())
    mem = win.views[4]
    assert all(b.startswith("estimated") for b in mem.badge_texts())
    assert f"run {run_id}" in mem.footer_rec.text() or "reused" in mem.footer_rec.text()
    bundle = win.views[5]
    assert any(RECORDED.match(t) for t in bundle.recorded_texts())  # the chip's compile
    assert "studio bundle" in bundle.scene.note  # no bundle built: says how

    qtbot.keyClick(win, Qt.Key.Key_Home)
    assert win.index == 0
    qtbot.keyClick(win, Qt.Key.Key_End)
    assert win.index == 5
    qtbot.keyClick(win, Qt.Key.Key_Escape)  # windowed: Esc closes
    assert not win.isVisible()


def test_type_follows_the_window_size(finished, copy_project, tmp_path, qtbot):
    src, _ = finished
    path = copy_project(src, tmp_path / "p")
    path.with_name(path.stem + ".demo.toml").write_text('scenes = ["accuracy", "memory"]\n')
    win = _demo_window(path, qtbot, (1920, 1080))
    qtbot.wait(50)
    big = win.views[0].title.fontInfo().pixelSize()
    win.resize(1280, 720)
    qtbot.wait(50)
    assert win.minimumSizeHint().width() <= 1280 and win.minimumSizeHint().height() <= 720
    small = win.views[0].title.fontInfo().pixelSize()
    assert big > small >= 24 and big / small == pytest.approx(1.5, rel=0.1)
    win.close()


def test_view_demo_opens_full_screen_and_esc_leaves(make_window, finished, copy_project,
                                                    tmp_path, qtbot):
    src, _ = finished
    path = copy_project(src, tmp_path / "p")
    path.with_name(path.stem + ".demo.toml").write_text('scenes = ["profile", "bundle"]\n')
    win = make_window()
    assert win.open_project(path)
    assert win.demo_act in win.menuBar().actions()[2].menu().actions()  # View → Demo
    win.demo_act.trigger()
    dw = win.demo_window
    assert dw is not None and dw.isVisible() and dw.isFullScreen()
    qtbot.waitUntil(dw.ready, timeout=120_000)
    assert [v.kind for v in dw.views] == ["profile", "bundle"]
    qtbot.wait(100)  # widgets added to a shown layout are shown by a queued call
    assert dw.views[0].badge_texts()
    qtbot.keyClick(dw, Qt.Key.Key_Escape)
    assert dw.isVisible() and not dw.isFullScreen()
    qtbot.keyClick(dw, Qt.Key.Key_Escape)
    assert not dw.isVisible()
    # a demo file with a mistake: a notification in the studio window, no demo window
    path.with_name(path.stem + ".demo.toml").write_text('scenes = ["fireworks"]\n')
    messages = []
    win.notify = lambda text, level="info", timeout_ms=0: messages.append((level, text))
    win.demo_act.trigger()
    assert win.demo_window is None
    assert messages and messages[-1][0] == "error" and "unknown scene" in messages[-1][1]
