"""The Sweeps page in the window, on a real sweep: the declared sweep before it runs, Run and
Cancel (every point ends cancelled, the page is idle again), a run to the end with live
progress (the UI thread keeps going), the table and the plot of both points with their
sources, the Pareto front and the best point, a point selected in the plot and in the table,
its run opened on the Validation page, and a point applied as one undoable step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import QPointF, Qt, QTimer

from studio.ui.pages.sweeps import COL
from tests.ui.conftest import wait_task

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-coder" / "tiny-coder.qstudio"
SWEEP = """
[[sweeps]]
name = "schemes"
[sweeps.axes]
"quantization.scheme" = ["W8A16", "W8A8"]
"""


def _sweep_project(folder: Path) -> Path:
    """The tiny-coder example with a short validation and a two-point sweep of schemes."""
    text = EXAMPLE.read_text()
    assert "heldout_tokens = 256" in text and "greedy_tokens = 16" in text
    text = text.replace("heldout_tokens = 256", "heldout_tokens = 32")
    text = text.replace("greedy_tokens = 16", "greedy_tokens = 2")
    text = text.split("\n# The seed's grid")[0]  # the example's own sweep: not this test's
    folder.mkdir(parents=True)
    path = folder / "tiny-coder.qstudio"
    path.write_text(text + SWEEP)
    return path


def _click_point(qtbot, page, x: float, y: float) -> None:
    """A real mouse click on the plot where the point (x, y) is drawn."""
    vb = page.plot.getPlotItem().getViewBox()
    at = page.plot.mapFromScene(vb.mapViewToScene(QPointF(x, y)))
    qtbot.mouseClick(page.plot.viewport(), Qt.MouseButton.LeftButton, pos=at)


def test_a_project_without_sweeps_says_how_to_declare_one(window, project_path):
    assert window.open_project(project_path)
    page = window.show_page("Sweeps")
    assert page.empty.isVisibleTo(page) and not page.content.isVisibleTo(page)
    assert page.empty.title.text() == "No sweeps in this project"
    text = page.empty.text.text()
    assert "[[sweeps]]" in text and "quantization.scheme" in text
    assert f"studio sweep {project_path.name} --axis quantization.scheme=W8A16,W8A8" in text
    assert page.empty.buttons.count() > 2  # "Copy the example" (between two stretches)
    assert page.combo.count() == 0 and not page.run_button.isEnabled()


@pytest.mark.slow
def test_run_cancel_and_run_a_sweep_then_apply_a_point(window, tmp_path, qtbot):
    path = _sweep_project(tmp_path / "sweep")
    assert window.open_project(path)
    ctl = window.ctl
    page = window.show_page("Sweeps")
    # before it runs: the declared sweep and its points
    assert page.content.isVisibleTo(page) and not page.empty.isVisibleTo(page)
    assert page.combo.currentData() == "schemes"
    assert "quantization.scheme (W8A16, W8A8)" in page.spec_line.text()
    assert [(r["label"], r["state"]) for r in page.rows] == [("p1", "not run"),
                                                             ("p2", "not run")]
    assert page.status.text() == "Not run yet" and "Not run yet" in page.best_line.text()
    assert page.run_button.isEnabled() and not page.cancel_button.isEnabled()
    page.workers.setValue(2)
    assert page.workers.value() == 2

    # run, then cancel while the first job runs
    qtbot.mouseClick(page.run_button, Qt.MouseButton.LeftButton)
    assert page.running and ctl.sweeping == "schemes"
    assert not page.run_button.isEnabled() and not page.combo.isEnabled()
    queued = ctl.run()  # the pipeline waits for the sweep: queued behind it
    item = ctl.queue.waiting_for(ctl.project.path)[0]
    assert ctl.queue.why[item.id].startswith("after #") and "same project" in \
        ctl.queue.why[item.id]
    ctl.queue.cancel(item.id)
    assert queued.done() and queued.result() is None
    qtbot.waitUntil(lambda: any(j["state"] == "running" for j in page._jobs.values()),
                    timeout=120_000)
    assert page.cancel_button.isEnabled()
    qtbot.mouseClick(page.cancel_button, Qt.MouseButton.LeftButton)
    assert not page.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: not page.running, timeout=120_000)
    assert [r["state"] for r in page.rows] == ["cancelled", "cancelled"]
    assert page.status.text().startswith("cancelled")
    assert page.run_button.isEnabled() and page.combo.isEnabled() and ctl.sweeping is None
    assert not page.cancel_button.isEnabled()
    # a cancelled point's run has no validation: Open run shows its jobs
    page.select_point("p1")
    cancelled_run = page.selected_point()["run_id"]
    assert cancelled_run and page.open_button.isEnabled()
    qtbot.mouseClick(page.open_button, Qt.MouseButton.LeftButton)
    assert window.current_page() == "Jobs"
    assert window.page("Jobs").selected_job().run_id == cancelled_run
    window.show_page("Sweeps")

    # run to the end: the UI thread keeps going and the rows follow the points
    gaps: list[float] = []
    seen: set[str] = set()
    last = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now
        seen.update(r["state"] for r in page.rows)

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(50)
    qtbot.mouseClick(page.run_button, Qt.MouseButton.LeftButton)
    assert page.running
    qtbot.waitUntil(lambda: not page.running, timeout=300_000)
    timer.stop()
    assert "running" in seen, seen
    assert max(gaps) < 2.0, f"the UI thread stalled {max(gaps):.2f} s"

    # the table: both points, their states, figures with sources, the reason of the failure
    assert [(r["label"], r["state"]) for r in page.rows] == [("p1", "succeeded"),
                                                             ("p2", "failed")]
    assert page.table.rowCount() == 2
    cell = lambda row, col: page.table.item(row, COL[col]).text()  # noqa: E731
    assert cell(0, "settings") == "quantization.scheme=W8A16"
    assert cell(1, "settings") == "quantization.scheme=W8A8"
    assert cell(0, "state") == "succeeded" and cell(1, "state") == "failed"
    assert cell(0, "reason") == ""
    assert "min_top1_agreement" in cell(1, "reason")
    for row in (0, 1):
        assert float(cell(row, "accuracy")) > 0.99
        assert cell(row, "weights").endswith("MiB") and float(cell(row, "decode tok/s")) > 0
        assert cell(row, "size").endswith("MiB")
        assert cell(row, "perplexity change").endswith("%")
        assert int(cell(row, "run")) == page.rows[row]["run_id"]
    heads = [page.table.horizontalHeaderItem(c).text() for c in range(page.table.columnCount())]
    assert "logits cosine vs FP32 (mean)\n(simulated)" in heads
    assert "MatMul weight bytes\n(estimated)" in heads
    assert "decode tok/s (estimated)\nsnapdragon-8-gen-3" in heads
    assert "best" in cell(0, "front / best") and "front" in cell(0, "front / best")
    assert cell(1, "front / best") == "front"  # smaller (A8 activations), less accurate
    assert "p1" in page.best_line.text() and "smallest" in page.best_line.text()
    assert page.status.text().startswith("finished with failures")
    assert "HTP simulator" in page.sources.text() and "performance model" in page.sources.text()

    # the plot: both points, p1 filled (every gate passed), p2 hollow
    spots = page.scatter.points()
    assert len(spots) == 2
    by_label = {page.rows[s.data()]["label"]: s for s in spots}
    assert by_label["p1"].brush().color().alpha() == 255
    assert by_label["p2"].brush().color().alpha() == 0
    assert "simulated" in page.plot.getAxis("left").labelText
    assert page.plot.getAxis("bottom").labelText == "deployable binaries, total, MiB (measured) →"

    # the best point is selected; a click on p2 in the plot selects it in the table too
    assert page.selected_point()["label"] == "p1"
    assert page.apply_button.text() == "Apply p1 to project"
    p2 = by_label["p2"].pos()
    _click_point(qtbot, page, p2.x(), p2.y())
    assert page.selected_point()["label"] == "p2"
    assert [i.row() for i in page.table.selectionModel().selectedRows()] == [1]
    assert page.selection_ring.data["x"][0] == pytest.approx(p2.x())
    page.table.selectRow(0)  # and a row selects its point in the plot
    assert page.selected_point()["label"] == "p1"
    assert page.selection_ring.data["y"][0] == pytest.approx(by_label["p1"].pos().y())
    page.table.selectRow(1)
    assert page.selected_point()["label"] == "p2" and page.apply_button.isEnabled()

    # open p2's run: the Validation page shows it
    run_id = page.selected_point()["run_id"]
    qtbot.mouseClick(page.open_button, Qt.MouseButton.LeftButton)
    assert window.current_page() == "Validation"
    assert window.page("Validation").run_combo.currentData() == run_id
    window.show_page("Sweeps")

    # apply p2: one undoable step
    assert ctl.project.quantization["scheme"] == "W8A16"
    assert not ctl.studio.commands.can_undo
    qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    assert ctl.project.quantization["scheme"] == "W8A8"
    assert ctl.studio.commands.undo_text == "Apply sweep point p2 (quantization.scheme=W8A8)"
    assert "the project's settings now" in page.selection.text()
    window.undo()
    assert ctl.project.quantization["scheme"] == "W8A16"
    assert not ctl.studio.commands.can_undo
    assert "the project's settings now" not in page.selection.text()

    # a sweep asked for while a pipeline run goes is queued behind it (its export comes
    # from the store), then runs
    task = ctl.run(["export"])
    assert page.run_button.text() == "Queue sweep"
    assert "queued and starts when it ends" in page.run_button.toolTip()
    assert page.run_sweep() is True
    assert any("queued as #" in t for t in window.notifications.texts())
    assert not page.run_button.isEnabled() and "Queued as #" in page.run_button.toolTip()
    item = next(i for i in ctl.queue.waiting_for(ctl.project.path) if i.kind == "sweep")
    assert ctl.queue.why[item.id].startswith("after #")  # behind the export's run
    ctl.queue.cancel(item.id)  # (the sweep itself runs above and below)
    wait_task(qtbot, task)
    qtbot.waitUntil(page.run_button.isEnabled, timeout=10_000)
