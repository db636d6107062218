"""The Profiler page on real profiles: two profile runs of the sample on the HTP simulator
(through the window, like a user), the live op table while a job runs, the seed's table,
the compare of the two runs and the memory plan."""

from __future__ import annotations

import pytest

from studio.core.events import BLOCKS

pytestmark = pytest.mark.slow


def _texts(model, col: int = 0) -> list[str]:
    return [model.index(r, col).data() for r in range(model.rowCount())]


def test_profile_runs_live_then_breakdown_compare_and_memory(
    make_window, copy_project, compiled_template, tmp_path, qtbot
):
    from tests.ui.conftest import wait_task

    win = make_window()
    win.resize(1280, 820)
    assert win.open_project(copy_project(compiled_template, tmp_path / "p"))
    page = win.show_page("Profiler")
    assert page.empty.isVisibleTo(page)

    partials = []
    win.ctl.job_partial.connect(lambda jid, data: partials.append((jid, data)))
    win.ctl.set("profile", "repeats", 2)
    summary = wait_task(qtbot, win.ctl.run(["profile"]))
    assert summary.state == "succeeded", summary.to_dict()
    # the op table filled in live, run by run, before the job finished
    assert [d["repeat"] for _, d in partials] == [1, 2]
    assert set(partials[-1][1]["by_block"]) <= set(BLOCKS)

    qtbot.waitUntil(lambda: page.data is not None and page.data.stats.get("runs") == 2,
                    timeout=20_000)
    assert page.content.isVisibleTo(page)
    rows = _texts(page.table)
    for block in ("QKV projection", "attention: QK", "attention: softmax", "attention: AV",
                  "o_proj", "gate/up", "down_proj", "RMSNorm", "RoPE",
                  "data movement / Q-DQ"):
        assert block in rows, block
    shares = [float(s.rstrip("%")) for s in _texts(page.table, 2)]
    assert sum(shares) == pytest.approx(100, abs=0.5)
    assert "median of 2 runs" in page.reliability_text.text()
    assert page.badge.source == "simulated"
    # the bytes column is the compiler's own traffic (optrace) and the note says so
    assert page.data.stats["bytes_source"] == "compiler (optrace)"
    assert "bytes moved: the HTP compiler's own DRAM traffic" in page.op_note.text()

    # the timeline: the measured host-CPU step, and the estimated schedule on the HTP cores
    page.tabs.setCurrentIndex(page.tabs.indexOf(page.timeline))
    qtbot.waitUntil(lambda: page.timeline.result is not None, timeout=20_000)
    kinds = [page.timeline.kind.itemData(i) for i in range(page.timeline.kind.count())]
    assert kinds == ["host", "estimated"]
    assert page.timeline.view.data is not None and "measured" in page.timeline.status.text()
    page.timeline.kind.setCurrentIndex(1)
    qtbot.waitUntil(lambda: page.timeline.result is not None
                    and page.timeline.result.tracks[0].source == "estimated", timeout=20_000)
    assert page.timeline.result.tracks[0].label.endswith("(estimated)")
    page.tabs.setCurrentIndex(0)

    page.group.setCurrentIndex(page.group.findData("layer"))
    assert _texts(page.table)[:4] == ["layer 0", "layer 1", "layer 2", "layer 3"]
    page.group.setCurrentIndex(page.group.findData("layer_block"))
    assert page.table.columns[0] == "Layer" and "RoPE" in page.table.columns

    # one profile: the compare chart says there is nothing to compare with (no bare axes)
    assert page.delta_plot.property("message") == "No other profile to compare with yet"
    assert not page.delta_plot.getPlotItem().getAxis("left").isVisible()
    # a second run with another setting: a second profile to compare with
    first_job = page.data.job.id
    win.ctl.set("profile", "repeats", 3)
    summary = wait_task(qtbot, win.ctl.run(["profile"]))
    assert summary.state == "succeeded"
    qtbot.waitUntil(lambda: page.data is not None and page.data.stats.get("runs") == 3,
                    timeout=20_000)
    page.tabs.setCurrentIndex(1)
    assert page.against.count() >= 1 and page.against.currentData() == first_job
    diff = _texts(page.diff)
    assert "gate/up" in diff and page.diff.columnCount() == 7
    ratios = [page.diff.index(r, 4).data() for r in range(page.diff.rowCount())]
    assert all(r.endswith("×") for r in ratios)
    # the shown profile (A) is the newer: changes read from B (older) to A, red where A
    # takes more — an improvement is green whichever side it is on
    assert page.diff.columns[3] == "Δ A − B" and "from the older profile (B)" in \
        page.compare_note.text()
    for r in range(page.diff.rowCount()):
        a, b = (float(page.diff.index(r, c).data().split()[0].replace(",", ""))
                for c in (1, 2))
        change = float(page.diff.index(r, 3).data().replace(",", "").replace("−", "-"))
        assert change == pytest.approx(a - b, abs=1.0)
    assert page.delta_plot.getPlotItem().listDataItems() or page.delta_plot.items()
    assert not page.delta_plot.property("message")
    assert page.delta_plot.getPlotItem().getAxis("left").isVisible()

    page.tabs.setCurrentIndex(page.tabs.indexOf(page.memory))
    qtbot.waitUntil(lambda: page.memory.result is not None, timeout=60_000)
    assert page.memory.graph.count() == 4  # prefill / decode, FP32 and quantized
    assert page.memory.cards["arena"].where.text().endswith("less than naive")
    assert page.memory.cards["arena"].value.text().endswith("iB")
    assert page.memory.peak.rowCount() > 0
    page.tabs.setCurrentIndex(page.tabs.indexOf(page.roofline))
    qtbot.waitUntil(lambda: page.roofline.result is not None, timeout=30_000)
    assert page.roofline.table.rowCount() == 5  # four layers and what is outside them
    assert page.roofline.compiler_bytes  # the compiler's own traffic (optrace)

    # export, then import the file back: an imported profile with its own timeline
    trace = tmp_path / "trace.json"
    page.export_file(str(trace), "chrome")
    assert trace.exists()
    wait_task(qtbot, page.import_file(str(trace)))
    assert page.data.source == "imported" and page.badge.source == "imported"
    assert page.data.job is None and page.table.rowCount() == 5  # still by layer
    page.import_file(str(tmp_path / "missing.json"))
    qtbot.waitUntil(lambda: any("not found" in t for t in win.notifications.texts()),
                    timeout=10_000)
    page.grab().save(str(tmp_path / "profiler.png"))
