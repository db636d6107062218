"""Weight-shared context binaries and the QNN System reader, against the real QNN EP and the
wheel's libQnnSystem.so. No mocks.

The pair is small and real: a "prefill" graph over 8 rows and a "decode" graph over 1 row of
the same MLP (two MatMuls whose initializers have the same names and values), quantized
W8A16 with ONNX Runtime's QNN config and given quantized (uint16) graph I/O, as a Genie
part's graphs are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.engine import qnn
from studio.engine.qnn_system import context_info
from studio.engine.weightshare import (
    EXECUTED,
    STRUCTURE_ONLY,
    compare_structure,
    compile_shared,
    sharing_wanted,
    summary,
)

pytest.importorskip("onnxruntime_qnn")

TARGET = "snapdragon-8-gen-3"
HIDDEN, FFN = 128, 512
ROWS = {"prefill": 8, "decode": 1}


def _mlp(path: Path, rows: int) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)  # the same weights in every graph
    w1 = (rng.standard_normal((HIDDEN, FFN)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((FFN, HIDDEN)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W_up"], ["h"], name="/mlp/up"),
             helper.make_node("Relu", ["h"], ["r"], name="/mlp/act"),
             helper.make_node("MatMul", ["r", "W_down"], ["y"], name="/mlp/down")]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, HIDDEN])],
        [numpy_helper.from_array(w1, "W_up"), numpy_helper.from_array(w2, "W_down")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _quantize(src: Path, dst: Path, rows: int, gain: float = 1.0) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": (rng.standard_normal((1, rows, HIDDEN)) * gain)
                             .astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    cfg = get_qnn_qdq_config(str(src), Reader(), activation_type=QuantType.QUInt16,
                             weight_type=QuantType.QUInt8)
    quantize(str(src), str(dst), cfg)
    return dst


def _quantized_io(folder: Path, out: Path, names: tuple[str, ...]) -> dict:
    from studio.engine.graphio import quantize_io

    return quantize_io(folder, out, names)["graphs"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The pair with quantized I/O, compiled shared and separately; and a decode graph
    calibrated on inputs three times as wide, compiled separately (a real negative case)."""
    d = tmp_path_factory.mktemp("weightshare")
    (d / "q").mkdir()
    (d / "q_other").mkdir()
    for name, rows in ROWS.items():
        _quantize(_mlp(d / f"{name}_f32.onnx", rows), d / "q" / f"{name}.onnx", rows)
    _quantize(d / "decode_f32.onnx", d / "q_other" / "decode.onnx", 1, gain=3.0)
    enc = _quantized_io(d / "q", d / "io", ("prefill", "decode"))
    enc_other = _quantized_io(d / "q_other", d / "io_other", ("decode",))
    graphs = [d / "io" / "prefill.onnx", d / "io" / "decode.onnx"]
    shared = compile_shared(graphs, d / "shared", TARGET)
    separate = {g.stem: qnn.compile_context(g, d / "separate" / f"{g.stem}_ctx.onnx", TARGET)
                for g in graphs}
    other = qnn.compile_context(d / "io_other" / "decode.onnx",
                                d / "other" / "decode_ctx.onnx", TARGET)
    return {"dir": d, "graphs": graphs, "enc": enc, "enc_other": enc_other, "shared": shared,
            "separate": separate, "other": other}


# ---------------------------------------------------------------------------------------
# the QNN System reader
# ---------------------------------------------------------------------------------------
def test_context_info_lists_the_graphs_io_and_its_onnx_encodings(pair):
    sep = pair["separate"]["decode"]
    info = context_info(sep["bin_files"][0])
    assert info["backend"] == "HTP"
    assert info["sdk_build"] == sep["sdk_version"] == qnn.versions()["qnn_sdk_build"]
    assert info["bytes"] == Path(sep["bin_files"][0]).stat().st_size
    [graph] = info["graphs"]
    enc = pair["enc"]["decode"]
    for side, name in (("inputs", "x"), ("outputs", "y")):
        [t] = graph[side]
        assert (t["name"], t["shape"], t["dtype"]) == (name, [1, 1, HIDDEN], "ufixed_point_16")
        assert t["type"] == ("app_write" if side == "inputs" else "app_read")
        e = t["encoding"]
        assert e["kind"] == "scale_offset"
        # the Q/DQ scale of the ONNX graph, as float32; QNN's offset is the negated zero point
        assert e["scale"] == pytest.approx(enc[name]["scale"], rel=1e-7)
        assert e["offset"] == -enc[name]["zero_point"]


def test_context_info_reads_a_context_model_named_or_embedded(pair, tmp_path):
    sep = pair["separate"]["decode"]
    from_bin = context_info(sep["bin_files"][0])
    from_ctx = context_info(sep["ctx_path"])  # the _ctx.onnx naming the .bin
    assert from_ctx["graphs"] == from_bin["graphs"]
    embedded = qnn.compile_context(pair["graphs"][1], tmp_path / "decode_ctx.onnx", TARGET,
                                   embed=True)
    from_embedded = context_info(embedded["ctx_path"])
    assert from_embedded["graphs"][0]["inputs"] == from_bin["graphs"][0]["inputs"]
    assert from_embedded["graphs"][0]["outputs"] == from_bin["graphs"][0]["outputs"]


