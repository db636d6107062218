"""Importers on real output (the QNN simulator's CSV and optrace schematic, ONNX Runtime's
profiler JSON) and on minimal files of the formats this machine cannot produce (a device's
chrome trace from qnn-profile-viewer, an AI Hub profile job's JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.profile_export import to_chrome_trace
from studio.engine import profiling
from studio.engine.profile_import import (
    detect_format,
    import_profile,
    merge_bandwidth,
    read_schematic,
)
from studio.engine.qnn_profile import event_table, parse_profile_csv
from tests.engine.tiny_onnx import WIDTH, float_model, quantize_w8a16

pytest.importorskip("onnxruntime_qnn")

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"


@pytest.fixture(scope="module")
def optrace(tmp_path_factory):
    d = tmp_path_factory.mktemp("optrace")
    q = quantize_w8a16(float_model(d / "f32.onnx"), d / "q.onnx")
    x = (0.5 * np.random.default_rng(3).standard_normal((1, WIDTH))).astype(np.float32)
    run = profiling.profile_run(q, "snapdragon-8-gen-3", {"x": x}, d / "out" / "p.csv",
                          level="optrace", runs=2)
    host = profiling.profile_host_cpu(q, d / "ort.json", runs=2)
    return {"run": run, "q": q, "host": host}


def test_real_qnn_csv_and_schematic(optrace):
    run = optrace["run"]
    assert detect_format(run["csv"]) == "qnn-csv"
    prof = import_profile(run["csv"], onnx_path=optrace["q"])
    assert prof.source == "imported" and prof.unit == "cycles" and prof.table.has("cycles")
    assert len(prof.table) == len(prof.ops) > 3

    sch = run["schematic"][0]
    assert detect_format(sch) == "qnn-optrace-schematic"
    data = read_schematic(sch)
    assert data["bandwidth"] and data["kernels"]
    assert any(v[4] == 1 for v in data["bandwidth"].values())  # DMA transfers
    sprof = import_profile(sch)
    assert sprof.table.has("dram_read") and sprof.table.has("kernel") and sprof.table.has("dma")

    parsed = parse_profile_csv(run["csv"], onnx_path=optrace["q"])
    merged = merge_bandwidth(event_table(parsed), parsed.ops, data)
    assert data["vtcm_peak"] is not None and data["vtcm_peak"] > 0  # its tcm_block_info
    rows = {r["op"]: r for r in merged.rows()}
    matmul = next(r for name, r in rows.items() if name.endswith("MatMul"))
    assert matmul["vtcm_read"] > 0 and matmul["kernel"]  # the compiler's own figures
    assert rows["Input"]["dma"] and rows["Input"]["dram_read"] > 0


def test_real_onnx_runtime_profile(optrace):
    path = optrace["host"]["json"]
    assert detect_format(path) == "ort-json"
    prof = import_profile(path, onnx_path=optrace["q"], source="measured")
    t = prof.table
    assert prof.source == "measured" and t.has("start") and t.has("dur")
    assert all(name.startswith("CPU thread ") for name in t.vocab["track"])
    assert set(t["kernel"]) == {"CPU"}  # the provider of every node
    assert any(x.startswith("MatMul") for x in set(t["op_type"]))  # ORT may fuse it
    assert len(t) == 2 * len(prof.ops)  # two runs, one event per node each


def test_device_chrome_trace_fixture():
    prof = import_profile(FIXTURES / "qnn_chrome_trace.json")
    t = prof.table
    assert detect_format(FIXTURES / "qnn_chrome_trace.json") == "chrome-trace"
    assert t.vocab["track"] == ["QNN HTP / HTP core 0 / hw thread 0",
                                "QNN HTP / HTP core 0 / hw thread 1"]
    rows = {r["op"]: r for r in t.rows()}
    down = rows["/model/layers.0/mlp/down_proj/MatMul"]  # a B/E pair
    assert down["start"] == 14 and down["dur"] == 16 and down["block"] == "down_proj"
    assert rows["/model/layers.0/self_attn/q_proj/MatMul"]["cycles"] == 15000
    assert rows["x_QuantizeLinear"]["block"] == "data movement / Q-DQ"


def test_aihub_fixture():
    prof = import_profile(FIXTURES / "aihub_profile.json")
    t = prof.table
    assert set(t.vocab["track"]) == {"CPU", "NPU"}
    assert t.group_sum("track")["NPU"] == 310 + 22 + 420 + 900
    assert {e.name for e in prof.events} >= {"estimated_inference_time"}
    assert not t.has("start")  # per-layer times, no timeline


def test_chrome_export_round_trip_and_trace_event_format(optrace, tmp_path):
    prof = import_profile(optrace["host"]["json"])
    trace = to_chrome_trace(prof)
    _check_trace_event_format(trace)
    assert trace["otherData"]["time_axis"].startswith("measured")
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    back = import_profile(path)
    a, b = prof.table, back.table
    assert len(a) == len(b)
    assert np.allclose(a.num["start"], b.num["start"]) and np.allclose(a.num["dur"],
                                                                        b.num["dur"])
    assert list(a["op"]) == list(b["op"]) and list(a["track"]) == list(b["track"])


def test_a_cycles_profile_exports_back_to_back_and_says_so(optrace):
    prof = import_profile(optrace["run"]["csv"])
    trace = to_chrome_trace(prof)
    _check_trace_event_format(trace)
    assert "back to back" in trace["otherData"]["time_axis"]
    assert "cycles" in trace["otherData"]["time_axis"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(b["ts"] == a["ts"] + a["dur"] for a, b in zip(xs, xs[1:], strict=False))


@pytest.mark.parametrize("content, match", [
    (b"", "is empty"),
    (b"hello world\n", "not a profile the studio reads"),
    (b'{"traceEvents": [', "not readable JSON"),
    (b'{"execution_detail": 3}', "execution_detail is not a list"),
    (b'[{"cat": "Node", "name": "x_kernel_time", "ph": "X"}]', "no numeric ts"),
    (b"# python_pprint_graph_summary\ngraph_before_optimization = {\n", "truncated"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    with pytest.raises(StudioError, match=match) as exc:
        import_profile(path)
    assert "\n" not in exc.value.message


def _check_trace_event_format(trace: dict) -> None:
    """The keys and types the Trace Event Format requires of the events we write."""
    assert isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["name"], str) and e["name"]
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int) and isinstance(e["dur"], float | int)
            assert e["dur"] >= 0 and isinstance(e.get("args", {}), dict)
            assert isinstance(e["cat"], str)
        else:
            assert e["name"] in ("process_name", "thread_name") and "name" in e["args"]
    json.dumps(trace)  # serialisable as is
