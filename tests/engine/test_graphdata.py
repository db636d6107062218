"""Any ONNX network: a small CNN exported from torch with a dynamic batch, made static, fed
calibration samples from an .npz, quantized W8A16 and run on the HTP simulator against FP32
per output; bad calibration files are one clear line each."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.engine import graphdata, qnn
from tests.engine import small_graphs

CHIP = "snapdragon-8-gen-3"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cnn")
    return folder, small_graphs.cnn(folder / "cnn.onnx")


def test_a_cnn_from_npz_calibration_to_the_htp(cnn):
    import onnxruntime as ort

    from studio.engine.qdq import quantize_graph

    folder, src = cnn
    with pytest.raises(StudioError, match=r"'image' .*dynamic shape \[batch, 3, 16, 16\]"):
        graphdata.make_static(src, folder / "static.onnx")
    inputs = graphdata.make_static(src, folder / "static.onnx", {"image": [1, 3, 16, 16]})
    assert [(i.name, i.dtype, i.shape) for i in inputs] == [
        ("image", "float32", (1, 3, 16, 16))]

    rng = np.random.RandomState(1)
    np.savez(folder / "calib.npz", image=rng.randn(8, 1, 3, 16, 16).astype(np.float32))
    feeds = graphdata.load_samples(folder / "calib.npz", inputs)
    assert len(feeds) == 8 and feeds[0]["image"].shape == (1, 3, 16, 16)

    info = quantize_graph(folder / "static.onnx", folder / "q.onnx",
                          {"scheme": "W8A16", "weight_granularity": "per_channel"}, feeds)
    assert info["calibration_feeds"] == 8 and info["qdq_nodes"] > 0
    htp = qnn.make_session(folder / "q.onnx", CHIP, strict=True)  # every node on the NPU
    cpu = ort.InferenceSession(str(folder / "static.onnx"), providers=["CPUExecutionProvider"])
    held = [{"image": rng.randn(1, 3, 16, 16).astype(np.float32)} for _ in range(3)]
    check = graphdata.compare_outputs(cpu, htp, held)
    assert set(check["outputs"]) == {"logits", "features"} and check["samples"] == 3
    assert check["worst_cosine"] > 0.99, check


def test_bad_calibration_files_are_one_line(cnn, tmp_path):
    folder, src = cnn
    inputs = graphdata.make_static(src, tmp_path / "s.onnx", {"image": [1, 3, 16, 16]})
    good = np.zeros((2, 1, 3, 16, 16), np.float32)
    cases = {
        "missing.npz": ({"pixels": good}, r"has no array 'image' .*the file has: pixels"),
        "dtype.npz": ({"image": good.astype(np.float64)}, r"'image' is float64, the model "
                                                          r"wants float32"),
        "shape.npz": ({"image": np.zeros((2, 3, 8, 8), np.float32)},
                      r"'image' is \[2, 3, 8, 8\], the model wants \[1, 3, 16, 16\] per sample"),
    }
    for name, (arrays, pattern) in cases.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(StudioError, match=pattern) as err:
            graphdata.load_samples(tmp_path / name, inputs)
        assert "\n" not in err.value.message
    (tmp_path / "junk.npz").write_bytes(b"not numpy at all")
    with pytest.raises(StudioError, match="cannot be read as NumPy data"):
        graphdata.load_samples(tmp_path / "junk.npz", inputs)
    with pytest.raises(StudioError, match="does not exist"):
        graphdata.load_samples(tmp_path / "nope.npz", inputs)
    np.save(tmp_path / "one.npy", good)  # a .npy for a one-input graph is fine
    assert len(graphdata.load_samples(tmp_path / "one.npy", inputs)) == 2
    two = inputs + [graphdata.GraphInput("mask", "float32", (1, 16))]
    with pytest.raises(StudioError, match="one array but the model has 2 inputs"):
        graphdata.load_samples(tmp_path / "one.npy", two)
    np.savez(tmp_path / "uneven.npz", image=good, mask=np.zeros((3, 1, 16), np.float32))
    with pytest.raises(StudioError, match="different numbers of samples"):
        graphdata.load_samples(tmp_path / "uneven.npz", two)
    with pytest.raises(StudioError, match=r"the shape \[1, 3, 16\] does not fit"):
        graphdata.make_static(src, tmp_path / "x.onnx", {"image": [1, 3, 16]})
    with pytest.raises(StudioError, match="has no input 'img'"):
        graphdata.make_static(src, tmp_path / "x.onnx", {"img": [1, 3, 16, 16]})