def test_a_corrupt_or_foreign_file_is_a_one_line_error(pair, tmp_path):
    good = Path(pair["separate"]["decode"]["bin_files"][0]).read_bytes()
    cases = {
        "random.bin": np.random.default_rng(0).bytes(4096),
        "truncated.bin": good[: len(good) // 3],
        "empty.bin": b"",
        "text.bin": b"not a context binary\n",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(StudioError) as e:
            context_info(tmp_path / name)
        assert "\n" not in str(e.value), name
        assert name in str(e.value)
    # an ONNX model that is not a compiled context model
    with pytest.raises(StudioError, match="no EPContext node"):
        context_info(pair["graphs"][0])
    with pytest.raises(StudioError, match="not found"):
        context_info(tmp_path / "absent.bin")


# ---------------------------------------------------------------------------------------
# the shared compile
# ---------------------------------------------------------------------------------------
def test_compile_shared_writes_one_binary_smaller_than_the_two(pair):
    shared, separate = pair["shared"], pair["separate"]
    assert shared["bin"].is_file() and len(shared["ctx_onnx"]) == 2
    # both context models name the one binary
    for ctx in shared["ctx_onnx"]:
        assert qnn.read_context_info(ctx)["bin_files"] == [shared["bin"].name]
    assert [p.name for p in shared["bin"].parent.iterdir() if p.suffix == ".bin"] \
        == [shared["bin"].name]
    apart = sum(Path(s["bin_files"][0]).stat().st_size for s in separate.values())
    assert shared["bytes"] < apart
    # the weights are held once: the shared binary is much nearer one graph than two
    one = Path(separate["decode"]["bin_files"][0]).stat().st_size
    assert shared["bytes"] < 1.5 * one
    info = context_info(shared["bin"])
    assert [g["name"] for g in info["graphs"]] == shared["graphs"]
    assert [g["inputs"][0]["shape"] for g in info["graphs"]] == [[1, 8, HIDDEN], [1, 1, HIDDEN]]


def test_compile_shared_needs_two_graphs(pair, tmp_path):
    with pytest.raises(StudioError, match="two graphs"):
        compile_shared(pair["graphs"][:1], tmp_path, TARGET)


def test_the_modes():
    assert sharing_wanted("auto", for_device=True)
    assert not sharing_wanted("auto", for_device=False)
    assert sharing_wanted("on", for_device=False)
    assert not sharing_wanted("off", for_device=True)
    with pytest.raises(StudioError, match="auto, on, off"):
        sharing_wanted("yes", True)


# ---------------------------------------------------------------------------------------
# the structure check
# ---------------------------------------------------------------------------------------
def test_compare_structure_is_equal_for_the_real_pair(pair):
    sep = [pair["separate"][g]["ctx_path"] for g in ("prefill", "decode")]
    report = compare_structure(pair["shared"]["bin"], sep)
    assert report["equal"], report
    assert report["status"] == STRUCTURE_ONLY
    assert report["matched_by"] == "graph name"
    assert [(g["inputs"], g["outputs"]) for g in report["graphs"]] == [(1, 1), (1, 1)]
    assert any("encodings" in c for c in report["checks"])
    line = summary(report)
    assert "\n" not in line and "2 graphs equal" in line and STRUCTURE_ONLY in line
    json.dumps(report)  # it goes into a manifest as it is


def test_compare_structure_finds_a_graph_quantized_differently(pair):
    # the decode graph calibrated on wider inputs: its input scale differs
    assert pair["enc_other"]["decode"]["x"]["scale"] > 2 * pair["enc"]["decode"]["x"]["scale"]
    sep = [pair["separate"]["prefill"]["ctx_path"], pair["other"]["ctx_path"]]
    report = compare_structure(pair["shared"]["bin"], sep)
    assert not report["equal"]
    # another file gives another QNN graph name: matched by the graphs' I/O instead
    assert report["matched_by"] == "input and output tensor names and shapes"
    prefill, decode = report["graphs"]
    assert prefill["differences"] == []
    assert any(d.startswith("input x: scale") for d in decode["differences"])
    line = summary(report)
    assert "differs" in line and "scale" in line and "\n" not in line


def test_compare_structure_counts_the_graphs(pair):
    report = compare_structure(pair["shared"]["bin"], [pair["separate"]["decode"]["ctx_path"]])
    assert not report["equal"]
    assert report["differences"][0].startswith("the shared binary holds 2 graphs")


@pytest.mark.slow
def test_the_simulator_runs_the_separate_binary_and_refuses_the_shared_one(pair):
    """What the two labels rest on: the separately compiled decode binary executes on the
    HTP simulator; the weight-shared one does not load (in a child process: loading it can
    crash the process). If a future simulator loads it, this fails: the shared binaries can
    then be executed here too."""
    code = (
        "import sys, numpy as np\n"
        "from studio.engine import qnn\n"
        "s = qnn.make_session(sys.argv[1], sys.argv[2])\n"
        f"y = s.run(None, {{'x': np.full((1, 1, {HIDDEN}), 30000, np.uint16)}})[0]\n"
        "print('RAN', y.dtype, y.shape)\n"
    )
    root = Path(__file__).resolve().parents[2]

    def run(ctx):
        return subprocess.run([sys.executable, "-c", code, str(ctx), TARGET], cwd=root,
                              capture_output=True, text=True, timeout=300)

    ran = run(pair["separate"]["decode"]["ctx_path"])
    assert ran.returncode == 0 and "RAN uint16 (1, 1, 128)" in ran.stdout, ran.stderr[-800:]
    shared_decode = pair["shared"]["ctx_onnx"][1]
    refused = run(shared_decode)
    assert refused.returncode != 0 and "RAN" not in refused.stdout
    if refused.returncode > 0:  # an error, not a crash: it says why
        assert "NOT_SUPPORTED" in refused.stderr
    assert EXECUTED != STRUCTURE_ONLY
