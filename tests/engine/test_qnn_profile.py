"""Parsing real QNN HTP profiles (made here by the real simulator) into the profile model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.profile import Profile, ProfileOp, layer_label, layer_of
from studio.engine import profiling, qnn
from studio.engine.qnn_profile import parse_profile_csv
from tests.engine.tiny_onnx import WIDTH, float_model, quantize_w8a16

pytest.importorskip("onnxruntime_qnn")

TARGET = "snapdragon-8-gen-3"
HEADER = "Msg Timestamp,Message,Time,Unit of Measurement,Timing Source,Event Level,Event Identifier"


def _tiny_w8a16(d: Path) -> tuple[Path, Path]:
    """A MatMul+Add (layer 0) + Relu (layer 1) model and its W8A16 QDQ version."""
    f32 = float_model(d / "tiny_f32.onnx")
    return f32, quantize_w8a16(f32, d / "tiny_w8a16.onnx")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Real profiles from the simulator: detailed x2 runs, basic, a compiled model, FP16."""
    d = tmp_path_factory.mktemp("qnn-prof")
    f32, q = _tiny_w8a16(d)
    x = (0.5 * np.random.default_rng(3).standard_normal((1, WIDTH))).astype(np.float32)
    detailed = profiling.profile_run(q, TARGET, {"x": x}, d / "detailed.csv", runs=2)
    basic = profiling.profile_run(q, TARGET, {"x": x}, d / "basic.csv", level="basic", runs=3)
    ctx = qnn.compile_context(q, d / "ctx" / "tiny_ctx.onnx", TARGET)
    # The pipeline's call: synthetic inputs for a compiled decode graph.
    compiled = profiling.profile_decode_step(
        ctx["ctx_path"], TARGET, {"prompt_length": 4}, d / "compiled.csv"
    )
    fp16 = profiling.profile_run(f32, TARGET, {"x": x}, d / "fp16.csv", fp16=True)
    return {
        "dir": d,
        "f32": f32,
        "q": q,
        "detailed": detailed,
        "basic": basic,
        "compiled": compiled,
        "fp16": fp16,
    }


def test_detailed_profile_with_op_trace(real):
    res = real["detailed"]
    p = parse_profile_csv(res["csv"], onnx_path=real["q"], op_trace_json=res["op_trace"])
    assert p.source == "simulated" and "not device latency" in p.note
    assert p.runs == 2 and p.level == "detailed" and p.unit == "cycles"
    assert p.target == {"htp_arch": 75, "soc_model": 57}
    by_node = {op.onnx_node: op for op in p.ops}
    mm = by_node["/model/layers.0/mlp/MatMul"]
    assert mm.op_type == "MatMul" and mm.layer == 0 and mm.qnn_op_type == "FullyConnected"
    assert (
        mm.unit == "cycles"
        and len(mm.samples) == 2
        and mm.value == pytest.approx(np.mean(mm.samples))
    )
    # The fused QDQ unit lists all its ONNX source nodes.
    assert {"W_DequantizeLinear", "/model/layers.0/mlp/MatMul"} <= set(mm.onnx_nodes)
    assert by_node["/model/layers.0/mlp/Add"].layer == 0
    assert {op.op_type for op in p.ops} >= {"Input", "Output", "MatMul", "Add", "QuantizeLinear"}
    io = [op for op in p.ops if op.op_type in ("Input", "Output")]
    assert all(op.onnx_node is None and op.layer is None for op in io)

    # Per run, the op rows add up to the accelerator's cycle count.
    acc = p.event("Accelerator (execute) time (cycles)")
    assert acc is not None and len(acc.samples) == 2
    for run in range(2):
        assert sum(op.samples[run] for op in p.ops) == acc.samples[run]
    assert p.total() == pytest.approx(acc.value)

    by_type = p.totals_by_op_type()
    assert list(by_type.values()) == sorted(by_type.values(), reverse=True)
    assert sum(by_type.values()) == pytest.approx(p.total())
    by_layer = p.totals_by_layer()
    assert 0 in by_layer and list(by_layer)[-1] is None
    assert sum(by_layer.values()) == pytest.approx(p.total())
    assert p.event("QNN (finalize) time").unit == "us"
    assert len(p.event("QNN (execute) time").samples) == 2


def test_detailed_profile_by_name_matching_only(real):
    """Without the op trace the CSV's own source column and the names still map ops."""
    p = parse_profile_csv(real["detailed"]["csv"], onnx_path=real["q"])
    names = {op.onnx_node for op in p.ops}
    assert "/model/layers.0/mlp/MatMul" in names and "x_QuantizeLinear" in names
    bare = parse_profile_csv(real["detailed"]["csv"])
    assert {op.op_type for op in bare.ops} >= {"MatMul", "Add", "QuantizeLinear", "Input"}
    assert {op.layer for op in bare.ops} == {0, None}


def test_compiled_model_profile_maps_names_to_the_source_model(real):
    res = real["compiled"]
    assert res["op_trace"] is None  # context models carry no op trace
    p = parse_profile_csv(res["csv"], onnx_path=real["q"])
    assert p.event("QNN (load binary) time") is not None
    assert p.event("QNN (finalize) time") is None  # nothing left to compile
    mm = next(op for op in p.ops if op.onnx_node == "/model/layers.0/mlp/MatMul")
    assert mm.op_type == "MatMul" and mm.layer == 0


