"""One override rule, three readers: for a table of override sets on the shipped sample
``tiny-coder`` (4 blocks), the quantizer's own per-layer record as applied
(``check_overrides(...)["decode"]["layers"]``), ``studio info --json``'s "layers" (the real
CLI in a subprocess) and the Precision page's layer table (a real page, offscreen) agree
layer by layer on weight precision, activation precision and the rule that set each."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from studio.core import project as projectfile

ROOT = Path(__file__).resolve().parents[2]
TARGET = "snapdragon-8-gen-3"

# (id, scheme, overrides, layers each pattern covers)
CASES = [
    ("block", "W8A16", {"layers.3": "INT8"}, {"layers.3": 12}),
    ("glob-int16-w8a8", "W8A8", {"*.down_proj": "INT16"}, {"*.down_proj": 4}),
    ("mlp-int4", "W8A16", {"model.layers.0.mlp.*": "INT4"}, {"model.layers.0.mlp.*": 3}),
    ("weight-only-w8a8", "W8A8", {"*.down_proj.weight": "INT16"}, {"*.down_proj.weight": 4}),
    ("one-weight-int4", "W8A16", {"model.layers.1.self_attn.q_proj.weight": "INT4"},
     {"model.layers.1.self_attn.q_proj.weight": 1}),
    ("scores-int16-w8a8", "W8A8", {"*.self_attn.scores": "INT16", "layers.1.residual": "INT16"},
     {"*.self_attn.scores": 4, "layers.1.residual": 1}),
    ("softmax-float", "W8A16", {"model.layers.0.self_attn.softmax": "FP16"},
     {"model.layers.0.self_attn.softmax": 1}),
    ("overlapping-w8a8", "W8A8",
     {"layers.2": "INT16", "layers.2.mlp.up_proj": "INT8", "*.o_proj": "FP16"},
     {"layers.2": 12, "layers.2.mlp.up_proj": 1, "*.o_proj": 4}),
]
# A float pattern followed by a later pattern on the same layer: the later pattern wins and
# quantizes the layer again (scheme defaults, then that pattern) on every side.
FLOAT_THEN_QUANTIZED = [
    pytest.param("float-then-int16", "W8A8", {"*.o_proj": "FP16", "layers.2": "INT16"},
                 {"*.o_proj": 4, "layers.2": 12}, id="float-then-int16"),
    pytest.param("float-then-weight-int4", "W8A16", {"self_attn": "FP16", "q_proj.weight": "INT4"},
                 {"self_attn": 24, "q_proj.weight": 4}, id="float-then-weight-int4"),
]
ALL = [pytest.param(*c, id=c[0]) for c in CASES] + FLOAT_THEN_QUANTIZED


def _project(folder: Path, scheme: str, overrides: dict[str, str]) -> projectfile.Project:
    p = projectfile.new_project("agree", "sample:tiny-coder", [TARGET],
                                quantization={"scheme": scheme, "overrides": dict(overrides)})
    folder.mkdir(parents=True, exist_ok=True)
    projectfile.save(p, folder / "agree.qstudio")
    return p


def _recipe(p: projectfile.Project) -> dict:
    """The quantize stage's recipe for a project (studio/worker/stages/_llm.py: recipe)."""
    q = p.quantization
    return {"scheme": q["scheme"], "weight_granularity": q["weight_granularity"],
            "samples": q["calibration_samples"], "overrides": q["overrides"]}


def _split_rule(cell: str) -> tuple[str, str]:
    """The Precision page's rule cell -> (weight rule, activation rule)."""
    if cell.startswith("weights: "):
        w, _, a = cell[len("weights: "):].partition("; activations: ")
        return w, a
    return cell, cell


# ---- the three readers ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    """The FP32 decode/prefill graphs of tiny-coder at small shapes, exported once."""
    from studio.core.samples import sample_path
    from studio.engine.llm_export import export_llm

    out = tmp_path_factory.mktemp("agree") / "export"
    export_llm(sample_path("tiny-coder"), out, 16, 64)
    return out


def quantizer_layers(graphs: Path, p: projectfile.Project) -> list[dict]:
    from studio.engine.quant_recipe import check_overrides

    return check_overrides(graphs, _recipe(p))["decode"]["layers"]


