"""The QNN HTP adapter against the real QNN HTP backend (the simulator on x86). No mocks.

The models are tiny (a 16-wide MatMul + Add + Relu) because the simulator is slow and the
machine's cores are shared.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from studio.core.catalog import Chip, get_chip, load_catalog
from studio.core.errors import StudioError
from studio.engine import profiling, qnn
from tests.engine.tiny_onnx import WIDTH, float_model, quantize_w8a16

pytest.importorskip("onnxruntime_qnn")

TARGET = "snapdragon-8-gen-3"


# ---------------------------------------------------------------------------------------
# fixtures: tiny real models
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qnn-models")
    f32 = float_model(d / "tiny_f32.onnx")
    return {
        "dir": d,
        "f32": f32,
        "w8a16": quantize_w8a16(f32, d / "tiny_w8a16.onnx"),
        "mod": float_model(d / "tiny_mod.onnx", with_mod=True),
    }


def _x(seed: int = 3) -> np.ndarray:
    # Half the calibration spread: inside the calibrated range, no clipping.
    return (0.5 * np.random.default_rng(seed).standard_normal((1, WIDTH))).astype(np.float32)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _cpu(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


# ---------------------------------------------------------------------------------------
# registration, versions, options
# ---------------------------------------------------------------------------------------
def test_register_is_idempotent_and_versions_are_recorded():
    qnn.register()
    qnn.register()
    import onnxruntime as ort

    devices = [d for d in ort.get_ep_devices() if d.ep_name == qnn.EP_NAME]
    assert len(devices) >= 1
    v = qnn.versions()
    assert v == qnn.versions()
    assert v["onnxruntime"] == ort.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", v["qnn_sdk"])
    assert re.fullmatch(r"v\d+\.\d+\.\d+\.\d+", v["qnn_sdk_build"])
    assert v["qnn_sdk_build"].startswith("v" + v["qnn_sdk"] + ".")


def test_provider_options_map_the_chip():
    chip = get_chip(TARGET)
    opts = qnn.provider_options(chip)
    assert opts["htp_arch"] == "75" and opts["soc_model"] == "57" and opts["vtcm_mb"] == "8"
    assert opts["backend_path"].endswith("libQnnHtp.so") and os.path.isfile(opts["backend_path"])
    assert "enable_htp_fp16_precision" not in opts
    fp16 = qnn.provider_options(
        TARGET, fp16=True, extra={"htp_performance_mode": "burst", "x": True}
    )
    assert fp16["enable_htp_fp16_precision"] == "1" and fp16["soc_model"] == "57"
    assert fp16["htp_performance_mode"] == "burst" and fp16["x"] == "1"
    prof = qnn.provider_options(TARGET, profiling_level="detailed", profiling_path="p.csv")
    assert prof["profiling_level"] == "detailed" and os.path.isabs(prof["profiling_file_path"])
    with pytest.raises(StudioError, match="unknown profiling level"):
        qnn.provider_options(TARGET, profiling_level="verbose", profiling_path="p.csv")
    with pytest.raises(StudioError, match="does not run float graphs"):
        qnn.provider_options("qcm6490", fp16=True)
    with pytest.raises(StudioError, match="unknown target 'snapdragon-9000'; known targets: "):
        qnn.provider_options("snapdragon-9000")


# ---------------------------------------------------------------------------------------
# strict sessions
# ---------------------------------------------------------------------------------------
def test_strict_session_runs_on_htp_and_matches_cpu(models):
    x = _x()
    sess = qnn.make_session(models["w8a16"], TARGET)
    assert sess.get_providers()[0] == qnn.EP_NAME
    y = sess.run(None, {"x": x})[0]
    ref_q = _cpu(models["w8a16"], x)  # the same QDQ model on ORT's CPU kernels
    ref_f = _cpu(models["f32"], x)
    # HTP integer kernels vs ORT's CPU QDQ kernels: within ~1 % of the output range.
    assert np.max(np.abs(y - ref_q)) < 0.01 * np.max(np.abs(ref_q)) + 1e-3
    assert _cos(y, ref_f) > 0.999


def test_fp16_float_model_runs_in_strict_mode(models):
    x = _x()
    y = qnn.make_session(models["f32"], TARGET, fp16=True).run(None, {"x": x})[0]
    assert np.max(np.abs(y - _cpu(models["f32"], x))) < 1e-2


def test_every_catalog_chip_is_accepted_by_the_backend(models):
    x = _x()
    ref = _cpu(models["w8a16"], x)
    for chip in load_catalog().values():
        y = qnn.make_session(models["w8a16"], chip).run(None, {"x": x})[0]
        # Placement and device setup only: numerics per arch are checked on real models.
        assert np.all(np.isfinite(y)) and np.max(np.abs(y - ref)) < 5e-2, chip.key


def test_unsupported_op_is_named_by_placement_report_and_strict_session(models):
    report = qnn.placement_report(models["mod"], TARGET, fp16=True)
    assert report["all_on_npu"] is False
    assert report["error"] is None
    assert [n["name"] for n in report["cpu_nodes"]] == ["/model/layers.1/the_Mod"]
    node = report["cpu_nodes"][0]
    assert node["op_type"] == "Mod" and "fmod" in node["reason"]
    assert report["qnn_nodes"] >= 1 and report["total_nodes"] == report["qnn_nodes"] + 1

    with pytest.raises(StudioError) as e:
        qnn.make_session(models["mod"], TARGET, fp16=True)
    msg = str(e.value)
    assert "/model/layers.1/the_Mod" in msg and "Mod" in msg and "fmod" in msg
    assert "\n" not in msg

    # Non-strict: the Mod runs on the CPU, the rest on the HTP.
    x = _x()
    y = qnn.make_session(models["mod"], TARGET, strict=False, fp16=True).run(None, {"x": x})[0]
    assert np.max(np.abs(y - _cpu(models["mod"], x))) < 1e-2


def test_placement_report_all_on_npu(models):
    report = qnn.placement_report(models["w8a16"], TARGET)
    assert report["all_on_npu"] is True
    assert report["cpu_nodes"] == [] and report["error"] is None
    assert report["total_nodes"] == report["qnn_nodes"] == 10
    assert report["qnn_subgraphs"] == 1 and report["chip"] == TARGET
    # Offloading graph-edge quantization moves exactly those Q/DQ nodes to the CPU.
    off = qnn.placement_report(models["w8a16"], TARGET, offload_io_quantization=True)
    assert {n["op_type"] for n in off["cpu_nodes"]} == {"QuantizeLinear", "DequantizeLinear"}


def test_one_compile_gives_the_placement_report_and_the_binary(models, tmp_path):
    """``compile_placed``: the strict compile's op trace gives the placement report the
    non-strict session gives; a graph with a node the NPU refuses gets that session's report
    naming it, and no compiled file."""
    rep, comp = qnn.compile_placed(models["w8a16"], tmp_path / "a" / "m_ctx.onnx", TARGET,
                                   embed=True)
    assert rep == qnn.placement_report(models["w8a16"], TARGET)
    assert comp is not None and Path(comp["ctx_path"]).is_file()
    x = _x()
    ran = qnn.make_session(comp["ctx_path"], TARGET).run(None, {"x": x})[0]
    assert _cos(ran, _cpu(models["w8a16"], x)) > 0.99

    rep, comp = qnn.compile_placed(models["mod"], tmp_path / "b" / "m_ctx.onnx", TARGET,
                                   fp16=True)
    assert comp is None and rep == qnn.placement_report(models["mod"], TARGET, fp16=True)
    assert [n["name"] for n in rep["cpu_nodes"]] == ["/model/layers.1/the_Mod"]
    assert not (tmp_path / "b" / "m_ctx.onnx").exists()


def test_invalid_soc_model_is_a_clear_error(models):
    bogus = Chip(key="bogus", name="Bogus", htp_arch=73, soc_model=999, vtcm_mb=8)
    with pytest.raises(StudioError, match=r"refused target bogus \(htp_arch 73, soc_model 999\)"):
        qnn.make_session(models["w8a16"], bogus)
    report = qnn.placement_report(models["w8a16"], bogus)
    assert report["all_on_npu"] is False and report["qnn_nodes"] == 0
    assert len(report["cpu_nodes"]) == report["total_nodes"] == 10
    assert "soc_model 999" in report["error"]


def test_bad_inputs_are_one_line_errors(models, tmp_path):
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_text("this is not a model\n")
    with pytest.raises(StudioError, match="is not an ONNX model"):
        qnn.make_session(not_onnx, TARGET)
    with pytest.raises(StudioError, match="is not an ONNX model"):
        qnn.placement_report(not_onnx, TARGET)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(StudioError, match="empty"):
        qnn.make_session(empty, TARGET)
    with pytest.raises(StudioError, match="not found"):
        qnn.make_session(tmp_path / "missing.onnx", TARGET)
    with pytest.raises(StudioError, match="unknown target 'nope'"):
        qnn.make_session(models["w8a16"], "nope")


# ---------------------------------------------------------------------------------------
# compile
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("embed", [False, True])
def test_compile_then_reload_is_bit_identical(models, tmp_path, embed):
    out = tmp_path / "ctx" / "tiny_ctx.onnx"
    res = qnn.compile_context(models["w8a16"], out, TARGET, embed=embed)
    assert res["ctx_path"] == str(out) and out.is_file()
    assert res["sdk_version"] == qnn.versions()["qnn_sdk_build"]
    assert res["embed"] is embed and res["chip"] == TARGET and res["seconds"] > 0
    if embed:
        assert res["bin_files"] == []
    else:
        assert [Path(b).name for b in res["bin_files"]] == ["tiny_ctx_qnn.bin"]
        assert all(Path(b).is_file() for b in res["bin_files"])
    # Atomic: only the results are in the folder, no staging left behind.
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [out.name] + [Path(b).name for b in res["bin_files"]]
    )
    info = qnn.read_context_info(out)
    assert info["sdk_version"] == res["sdk_version"] and info["embed"] is embed

    x = _x()
    t0 = time.perf_counter()
    ctx_sess = qnn.make_session(out, TARGET)
    reload_s = time.perf_counter() - t0
    y_ctx = ctx_sess.run(None, {"x": x})[0]
    y_ref = qnn.make_session(models["w8a16"], TARGET).run(None, {"x": x})[0]
    assert np.array_equal(y_ctx, y_ref)
    assert reload_s < 5.0

    # Compiling again over the same path replaces the files.
    again = qnn.compile_context(models["w8a16"], out, TARGET, embed=embed)
    assert again["ctx_path"] == str(out)


def test_compile_errors(models, tmp_path):
    with pytest.raises(StudioError, match=r"must end in \.onnx"):
        qnn.compile_context(models["w8a16"], tmp_path / "x.bin", TARGET)
    with pytest.raises(StudioError, match="overwrite"):
        qnn.compile_context(models["w8a16"], models["w8a16"], TARGET)
    with pytest.raises(StudioError, match="the_Mod"):
        qnn.compile_context(models["mod"], tmp_path / "mod_ctx.onnx", TARGET, fp16=True)
    assert not (tmp_path / "mod_ctx.onnx").exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".qnn-compile-")] == []

    out = qnn.compile_context(models["w8a16"], tmp_path / "c" / "m_ctx.onnx", TARGET)
    os.remove(out["bin_files"][0])
    with pytest.raises(StudioError, match="context binary is missing"):
        qnn.make_session(out["ctx_path"], TARGET)
    with pytest.raises(StudioError, match="no EPContext node"):
        qnn.read_context_info(models["w8a16"])


def test_a_damaged_context_binary_and_a_wrong_feed_are_decoded(models, tmp_path):
    """Two real errors, provoked: a compiled context whose embedded binary lost its second
    half (a copy cut short), and a session fed the wrong shape; each one line with the
    decoder's cause and fix (docs/errors.md), not the bare runtime text."""
    import onnx

    from studio.services.jobrunner import job_failure

    out = qnn.compile_context(models["w8a16"], tmp_path / "e" / "m_ctx.onnx", TARGET,
                              embed=True)["ctx_path"]
    m = onnx.load(out)
    attr = next(a for n in m.graph.node if n.op_type == "EPContext" for a in n.attribute
                if a.name == "ep_cache_context")
    attr.s = attr.s[:len(attr.s) // 2]
    onnx.save(m, tmp_path / "cut_ctx.onnx")
    with pytest.raises(StudioError) as err:
        qnn.make_session(tmp_path / "cut_ctx.onnx", TARGET)
    msg = err.value.message
    assert "Failed to get context binary info" in msg  # the runtime's own words ...
    assert "[ORT context binary unreadable context binary:" in msg  # ... decoded
    assert "fix: copy the compiled files again" in msg and "\n" not in msg
    # a graph fed another shape than its own: the stage's crash line says so
    sess = qnn.make_session(models["w8a16"], TARGET)
    with pytest.raises(Exception) as raw:  # noqa: PT011 - ORT raises its own types
        sess.run(None, {"x": np.zeros((1, 3), np.float32)})
    crash = job_failure("validate", {"type": "error", "kind": "bug",
                                     "message": f"{type(raw.value).__name__}: {raw.value}",
                                     "traceback": "..."})
    assert "invalid dimensions for input" in crash.message.lower()
    assert "[ORT input shape invalid input dimensions:" in crash.message
    assert "export with the lengths you feed" in crash.message


# ---------------------------------------------------------------------------------------
# profiling
# ---------------------------------------------------------------------------------------
def test_profile_run_writes_csv_and_op_trace(models, tmp_path):
    res = profiling.profile_run(
        models["w8a16"], TARGET, {"x": _x()}, tmp_path / "prof" / "run.csv", runs=2
    )
    assert res["source"] == "simulated" and res["level"] == "detailed" and res["runs"] == 2
    csv_text = Path(res["csv"]).read_text()
    assert csv_text.startswith("Msg Timestamp,Message,Time,Unit of Measurement")
    assert csv_text.count("QNN (execute) time") == 2
    assert "/model/layers.0/mlp/MatMul:OpId_" in csv_text
    assert Path(res["op_trace"]).name == "run_op_trace.json"
    assert len(res["wall_s"]) == 2 and res["outputs"][0].shape == (1, WIDTH)
    leftovers = [p.name for p in (tmp_path / "prof").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_synthetic_feeds_follow_the_session_inputs(models, tmp_path):
    sess = qnn.make_session(models["w8a16"], TARGET)
    feeds = profiling.synthetic_feeds(sess, {"x": 0.25})
    assert (
        list(feeds) == ["x"] and feeds["x"].shape == (1, WIDTH) and feeds["x"].dtype == np.float32
    )
    assert np.all(feeds["x"] == 0.25)
    res = profiling.profile_run(models["w8a16"], TARGET, None, tmp_path / "synthetic.csv")
    assert Path(res["csv"]).is_file() and res["outputs"][0].shape == (1, WIDTH)


def test_profile_run_optrace_moves_the_schematic(models, tmp_path, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # the EP writes the schematic into the current directory
    res = profiling.profile_run(
        models["w8a16"], TARGET, {"x": _x()}, tmp_path / "o" / "opt.csv", level="optrace"
    )
    assert len(res["schematic"]) == 1 and Path(res["schematic"][0]).parent == tmp_path / "o"
    assert list(work.iterdir()) == []
    with pytest.raises(StudioError, match="unknown profiling level"):
        profiling.profile_run(models["w8a16"], TARGET, {"x": _x()}, tmp_path / "o" / "b.csv", level="x")
    with pytest.raises(StudioError, match="check the inputs"):
        profiling.profile_run(models["w8a16"], TARGET, {"wrong": _x()}, tmp_path / "o" / "c.csv")


def test_a_context_that_does_not_fit_beside_the_loaded_ones_says_so():
    """The message the simulator gave when the 3 B shape's 18 context binaries were loaded
    together: not the float-model advice, but what to do about the memory."""
    from pathlib import Path

    from studio.core.catalog import get_chip
    from studio.engine.qnn import _diagnose

    err = RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : Failed to load from EpContext "
                       "model. contextCreateFromBinary failed. Error: QNN_COMMON_ERROR_MEM_ALLOC: "
                       "Memory allocation related error.")
    got = str(_diagnose(err, "", None, Path("/c/part8_of_9/prefill_ctx.onnx"),
                        get_chip("snapdragon-8-gen-3")))
    assert "no memory left to load part8_of_9/prefill_ctx.onnx" in got
    assert "one part at a time" in got and "fp16" not in got and "\n" not in got
