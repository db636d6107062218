"""Per-node ONNX costs and the graph estimate, on tiny graphs whose roofline is computed by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.perfmodel import Efficiency
from studio.engine.opcost import estimate_graph, op_costs
from tests.engine.tiny_onnx import float_model, quantize_w8a16

CATALOG = """
[chips.two-core]
name = "Two cores"
htp_arch = 73
soc_model = 43
vtcm_mb = 8
ddr_gbps = 10.0
ddr_source = "test"
htp_cores = 2
htp_tops = 2.0
htp_source = "test"
"""


def synthetic(path: Path) -> Path:
    """x[1,64] -> DQ(int8 W0[64,32]) MatMul -> Relu  (layer 0)
                  \\-> MatMul(float W1[64,16])          (layer 1, independent of layer 0)"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w0 = numpy_helper.from_array(np.ones((64, 32), np.int8), "W0_q")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "W0_s")
    zp = numpy_helper.from_array(np.array(0, np.int8), "W0_z")
    w1 = numpy_helper.from_array(np.ones((64, 16), np.float32), "W1")
    nodes = [
        helper.make_node("DequantizeLinear", ["W0_q", "W0_s", "W0_z"], ["W0"],
                         name="/model/layers.0/mlp/W0_DQ"),
        helper.make_node("MatMul", ["x", "W0"], ["h"], name="/model/layers.0/mlp/MatMul"),
        helper.make_node("Relu", ["h"], ["y0"], name="/model/layers.0/mlp/Relu"),
        helper.make_node("MatMul", ["x", "W1"], ["y1"], name="/model/layers.1/mlp/MatMul"),
    ]
    graph = helper.make_graph(
        nodes, "synthetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1, 32]),
         helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 16])],
        [w0, scale, zp, w1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_costs_of_a_synthetic_graph(tmp_path):
    g = op_costs(synthetic(tmp_path / "s.onnx"))
    assert g.op_types == ["DequantizeLinear", "MatMul", "Relu", "MatMul"]
    assert g.layer.tolist() == [0, 0, 0, 1]
    assert g.macs.tolist() == [0, 64 * 32, 0, 64 * 16]
    assert g.dram_bytes.tolist() == [
        0,                              # the DQ is folded into the MatMul
        64 * 32 * 1 + 64 * 4 + 32 * 4,  # int8 weight, float x in, float h out
        32 * 4 + 32 * 4,                # h in, y0 out
        64 * 16 * 4 + 64 * 4 + 16 * 4,  # float weight, x, y1
    ]
    assert sorted(map(tuple, g.edges.tolist())) == [(0, 1), (1, 2)]


def test_estimate_graph_matches_the_hand_computed_roofline_and_schedule(tmp_path):
    cat = tmp_path / "chips.toml"
    cat.write_text(CATALOG)
    eff = Efficiency(bw_fraction=0.5, overhead_ms=0.0, compute_fraction=0.5)
    ge, perf = estimate_graph(synthetic(tmp_path / "s.onnx"), get_chip("two-core", cat), eff)
    bps = 10e9 * 0.5        # bytes/s
    ops = 2e12 * 0.5 / 2    # ops/s per core
    t_mm0 = max(2 * 2048 / ops, 2432 / bps)
    t_relu = 256 / bps
    t_mm1 = max(2 * 1024 / ops, 4416 / bps)
    assert ge.roof["time_s"] == pytest.approx([0.0, t_mm0, t_relu, t_mm1])
    assert list(ge.roof["bound"]) == ["none", "memory", "memory", "memory"]
    # two cores: the layer-1 MatMul runs beside the layer-0 chain
    assert ge.sched.core.tolist() == [0, 0, 0, 1]
    assert ge.sched.start.tolist() == pytest.approx([0.0, 0.0, t_mm0, 0.0])
    assert ge.sched.makespan == pytest.approx(max(t_mm0 + t_relu, t_mm1))
    # DDR is shared: the pass cannot beat all its bytes over the bandwidth
    assert ge.total_s == pytest.approx((2432 + 256 + 4416) / bps)
    assert perf.htp_cores == 2


def test_a_quantized_graph_reads_its_weights_at_the_quantized_size(tmp_path):
    f32 = float_model(tmp_path / "f.onnx")
    q = quantize_w8a16(f32, tmp_path / "q.onnx")
    gf, gq = op_costs(f32), op_costs(q)
    mm_f = gf.dram_bytes[gf.op_types.index("MatMul")]
    mm_q = gq.dram_bytes[gq.op_types.index("MatMul")]
    # 16x16 weight: 1024 B in float, 256 B as uint8; activations 4 B -> 2 B (uint16)
    add_q = gq.dram_bytes[gq.op_types.index("Add")]
    assert mm_f == 16 * 16 * 4 + 16 * 4 * 2
    assert mm_q == 16 * 16 * 1 + 16 * 2 * 2
    assert add_q == 16 * 2 * 2 + 16 * 2  # mm and y at uint16, the bias B at uint8
    assert gq.macs.sum() == gf.macs.sum() == 256
    assert sum(t in ("QuantizeLinear", "DequantizeLinear") for t in gq.op_types) == len(gq) - 2
    assert gq.dram_bytes[[t.endswith("Linear") for t in gq.op_types]].sum() == 0


def test_bad_files_and_unknown_figures(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(StudioError, match="not a readable ONNX"):
        op_costs(bad)
    with pytest.raises(StudioError, match="not found"):
        op_costs(tmp_path / "missing.onnx")
    with pytest.raises(StudioError, match="cannot estimate for QCS9100"):
        estimate_graph(synthetic(tmp_path / "s.onnx"), get_chip("qcs9100"))


def test_an_embedding_lookup_reads_the_rows_it_returns_not_the_table(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((1000, 64), np.float32), "table")
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 1])
    out = helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 1, 64])
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["emb"], name="/embed")],
                          "g", [ids], [out], [table])
    path = tmp_path / "gather.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    costs = op_costs(path)
    assert costs.dram_bytes[0] == 2 * 64 * 4 + 8  # one row read, one row written, the id
    assert costs.macs[0] == 0
