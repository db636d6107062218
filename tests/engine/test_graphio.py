"""Quantized graph I/O on real quantized graphs (the tiny Qwen, W8A16, ONNX Runtime on the
host): the edge Q/DQ pairs cut, one encoding per cache tensor across the graphs, and a host
runtime that keeps the cache as the integers the graphs give and reads the logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from studio.core.errors import StudioError
from studio.engine.graphio import (
    IO_ENCODINGS_FILE,
    EncodedSession,
    dequantize,
    encoded,
    quantize,
    quantize_io,
    union,
)
from studio.engine.llm_runtime import cpu_generator, make_cpu_session

GRAPHS = ("prefill", "decode")


@pytest.fixture(scope="module")
def io_graphs(tmp_path_factory, w8a16):
    src = w8a16[0]
    out = tmp_path_factory.mktemp("w8a16-io")
    got = quantize_io(src, out, GRAPHS)
    assert (out / "graph.json").read_bytes() == (src / "graph.json").read_bytes()  # linked
    assert not (out / "verify.onnx").exists()  # a graph it did not cut stays out
    return src, out, got


def _types(path: Path) -> dict[str, int]:
    g = onnx.load(str(path), load_external_data=False).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output]}


def _qdq_pairs(path: Path) -> dict[str, tuple[float, int]]:
    """The (scale, zero point) of the Q/DQ pair at each float edge of a QDQ graph."""
    from onnx import numpy_helper

    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    out = {}
    for n in g.node:
        if n.op_type == "QuantizeLinear" and any(n.input[0] == i.name for i in g.input):
            out[n.input[0]] = (float(inits[n.input[1]]), int(inits[n.input[2]]))
        if n.op_type == "DequantizeLinear" and any(n.output[0] == o.name for o in g.output):
            out[n.output[0]] = (float(inits[n.input[1]]), int(inits[n.input[2]]))
    return out


def test_the_edges_become_the_integers_the_graph_computes_with(io_graphs):
    src, out, got = io_graphs
    u16 = onnx.TensorProto.UINT16
    for g in GRAPHS:
        types = _types(out / f"{g}.onnx")
        assert types["input_ids"] == types["position_ids"] == onnx.TensorProto.INT64  # untouched
        assert types["attention_mask"] == u16 and types["logits"] == u16
        assert all(t == u16 for n, t in types.items() if n.startswith(("past_", "present_")))
        # nothing left of the edge pairs: no input feeds a QuantizeLinear, no output comes
        # out of a DequantizeLinear
        assert _qdq_pairs(out / f"{g}.onnx") == {}
        assert set(got["graphs"][g]) == {n for n, t in types.items() if t == u16}
    assert json.loads((out / IO_ENCODINGS_FILE).read_text())["graphs"] == got["graphs"]


def test_each_cache_tensor_has_one_encoding_covering_what_it_was_calibrated_for(io_graphs):
    src, _out, got = io_graphs
    pre, dec = got["graphs"]["prefill"], got["graphs"]["decode"]
    before = {g: _qdq_pairs(src / f"{g}.onnx") for g in GRAPHS}
    layers = sum(1 for n in dec if n.startswith("past_key_"))
    assert layers >= 2
    for i in range(layers):
        for t in ("key", "value"):
            enc = dec[f"past_{t}_{i}"]
            assert dec[f"present_{t}_{i}"] == pre[f"present_{t}_{i}"] == enc
            # the union range holds every range the quantizer had calibrated
            lo, hi = enc["scale"] * (0 - enc["zero_point"]), enc["scale"] * (65535 - enc["zero_point"])
            for g, name in (("decode", f"past_{t}_{i}"), ("decode", f"present_{t}_{i}"),
                            ("prefill", f"present_{t}_{i}")):
                s, z = before[g][name]  # (within the one step the rounded zero point moves)
                step = enc["scale"]
                assert lo <= s * (0 - z) + step and s * (65535 - z) <= hi + step
    # the mask and the logits keep each graph's own encoding
    assert pre["attention_mask"] == {"dtype": "uint16", "scale": before["prefill"]["attention_mask"][0],
                                     "zero_point": before["prefill"]["attention_mask"][1]}


def test_the_host_runtime_keeps_the_cache_as_integers_and_gives_the_same_model(io_graphs, corpus):
    from transformers import AutoTokenizer

    src, out, _ = io_graphs
    spec = json.loads((src / "graph.json").read_text())
    plain, io = cpu_generator(src, spec), cpu_generator(out, spec)  # the host's own runtime
    assert all(k.dtype == np.uint16 for pair in io.cache for k in pair)  # half of float32
    assert all(k.dtype == np.float32 for pair in plain.cache for k in pair)
    tok = AutoTokenizer.from_pretrained(str(src / "tokenizer")) if (src / "tokenizer").is_dir() \
        else None
    ids = (tok(corpus).input_ids if tok is not None else list(range(3, 200)))[:48]
    a = plain.teacher_forced_logits(ids)
    b = io.teacher_forced_logits(ids)
    cos = float(np.mean([np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))
                         for x, y in zip(a, b, strict=True)]))
    top1 = float(np.mean(a.argmax(-1) == b.argmax(-1)))
    # the same arithmetic inside; only the cache encoding is the union of two ranges
    assert cos > 0.999 and top1 >= 0.9, (cos, top1)
    print(f"\nquantized I/O vs the QDQ graphs on the host: cosine {cos:.6f}, top-1 {top1:.3f}")


def test_a_float_graph_or_a_corrupt_one_is_refused_in_one_line(tmp_path, qwen_graphs, w8a16):
    with pytest.raises(StudioError, match="no quantized edge") as e:
        quantize_io(qwen_graphs[0], tmp_path / "f", GRAPHS)
    assert "\n" not in e.value.message
    bad = tmp_path / "bad"
    bad.mkdir()
    for g in GRAPHS:
        (bad / f"{g}.onnx").write_bytes(b"not a model")
    with pytest.raises(StudioError, match="re-run the quantize stage"):
        quantize_io(bad, tmp_path / "b", GRAPHS)


def test_encodings_round_trip_and_the_union_of_two_ranges():
    enc = {"dtype": "uint16", "scale": 0.001, "zero_point": 30000}
    x = np.linspace(-30.0, 35.0, 101, dtype=np.float32)
    q = quantize(x, enc)
    assert q.dtype == np.uint16
    assert np.abs(dequantize(q, enc) - x).max() <= 0.0005 + 1e-6
    a = {"dtype": "uint16", "scale": 0.001, "zero_point": 0}       # [0, 65.5]
    b = {"dtype": "uint16", "scale": 0.002, "zero_point": 65535}   # [-131, 0]
    u = union([a, b])
    lo, hi = u["scale"] * -u["zero_point"], u["scale"] * (65535 - u["zero_point"])
    assert lo <= -131.0 + 1e-3 and hi >= 65.5 - 1e-3
    with pytest.raises(StudioError, match="same activation bits"):
        union([a, {"dtype": "uint8", "scale": 0.1, "zero_point": 128}])


def test_a_session_quantizes_float_feeds_and_passes_integers(io_graphs):
    _src, out, got = io_graphs
    sess = encoded(make_cpu_session(out / "decode.onnx"), out, "decode")
    assert isinstance(sess, EncodedSession)
    seen = {}

    class Spy:
        def run(self, names, feeds, run_options=None):
            seen.update(feeds)
            return [np.zeros((1, 1, 4), np.uint16) + 7 for _ in names]

        def get_outputs(self):
            return []

    spy = EncodedSession(Spy(), got["graphs"]["decode"])
    cache = np.full((1, 2, 3, 4), 5, np.uint16)
    logits, row = spy.run(["logits", "present_key_0"],
                          {"attention_mask": np.zeros((1, 1, 1, 3), np.float32),
                           "past_key_0": cache})
    assert seen["attention_mask"].dtype == np.uint16 and seen["past_key_0"] is cache
    assert logits.dtype == np.float32 and row.dtype == np.uint16
    assert encoded(make_cpu_session(out / "decode.onnx"), out.parent, "decode").__class__ \
        is not EncodedSession  # a folder with no encodings: the plain session
