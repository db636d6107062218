"""The layer-precision editor on the Precision page, in a real window on real projects built
from the shipped tiny-coder sample: bulk edits through the grid with undo and redo, glob rules
reflected in the grid, refusals of what the target HTP cannot run, the sensitivity heat map
after the sensitivity stage (the session's real result, from the cache), and the Apply
button's run.

Every check of a precision goes through the recipe's own rule
(``core.recipe.effective_precisions``) on the project the session holds."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest

from studio.core.recipe import effective_precisions
from studio.services import history
from studio.services.precision import quantizable, weighted_layers
from tests.cli.conftest import share_store

DOWN = [f"model.layers.{b}.mlp.down_proj" for b in range(4)]


def _open(window, path, qtbot):
    assert window.open_project(path)
    page = window.show_page("Precision")
    qtbot.waitUntil(lambda: page.grid.model.rowCount() > 0, timeout=30_000)
    return page


def _state(window) -> dict[str, tuple[str, str]]:
    info, project = window.ctl.model, window.ctl.project
    names = [n for n, *_ in quantizable(info)]
    return {lp.layer: (lp.weight, lp.activation)
            for lp in effective_precisions(names, project.quantization, weighted_layers(info))}


def _cell(page, layer: str) -> str:
    return page.grid.model.index_of(layer).data()


def _click_cell(page, layer: str, modifier=Qt.KeyboardModifier.NoModifier) -> None:
    view = page.grid.view
    rect = view.visualRect(page.grid.model.index_of(layer))
    QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, modifier, rect.center())


def _click_header(page, title: str) -> None:
    header = page.grid.view.horizontalHeader()
    col = page.grid.model.layout.titles.index(title)
    x = header.sectionViewportPosition(col) + header.sectionSize(col) // 2
    QTest.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     QPoint(x, header.height() // 2))


def _set(page, part: str, precision: str) -> None:
    page.part_combo.setCurrentIndex(page.part_combo.findData(part))
    page.prec_combo.setCurrentText(precision)
    page.set_button.click()


def test_bulk_edit_of_cells_with_undo_and_redo(window, project_path, qtbot):
    page = _open(window, project_path, qtbot)
    p = window.ctl.project
    scheme = _state(window)
    assert scheme["model.layers.0.mlp.down_proj"] == ("INT8", "INT16")
    assert _cell(page, "model.layers.0.mlp.down_proj") == "W8 A16"
    assert _cell(page, "model.layers.0.residual") == "A16"  # a key activation: no weights
    assert not page.undo_button.isEnabled()

    # a header click selects the whole column: one compact rule for four cells
    _click_header(page, "down_proj")
    assert page.grid.selected_layers() == DOWN
    assert "4 layers selected" in page.details.text()
    _set(page, "activations", "INT8")
    assert p.quantization["overrides"] == {"*.down_proj": "INT8"}
    s = _state(window)
    assert all(s[n] == ("INT8", "INT8") for n in DOWN)
    assert {n for n in s if s[n] != scheme[n]} == set(DOWN)
    assert all(_cell(page, n) == "W8 A8" for n in DOWN)
    assert page.grid.model.row_of(DOWN[0])["activation_rule"] == "override '*.down_proj'"

    # Ctrl-click three cells of different columns and blocks: the whole layers to FP16
    picked = ["model.layers.1.self_attn.v_proj", "model.layers.2.self_attn.v_proj", "lm_head"]
    _click_cell(page, picked[0])
    for name in picked[1:]:
        _click_cell(page, name, Qt.KeyboardModifier.ControlModifier)
    assert sorted(page.grid.selected_layers()) == sorted(picked)
    _set(page, "layer", "FP16")
    after_both = {"*.down_proj": "INT8", "model.layers.1.self_attn.v_proj": "FP16",
                  "model.layers.2.self_attn.v_proj": "FP16", "lm_head": "FP16"}
    assert p.quantization["overrides"] == after_both
    s = _state(window)
    assert all(s[n] == ("FP16", "FP16") for n in picked)
    assert _cell(page, "lm_head") == "FP16"
    assert "Keep 3 layers in FP16" in page.status.text()
    assert "Keep 3 layers in FP16" in window.undo_act.text()
    assert page.diff_view.model.rowCount() == 7
    assert "7 layer(s) differ from plain W8A16" in page.diff_line.text()

    # undo twice: back to the plain scheme; the selection stays
    page.undo_button.click()
    assert p.quantization["overrides"] == {"*.down_proj": "INT8"}
    assert all(_state(window)[n] == scheme[n] for n in picked)
    assert _cell(page, "lm_head") == "W8 A16"
    assert sorted(page.grid.selected_layers()) == sorted(picked)
    window.undo_act.trigger()  # the Edit menu's Undo is the same stack
    assert p.quantization["overrides"] == {}
    assert _state(window) == scheme
    assert not page.undo_button.isEnabled() and page.redo_button.isEnabled()
    assert page.diff_view.model.rowCount() == 0

    # redo twice
    page.redo_button.click()
    assert p.quantization["overrides"] == {"*.down_proj": "INT8"}
    assert all(_state(window)[n] == ("INT8", "INT8") for n in DOWN)
    page.redo_button.click()
    assert p.quantization["overrides"] == after_both
    assert _state(window)["lm_head"] == ("FP16", "FP16")
    assert not page.redo_button.isEnabled()

    # back to the scheme for one of the down_proj cells: a rule for it after the glob
    page.grid.select_layers([DOWN[2]])
    page.reset_button.click()
    assert list(p.quantization["overrides"].items())[-1] == (DOWN[2], "INT16")
    assert _state(window)[DOWN[2]] == scheme[DOWN[2]]


def test_a_glob_rule_edit_shows_in_the_grid(window, project_path, qtbot):
    page = _open(window, project_path, qtbot)
    p = window.ctl.project
    # W8A8: 16-bit weights run under its 8-bit activations (not under W8A16's 16-bit ones)
    window.ctl.set("quantization", "scheme", "W8A8")
    o_proj = [f"model.layers.{b}.self_attn.o_proj" for b in range(4)]
    page.pattern.setText("*.o_proj.weight")
    page.prec.setCurrentText("INT4")
    page.add_button.click()
    assert p.quantization["overrides"] == {"*.o_proj.weight": "INT4"}
    assert all(_cell(page, n) == "W4 A8" for n in o_proj)
    assert page.overrides.index(0, 2).data() == "4"  # layers it covers
    # select the rule: its layers are selected in the grid; edit it in place
    page.over_view.selectRow(0)
    assert page.grid.selected_layers() == o_proj
    assert page.pattern.text() == "*.o_proj.weight"
    page.prec.setCurrentText("INT16")
    page.update_button.click()
    assert p.quantization["overrides"] == {"*.o_proj.weight": "INT16"}
    assert all(_cell(page, n) == "W16 A8" for n in o_proj)
    assert all(_state(window)[n] == ("INT16", "INT8") for n in o_proj)
    # a second rule, moved above the first: order matters, the grid follows
    page.pattern.setText("model.layers.0")
    page.prec.setCurrentText("FP16")
    page.add_button.click()
    assert _cell(page, o_proj[0]) == "FP16"
    page._select_rule("model.layers.0")
    page.up_button.click()
    assert list(p.quantization["overrides"]) == ["model.layers.0", "*.o_proj.weight"]
    assert _cell(page, o_proj[0]) == "W16 A8"  # the later weight rule puts it back
    assert _cell(page, "model.layers.0.mlp.up_proj") == "FP16"
    page._select_rule("*.o_proj.weight")
    page.remove_button.click()
    assert p.quantization["overrides"] == {"model.layers.0": "FP16"}
    assert _cell(page, o_proj[1]) == "W8 A8"
    window.undo_act.trigger()
    assert _cell(page, o_proj[1]) == "W16 A8"


def test_refused_choices_leave_the_project_unchanged_and_say_why(window, project_path, qtbot):
    page = _open(window, project_path, qtbot)
    ctl = window.ctl
    p = ctl.project
    _click_cell(page, "model.layers.0.self_attn.q_proj")
    _set(page, "activations", "INT8")
    before = dict(p.quantization["overrides"])
    assert before == {"model.layers.0.self_attn.q_proj": "INT8"}
    undo_text = window.undo_act.text()

    # INT4 activations: the HTP's activations are 8 or 16 bits
    _set(page, "activations", "INT4")
    assert p.quantization["overrides"] == before
    assert page.status.isVisible() and "INT4 is for weights only" in page.status.text()
    assert "Nothing was changed" in page.status.text()
    assert window.undo_act.text() == undo_text  # no command was pushed
    # weights on a layer without weights
    _click_cell(page, "model.layers.0.self_attn.softmax")
    _set(page, "weights", "INT8")
    assert p.quantization["overrides"] == before and "has no weights" in page.status.text()

    # FP16 on a target whose HTP has no float: the context menu marks it, the edit is refused
    ctl.set("", "targets", ["qcm6490"])
    _click_cell(page, "model.layers.2.mlp.up_proj")
    choices = {(part, prec): why for part, prec, _t, why in page.grid.menu_choices()}
    assert "fp16 = false" in choices[("layer", "FP16")] and not choices[("activations", "INT16")]
    # 16-bit weights under the scheme's 16-bit activations: the HTP's MatMul has no such kernel
    assert "16-bit weights under 16-bit activations" in choices[("layer", "INT16")]
    menu = page.grid.build_menu()
    texts = [a.text() for a in menu.actions()]
    assert "Whole layer → FP16   ✕ refused" in texts and "Activations → INT16" in texts
    fp16 = next(a for a in menu.actions() if a.text().startswith("Whole layer → FP16"))
    fp16.trigger()  # clicking a refused choice says why
    assert p.quantization["overrides"] == before
    assert "QCM6490 (qcm6490)" in page.status.text() and "fp16 = false" in page.status.text()
    # the rule table refuses the same
    page.pattern.setText("*.up_proj")
    page.prec.setCurrentText("FP16")
    assert not page.add_override()
    assert p.quantization["overrides"] == before and "qcm6490" in page.status.text()
    page.pattern.setText("*.residual.weight")
    page.prec.setCurrentText("INT8")
    assert not page.add_override()
    assert "sets weights" in page.status.text()
    assert p.quantization["overrides"] == before
    assert p.targets == ["qcm6490"] and window.ctl.dirty


def test_the_set_row_never_offers_a_refused_choice(window, project_path, qtbot):
    """The Set row's precision list greys out what the HTP refuses for the chosen part of the
    selection, with the reason as the tooltip, and never keeps a refused choice as its
    default: lm_head's weights under W8A16 are not offered INT16 (the quantizer would fail
    on it at Apply), a set of them anyway is refused and changes nothing."""
    page = _open(window, project_path, qtbot)
    p = window.ctl.project
    assert p.quantization["scheme"] == "W8A16"
    _click_cell(page, "lm_head")
    page.part_combo.setCurrentIndex(page.part_combo.findData("weights"))
    items = page.prec_combo.model()
    state = {page.prec_combo.itemText(i): (items.item(i).isEnabled(), items.item(i).toolTip())
             for i in range(page.prec_combo.count())}
    assert not state["INT16"][0] and "16-bit weights under 16-bit activations" in state["INT16"][1]
    assert state["INT8"][0] and state["INT4"][0] and not state["FP16"][0]
    assert page.prec_combo.currentText() == "INT8"  # the most precise one allowed
    page.prec_combo.setCurrentText("INT16")
    page.set_button.click()
    assert p.quantization["overrides"] == {} and "16-bit weights" in page.status.text()
    # activations of the same layer: INT16 is allowed again, and the list says so
    page.part_combo.setCurrentIndex(page.part_combo.findData("activations"))
    assert items.item(page.prec_combo.findText("INT16")).isEnabled()
    assert not items.item(page.prec_combo.findText("INT4")).isEnabled()


def test_heat_map_after_the_real_sensitivity_stage(
        window, exported_template, copy_project, sensitivity_run, tmp_path, qtbot):
    """The page before and after the sensitivity stage its empty state's button queues. The
    project takes the settings of the session's shared sensitivity project (W8A8, 96 held-out
    tokens; tests/conftest.py: sensitivity_run) and starts from a copy of its artifact store,
    so the queued run takes the real stage's stored result from the cache: what is checked
    here is the display; the stage itself is checked in tests/engine/test_sensitivity.py."""
    path = copy_project(exported_template, tmp_path / "s")
    share_store(sensitivity_run[0], path)  # artifacts only: no sensitivity run in the history
    page = _open(window, path, qtbot)
    ctl = window.ctl
    qtbot.waitUntil(lambda: page.sensitivity_loaded, timeout=30_000)
    assert page.sensitivity is None
    # the empty state says how to get it, and its button queues the stage
    assert page.heat.stack.currentWidget() is page.heat.empty
    text = page.heat.empty.text.text()
    assert "Run ▸ Run Stage ▸ sensitivity" in text and "--stages sensitivity" in text
    assert page.heat.run_button.isEnabled()
    ctl.set("quantization", "scheme", "W8A8")  # the shared project's settings
    ctl.set("sensitivity", "heldout_tokens", 96)
    page.heat.run_button.click()
    assert ctl.running and "queued behind it" in page.apply_button.toolTip()
    assert page.status.text().startswith("Sensitivity queued")
    qtbot.waitUntil(lambda: not ctl.running, timeout=400_000)
    qtbot.waitUntil(lambda: page.sensitivity is not None, timeout=60_000)
    result = page.sensitivity
    assert result["current"] and result["data"]["source"] == "measured"
    # the queued line does not stay once it finished
    assert page.status.text() == "Sensitivity finished: the heat map shows its result."

    # the ranked chart: most sensitive first, figures measured on the host CPU
    assert page.heat.stack.currentWidget() is page.heat.chart
    assert page.heat.badge.text() == "measured"
    shown = page.heat.shown
    ranking = result["data"]["ranking"]
    assert len(shown) > 5 and shown[0][0] in (ranking["raise"][0], ranking["raise_points"][0])
    assert [v for _, v in shown] == sorted((v for _, v in shown), reverse=True)
    # the toggle colours the grid by sensitivity, with a legend
    assert not page.grid.model.heat_on
    page.heat_check.click()
    m = page.grid.model
    assert m.heat_on and page.grid.legend.heat_on and page.grid.legend.heat_max > 0
    top = m.index_of(shown[0][0])
    assert top.data(Qt.ItemDataRole.UserRole + 3) == 1.0  # the hottest cell
    norm = m.index_of("model.layers.0.input_layernorm")
    assert norm.data(Qt.ItemDataRole.UserRole + 3) is None
    assert "not analysed" in norm.data(Qt.ItemDataRole.ToolTipRole)
    # the key activations are analysed too (raised alone, like the layers)
    assert m.index_of("model.layers.0.residual").data(Qt.ItemDataRole.UserRole + 3) is not None
    # clicking a bar selects its cell; the side panel shows its figures
    QTest.mouseClick(page.heat.plot.viewport(), Qt.MouseButton.LeftButton,
                     Qt.KeyboardModifier.NoModifier, page.heat.bar_center(1))
    qtbot.waitUntil(lambda: page.grid.selected_layers() == [shown[1][0]], timeout=5_000)
    assert "Sensitivity" in page.details.text() and "raised alone to" in page.details.text()
    # an override edit keeps the result current (the stage does not read the overrides)
    assert page.edit_selection("activations", "INT16")
    task = page.load_sensitivity()
    qtbot.waitUntil(task.done, timeout=30_000)
    assert page.sensitivity["current"] and page.sensitivity["job"] == result["job"]
    # another scheme: the result is shown as stale, with why and how to refresh it
    ctl.set("quantization", "scheme", "W8A16")
    qtbot.waitUntil(lambda: page.sensitivity is not None and not page.sensitivity["current"],
                    timeout=30_000)
    assert page.heat.stale.isVisibleTo(page)
    assert "scheme 'W8A8' → 'W8A16'" in page.heat.stale.text()
    page.heat_check.click()
    assert not m.heat_on


def test_apply_queues_quantize_compile_validate(
        window, exported_template, copy_project, tmp_path, qtbot):
    page = _open(window, copy_project(exported_template, tmp_path / "a"), qtbot)
    ctl = window.ctl
    page.grid.select_column("down_proj")
    assert page.edit_selection("activations", "INT8")
    before_runs = {r.id for r in history.runs(ctl.project, ctl.studio.jobs)}
    page.apply_button.click()
    assert ctl.running and "queued behind it" in page.apply_button.toolTip()
    assert "quantize → compile → validate queued" in page.status.text()
    # the plan's jobs, as their events come in (the cached export among them)
    seen: set[str] = set()
    ctl.job_event.connect(lambda job: seen.add(job.label))
    seen.update(j.label for j in ctl.active_jobs)
    qtbot.waitUntil(lambda: "validate[snapdragon-8-gen-3]" in seen, timeout=30_000)
    labels = set(seen)
    ctl.cancel_run()  # compiling on the simulator is slow: the plan is what is checked
    qtbot.waitUntil(lambda: not ctl.running, timeout=60_000)
    run = next(r for r in history.runs(ctl.project, ctl.studio.jobs) if r.id not in before_runs)
    assert run.stages == ["quantize", "compile", "validate"]
    assert run.settings["quantization"]["overrides"] == {"*.down_proj": "INT8"}
    stages = {j.stage for j in history.run_jobs(ctl.studio.jobs, run.id)}
    assert stages == {"export", "quantize", "compile", "validate"}  # export: from the cache
    assert {"compile[snapdragon-8-gen-3]", "validate[snapdragon-8-gen-3]"} <= labels
    assert page.apply_button.isEnabled()
    # a cancelled run has no validation figures: the page says so
    assert "without validation figures" in page.status.text()


@pytest.mark.slow
def test_apply_shows_before_and_after_with_sources(
        window, compiled_template, copy_project, tmp_path, qtbot):
    """Two real applies (the plain scheme, then an edit): the second one's validation figures
    next to the first's, each with its source (about a minute on the simulator)."""
    page = _open(window, copy_project(compiled_template, tmp_path / "b"), qtbot)
    ctl = window.ctl
    ctl.set("validation", "heldout_tokens", 16)
    ctl.set("validation", "greedy_tokens", 2)
    first = page.apply_recipe()
    qtbot.waitUntil(first.done, timeout=600_000)
    assert first.result().state == "succeeded"
    page.grid.select_column("down_proj")
    assert page.edit_selection("activations", "INT8")
    page.apply_button.click()
    qtbot.waitUntil(lambda: not ctl.running, timeout=600_000)
    qtbot.waitUntil(lambda: page.before_after.shown is not None, timeout=10_000)
    before, after = page.before_after.shown
    assert before == first.result().run_id and after > before
    assert page.tabs.tabText(page.tabs.currentIndex()) == "Before / after"
    assert "Applied: run" in page.status.text()
    text = page.before_after.runs.text()
    assert f"run {before}" in text and f"run {after}" in text and "*.down_proj: INT8" in text
    m = page.before_after.model
    rows = [[m.index(r, c).data() for c in range(m.columnCount())] for r in range(m.rowCount())]
    assert {r[3] for r in rows} == {"measured", "simulated"}
    htp = next(r for r in rows if r[1] == "perplexity" and r[2].startswith("HTP"))
    assert htp[3] == "simulated" and htp[4] != "—" and htp[5] != "—"


