"""Every table and tree model of the window passes Qt's model tester, also while it changes."""

from __future__ import annotations

import time

import pytest

from studio.core.jobs import JobStore
from studio.core.modelinfo import LayerInfo, ModelInfo
from studio.services import projects


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "runs.sqlite")
    yield s
    s.close()


def _jobs(store: JobStore):
    run = store.create_run({})
    ids = [
        store.add_job(run, st, tg)
        for st, tg in (
            ("export", ""),
            ("quantize", ""),
            ("compile", "snapdragon-8-gen-3"),
            ("run", "htp-sim/snapdragon-8-gen-3"),
        )
    ]
    now = time.time()
    store.update_job(
        ids[0],
        state="succeeded",
        started=now - 3,
        finished=now,
        progress=1.0,
        result={"summary": "exported"},
        message="done",
    )
    store.update_job(ids[1], state="running", started=now - 1, progress=0.4, message="calibrating")
    store.update_job(
        ids[2], state="failed", started=now, finished=now, error="boom", message="boom"
    )
    return run, ids


def test_jobs_model_and_filter(qtmodeltester, model_check, store):
    from studio.ui.models.jobs import STATE_GROUPS, JobFilter, JobsModel

    _, ids = _jobs(store)
    model = JobsModel()
    model.reset(store.jobs())
    qtmodeltester.check(model)  # Qt's C++ tester
    model_check(model)  # pytest-qt's Python tester, watching the changes below
    # live updates: a new run's jobs are inserted on top, a known job refreshes its row
    run2 = store.create_run({})
    j = store.add_job(run2, "export")
    row = model.upsert(store.job(j))
    assert row == 0
    store.update_job(ids[1], progress=0.9)
    model.upsert(store.job(ids[1]))
    assert model.data(model.index(model.row_of(ids[1]), 5)) == "90%"

    proxy = JobFilter()
    proxy.setSourceModel(model)
    model_check(proxy)
    proxy.set_filter(states=STATE_GROUPS["Failed"])
    assert proxy.rowCount() == 1
    proxy.set_filter(states=None, latest_only=True)
    assert proxy.rowCount() == 1  # only the new run's export
    proxy.set_filter(latest_only=False, text="calibrating")
    assert proxy.rowCount() == 1


def _model_info() -> ModelInfo:
    layers = [LayerInfo("model.embed_tokens", None, "embedding", 1024, {"weight": (64, 16)})]
    for b in range(2):
        for name, kind, shape in (
            ("input_layernorm", "norm", (16,)),
            ("self_attn.q_proj", "attention", (16, 16)),
            ("mlp.down_proj", "mlp", (16, 32)),
        ):
            n = 1
            for d in shape:
                n *= d
            layers.append(LayerInfo(f"model.layers.{b}.{name}", b, kind, n, {"weight": shape}))
    layers.append(LayerInfo("model.norm", None, "norm", 16, {"weight": (16,)}))
    layers.append(
        LayerInfo("lm_head", None, "lm_head", 0, {"weight": (64, 16)}, tied_to="model.embed_tokens")
    )
    return ModelInfo(
        source="t",
        format="hf",
        architecture="Qwen2ForCausalLM",
        family="qwen2",
        num_layers=2,
        hidden_size=16,
        intermediate_size=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=4,
        vocab_size=64,
        tied_embeddings=True,
        max_positions=128,
        parameters=sum(x.params for x in layers),
        layers=layers,
    )


def _tiny_onnx(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(
        np.zeros((16, 16), np.float32), "model.layers.0.self_attn.q_proj.weight"
    )
    nodes = [
        helper.make_node(
            "MatMul",
            ["x", "model.layers.0.self_attn.q_proj.weight"],
            ["q"],
            name="/model/layers.0/self_attn/q_proj/MatMul",
        ),
        helper.make_node("Softmax", ["q"], ["s"], name="/model/layers.0/self_attn/Softmax"),
        helper.make_node("Add", ["s", "x"], ["y"], name="/model/layers.0/Add"),
        helper.make_node("Identity", ["y"], ["out"], name="/final/Identity"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 16])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_model_tree(qtmodeltester, tmp_path):
    from studio.ui.models.model_tree import ModelTreeModel, build_tree

    info = _model_info()
    graph = projects.read_onnx_graph(_tiny_onnx(tmp_path / "m.onnx"))
    assert graph.nodes[0].module == "model.layers.0.self_attn.q_proj"
    assert graph.nodes[0].params == 256
    assert graph.nodes[0].outputs[0][1] == [1, 16]  # shape inference
    model = ModelTreeModel()
    model.set_root(build_tree(info))
    qtmodeltester.check(model)
    model.set_root(build_tree(info, graph))
    qtmodeltester.check(model)
    qtmodeltester.check(model, force_py=True)
    names = [model.index(r, 0).data() for r in range(model.rowCount())]
    assert names == ["Embedding", "Block 0", "Block 1", "Final norm and head", "Graph-level nodes"]
    block0 = model.index(1, 0)
    q = next(
        model.index(r, 0, block0)
        for r in range(model.rowCount(block0))
        if model.index(r, 0, block0).data() == "self_attn.q_proj"
    )
    assert model.index(0, 0, q).data() == "MatMul"  # the ONNX node under its module
    assert model.index(0, 2, q).data() == "[1×16]"
    # an ONNX file alone (an ONNX project)
    model.set_root(build_tree(None, graph))
    qtmodeltester.check(model, force_py=True)


def test_rows_model(qtmodeltester):
    from studio.ui.models.rows import Row, RowsModel

    model = RowsModel(["a", "b"])
    qtmodeltester.check(model)
    model.set_rows([Row(["1", "2"], colors={1: "#ff0000"}), Row(["3", "4"], tip="t")])
    qtmodeltester.check(model, force_py=True)
    model.set_rows([Row(["1", "x"]), Row(["3", "4"])])  # same shape: only changed rows refresh
    assert model.index(0, 1).data() == "x"
    qtmodeltester.check(model, force_py=True)


def test_page_models_pass_the_tester(aloop, qtbot, window, project_path, model_check):
    """The models inside the pages, on a real project, watched while it closes too."""
    assert window.open_project(project_path)
    for title in ("Jobs", "Precision", "Devices", "Model", "Validation", "Reports", "Profiler"):
        page = window.show_page(title)
        for attr in ("model", "proxy", "layers", "overrides", "chips", "metrics", "gates", "table"):
            m = getattr(page, attr, None)
            if m is not None and hasattr(m, "rowCount"):
                model_check(m)
    window.ctl.close()
