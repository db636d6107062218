"""The layer diff in the window (Validation ▸ Layer diff): the empty state says how to get a
diff and its button queues the layerdiff stage; after a real run (``studio --batch FILE
--stages layerdiff``: real export, quantizer, ONNX Runtime and QNN HTP simulator, once for
the module) the view draws the three curves with their sources, the finding names the real
parting tensor, the worst-tensor table matches the result, and double-clicking a row or a
point of the plot opens its layer on the Precision page."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from studio.core import project as pf
from tests.cli.conftest import studio as studio_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def diffed(layerdiff_run) -> dict:
    """A small sample project after ``studio --batch FILE --stages layerdiff`` (2 windows,
    module outputs; shared with the engine's tests), and what ``studio layerdiff FILE
    --json`` says about it."""
    path, _batch, seconds = layerdiff_run
    shown = studio_cli("layerdiff", path, "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    return {"path": path, "got": json.loads(shown.stdout), "seconds": seconds}


def _open(make_window, copy_project, src: Path, dest: Path):
    win = make_window()
    assert win.open_project(copy_project(src, dest))
    page = win.show_page("Validation")
    page.sections.setCurrentWidget(page.layer_diff)
    return win, page, page.layer_diff


def _wait_state(qtbot, view, state: str, timeout: int = 30_000) -> None:
    qtbot.waitUntil(lambda: view.state == state, timeout=timeout)


def test_layer_of_names_the_recipe_layers(diffed):
    """A tensor maps to the layer the recipe names: a module, or a key activation's
    pseudo-layer (a block's output is its last residual add)."""
    from studio.ui.pages.layerdiff_rows import layer_of

    rows = {r["name"]: r for r in diffed["got"]["rows"]}
    assert layer_of(rows["model.layers.0"]) == "model.layers.0.residual"
    assert layer_of(rows["model.layers.0.residual"]) == "model.layers.0.residual"
    assert layer_of(rows["model.layers.1.self_attn.scores"]) == "model.layers.1.self_attn.scores"
    assert layer_of(rows["model.layers.1.self_attn.softmax"]) == \
        "model.layers.1.self_attn.softmax"
    assert layer_of(rows["model.layers.0.self_attn.q_proj"]) == "model.layers.0.self_attn.q_proj"
    assert layer_of(rows["model.layers.0.post_attention_layernorm"]) == \
        "model.layers.0.post_attention_layernorm"
    assert layer_of(rows["lm_head"]) == "lm_head"
    assert layer_of(rows["model.embed_tokens"]) == "model.embed_tokens"


def test_the_view_draws_the_real_diff(diffed, make_window, copy_project, tmp_path, qtbot):
    from PySide6.QtCore import Qt

    from studio.ui.pages.layerdiff_rows import pct

    got = diffed["got"]
    r, rows = got["result"], got["rows"]
    win, page, view = _open(make_window, copy_project, diffed["path"], tmp_path / "p")
    _wait_state(qtbot, view, "content")
    assert view.isVisibleTo(page)

    # three curves, one point per tensor shown (module outputs by default)
    assert set(view.curves) == {"qdq_vs_fp32", "htp_vs_fp32", "htp_vs_qdq"}
    shown = [x for x in rows if x["kind"] in ("boundary", "module")]
    for pair, curve in view.curves.items():
        xs, ys = curve.getOriginalDataset()
        assert len(xs) == len(shown)
        assert [float(y) for y in ys] == [x[pair]["rel_error"] for x in shown]
    assert view.plot.getPlotItem().ctrl.logYCheck.isChecked()  # log y
    legend = view.legend.text()
    for words in ("host QDQ vs FP32", "HTP vs FP32", "HTP vs host QDQ", "measured",
                  "simulated", "host-cpu", r["device"]):
        assert words in legend, words

    # the finding comes from the result: the real parting tensor and its figures
    part = r["parting"]
    assert part is not None
    text = view.finding.text()
    assert f"Host QDQ and the HTP part at {part['name']}" in text
    assert pct(part["qdq_rel_error"]) in text and pct(part["htp_rel_error"]) in text
    assert r["first_jump"]["qdq_vs_fp32"]["name"] in text
    # markers at the first jump and where they part, at the tensors' places
    marked = {name: line for name, _, line in view.markers}
    assert part["name"] in marked and r["first_jump"]["qdq_vs_fp32"]["name"] in marked
    names = [x["name"] for x in shown]
    assert marked[part["name"]].value() == names.index(part["name"])

    # the table: the result's worst tensors (per pair) and where the two part most,
    # worst HTP error first, full names
    want = {w["name"] for p in r["pairs"] for w in r["worst"][p]} | {
        a["name"] for a in r["apart"]
    }
    table = view.table_rows()
    header, body = table[0], table[1:]
    assert header[:3] == ["Tensor", "Layer", "Block"]
    assert {row[0] for row in body} == want
    by_name = {x["name"]: x for x in rows}
    errs = [by_name[row[0]]["htp_vs_fp32"]["rel_error"] for row in body]
    assert errs == sorted(errs, reverse=True)
    first = by_name[body[0][0]]
    assert body[0][3] == pct(first["qdq_vs_fp32"]["rel_error"])
    assert body[0][4] == f"{first['qdq_vs_fp32']['cosine']:.6f}"
    assert body[0][5] == pct(first["htp_vs_fp32"]["rel_error"])
    assert not any("…" in row[0] for row in body)
    # sortable by value: the host QDQ error column, ascending
    view.table_view.sortByColumn(3, Qt.SortOrder.AscendingOrder)
    q = [by_name[row[0]]["qdq_vs_fp32"]["rel_error"] for row in view.table_rows()[1:]]
    assert q == sorted(q)

    # block boundaries only: one point per boundary, readable ticks
    view.mode_buttons["blocks"].setChecked(True)
    bounds = [x for x in rows if x["kind"] == "boundary"]
    xs, _ = view.curves["htp_vs_fp32"].getOriginalDataset()
    assert len(xs) == len(bounds) == len(r["curves"]["names"])
    ticks = [t for _, t in view.plot.getAxis("bottom")._tickLevels[0]]
    assert ticks[0] == "embed" and ticks[1] == "L0" and ticks[-2:] == ["norm", "lm_head"]
    # the markers keep their place between the boundaries
    assert 0 < marked_x(view, part["name"]) < len(bounds)
    # every tensor listed on request
    view.mode_buttons["modules"].setChecked(True)
    view.all_rows.setChecked(True)
    assert len(view.table_rows()) - 1 == len(shown)


def marked_x(view, name: str) -> float:
    return next(line.value() for n, _, line in view.markers if n == name)


def _double_click(qtbot, widget, pos) -> None:
    """What a user's double-click sends: press, release, double-click, release (QTest's
    mouseDClick alone sends no press before nor release after)."""
    from PySide6.QtCore import Qt

    qtbot.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseDClick(widget, Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseRelease(widget, Qt.MouseButton.LeftButton, pos=pos)


def test_activating_a_row_or_point_opens_the_layer(
    diffed, make_window, copy_project, tmp_path, qtbot
):
    from PySide6.QtCore import QPointF

    from studio.ui.pages.layerdiff_rows import layer_of

    win, page, view = _open(make_window, copy_project, diffed["path"], tmp_path / "p")
    _wait_state(qtbot, view, "content")
    prec = win.page("Precision")
    win.show_page("Precision")  # its grid: the model's layers, loaded once
    qtbot.waitUntil(lambda: prec.grid.model.rowCount() > 0, timeout=60_000)
    win.show_page("Validation")

    # double-click the row of the tensor where host QDQ and the HTP part
    part = diffed["got"]["result"]["parting"]["name"]
    row = next(i for i, r in enumerate(view.table_rows()[1:]) if r[0] == part)
    tv = view.table_view
    rect = tv.visualRect(view.proxy.index(row, 0))
    with qtbot.waitSignal(view.layerActivated, timeout=5_000) as sig:
        _double_click(qtbot, tv.viewport(), rect.center())
    assert sig.args == [part]  # a norm: the module itself
    assert win.current_page() == "Precision" and prec.grid.selected_layers() == [part]

    # a point of the plot: the scores of block 1 (a key activation's pseudo-layer)
    win.show_page("Validation")
    rows = diffed["got"]["rows"]
    k = next(i for i, x in enumerate(view._shown) if rows[x]["name"].endswith("1.self_attn.scores"))
    y = math.log10(rows[view._shown[k]]["htp_vs_fp32"]["rel_error"])
    vb = view.plot.getPlotItem().vb
    pos = view.plot.mapFromScene(vb.mapViewToScene(QPointF(k, y)))
    assert view.point_at(vb.mapViewToScene(QPointF(k, y)))["name"].endswith("1.self_attn.scores")
    with qtbot.waitSignal(view.layerActivated, timeout=5_000) as sig:
        _double_click(qtbot, view.plot.viewport(), pos)
    assert sig.args == ["model.layers.1.self_attn.scores"]
    assert layer_of(rows[view._shown[k]]) == "model.layers.1.self_attn.scores"
    assert win.current_page() == "Precision"
    assert prec.grid.selected_layers() == ["model.layers.1.self_attn.scores"]

    # the bisection's verdict over the diff (studio bisect's reading), its layer one click
    # away; step 1 says it was not run (this diff ran without the HTP in FP16)
    win.show_page("Validation")
    from studio.core.layerdiff import bisect_verdict

    want = bisect_verdict(diffed["got"]["result"], rows)
    assert view.verdict.text().startswith("<b>Verdict:</b> ")
    assert "Step 1, FP32 vs the HTP unquantized: not run" in view.verdict.text()
    assert want["layer"] is not None and view.open_verdict.isVisibleTo(view)
    with qtbot.waitSignal(view.layerActivated, timeout=5_000) as sig:
        view.open_verdict.click()
    assert win.current_page() == "Precision" and prec.grid.selected_layers() == sig.args


def test_empty_state_then_the_button_runs_the_layer_diff(
    diffed, make_window, copy_project, tmp_path, qtbot
):
    """A settings change makes the stored diff another settings' one: the view says how to
    get one; its button queues the layerdiff stage only (what it needs comes from the cache)
    and the view shows the new diff when the job is done."""
    win, page, view = _open(make_window, copy_project, diffed["path"], tmp_path / "p")
    _wait_state(qtbot, view, "content")
    win.ctl.set("layerdiff", "windows", 1)
    _wait_state(qtbot, view, "empty")
    path = win.ctl.project.path
    assert view.empty.title.text() == "No layer diff for the current settings"
    said = " ".join(re.sub(r"<[^>]+>", " ", view.empty.text.text()).split())
    assert f"Run the layer diff: studio --batch {path} --stages layerdiff" in said
    assert view.run_button.isVisibleTo(page) and view.run_button.isEnabled()
    assert not view.target.isVisibleTo(page)  # one target: no selector

    jobs_before = {j.id for j in win.ctl.studio.jobs.jobs()}
    view.run_button.click()
    assert win.ctl.running and "queued behind it" in view.run_button.toolTip()
    qtbot.waitUntil(lambda: not win.ctl.running, timeout=300_000)
    new = [j for j in win.ctl.studio.jobs.jobs() if j.id not in jobs_before]
    assert {j.stage for j in new} == {"export", "quantize", "compile", "layerdiff"}
    assert [j.stage for j in new if not j.cached] == ["layerdiff"]
    assert all(j.state == "succeeded" for j in new)
    run = win.ctl.studio.jobs.run(new[0].run_id)
    assert run["config"]["stages"] == ["layerdiff"]
    assert run["config"]["settings"]["layerdiff"]["windows"] == 1
    _wait_state(qtbot, view, "content", timeout=60_000)
    assert "1 held-out window(s)" in view.finding.text()


def test_error_state_shows_the_line(diffed, make_window, copy_project, tmp_path, qtbot):
    """An unreadable stored diff: the view shows the service's one-line error."""
    from studio.core.artifacts import ArtifactStore
    from studio.services.history import current_keys

    dest = copy_project(diffed["path"], tmp_path / "p")
    p = pf.load(dest)
    key = current_keys(p, ["layerdiff"])[f"layerdiff[{p.targets[0]}]"]
    art = ArtifactStore(p.folder / "artifacts").get(key)
    # a new file, not a write through the copy's hard link (that would damage the shared
    # project the later tests read)
    (art.path / "layerdiff.json").unlink()
    (art.path / "layerdiff.json").write_text("{not json")
    win = make_window()
    assert win.open_project(dest)
    page = win.show_page("Validation")
    view = page.layer_diff
    _wait_state(qtbot, view, "error")
    assert "is unreadable: run studio --batch" in view.error.text.text()


def test_a_model_in_parts_picks_the_part_to_diff(diffed, make_window, copy_project, tmp_path,
                                                qtbot):
    """A project exported in parts shows a part picker (layerdiff.part, an undoable edit);
    one exported whole does not. Picking a part leaves the diff of that part's settings to
    run (the empty state), nothing of another part shown as if it were current."""
    win, page, view = _open(make_window, copy_project, diffed["path"], tmp_path / "p")
    _wait_state(qtbot, view, "content")
    assert not view.part.isVisibleTo(page)
    win.ctl.set("export", "parts", 2)
    view.reload()
    qtbot.waitUntil(lambda: view.part.isVisibleTo(page), timeout=10_000)
    _wait_state(qtbot, view, "empty")
    view.part.setValue(2)
    assert win.ctl.project.layerdiff["part"] == 2
    assert "part 2" in win.undo_act.text()
    win.undo_act.trigger()
    assert win.ctl.project.layerdiff["part"] == 0
