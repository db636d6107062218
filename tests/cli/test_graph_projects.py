"""Encoders and ONNX graphs as projects: `studio new --onnx` / `--sample minilm`, the graph
stages of the pipeline (import → quantize → compile → validate → run → report), the
placement as a keyed recipe setting (strict names the refused node and exits 2; partition
and rewrite run, and `studio compare` shows what changed), .npz calibration with bad files
refused in one line, and the MiniLM encoder on the HTP simulator with its retrieval check."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli.conftest import studio
from tests.engine.small_graphs import FEEDS, cnn, mlp

pytestmark = pytest.mark.slow  # every test runs pipelines on the HTP simulator


def _errors(r) -> list[str]:
    """The error lines (a batch's progress goes to stderr too; QNN's own line is left out)."""
    return [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error")]


def _report(project: Path) -> dict:
    return json.loads((project.with_suffix(".studio") / "reports" / "latest.json").read_text())


def _set_placement(project: Path, value: str) -> None:
    text = project.read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("placement = "))
    project.write_text(text.replace(old, f'placement = "{value}"'))


def test_the_placement_is_a_recipe_setting_strict_partition_rewrite(tmp_path):
    mlp(tmp_path / "mlp.onnx", "celu")
    np.savez(tmp_path / "calib.npz", x=np.concatenate([f["x"][None] for f in FEEDS]))
    f = tmp_path / "mlp.qstudio"
    r = studio("new", f, "--onnx", tmp_path / "mlp.onnx", "--calibration", tmp_path / "calib.npz")
    assert r.returncode == 0, r.stderr
    assert 'kind = "onnx-graph"' in f.read_text() and 'placement = "strict"' in f.read_text()
    # strict: the refused node, the EP's reason and the ways forward, in one line, exit 2
    r = studio("--batch", f)
    assert r.returncode == 2
    err = _errors(r)
    assert len(err) == 1 and "act/Celu (Celu: Operators of type `Celu` are not supported" in err[0]
    assert "quantization.placement rewrite" in err[0] and "partition" in err[0]
    # partition: the CPU takes the Celu; the transitions and their bytes are reported
    _set_placement(f, "partition")
    r = studio("--batch", f)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = _report(f)
    st = rep["stages"]
    place = next(v for k, v in st.items() if k.startswith("graph-compile["))["placement"]
    assert not place["all_on_npu"] and place["transitions"] == 2
    assert place["bytes_crossing"] == 256  # the float [1, 32] to the CPU and back
    assert [n["name"] for n in place["cpu_nodes"]] == ["act/Celu"]
    assert "Celu" in place["cpu_nodes"][0]["reason"]
    val = next(v for k, v in st.items() if k.startswith("graph-validate["))
    assert val["output_cosine_min"] > 0.99 and val["source"] == "simulated"
    assert {g["gate"] for g in rep["gates"]} == {"min_output_cosine"}
    assert all(g["passed"] for g in rep["gates"])
    sources = {m["stage"].split("[")[0]: m["source"] for m in rep["metrics"]
               if m["name"] == "latency_ms" and "htp" in m["stage"]}
    assert sources == {"graph-run": "simulated"}
    # rewrite: Celu → α·Elu(x/α), checked against the original, every node on the NPU
    _set_placement(f, "rewrite")
    r = studio("--batch", f)
    assert r.returncode == 0, r.stderr[-2000:]
    st = _report(f)["stages"]
    q = st["graph-quantize"]
    assert [x["rewrite"] for x in q["rewrites"]] == ["celu"]
    assert q["rewrite_check"]["max_abs_error"] < 1e-6
    place = next(v for k, v in st.items() if k.startswith("graph-compile["))["placement"]
    assert place["all_on_npu"] and place["transitions"] == 0
    html = (f.with_suffix(".studio") / "reports" / "latest.html").read_text()
    assert "Rewrites and quantization" in html and "Latency per inference" in html
    # the two runs compare like any others: the setting and the figures that moved
    r = studio("compare", f, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "quantization.placement" in r.stdout


def test_a_cnn_project_with_a_fixed_shape_and_bad_calibration_files(tmp_path):
    model = cnn(tmp_path / "cnn.onnx")
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "c.npz", image=rng.randn(6, 1, 3, 16, 16).astype(np.float32))
    f = tmp_path / "cnn.qstudio"
    r = studio("new", f, "--onnx", model, "--shape", "image=1,3,16,16", "--calibration",
               tmp_path / "c.npz", "--target", "snapdragon-8-elite")
    assert r.returncode == 0, r.stderr
    r = studio("--batch", f)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = _report(f)
    val = rep["stages"]["graph-validate[snapdragon-8-elite]"]
    assert set(val["outputs"]) == {"logits", "features"} and val["output_cosine_min"] > 0.99
    runs = {m["device"]: m for m in rep["metrics"] if m["name"] == "latency_ms"}
    assert runs["host-cpu"]["source"] == "measured" and runs["htp-sim"]["source"] == "simulated"
    assert runs["htp-sim"]["detail"].endswith("follows the host CPU, not device latency")
    # bad calibration files: one line each, exit 2, the project file untouched
    before = f.read_text()
    np.savez(tmp_path / "f64.npz", image=rng.randn(6, 1, 3, 16, 16))
    np.savez(tmp_path / "shape.npz", image=rng.randn(6, 1, 3, 8, 8).astype(np.float32))
    np.savez(tmp_path / "name.npz", pixels=rng.randn(6, 1, 3, 16, 16).astype(np.float32))
    for bad, words in (("f64.npz", "'image' is float64, the model wants float32"),
                       ("shape.npz", "'image' is [6, 1, 3, 8, 8], the model wants [1, 3, 16, 16]"),
                       ("name.npz", "has no array 'image'")):
        g = tmp_path / f"bad-{bad}.qstudio"
        g.write_text(before.replace(str(tmp_path / "c.npz"), str(tmp_path / bad)))
        r = studio("--batch", g)
        assert r.returncode == 2, r.stderr[-2000:]
        assert len(_errors(r)) == 1 and words in r.stderr, r.stderr
    assert f.read_text() == before
    r = studio("new", tmp_path / "x.qstudio", "--onnx", model, "--calibration",
               tmp_path / "missing.npz")
    assert r.returncode == 2 and "no such .npz" in r.stderr
    assert not (tmp_path / "x.qstudio").exists()
    # an ONNX project without calibration data says what to give before any stage runs
    g = tmp_path / "nocal.qstudio"
    g.write_text(before.replace(str(tmp_path / "c.npz"), ""))
    r = studio("--batch", g)
    assert r.returncode == 2 and "graph.calibration is empty" in r.stderr


@pytest.fixture(scope="session")
def minilm_project(tmp_path_factory) -> Path:
    """The MiniLM sample as an encoder project at sequence length 16, run once (the sample's
    queries and sentences fit; at 32 the simulator's validation took 51 s, at 16 33 s)."""
    f = tmp_path_factory.mktemp("minilm") / "minilm.qstudio"
    r = studio("new", f, "--sample", "minilm", "--seq-len", "16")
    assert r.returncode == 0, r.stderr
    # two timed inferences and two profiled ones: the simulator takes ~1.4 s each at seq 16
    f.write_text(f.read_text().replace("repeats = 5", "repeats = 2"))
    r = studio("--batch", f, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    return f


def test_minilm_goes_through_the_pipeline_and_keeps_its_rankings(minilm_project):
    rep = _report(minilm_project)
    st = rep["stages"]
    imp = st["import"]
    assert imp["export_check"]["passed"] and imp["export_check"]["min_cosine"] > 0.999
    assert imp["op_types"].get("Erf", 0) == 6  # BERT's exact GELU, one per layer
    # no rewrite was needed for the GELU (the quantizer's preprocessing fuses Erf-GELU); the
    # attention mask's float-lowest constants were made quantizable
    assert [r["rewrite"] for r in st["graph-quantize"]["rewrites"]] == ["mask-min"]
    assert st["graph-quantize"]["rewrite_check"]["worst_cosine"] > 0.9999
    compile_ = next(v for k, v in st.items() if k.startswith("graph-compile["))
    assert compile_["placement"]["all_on_npu"]
    val = next(v for k, v in st.items() if k.startswith("graph-validate["))
    rank = val["ranking"]
    assert rank["queries"] == 8 and rank["top1_agreement"] >= 7 / 8
    assert rank["embedding_cosine_mean"] > 0.99 and rank["mean_kendall_tau"] > 0.8
    # held-out sentences, not calibrated on; the sample's feed-forward outputs in FP16 (its
    # outlier channels): without that rule 0.987
    assert val["output_cosine_min"] > 0.99
    assert all(g["passed"] for g in rep["gates"]) and {g["gate"] for g in rep["gates"]} == {
        "min_output_cosine", "min_ranking_top1"}
    assert {m["source"] for m in rep["metrics"] if m["name"] == "latency_ms"} == {
        "measured", "simulated"}
    prof = next(v for k, v in st.items() if k.startswith("graph-profile["))
    assert prof["source"] == "simulated" and prof["ops"] > 50 and len(prof["by_op_type"]) > 3
    html = (minilm_project.with_suffix(".studio") / "reports" / "latest.html").read_text()
    assert "Retrieval check" in html and "One inference" in html
    # a second run is all cache hits
    r = studio("--batch", minilm_project)
    assert r.returncode == 0 and r.stderr.count("(cached)") >= 4, r.stderr[-2000:]