def test_fp16_profile_maps_ort_fused_nodes_back(real):
    p = parse_profile_csv(
        real["fp16"]["csv"], onnx_path=real["f32"], op_trace_json=real["fp16"]["op_trace"]
    )
    layers = {op.onnx_node: op.layer for op in p.ops if op.onnx_node}
    # ORT fuses MatMul+Add into '/model/layers.0/mlp/MatMul/MatMulAddFusion'.
    assert layers.get("/model/layers.0/mlp/MatMul") == 0
    assert layers.get("/model/layers.1/act/Relu") == 1
    assert set(p.totals_by_layer()) == {0, 1, None}


def test_parse_profile_run_labels_source_and_target(real):
    from studio.core.catalog import get_chip
    from studio.engine.qnn_profile import parse_profile_run

    p = parse_profile_run(real["detailed"], onnx_path=real["q"], chip=get_chip(TARGET))
    assert p.source == qnn.timing_source() == "simulated"
    assert p.target == {"htp_arch": 75, "soc_model": 57, "chip": TARGET}
    assert p.level == "detailed" and p.runs == 2


def test_basic_profile_has_events_but_no_ops(real):
    p = parse_profile_csv(real["basic"]["csv"])
    assert p.ops == [] and p.level == "basic" and p.runs == 3
    ev = p.event("Accelerator (execute) time")
    assert ev is not None and ev.unit == "us" and len(ev.samples) == 3
    assert p.total() == 0 and p.totals_by_op_type() == {} and p.totals_by_layer() == {}


def test_source_label_and_serialization(real, tmp_path):
    p = parse_profile_csv(real["detailed"]["csv"], source="imported")
    assert p.source == "imported"
    again = Profile.from_dict(p.to_dict())
    assert again == p
    with pytest.raises(StudioError, match="unknown profile source"):
        parse_profile_csv(real["detailed"]["csv"], source="device")
    with pytest.raises(ValueError):
        Profile(source="fast")


# ---------------------------------------------------------------------------------------
# malformed input
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "missing column"),
        ("a,b,c\n1,2,3\n", "missing column"),
        (HEADER + "\n", "holds no rows"),
        (HEADER + "\n0,NODE,abc,CYCLES,BACKEND,SUB-EVENT,x:OpId_1 (cycles)\n", "is not a number"),
        (HEADER + "\n0,NODE,12,CYCLES,BACKEND,SUB-EVENT,no op id here\n", "OpId_N"),
        (HEADER + "\n0,NODE,12,FURLONGS,BACKEND,SUB-EVENT,x:OpId_1 (cycles)\n", "unknown unit"),
        (HEADER + "\n0,NODE,12\n", "too few columns"),
    ],
)
def test_malformed_csv_is_a_one_line_error(tmp_path, text, match):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(StudioError, match=match) as e:
        parse_profile_csv(f)
    assert "\n" not in str(e.value)


def test_unreadable_inputs(tmp_path, real):
    with pytest.raises(StudioError, match="not found"):
        parse_profile_csv(tmp_path / "missing.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00\x81" * 64)
    with pytest.raises(StudioError):
        parse_profile_csv(binary)
    bad_trace = tmp_path / "trace.json"
    bad_trace.write_text("{not json")
    with pytest.raises(StudioError, match="not JSON"):
        parse_profile_csv(real["detailed"]["csv"], op_trace_json=bad_trace)
    with pytest.raises(StudioError, match="not a valid ONNX model"):
        parse_profile_csv(real["detailed"]["csv"], onnx_path=real["detailed"]["csv"])


# ---------------------------------------------------------------------------------------
# the profile model
# ---------------------------------------------------------------------------------------
def test_layer_of_names():
    assert layer_of("/model/layers.3/self_attn/q_proj/MatMul") == 3
    assert layer_of("model.layers.12.mlp.down_proj") == 12
    assert layer_of("/transformer/h.11/attn/c_attn/MatMul") == 11
    assert layer_of("/blocks.2/ffn/Add:OpId_4") == 2
    assert layer_of("/model/embed_tokens/Gather") is None
    assert layer_of("/lm_head/MatMul") is None
    assert layer_of("/graph.3/x") is None
    assert layer_of(None) is None
    assert layer_label(3) == "layer 3" and layer_label(None) == "outside layers"


def test_profile_totals_from_rows():
    ops = [
        ProfileOp("a", "MatMul", 10.0, "cycles", layer=1),
        ProfileOp("b", "MatMul", 5.0, "cycles", layer=0),
        ProfileOp("c", "Add", 20.0, "cycles", layer=None),
    ]
    p = Profile(source="measured", ops=ops)
    assert p.totals_by_op_type() == {"Add": 20.0, "MatMul": 15.0}
    assert list(p.totals_by_layer().items()) == [(0, 5.0), (1, 10.0), (None, 20.0)]
    assert p.counts_by_op_type() == {"MatMul": 2, "Add": 1}
    assert [op.qnn_name for op in p.top(2)] == ["c", "a"]


def test_ops_the_backend_made_itself_have_no_name(tmp_path):
    # seen on the 4-layer sample's decode step: "OpId_2087 (cycles)" with no "<op>:" prefix
    f = tmp_path / "p.csv"
    f.write_text(HEADER + "\n0,NODE,12,CYCLES,BACKEND,SUB-EVENT,OpId_2087 (cycles)\n"
                 "0,NODE,30,CYCLES,BACKEND,SUB-EVENT,/lm_head/MatMul:OpId_7 (cycles)\n")
    prof = parse_profile_csv(f)
    assert sorted(op.qnn_name for op in prof.ops) == ["/lm_head/MatMul", "OpId_2087"]
    assert prof.total() == 42.0
    assert prof.totals_by_op_type() == {"MatMul": 30.0, "unnamed backend op": 12.0}
