"""The playground's badge labels the output on screen: after a host-CPU generation
(measured), choosing the HTP simulator and generating relabels it at once (simulated, the
device named), and a generation that gives no text leaves no label over the old one (the real
sample: its FP32 export on the host; the simulator needs a compile this project lacks)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_badge_follows_the_device_of_the_output(make_window, copy_project,
                                                    exported_template, tmp_path, qtbot):
    win = make_window()
    assert win.open_project(copy_project(exported_template, tmp_path / "p"))
    page = win.show_page("LLM")
    page.tabs.setCurrentWidget(page.playground)
    pg = page.playground
    pg.prompt.setPlainText("def add(a, b):\n")
    pg.max_new.setValue(6)
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert pg.last["source"] == "measured" and pg.badge.source == "measured"
    assert pg.badge.isVisibleTo(pg) and "host CPU" in pg.badge.toolTip()

    chip = win.ctl.project.targets[0]
    pg.device.setCurrentIndex(pg.device.findData(f"htp-sim:{chip}"))
    pg.go.click()
    # while it runs, the badge already names what streams: the simulator
    assert pg.badge.source == "simulated" and pg.badge.isVisibleTo(pg)
    assert "live: generating on HTP simulator" in pg.badge.toolTip()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    # no compile yet: no text came, so no label stays over the prompt it left
    assert "compile" in pg.stats.text()
    assert not pg.badge.isVisibleTo(pg)
    assert pg.export_btn.isVisibleTo(pg) and pg.export_btn.text() == "Run compile"
