"""Every page: its no-project and empty states say what will appear and how; where the run
history has data, the page shows it with the source of every figure."""

from __future__ import annotations

import time

import pytest
from PySide6.QtGui import QKeySequence, QPalette

from studio.core.metrics import Metric
from studio.ui.pages.registry import PAGES


def _visible_texts(widget) -> str:
    from PySide6.QtWidgets import QLabel

    return " ".join(w.text() for w in widget.findChildren(QLabel) if w.isVisibleTo(widget))


def test_every_page_without_a_project(window):
    assert window.stack.currentWidget() is window.welcome
    assert "Welcome to QStudio" in _visible_texts(window.welcome)
    for spec in PAGES:
        title = spec.title
        page = window.show_page(title)
        if title == "Overview":
            assert page is window.welcome
            continue
        if title == "Devices":
            assert page.stack.currentWidget() is page.body
            assert page.chips.rowCount() > 5  # the catalog, even without a project
            continue
        if title == "Queue":  # the window's queue, not a project's
            assert page.stack.currentWidget() is page.body
            assert "The queue is empty" in _visible_texts(page)
            continue
        assert page.stack.currentWidget() is page.no_project
        assert "No project open" in _visible_texts(page.no_project)
    assert not window.save_act.isEnabled() and not window.run_act.isEnabled()
    assert not window.undo_act.isEnabled()


def test_empty_states_of_a_fresh_project(window, project_path, qtbot):
    from studio.ui.pages.registry import PAGES

    listed = lambda: [s.title for i, s in enumerate(PAGES)  # noqa: E731
                      if not window.nav.item(i).isHidden()]
    assert "Placement" in listed()  # no project: every page
    assert window.open_project(project_path)
    # a causal LM's project does not list the page of encoders' and graphs' node placement
    assert "Placement" not in listed() and "Precision" in listed()
    expect = {
        "Jobs": "No jobs yet",
        "Profiler": "No profile yet",
        "Validation": "No validation yet",
        "LLM": "No generation yet",
        "Reports": "No reports yet",
        "Deploy": "No bundle yet",
    }
    for title, text in expect.items():
        page = window.show_page(title)
        assert page.empty.isVisibleTo(page), title
        assert text in page.empty.title.text()
        assert "Run" in page.empty.text.text() or "run" in page.empty.text.text()
        assert page.empty.buttons.count() > 2, f"{title}: an empty state leads somewhere"
    over = window.show_page("Overview")
    assert "No results yet" in _visible_texts(over)
    qtbot.waitUntil(lambda: "Parameters" in _visible_texts(over), timeout=20_000)
    text = _visible_texts(over)
    assert "KV cache on the device" in text and "Checkpoint weights" in text and "formula" in text
    model = window.show_page("Model")
    qtbot.waitUntil(lambda: "Run the export stage" in model.status.text(), timeout=20_000)
    assert model.export_button.isVisibleTo(model)
    assert model.model.rowCount() > 2  # embedding, blocks, head
    # the part plan and the predicted peak memory of the stages that hold a part
    qtbot.waitUntil(lambda: model.plan.isVisibleTo(model), timeout=20_000)
    plan = model.plan.text()
    assert plan.startswith("Plan: one part; the largest holds")
    assert "Predicted peak memory (estimated): export" in plan and "GiB free now" in plan
    # the device memory plan: a line per target, a small table with the source column
    qtbot.waitUntil(lambda: model.device_table.isVisibleTo(model), timeout=20_000)
    assert "; fits" in model.device_plan.text()
    table = model.device_table
    assert table.horizontalHeaderItem(3).text() == "source" and table.rowCount() == 5
    assert {table.item(i, 3).text() for i in range(table.rowCount())} == {"estimated"}
    prec = window.show_page("Precision")
    qtbot.waitUntil(lambda: prec.layers.rowCount() > 0, timeout=20_000)


def test_netron_control_is_absent_with_a_hint_when_netron_is_missing(window, project_path):
    from studio.services import projects

    assert window.open_project(project_path)
    page = window.show_page("Model")
    if projects.netron_available():
        assert page.netron_button.isVisibleTo(page)
    else:
        assert not page.netron_button.isVisibleTo(page)
        assert page.netron_hint.isVisibleTo(page)
        assert "pip install netron" in page.netron_hint.toolTip()


