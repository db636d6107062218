"""Memory plans of real ONNX graphs: the shipped sample model's prefill and decode graphs
(checked tensor by tensor against what ONNX Runtime really produces), a tiny QDQ graph, an
int4 weight, a model with external data, and bad input. Run with ``-s`` to see the figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.memplan import overlaps
from studio.engine.memplan import analyse, graph_memory
from tests.engine.tiny_onnx import WIDTH, float_model, quantize_w8a16

FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_figures():
    yield
    if FIGURES:
        print("\nmemory plan figures:\n" + json.dumps(FIGURES, indent=1))


def _ort_tensor_bytes(path: Path, names: list[str], feeds: dict[str, np.ndarray]
                      ) -> dict[str, int]:
    """Bytes of each named tensor as ONNX Runtime computes it (all made graph outputs)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    return {n: int(np.asarray(v).nbytes) for n, v in zip(outs, sess.run(outs, feeds), strict=True)}


def _feeds(spec: dict, graph: str) -> dict[str, np.ndarray]:
    dt = {"int64": np.int64, "float32": np.float32}
    return {i["name"]: np.zeros(i["shape"], dt[i["dtype"]]) for i in spec["graphs"][graph]["inputs"]}


@pytest.mark.parametrize("graph", ["prefill", "decode"])
def test_sample_graphs(tiny_coder_graphs, graph):
    import onnx
    from onnx import numpy_helper

    folder, spec = tiny_coder_graphs
    path = folder / f"{graph}.onnx"
    gm, tensors = analyse(path)
    p = gm.plan
    L, KV, D = spec["num_layers"], spec["num_kv_heads"], spec["head_dim"]
    P, C, V = spec["prompt_length"], spec["context_length"], spec["vocab_size"]

    # every planned tensor has the size ONNX Runtime gives it
    real = _ort_tensor_bytes(path, [t.name for t in tensors], _feeds(spec, graph))
    assert {t.name: t.nbytes for t in tensors} == {t.name: real[t.name] for t in tensors}
    assert p.raw_bytes == sum(real[t.name] for t in tensors)

    # the allocator: no two live tensors share a byte, between the bound and naive
    assert overlaps(p.placements) == []
    assert p.lower_bound_bytes <= p.arena_bytes <= p.naive_bytes
    assert p.lower_bound_bytes == int(p.live_bytes.max()) and len(p.live_bytes) == p.steps
    assert p.arena_bytes <= 1.1 * p.lower_bound_bytes
    assert p.reuse_saving >= 0.3  # the seed's 30-40 % at least
    # the peak: named, and its largest tensors really alive there
    assert p.peak_node and p.peak_op_type and p.peak_tensors
    assert all(t.start <= p.peak_step <= t.end for t in p.peak_tensors)
    assert p.peak_tensors[0].nbytes == max(t.nbytes for t in tensors
                                           if t.start <= p.peak_step <= t.end)

    # KV cache (past_* in, present_* out) beside the plan, not in it
    names = {t.name for t in tensors}
    assert not any(n.startswith(("past_", "present_")) for n in names)
    if graph == "decode":
        assert gm.kv_cache_bytes == L * 2 * KV * C * D * 4
        assert gm.kv_output_bytes == L * 2 * KV * 1 * D * 4
        assert gm.output_bytes == V * 4
    else:
        assert gm.kv_cache_bytes == 0
        assert gm.kv_output_bytes == L * 2 * KV * P * D * 4
        assert gm.output_bytes == P * V * 4
    assert gm.input_bytes == sum(math.prod(i["shape"]) * (8 if i["dtype"] == "int64" else 4)
                                 for i in spec["graphs"][graph]["inputs"]
                                 if not i["name"].startswith("past_"))

    # weights: every initializer and Constant at its stored size; FP32 graph: = FP32 bytes
    model = onnx.load(str(path))
    stored = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    stored += sum(numpy_helper.to_array(a.t).nbytes for n in model.graph.node
                  if n.op_type == "Constant" for a in n.attribute if a.name == "value")
    assert gm.weight_bytes == stored == gm.weight_bytes_fp32
    assert gm.weight_bytes_by_dtype["float"] > 0.99 * gm.weight_bytes
    assert gm.source == "estimated"

    FIGURES[graph] = {
        "naive_bytes": p.naive_bytes, "arena_bytes": p.arena_bytes,
        "lower_bound_bytes": p.lower_bound_bytes, "reuse_saving": round(p.reuse_saving, 4),
        "peak": f"{p.peak_op_type} {p.peak_node} (step {p.peak_step} of {p.steps})",
        "largest_at_peak": [(t.name, t.nbytes) for t in p.peak_tensors[:3]],
        "weight_bytes": gm.weight_bytes, "kv_cache_bytes": gm.kv_cache_bytes,
    }


