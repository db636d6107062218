"""Encoders and ONNX graphs in the window: the wizard makes each kind of project (an ONNX
file with a dynamic input gets its fixed shape and .npz samples checked on the way; the
MiniLM sample gets its sequence length), and the Placement page shows the nodes the HTP
refuses with the EP's reasons and the way forward, an undoable setting, before and after a
real pipeline run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studio.core import project as projectfile
from studio.core.stagegraph import default_stages
from studio.ui.pages.registry import PAGES
from tests.engine.small_graphs import FEEDS, cnn, mlp
from tests.ui.conftest import wait_task


def _to_graph_page(wiz, onnx: Path | None = None, sample: str = ""):
    src = wiz.source_page
    if onnx is not None:
        src.onnx.setText(str(onnx))
    else:
        src.sample_radio.setChecked(True)
        src.sample.setCurrentIndex(src.sample.findData(sample))
    assert src.validatePage(), src.error.text()
    assert src.nextId() == 1  # the graph page: encoders and ONNX graphs only
    wiz.graph_page.initializePage()
    return wiz.graph_page


def _finish(wiz, folder: Path, name: str):
    wiz.recipe_page.initializePage()
    wiz.location_page.name.setText(name)
    wiz.location_page.folder.setText(str(folder))
    assert wiz.location_page.isComplete()
    wiz.accept()
    assert wiz.result() == wiz.DialogCode.Accepted, wiz.location_page.error.text()


def test_the_wizard_makes_an_onnx_graph_project(window, tmp_path):
    model = cnn(tmp_path / "cnn.onnx")
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "c.npz", image=rng.randn(5, 1, 3, 16, 16).astype(np.float32))
    np.savez(tmp_path / "f64.npz", image=rng.randn(5, 1, 3, 16, 16))
    wiz = window.new_project()
    page = _to_graph_page(wiz, onnx=model)
    assert "onnx-graph" in wiz.source_page.kind_label.text()
    assert list(page.shape_edits) == ["image"] and page.shape_edits["image"].isEnabled()
    assert not page.isComplete()  # the dynamic batch needs a fixed shape
    page.shape_edits["image"].setText("1, 3, 16, 16")
    page.calibration.setText(str(tmp_path / "f64.npz"))
    assert page.isComplete() and not page.validatePage()
    assert "'image' is float64, the model wants float32" in page.error.text()
    page.calibration.setText(str(tmp_path / "c.npz"))
    page.placement.button(1).setChecked(True)  # partition
    assert page.validatePage(), page.error.text()
    assert wiz.recipe_page.samples.value() == 5  # the file's samples
    _finish(wiz, tmp_path / "made", "cnn")
    r = wiz.recipe_page
    assert not r.prompt.isVisible() and not r.gates["min_logits_cosine"].isVisibleTo(r)
    assert r.gates["min_output_cosine"].isVisibleTo(r)
    p = projectfile.load(window.ctl.project.path)
    assert p.model["kind"] == "onnx-graph" and p.quantization["placement"] == "partition"
    assert p.graph["shapes"] == {"image": [1, 3, 16, 16]}
    assert p.graph["calibration"] == str((tmp_path / "c.npz").resolve())
    assert p.pipeline["stages"] == list(default_stages("onnx-graph"))


def test_the_wizard_makes_an_encoder_project(window, tmp_path):
    wiz = window.new_project()
    page = _to_graph_page(wiz, sample="minilm")
    assert not page.inputs_box.isVisibleTo(page) and page.seq_len.isVisibleTo(page)
    assert page.isComplete()
    page.seq_len.setValue(48)
    assert page.validatePage()
    _finish(wiz, tmp_path / "made", "minilm")
    p = projectfile.load(window.ctl.project.path)
    assert p.model == {"source": "sample:minilm", "draft": "", "kind": "encoder",
                       "chat_template": "checkpoint", "draft_embedding": "auto"}
    assert p.graph["seq_len"] == 48 and p.quantization["calibration_samples"] == 40
    assert p.quantization["calibration_text"] == "sample:sentences"
    gates = wiz.recipe_page.gates
    assert gates["min_ranking_top1"].isVisibleTo(wiz.recipe_page)


@pytest.mark.slow
def test_the_placement_page_before_and_after_a_run(window, qtbot, tmp_path):
    mlp(tmp_path / "mlp.onnx", "celu")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"][None] for f in FEEDS]))
    p = projectfile.new_project("mlp", "mlp.onnx", None, graph={"calibration": "calib.npz"})
    p.path = tmp_path / "mlp.qstudio"
    projectfile.save(p)
    assert window.open_project(p.path)
    row = [s.key for s in PAGES].index("placement")
    assert not window.nav.item(row).isHidden()  # an ONNX graph's project lists the page
    page = window.show_page("Placement")
    qtbot.waitUntil(lambda: page.not_yet.isVisible(), timeout=30_000)
    assert "not quantized" in page.not_yet.title.text()
    assert not page.save_button.isEnabled() and not page.details.isVisible()
    # strict: the pipeline stops at the compile stage; the page names the node and reason
    task = page.run_stages(None)
    wait_task(qtbot, task)
    qtbot.waitUntil(lambda: "refused" in page.summary.text(), timeout=60_000)
    assert page.refused.rowCount() == 1
    row = [page.refused.item(0, c).text() for c in range(5)]
    assert row[0] == "act/Celu" and row[1] == "Celu" and "not supported" in row[2]
    assert row[4].startswith("celu:")  # the catalogue has a rewrite for it
    assert "partition would make" in page.crossings_title.text()
    assert page.crossings.rowCount() == 2
    # the way forward is a recipe setting: chosen here, undone, chosen again
    page.way.setCurrentIndex(page.way.findData("rewrite"))
    page.way.activated.emit(page.way.currentIndex())
    assert window.ctl.project.quantization["placement"] == "rewrite"
    window.ctl.undo()
    assert window.ctl.project.quantization["placement"] == "strict"
    assert page.way.currentData() == "strict"
    window.ctl.redo()
    task = page.run_stages(None)
    wait_task(qtbot, task)
    qtbot.waitUntil(lambda: "every node on the NPU" in page.summary.text(), timeout=60_000)
    assert page.refused.rowCount() == 0 and page.rewrites.rowCount() == 1
    assert page.rewrites.item(0, 0).text() == "celu"
    assert "worst cosine" in page.check.text()
    assert page.accuracy.rowCount() == 1 and page.accuracy.item(0, 0).text() == "y"
    assert page.accuracy.item(0, 3).text() == "simulated"
    files = page.save_to(tmp_path / "out")
    assert {f.name for f in files} == {"rewritten.onnx", "quantized.onnx", "graph_ctx.onnx",
                                       "placement.json"}
    page.grab().save(str(tmp_path / "placement.png"))