def _tiny_onnx(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "layers.0.fc.weight")
    graph = helper.make_graph(
        [
            helper.make_node(
                "MatMul", ["x", "layers.0.fc.weight"], ["y"], name="/layers.0/fc/MatMul"
            ),
            helper.make_node("Relu", ["y"], ["z"], name="/layers.0/Relu"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_open_in_netron_when_netron_is_installed(
    window, project_path, tmp_path, monkeypatch, qtbot, make_spec
):
    """With netron importable the button shows; it is enabled once there is a graph to show.
    netron's own start() is replaced so no browser opens."""
    from studio.services import projects

    monkeypatch.setattr(projects, "netron_available", lambda: True)
    served = []
    monkeypatch.setattr(
        projects, "open_in_netron", lambda path: served.append(path) or "http://localhost:8080"
    )
    assert window.open_project(project_path)
    page = window.show_page("Model")
    assert page.netron_button.isVisibleTo(page) and not page.netron_hint.isVisibleTo(page)
    assert not page.netron_button.isEnabled()  # nothing exported yet
    assert "Run the export stage first" in page.netron_button.toolTip()
    onnx_path = _tiny_onnx(tmp_path / "tiny.onnx")
    window.ctl.create(
        make_spec(tmp_path / "p", "onnxproj", source_kind="onnx", source=str(onnx_path))
    )
    page = window.show_page("Model")
    qtbot.waitUntil(page.netron_button.isEnabled, timeout=20_000)
    page.netron_button.click()
    assert served == [onnx_path]
    assert any("Netron serves tiny.onnx" in t for t in window.notifications.texts())


def _add_job(store, stage, target, result, metrics=()):
    run = store.create_run({})
    jid = store.add_job(run, stage, target)
    now = time.time()
    store.update_job(
        jid,
        state="succeeded",
        started=now - 2,
        finished=now,
        progress=1.0,
        result=result,
        message=result.get("summary", ""),
    )
    store.add_metrics(jid, list(metrics))
    return jid


def test_pages_show_results_from_the_run_history(window, project_path, qtbot, monkeypatch):
    """Validation, Profiler, LLM and Reports read the job store (rows written here the way the
    pipeline writes them) and badge every figure with its source."""
    assert window.open_project(project_path)
    studio = window.ctl.studio
    chip = "snapdragon-8-gen-3"
    sim = dict(source="simulated", device="htp-sim", target=chip)
    _add_job(
        studio.jobs,
        "validate",
        chip,
        {
            "summary": "cosine 0.998",
            "logits_cosine_mean": 0.998,
            "top1_agreement": 0.9,
            "perplexity_fp32": 10.0,
            "perplexity_quantized": 10.2,
            "greedy_fp32": "return self",
            "greedy_htp": "return self",
        },
        [
            Metric("logits_cosine_mean", 0.998, "", **sim),
            Metric("top1_agreement", 0.9, "fraction", **sim),
            Metric("perplexity_fp32", 10.0, "", "measured", "host-cpu"),
        ],
    )
    _add_job(
        studio.jobs,
        "profile",
        chip,
        {
            "summary": "3 op types",
            "by_op_type": {"MatMul": 900.0, "Add": 50.0, "Softmax": 50.0},
            "unit": "cycles",
            "source": "simulated",
        },
    )
    _add_job(
        studio.jobs,
        "run",
        "cpu",
        {"summary": "16 tokens", "text": "x = 1", "step_s": [0.01, 0.011], "source": "measured"},
        [Metric("decode_tokens_per_s", 95.0, "tok/s", "measured", "host-cpu")],
    )
    reports = project_path.with_suffix(".studio") / "reports"
    reports.mkdir(parents=True)
    (reports / "report-1.html").write_text("<html>r</html>")
    (reports / "report-1.json").write_text("{}")

    val = window.show_page("Validation")
    assert val.content.isVisibleTo(val) and not val.empty.isVisibleTo(val)
    rows = [
        [val.metrics.index(r, c).data() for c in range(5)] for r in range(val.metrics.rowCount())
    ]
    # the catalogue's titles and way of writing the figures
    assert ["logits cosine vs FP32 (mean)", "0.998000", "simulated", "htp-sim", chip] in rows
    assert ["perplexity, FP32", "10.000", "measured", "host-cpu", "—"] in rows
    gates = {
        val.gates.index(r, 0).data(): val.gates.index(r, 3).data()
        for r in range(val.gates.rowCount())
    }
    assert gates["logits cosine ≥"] == "pass" and gates["perplexity increase ≤"] == "pass"
    assert val.htp_text.toPlainText() == "return self"

    prof = window.show_page("Profiler")
    assert prof.content.isVisibleTo(prof)
    assert prof.badge.text() == "simulated"
    assert "not device latency" in prof.reliability_text.text()
    prof.group.setCurrentIndex(prof.group.findData("op_type"))
    assert prof.table.rowCount() == 3
    assert prof.table.index(0, 0).data() == "MatMul" and prof.table.index(0, 2).data() == "90.0%"

    llm = window.show_page("LLM")
    assert llm.content.isVisibleTo(llm)
    assert "95 tok/s" in _visible_texts(llm) and "measured" in _visible_texts(llm)

    over = window.show_page("Overview")
    qtbot.waitUntil(lambda: "decode speed" in _visible_texts(over))
    assert "simulated" in _visible_texts(over)

    opened = []
    from studio.ui.pages import reports as reports_mod

    monkeypatch.setattr(
        reports_mod.QDesktopServices,
        "openUrl",
        staticmethod(lambda url: opened.append(url.toLocalFile()) or True),
    )
    rep = window.show_page("Reports")
    assert rep.model.rowCount() == 1 and rep.model.index(0, 0).data() == "report-1.html"
    assert rep.open_selected()
    assert rep.open_selected(json=True)
    assert opened == [str(reports / "report-1.html"), str(reports / "report-1.json")]


def test_stage_pages_run_their_stage_and_refresh_on_its_jobs(
    window, project_path, qtbot, monkeypatch
):
    """The pages of one stage (StagePage): the empty state's first action runs the page's stage
    (Reports: the whole pipeline) and a StudioError becomes an error notification; a succeeded
    job of the stage refreshes the page."""
    from PySide6.QtWidgets import QPushButton

    from studio.core.errors import StudioError

    assert window.open_project(project_path)
    asked = []

    def refuse(stages):
        asked.append(stages)
        raise StudioError(f"cannot run {stages}: fix the project first")

    monkeypatch.setattr(window.ctl, "run", refuse)
    pages = {"Profiler": ["profile"], "Validation": ["validate"], "LLM": ["run"], "Reports": None}
    for title in pages:
        page = window.show_page(title)
        page.empty.findChildren(QPushButton)[0].click()
    assert asked == list(pages.values())
    texts = window.notifications.texts()
    assert any("cannot run ['profile']: fix the project first" in t for t in texts)

    prof = window.show_page("Profiler")
    assert prof.empty.isVisibleTo(prof)
    # while its stage runs, the empty state says so and its run button waits (not "No
    # profile yet" beside a live button)
    import dataclasses

    run = window.ctl.studio.jobs.create_run({})
    live = window.ctl.studio.jobs.job(window.ctl.studio.jobs.add_job(run, "profile", "x"))
    button = prof.empty.findChildren(QPushButton)[0]
    window.ctl.dispatch_event({"kind": "job", "job": dataclasses.replace(live, state="running")})
    assert prof.empty.title.text() == "No profile yet: the profile stage is running now"
    assert not button.isEnabled() and "Jobs page" in button.toolTip()
    window.ctl.dispatch_event({"kind": "job", "job": dataclasses.replace(live, state="cancelled")})
    assert prof.empty.title.text() == "No profile yet" and button.isEnabled()
    jid = _add_job(
        window.ctl.studio.jobs,
        "profile",
        "snapdragon-8-gen-3",
        {"summary": "1 op type", "by_op_type": {"MatMul": 9.0}, "unit": "cycles"},
    )
    window.ctl.job_event.emit(window.ctl.studio.jobs.job(jid))
    qtbot.waitUntil(lambda: prof.content.isVisibleTo(prof), timeout=5_000)
    assert prof.target.count() == 1 and prof.target.currentText() == "snapdragon-8-gen-3"
    assert prof.job_label.text().startswith(f"job #{jid}")


def test_an_onnx_project_shows_its_graph_and_says_why_it_cannot_run(
    window, tmp_path, qtbot, make_spec
):
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    window.ctl.create(make_spec(tmp_path / "p", "onnxproj", source_kind="onnx", source=str(path)))
    over = window.show_page("Overview")
    qtbot.waitUntil(lambda: "ONNX model tiny.onnx" in _visible_texts(over), timeout=20_000)
    qtbot.waitUntil(lambda: "64 (64)" in _visible_texts(over), timeout=5_000)  # parameters
    model = window.show_page("Model")
    qtbot.waitUntil(lambda: "2 nodes of tiny.onnx" in model.status.text(), timeout=20_000)
    assert not model.export_button.isVisibleTo(model)
    window.run_stages(None)
    qtbot.waitUntil(lambda: not window.ctl.running, timeout=20_000)
    # an ONNX file is a graph project: without calibration samples a run says what to give
    qtbot.waitUntil(lambda: any("graph.calibration is empty" in t
                                for t in window.notifications.texts()), timeout=20_000)


def test_menus_shortcuts_theme_and_status_bar(window, project_path):
    shortcuts = {a.shortcut().toString() for a in window.actions() if not a.shortcut().isEmpty()}
    for key in ("Ctrl+N", "Ctrl+O", "Ctrl+S", "Ctrl+Z", "F5", "Shift+F5", "Ctrl+1", "Ctrl+9"):
        assert QKeySequence(key).toString() in shortcuts, key
    window.page_acts[3].trigger()
    assert window.current_page() == "Jobs"
    window.set_theme("dark")
    assert window.palette().color(QPalette.ColorRole.Window).lightness() < 100
    window.set_theme("light")
    assert window.palette().color(QPalette.ColorRole.Window).lightness() > 200
    assert (
        "Host CPU ready" in window.device_label.text() or window.device_label.text() == "Devices: …"
    )
    window._update_devices()
    assert "Host CPU ready" in window.device_label.text()
    assert window.jobs_label.text() == "No jobs running"
    assert window.open_project(project_path)
    assert window.windowTitle().startswith("proj")
    assert window.save_act.isEnabled() and window.run_act.isEnabled()


@pytest.mark.parametrize(
    "module",
    [
        "overview",
        "model",
        "precision",
        "jobs",
        "devices",
        "profiler",
        "validation",
        "llm",
        "reports",
    ],
)
def test_each_page_opens_alone(module, project_path, tmp_path):
    """``python -m studio.ui.pages.<name> FILE --screenshot PNG`` opens the page on its own."""
    import os
    import subprocess
    import sys

    out = tmp_path / f"{module}.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            f"studio.ui.pages.{module}",
            str(project_path),
            "--screenshot",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.stat().st_size > 5000


def test_a_page_built_the_first_time_says_it_is_loading(window, monkeypatch):
    """The old page does not stay up while a page is built (seconds on a big model or while
    a run keeps the cores busy): the window shows 'Loading <page>…' first."""
    from studio.ui.pages.registry import page_spec

    spec = page_spec("reports")
    seen = []
    real = spec.load()

    def build(ctl):
        seen.append((window.stack.currentWidget() is window.loading_page,
                     window.loading_page.title.text()))
        return real(ctl)

    monkeypatch.setattr(type(spec), "load", lambda self: build if self.key == "reports"
                        else importlib_load(self))
    window.show_page("reports")
    assert seen == [(True, "Loading Reports…")]
    assert window.stack.currentWidget() is window.page("reports")
    window.show_page("jobs")
    window.show_page("reports")  # built once: no second loading state
    assert len(seen) == 1


def importlib_load(spec):
    import importlib

    module, _, cls = spec.target.partition(":")
    return getattr(importlib.import_module(module), cls)


def test_the_clip_check_sees_a_wrapped_label_cut_below(qtbot):
    """A wrapped label given less height than its lines (a card too short: the demo's lost
    closing bracket) is reported, as a non-wrapping label narrower than its text is."""
    from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

    from studio.ui.clipcheck import clipped_texts

    root = QWidget()
    qtbot.addWidget(root)
    lay = QVBoxLayout(root)
    wrapped = QLabel("quantize → compile → validate (the export from the cache) " * 3)
    wrapped.setWordWrap(True)
    wrapped.setFixedHeight(18)
    single = QLabel("a label that does not wrap and is far too narrow for its text")
    single.setFixedWidth(60)
    lay.addWidget(wrapped)
    lay.addWidget(single)
    root.resize(300, 200)
    root.show()
    cut = clipped_texts(root)
    assert len(cut) == 2
    assert cut[0].startswith("QLabel 'quantize") and "height 18 <" in cut[0]
    assert cut[1].startswith("QLabel 'a label that") and "60 <" in cut[1]
    wrapped.setFixedHeight(wrapped.heightForWidth(wrapped.width()))
    assert len(clipped_texts(root)) == 1