def test_the_weight_rounding_combo_is_one_undoable_edit(window, project_path, qtbot):
    page = _open(window, project_path, qtbot)
    p = window.ctl.project
    combo = page.rounding
    assert combo.currentData() == "nearest" and combo.isEnabled()
    combo.setCurrentIndex(combo.findData("seqmse_gptq"))
    combo.activated.emit(combo.currentIndex())
    assert p.quantization["weight_rounding"] == "seqmse_gptq"
    window.undo_act.trigger()
    assert p.quantization["weight_rounding"] == "nearest"
    qtbot.waitUntil(lambda: combo.currentData() == "nearest", timeout=5_000)
    window.ctl.set("quantization", "scheme", "FP16")
    qtbot.waitUntil(lambda: not combo.isEnabled(), timeout=5_000)


def test_the_heat_colour_scale_has_a_floor(qapp):
    """Full colour means at least the figure's floor (a KL drop of 1e-4 nats): a model whose
    layers all move the KL by 2e-5 nats stays pale, not deep red; above the floor the largest
    value is full colour."""
    from studio.services.sensitivity import HEAT_FLOOR
    from studio.ui.models.layergrid import LayerGridModel

    m = LayerGridModel()
    floor = HEAT_FLOOR["kl_divergence"]
    m.set_heat({"a": 2e-5, "b": 1e-5}, "nats", floor)
    assert m.heat_max == floor and m.heat_level(2e-5) == pytest.approx(0.2)
    m.set_heat({"a": 0.5, "b": 0.25}, "nats", floor)
    assert m.heat_level(0.5) == 1.0 and m.heat_level(0.25) == pytest.approx(0.5)
    m.set_heat({"a": 2e-5}, "nats")  # no floor: the old relative scale
    assert m.heat_level(2e-5) == 1.0
