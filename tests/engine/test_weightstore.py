"""One weights file for the graphs of a folder: each distinct tensor stored once, on 4 KiB
boundaries, and read back by ONNX Runtime and onnx's checker as any external data."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from studio.engine import weightstore
from studio.engine.weightstore import ALIGN, WEIGHTS_FILE, WeightStore, graph_bytes, shared_store


def _matmul_graph(w: np.ndarray, b: np.ndarray, name: str):
    """y = x @ w + b with the weights as initializers."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, w.shape[0]])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, w.shape[1]])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, name, [x], [y], [numpy_helper.from_array(w, "w"),
                                                      numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_same_bytes_are_stored_once_and_tensors_start_aligned(tmp_path):
    with WeightStore(tmp_path) as store:
        a = store.add([b"x" * 5000])
        b = store.add([b"y" * 10, b"y" * 10])
        again = store.add([b"x" * 2000, b"x" * 3000])  # other slices, the same bytes
    assert a == (0, 5000) and b == (ALIGN * 2, 20) and again == a
    assert store.written == 5020 and store.shared == 5000
    data = (tmp_path / WEIGHTS_FILE).read_bytes()
    assert len(data) == ALIGN * 2 + 20 and data[ALIGN * 2:] == b"y" * 20


def test_graphs_sharing_one_file_run_in_onnx_runtime_and_pass_the_checker(tmp_path):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    other_b = b + 1
    x = rng.standard_normal((1, 64)).astype(np.float32)
    with shared_store(tmp_path) as store:
        weightstore.save_shared(_matmul_graph(w, b, "one"), tmp_path / "one.onnx", store)
        weightstore.save_shared(_matmul_graph(w, other_b, "two"), tmp_path / "two.onnx", store)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["one.onnx", "two.onnx", WEIGHTS_FILE]
    # w once; the biases (under 1 KiB) stay in their graphs
    assert store.written == w.nbytes and store.shared == w.nbytes
    for name, bias in (("one", b), ("two", other_b)):
        onnx.checker.check_model(str(tmp_path / f"{name}.onnx"))
        sess = ort.InferenceSession(str(tmp_path / f"{name}.onnx"),
                                    providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w + bias, atol=1e-4)
        # a graph's bytes count what it refers to, shared or not
        assert graph_bytes(tmp_path / f"{name}.onnx") > w.nbytes + b.nbytes
    assert (tmp_path / WEIGHTS_FILE).stat().st_size < 2 * w.nbytes


def test_streamed_copy_into_the_shared_file(tmp_path):
    """A graph whose weights are external data elsewhere is copied slice by slice into the
    shared file; a store nobody used leaves no file."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((128, 16)).astype(np.float32)
    b = np.zeros(16, np.float32)
    src = tmp_path / "src"
    src.mkdir()
    onnx.save_model(_matmul_graph(w, b, "g"), str(src / "g.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="g.onnx.data", size_threshold=0)
    out = tmp_path / "out"
    out.mkdir()
    with shared_store(out) as store:
        for name in ("a", "b"):
            model = onnx.load(str(src / "g.onnx"), load_external_data=False)
            written = weightstore.save_streamed(model, src, out / f"{name}.onnx", store)
            assert written == [out / f"{name}.onnx"]
    assert store.shared == w.nbytes + b.nbytes
    got = onnx.load(str(out / "b.onnx"))
    np.testing.assert_array_equal(numpy_helper.to_array(got.graph.initializer[0]), w)
    empty = tmp_path / "empty"
    empty.mkdir()
    with shared_store(empty):
        pass
    assert list(empty.iterdir()) == []


def test_a_store_must_lie_beside_the_graph(tmp_path):
    (tmp_path / "x").mkdir()
    with WeightStore(tmp_path / "x") as store, pytest.raises(ValueError, match="not beside"):
        weightstore.save_shared(_matmul_graph(np.ones((2, 2), np.float32),
                                              np.ones(2, np.float32), "g"),
                                tmp_path / "g.onnx", store)


def test_cpu_sessions_over_one_weights_file_share_one_mapping_of_it(tmp_path):
    """The host's float sessions (a part's prefill and decode) read a shared file's weights
    through one read-only mapping, and compute what ONNX Runtime computes loading it."""
    import onnxruntime as ort

    from studio.engine import llm_runtime
    from studio.engine.llm_runtime import make_cpu_session

    rng = np.random.default_rng(1)
    w = rng.standard_normal((300, 40)).astype(np.float32)  # past the 1 KiB kept inline
    b = rng.standard_normal(40).astype(np.float32)
    x = rng.standard_normal((1, 300)).astype(np.float32)
    with shared_store(tmp_path) as store:
        weightstore.save_shared(_matmul_graph(w, b, "one"), tmp_path / "one.onnx", store)
        weightstore.save_shared(_matmul_graph(w, b + 1, "two"), tmp_path / "two.onnx", store)
    one, two = (make_cpu_session(tmp_path / f"{g}.onnx", threads=1) for g in ("one", "two"))
    (a,), (c,) = one._studio_shared_weights, two._studio_shared_weights
    assert a.shape() == c.shape() == [300, 40]
    va, vc = a.numpy(), c.numpy()
    assert va.ctypes.data == vc.ctypes.data  # one copy in memory: the file's mapping
    (mapping,) = llm_runtime._MAPPINGS.values()
    assert str(mapping.filename) == str((tmp_path / WEIGHTS_FILE).resolve())
    assert 0 <= va.ctypes.data - mapping.ctypes.data < mapping.size
    for sess, name, bias in ((one, "one", b), (two, "two", b + 1)):
        opts = ort.SessionOptions()  # ONNX Runtime mapping the file itself, as many threads
        opts.intra_op_num_threads = 1
        opts.add_session_config_entry("session.disable_prepacking", "1")
        plain = ort.InferenceSession(str(tmp_path / f"{name}.onnx"), sess_options=opts,
                                     providers=["CPUExecutionProvider"])
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])
        np.testing.assert_allclose(got, x @ w + bias, atol=1e-4)