def test_qdq_weights_count_at_their_quantized_size(tmp_path):
    q = quantize_w8a16(float_model(tmp_path / "f.onnx"), tmp_path / "q.onnx")
    gm, tensors = analyse(q, alignment=1)
    # W 16x16 uint8 + its zero point, bias 16 uint16 + four uint16 zero points, five scales
    assert gm.weight_bytes_by_dtype == {"uint8": WIDTH * WIDTH + 1, "uint16": 2 * WIDTH + 4 * 2,
                                        "float": 5 * 4}
    assert gm.weight_bytes_fp32 == (WIDTH * WIDTH + WIDTH) * 4  # scales, zero points left out
    # the dequantized weights are folded constants, not activations
    names = {t.name for t in tensors}
    assert "W_DequantizeLinear_Output" not in names and "x_QuantizeLinear_Output" in names
    assert gm.folded_bytes == (WIDTH * WIDTH + WIDTH) * 4
    assert {t.name: t.nbytes for t in tensors}["x_QuantizeLinear_Output"] == WIDTH * 2
    assert gm.notes and overlaps(gm.plan.placements) == []
    # the float graph: x, mm, ad are activations; y the output
    f = graph_memory(tmp_path / "f.onnx", alignment=1)
    assert f.plan.naive_bytes == 4 * WIDTH * 4 and f.plan.lower_bound_bytes == 2 * WIDTH * 4
    assert f.weight_bytes == f.weight_bytes_fp32 == (WIDTH * WIDTH + WIDTH) * 4


def test_int4_weights_are_packed(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("W", TensorProto.INT4, [WIDTH, WIDTH], [1] * (WIDTH * WIDTH))
    s = helper.make_tensor("S", TensorProto.FLOAT, [WIDTH], [0.1] * WIDTH)
    nodes = [helper.make_node("DequantizeLinear", ["W", "S"], ["Wf"], axis=1),
             helper.make_node("MatMul", ["x", "Wf"], ["y"])]
    g = helper.make_graph(nodes, "int4",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, WIDTH])],
                          [w, s])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(m, str(tmp_path / "int4.onnx"))
    gm = graph_memory(tmp_path / "int4.onnx", alignment=1)
    assert gm.weight_bytes_by_dtype == {"int4": WIDTH * WIDTH // 2, "float": WIDTH * 4}
    assert gm.weight_bytes_fp32 == WIDTH * WIDTH * 4
    assert gm.plan.naive_bytes == 2 * WIDTH * 4 and gm.plan.steps == 1


def test_external_data_is_not_read(tmp_path):
    import onnx

    src = float_model(tmp_path / "f.onnx")
    model = onnx.load(str(src))
    onnx.save(model, str(tmp_path / "ext.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").unlink()  # sizes come from shapes and dtypes alone
    a, b = graph_memory(src), graph_memory(tmp_path / "ext.onnx")
    assert a.weight_bytes == b.weight_bytes == (WIDTH * WIDTH + WIDTH) * 4
    assert a.plan.to_dict() == b.plan.to_dict()


def test_bad_input_gives_one_line(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    (tmp_path / "notes.onnx").write_text("not a model")
    with pytest.raises(StudioError, match="not a valid ONNX model"):
        graph_memory(tmp_path / "notes.onnx")
    with pytest.raises(StudioError, match="does not exist"):
        graph_memory(tmp_path / "missing.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "dyn.onnx"))
    with pytest.raises(StudioError, match="no static shape.*static shapes") as exc:
        graph_memory(tmp_path / "dyn.onnx")
    assert "\n" not in str(exc.value) and "batch" in str(exc.value)
    gm = graph_memory(tmp_path / "dyn.onnx", dims={"batch": 2}, alignment=1)
    assert gm.plan.naive_bytes == 2 * 2 * 8 * 4