def cli_layers(folder: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "studio.cli", "info",
                        str(folder / "agree.qstudio"), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["unmatched_overrides"] == [], data["unmatched_overrides"]
    return data["layers"]


def _pump(qapp, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        qapp.processEvents()
        time.sleep(0.01)
    assert done(), "timed out"


@pytest.fixture(scope="module")
def page(qapp, tmp_path_factory):
    """The Precision page on a real project (a real controller and session), its model
    described the way the app does it, on the app's qasync event loop."""
    import qasync

    from studio.ui.controller import ProjectController
    from studio.ui.pages.precision import PrecisionPage
    from studio.ui.settings import AppSettings

    folder = tmp_path_factory.mktemp("agree-page")
    _project(folder, "W8A16", {})
    loop = qasync.QEventLoop(qapp, already_running=True)
    asyncio.events._set_running_loop(loop)
    asyncio.set_event_loop(loop)
    ctl = ProjectController(AppSettings(folder / "config"))
    page = None
    try:
        ctl.open(folder / "agree.qstudio")
        page = PrecisionPage(ctl)
        page.resize(900, 700)
        page.start()
        page.show()
        _pump(qapp, lambda: page.layers.rowCount() > 0)
        yield page
    finally:
        ctl.close("discard")
        ctl.shutdown()
        if page is not None:
            page.hide()
            page.deleteLater()
        qapp.processEvents()
        asyncio.events._set_running_loop(None)
        asyncio.set_event_loop(None)


def page_layers(page, scheme: str, overrides: dict[str, str]) -> list[dict]:
    """Make the edits a user would (undoable commands), then read the table as shown."""
    ctl = page.ctl
    ctl.set("quantization", "overrides", {})
    ctl.set("quantization", "scheme", scheme)
    ctl.set("quantization", "overrides", dict(overrides))
    m = page.layers
    rows = []
    for i in range(m.rowCount()):
        cells = [m.data(m.index(i, c)) for c in range(m.columnCount())]
        w_rule, a_rule = _split_rule(cells[5])
        if cells[3] == "—":  # a layer without weights (a norm, a key activation)
            cells[3], w_rule = "", ""
        rows.append({"layer": cells[0], "block": cells[1], "kind": cells[2],
                     "weight": cells[3], "activation": cells[4],
                     "weight_rule": w_rule, "activation_rule": a_rule})
    return rows


# ---- the checks ------------------------------------------------------------------------------
FIELDS = ("weight", "activation", "weight_rule", "activation_rule")


def _disagreements(applied: list[dict], shown: list[dict]) -> list[str]:
    by_layer = {r["layer"]: r for r in shown}
    out = []
    for r in applied:
        s = by_layer.get(r["layer"])
        if s is None:
            out.append(f"{r['layer']}: missing")
            continue
        out.extend(f"{r['layer']}.{k}: quantizer {r[k]!r}, shown {s[k]!r}"
                   for k in FIELDS if s[k] != r[k])
    return out


@pytest.mark.parametrize("case, scheme, overrides, counts", ALL)
def test_quantizer_cli_and_page_agree(case, scheme, overrides, counts, graphs, page, tmp_path):
    p = _project(tmp_path, scheme, overrides)
    applied = quantizer_layers(graphs, p)
    # every weighted layer: 4 blocks x 7 projections, and the head; and each block's key
    # activations (attention scores, softmax output, residual stream)
    weighted = [r for r in applied if r["weight"]]
    assert len(weighted) == 29 and weighted[-1]["layer"] == "model.layers.3.self_attn.v_proj"
    assert len(applied) == 29 + 4 * 3
    assert any(r["weight_rule"].startswith("override") or
               r["activation_rule"].startswith("override") for r in applied)

    cli = cli_layers(tmp_path)
    assert len(cli) == 39 + 4 * 3
    shown = page_layers(page, scheme, overrides)
    assert [r["layer"] for r in shown] == [r["layer"] for r in cli]

    assert _disagreements(applied, cli) == [], "studio info --json"
    assert _disagreements(applied, shown) == [], "Precision page"

    # the overrides table counts the layers each pattern covers (the recipe's rule)
    o = page.overrides
    table = {o.data(o.index(i, 0)): o.data(o.index(i, 2)) for i in range(o.rowCount())}
    assert table == {k: str(n) for k, n in counts.items()}


def test_disagreements_are_reported():
    applied = [{"layer": "a", "weight": "INT8", "activation": "INT16",
                "weight_rule": "scheme W8A16 (per_channel)",
                "activation_rule": "override 'a'"}]
    shown = [dict(applied[0], activation="INT8")]
    assert _disagreements(applied, shown) == ["a.activation: quantizer 'INT16', shown 'INT8'"]
    assert _disagreements(applied, []) == ["a: missing"]


def test_page_shows_full_layer_names(page):
    from PySide6.QtCore import Qt

    page_layers(page, "W8A16", {})
    view, m = page.layer_view, page.layers
    assert [m.headerData(c, Qt.Orientation.Horizontal) for c in range(m.columnCount())] == [
        "Layer", "Block", "Kind", "Weights", "Activations", "Rule"]
    names = [m.data(m.index(i, 0)) for i in range(m.rowCount())]
    assert "model.layers.3.post_attention_layernorm" in names  # the name, whole
    assert view.textElideMode() == Qt.TextElideMode.ElideNone
    widest = max(view.fontMetrics().horizontalAdvance(n) for n in names)
    assert view.columnWidth(0) >= widest
