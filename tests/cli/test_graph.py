"""`studio graph`: any ONNX network onto the NPU headless — on an MLP with a Celu (which the
HTP refuses) strict names the node and the EP's reason (exit 2), partition runs it with the
CPU part and reports the transitions, rewrite makes it NPU-resident with the numeric check; a CNN with a dynamic batch goes
through with --shape and .npz calibration; bad calibration files are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.cli.conftest import studio
from tests.engine.small_graphs import FEEDS, cnn, mlp

pytestmark = pytest.mark.slow  # each test runs `studio graph` on the HTP simulator


@pytest.fixture(scope="module")
def celu_mlp(tmp_path_factory):
    folder = tmp_path_factory.mktemp("graph")
    model = mlp(folder / "mlp.onnx", "celu")
    np.savez(folder / "calib.npz", x=np.concatenate([f["x"][None] for f in FEEDS]))
    return folder, model


def test_strict_names_the_refused_node_and_says_what_to_do(celu_mlp):
    folder, model = celu_mlp
    r = studio("graph", model, "--calibration", folder / "calib.npz", "--out", folder / "s")
    assert r.returncode == 2
    err = [ln for ln in r.stderr.strip().splitlines() if "LIBNATIVE" not in ln]  # QNN's own
    assert len(err) == 1 and "act/Celu (Celu: Operators of type `Celu` are not supported" in err[0]
    assert "--placement rewrite" in err[0] and "partition" in err[0]


def test_partition_runs_with_the_cpu_part(celu_mlp):
    folder, model = celu_mlp
    r = studio("graph", model, "--calibration", folder / "calib.npz", "--placement",
               "partition", "--out", folder / "p", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    n = res["on_npu"]
    assert not n["all_on_npu"] and n["qnn_subgraphs"] == 2
    # the float [1, 32] into the CPU's Celu and its float result back: 128 bytes each way
    assert n["transitions"] == 2 and n["bytes_crossing"] == 256
    assert "act/Celu" in {c["name"] for c in res["cpu_nodes"]}
    assert res["validation"]["worst_cosine"] > 0.99
    assert res["latency_ms"]["htp"]["source"] == "simulated"
    assert res["latency_ms"]["cpu_fp32"]["source"] == "measured"
    assert {"static.onnx", "quantized.onnx", "placement.json", "result.json"} <= set(
        p.name for p in (folder / "p").iterdir())


def test_rewrite_puts_everything_on_the_npu(celu_mlp):
    folder, model = celu_mlp
    r = studio("graph", model, "--calibration", folder / "calib.npz", "--placement", "rewrite",
               "--weights", "per_tensor", "--out", folder / "r")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "on the NPU in 1 subgraph(s)" in r.stdout and "rewrite celu at 1 place(s)" in r.stdout
    res = json.loads((folder / "r" / "result.json").read_text())
    assert res["on_npu"]["all_on_npu"] and res["on_npu"]["transitions"] == 0
    assert res["quantization"]["weight_granularity"] == "per_tensor"
    assert res["rewrite_check"]["max_abs_error"] < 1e-6
    assert res["validation"]["worst_cosine"] > 0.99
    assert (folder / "r" / "rewritten.onnx").is_file()


def test_the_quantizer_fuses_an_erf_gelu_by_itself(tmp_path):
    """ONNX Runtime's QNN preprocessing (run before the studio quantizes) fuses the Erf-based
    GELU into one Gelu: strict placement takes it whole — the rewrite is for graphs quantized
    elsewhere."""
    model = mlp(tmp_path / "m.onnx", "gelu-div")
    np.savez(tmp_path / "c.npz", x=np.concatenate([f["x"][None] for f in FEEDS]))
    r = studio("graph", model, "--calibration", tmp_path / "c.npz", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["on_npu"]["all_on_npu"]


def test_a_cnn_with_a_dynamic_batch_and_bad_inputs(tmp_path):
    model = cnn(tmp_path / "cnn.onnx")
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "c.npz", image=rng.randn(6, 1, 3, 16, 16).astype(np.float32))
    r = studio("graph", model, "--calibration", tmp_path / "c.npz", "--json")
    assert r.returncode == 2 and "dynamic shape [batch, 3, 16, 16]" in r.stderr
    r = studio("graph", model, "--calibration", tmp_path / "c.npz", "--shape",
               "image=1,3,16,16", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout)
    assert res["on_npu"]["all_on_npu"] and set(res["validation"]["outputs"]) == {
        "logits", "features"}
    assert res["validation"]["worst_cosine"] > 0.99
    assert (tmp_path / "cnn.studio-graph" / "quantized.onnx").is_file()
    np.savez(tmp_path / "bad.npz", image=rng.randn(6, 1, 3, 16, 16))  # float64
    for args, words in (
            (["--calibration", tmp_path / "bad.npz"], "'image' is float64, the model wants"),
            (["--calibration", tmp_path / "none.npz"], "does not exist"),
            (["--calibration", tmp_path / "c.npz", "--shape", "image=1,3,x"],
             "write NAME=D,D,..."),
    ):
        r = studio("graph", model, "--shape", "image=1,3,16,16", *args)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert len([ln for ln in r.stderr.strip().splitlines() if "LIBNATIVE" not in ln]) == 1
