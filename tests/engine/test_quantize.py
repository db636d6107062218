"""Calibration data and QDQ quantization of the tiny exported graphs (real ORT, no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import Cancelled, StudioError
from studio.core.progress import RecordingProgress

SAMPLES = 4


def _cos(a, b) -> float:
    return float(((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).mean())


def _text_ids(folder: Path, text: str, n: int) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids[:n]


def _generator(folder: Path, spec: dict):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    return StaticKVGenerator(
        make_cpu_session(folder / "prefill.onnx"), make_cpu_session(folder / "decode.onnx"), spec
    )


def _qparams(model) -> dict[str, tuple[str, int | None, tuple]]:
    """Tensor name -> (zero-point dtype, axis, scale shape) for every QuantizeLinear/DequantizeLinear."""
    import onnx

    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 3:
            continue
        zp, scale = inits.get(n.input[2]), inits.get(n.input[1])
        if zp is None:
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), None)
        if n.op_type == "QuantizeLinear":  # graph outputs: <name>_QuantizeLinear_Input
            name = n.input[0].removesuffix("_QuantizeLinear_Input")
        elif n.input[0] in inits:  # a weight: <name>_quantized
            name = n.input[0].removesuffix("_quantized")
        else:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(zp.data_type).name
        out[name] = (dtype, axis if len(scale.dims) else None, tuple(scale.dims))
    return out


def test_calibration_windows(tiny_qwen_dir, corpus):
    from studio.engine.calibration import calibration_windows, load_tokenizer

    ids = load_tokenizer(tiny_qwen_dir).encode(corpus, add_special_tokens=False).ids
    wins = calibration_windows(corpus, tiny_qwen_dir, 50, 5)
    assert len(wins) == 5 and all(len(w) == 50 for w in wins)
    assert wins[0] == ids[:50] and wins[-1] == ids[-50:]  # evenly spaced, first to last
    span = len(ids) - 50
    assert wins == [ids[round(i * span / 4) : round(i * span / 4) + 50] for i in range(5)]
    assert calibration_windows(corpus, tiny_qwen_dir, 50, 1) == [ids[:50]]

    short = "def f(x):\n    return x\n"
    n = len(load_tokenizer(tiny_qwen_dir).encode(short).ids)
    with pytest.raises(StudioError, match="longer calibration text"):
        calibration_windows(short, tiny_qwen_dir, 64, 2)
    assert [len(w) for w in calibration_windows(short, tiny_qwen_dir, 64, 2, min_length=2)] == [
        n,
        n,
    ]
    with pytest.raises(StudioError, match="empty"):
        calibration_windows("  \n", tiny_qwen_dir, 8, 2)
    with pytest.raises(StudioError, match="tokenizer.json"):
        calibration_windows(corpus, tiny_qwen_dir / "nope", 8, 2)


def test_calibration_feeds_carry_real_kv_caches(qwen_graphs, qwen_generator, tiny_qwen_dir, corpus):
    from studio.engine.calibration import build_calibration_feeds, calibration_windows
    from studio.engine.llm_runtime import make_cpu_session

    graphs, spec = qwen_graphs
    P, C = spec["prompt_length"], spec["context_length"]
    wins = calibration_windows(corpus, tiny_qwen_dir, C, 4)
    pre, dec = build_calibration_feeds(graphs, spec, wins, RecordingProgress(), decode_per_window=3)
    assert len(pre) == 4 and len(dec) == 12
    # Full and shorter (padded) prompts.
    real = [int((f["attention_mask"][0, 0, -1] == 0).sum()) for f in pre]
    assert real[0] == P and min(real) < P
    positions = sorted(int(f["position_ids"][0, 0]) for f in dec)
    assert positions[0] < P and positions[-1] > C // 2  # spread over the context
    # A decode feed is the state of real decoding: running it gives the teacher-forced logits.
    sess = make_cpu_session(graphs / "decode.onnx")
    for f in (dec[0], dec[-1]):
        pos = int(f["position_ids"][0, 0])
        window = next(w for w in wins if w[pos] == int(f["input_ids"][0, 0]))
        want = qwen_generator.teacher_forced_logits(window[: pos + 1])[pos]
        got = sess.run(["logits"], f)[0][0, -1]
        np.testing.assert_allclose(got, want, atol=1e-4)
        assert not f["past_key_0"][:, :, pos:].any() and f["past_key_0"][:, :, :pos].any()
        assert (f["attention_mask"][0, 0, 0, :pos] == 0).all() and f["attention_mask"][
            0, 0, 0, -1
        ] == 0


def test_w8a16_writes_qdq_graphs_close_to_fp32(
    w8a16, qwen_graphs, qwen_generator, tiny_qwen_dir, corpus
):
    import onnx

    out, info, prog = w8a16
    graphs, spec = qwen_graphs
    assert sorted(p.name for p in out.iterdir()) == [
        "decode.onnx",
        "graph.json",
        "prefill.onnx",
        "quant.json",
    ]
    assert json.loads((out / "quant.json").read_text()) == info
    qspec = json.loads((out / "graph.json").read_text())
    assert qspec["quantization"]["scheme"] == "W8A16" and qspec["num_layers"] == spec["num_layers"]
    assert (
        info["calibration"]["windows"] == SAMPLES
        and info["calibration"]["decode_feeds"] == 4 * SAMPLES
    )
    for g in ("prefill", "decode"):
        # activations x activations 16x16 (attention), activations x weights 16x8
        assert set(info["graphs"][g]["matmul_precisions"]) == {"16x16", "16x8w"}
        model = onnx.load(str(out / f"{g}.onnx"))
        q = _qparams(model)
        assert q["model.layers.0.mlp.up_proj.weight"] == ("uint8", None, ())
        assert q["attention_mask"][0] == "uint16" and q["logits"][0] == "uint16"
        assert {i.name: i.type.tensor_type.elem_type for i in model.graph.input}[
            "attention_mask"
        ] == 1  # float edges
    assert (
        any("quantized decode.onnx" in line for line in prog.lines) and prog.updates[-1][0] == 1.0
    )
    assert info["check"]["decode_logits_cosine"] > 0.99

    # A random model with large weights is rough on 8-bit weights; a trained one does far better.
    gen = _generator(out, qspec)
    ids = _text_ids(tiny_qwen_dir, corpus[5000:], 40)
    ref, got = qwen_generator.teacher_forced_logits(ids), gen.teacher_forced_logits(ids)
    assert _cos(ref, got) > 0.97
    assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.6
    assert len(gen.greedy(ids[:10], 8)["tokens"]) == 8


def test_w8a8_per_channel_with_a_16_bit_layer(
    tmp_path, qwen_graphs, tiny_qwen_dir, corpus, qwen_generator
):
    import onnx

    from studio.engine.quantize import quantize_llm

    graphs, spec = qwen_graphs
    recipe = {
        "scheme": "W8A8",
        "weight_granularity": "per_channel",
        "samples": 2,
        "overrides": {"model.layers.1": "INT16"},
    }
    info = quantize_llm(graphs, tmp_path, recipe, corpus, tiny_qwen_dir)
    dec = info["graphs"]["decode"]
    assert dec["per_channel_weights"] == 15  # 7 per layer + lm_head
    assert dec["matmul_precisions"] == {"16x16": 2, "16x8w": 7, "8x8": 2, "8x8w": 8}
    covered = dec["patterns"]["model.layers.1"]
    assert (
        covered["precision"] == "INT16"
        and "/model/layers.1/mlp/down_proj/MatMul_output_0" in covered["tensors"]
    )
    assert not any("layers.0" in t for t in covered["tensors"])
    q = _qparams(onnx.load(str(tmp_path / "decode.onnx")))
    assert q["model.layers.0.mlp.up_proj.weight"] == ("int8", 1, (128,))  # per output channel
    assert q["lm_head.weight"] == ("int8", 1, (256,))
    assert q["/model/layers.1/mlp/down_proj/MatMul_output_0"][0] == "uint16"
    assert q["/model/layers.0/mlp/down_proj/MatMul_output_0"][0] == "uint8"
    # 8-bit activations on a random large-weight model are rough: only a sanity bound here.
    ids = _text_ids(tiny_qwen_dir, corpus[5000:], 40)
    assert (
        _cos(
            qwen_generator.teacher_forced_logits(ids),
            _generator(tmp_path, spec).teacher_forced_logits(ids),
        )
        > 0.7
    )


def test_override_patterns_resolve_to_tensors(qwen_graphs):
    from studio.engine.quant_recipe import check_overrides

    recipe = {
        "scheme": "W8A8",
        "overrides": {
            "layers.1": "INT16",  # a layer, leading "model." left out
            "layers.0.*.down_proj.weight": "INT16",  # weights only: W16 under A8 runs on the HTP
            "mlp.gate_proj": "INT4",
            "/lm_head/MatMul": "FP16",  # an ONNX node name
        },
    }
    res = check_overrides(qwen_graphs[0], recipe)["decode"]
    pats, inits = res["patterns"], res["init_overrides"]
    assert pats["layers.1"]["nodes"] > 50
    assert all("/model/layers.1/" in t or t.endswith("_1") for t in pats["layers.1"]["tensors"])
    assert {"present_key_1", "present_value_1"} <= set(pats["layers.1"]["tensors"])
    assert pats["layers.0.*.down_proj.weight"]["tensors"] == ["model.layers.0.mlp.down_proj.weight"]
    assert inits["model.layers.0.mlp.down_proj.weight"][0]["quant_type"].name == "QUInt16"
    assert inits["model.layers.1.mlp.gate_proj.weight"][0]["quant_type"].name == "QInt4"
    assert inits["model.layers.1.mlp.gate_proj.weight"][0]["axis"] == 1
    assert res["nodes_to_exclude"] == ["/lm_head/MatMul"]
    # The same weight under the 16-bit layer 1 is refused: the HTP MatMul has no 16x16-bit weights.
    recipe["overrides"]["*.down_proj.weight"] = "INT16"
    with pytest.raises(StudioError, match="16-bit under 16-bit activations"):
        check_overrides(qwen_graphs[0], recipe)
    assert inits["/model/layers.1/mlp/down_proj/MatMul_output_0"][0]["quant_type"].name == "QUInt16"


def test_fp16_copies_the_float_graphs(tmp_path, qwen_graphs, tiny_qwen_dir):
    from studio.engine.quantize import quantize_llm

    graphs, _ = qwen_graphs
    info = quantize_llm(graphs, tmp_path, {"scheme": "FP16"}, "", tiny_qwen_dir)
    assert info["scheme"] == "FP16" and "enable_htp_fp16_precision" in info["note"]
    for g in ("prefill.onnx", "decode.onnx"):
        assert (tmp_path / g).read_bytes() == (graphs / g).read_bytes()
    assert json.loads((tmp_path / "graph.json").read_text())["quantization"]["scheme"] == "FP16"


@pytest.mark.parametrize(
    ("recipe", "match"),
    [
        ({"scheme": "W4A4"}, "unknown quantization scheme"),
        ({"scheme": "W8A8", "weight_granularity": "per_row"}, "weight granularity"),
        ({"scheme": "W8A8", "weight_granularity": "per_block"}, "4-bit"),
        ({"scheme": "W8A8", "calibration_method": "Median"}, "calibration method"),
        ({"scheme": "W8A8", "samples": 0}, "samples"),
        ({"scheme": "W8A8", "bits": 3}, "unknown quantization setting"),
        ({"scheme": "W8A8", "overrides": {"model.layers.0": "INT3"}}, "unknown precision"),
        ({"scheme": "W8A8", "overrides": {"decoder.block.*": "INT16"}}, "matches no node"),
        (
            {"scheme": "W8A16", "overrides": {"model.layers.0.mlp.down_proj.weight": "INT16"}},
            "16-bit under 16-bit activations",
        ),
    ],
)
def test_bad_recipes_fail_fast(tmp_path, qwen_graphs, tiny_qwen_dir, corpus, recipe, match):
    from studio.engine.quantize import quantize_llm

    with pytest.raises(StudioError, match=match):
        quantize_llm(qwen_graphs[0], tmp_path / "q", recipe, corpus, tiny_qwen_dir)
    assert not (tmp_path / "q" / "quant.json").exists()


def test_bad_inputs(tmp_path, qwen_graphs, w8a16, tiny_qwen_dir, corpus):
    from studio.engine.quantize import quantize_llm

    recipe = {"scheme": "W8A16", "samples": 1}
    with pytest.raises(StudioError, match="no graph.json"):
        quantize_llm(tmp_path, tmp_path / "q", recipe, corpus, tiny_qwen_dir)
    with pytest.raises(StudioError, match="already-quantized"):
        quantize_llm(w8a16[0], tmp_path / "q", recipe, corpus, tiny_qwen_dir)
    with pytest.raises(StudioError, match="empty"):
        quantize_llm(qwen_graphs[0], tmp_path / "q", recipe, " ", tiny_qwen_dir)
    with pytest.raises(StudioError, match="longer calibration text"):
        quantize_llm(qwen_graphs[0], tmp_path / "q", recipe, "x = 1\n", tiny_qwen_dir)


def test_cancel_during_calibration(tmp_path, qwen_graphs, tiny_qwen_dir, corpus):
    from studio.engine.quantize import quantize_llm

    with pytest.raises(Cancelled):
        quantize_llm(
            qwen_graphs[0],
            tmp_path,
            {"scheme": "W8A8", "samples": 2},
            corpus,
            tiny_qwen_dir,
            RecordingProgress(cancel_after=12),
        )
    assert not (tmp_path / "quant.json").exists() and not [
        p for p in tmp_path.iterdir() if p.name.startswith(".")
    ]


@pytest.mark.slow
def test_sample_model_w8a16_close_to_fp32(
    tmp_path, tiny_coder_graphs, sample_model_dir, sample_data_dir
):
    """W8A16 (per channel, the project default) of the trained sample model on held-out text."""
    from studio.engine.calibration import load_tokenizer
    from studio.engine.quantize import quantize_llm

    graphs, spec = tiny_coder_graphs
    calib = (sample_data_dir / "calibration.py.txt").read_text(encoding="utf-8")
    recipe = {"scheme": "W8A16", "weight_granularity": "per_channel", "samples": 4}
    quantize_llm(graphs, tmp_path, recipe, calib, sample_model_dir)
    ids = (
        load_tokenizer(sample_model_dir)
        .encode((sample_data_dir / "heldout.py.txt").read_text())
        .ids
    )
    fp32, qdq = _generator(graphs, spec), _generator(tmp_path, spec)
    cos, top1 = [], []
    for start in range(0, 4 * 1000, 1000):
        w = ids[start : start + 128]
        a, b = fp32.teacher_forced_logits(w), qdq.teacher_forced_logits(w)
        cos.append(_cos(a, b))
        top1.append((a.argmax(-1) == b.argmax(-1)).mean())
    assert np.mean(cos) > 0.999 and np.mean(top1) > 0.9


@pytest.mark.parametrize("granularity", ["per_channel", "per_block"])
def test_w4a16_gives_4_bit_weights_per_channel_or_block_wise(
    tmp_path, qwen_graphs, qwen_generator, tiny_qwen_dir, corpus, granularity
):
    import onnx

    from studio.engine import qnn
    from studio.engine.quantize import quantize_llm

    graphs, spec = qwen_graphs
    recipe = {"scheme": "W4A16", "weight_granularity": granularity, "samples": 2,
              "block_size": 32}
    info = quantize_llm(graphs, tmp_path, recipe, corpus, tiny_qwen_dir)
    assert info["graphs"]["decode"]["matmul_precisions"]["16x4w"] > 0
    assert "16x8w" not in info["graphs"]["decode"]["matmul_precisions"]
    assert {r["weight"] for r in info["layers"] if r["weight"]} == {"INT4"}
    assert {r["activation"] for r in info["layers"]} == {"INT16"}
    points = [r for r in info["layers"] if not r["weight"]]  # scores, softmax, residual
    assert points and {r["layer"].rsplit(".", 1)[-1] for r in points} == {
        "scores", "softmax", "residual"}
    model = onnx.load(str(tmp_path / "decode.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] == "model.layers.0.mlp.up_proj.weight_quantized")
    attrs = {a.name: a.i for a in dq.attribute}
    scale = inits[dq.input[1]]
    if granularity == "per_block":
        # [in 64, out 128] weight, blocks of 32 along the input axis: a [2, 128] scale
        assert attrs.get("block_size") == 32 and attrs.get("axis") == 0
        assert list(scale.dims) == [2, 128]
    else:
        assert attrs.get("axis") == 1 and list(scale.dims) == [128]
    # 4-bit weights of a random model are rough, but not noise
    gen = _generator(tmp_path, json.loads((tmp_path / "graph.json").read_text()))
    ids = _text_ids(tiny_qwen_dir, corpus[5000:], 40)
    assert _cos(qwen_generator.teacher_forced_logits(ids), gen.teacher_forced_logits(ids)) > 0.8
    # every node stays on the HTP (block-wise weights with the HTP's block-quant option)
    extra = ({"enable_block_quant_weight_optimization": "1"} if granularity == "per_block"
             else {})
    rep = qnn.placement_report(tmp_path / "decode.onnx", "snapdragon-8-gen-3",
                               extra_options=extra)
    assert rep["all_on_npu"], rep["cpu_nodes"][:5]


@pytest.mark.slow
def test_encodings_round_trip_through_the_recipe(tmp_path, qwen_graphs, tiny_qwen_dir, corpus):
    from studio.engine.encodings import encodings_to_overrides, export_encodings, read_encodings
    from studio.engine.quantize import quantize_llm

    graphs, _ = qwen_graphs
    recipe = {"scheme": "W8A8", "weight_granularity": "per_channel", "samples": 2,
              "overrides": {"*.down_proj": "INT16", "model.layers.1.mlp.up_proj.weight": "INT16",
                            "model.layers.0.self_attn.q_proj.weight": "INT4"}}
    quantize_llm(graphs, tmp_path / "a", recipe, corpus, tiny_qwen_dir)
    enc = export_encodings(tmp_path / "a" / "decode.onnx")
    # the QNN / AIMET legacy format: the published schema, then fields and types per entry
    from studio.engine.encodings import schema_problem

    assert enc["version"] == "0.6.1"
    assert schema_problem(enc) is None
    for section in ("activation_encodings", "param_encodings"):
        assert enc[section]
        for name, entries in enc[section].items():
            assert isinstance(entries, list) and entries, name
            for e in entries:
                assert {"bitwidth", "dtype", "is_symmetric", "scale", "offset", "min",
                        "max"} <= set(e)
                assert e["dtype"] == "int" and e["is_symmetric"] in ("True", "False")
                assert e["min"] <= 0 <= e["max"] and e["scale"] > 0
    p = enc["param_encodings"]
    assert p["model.layers.1.mlp.up_proj.weight"][0]["bitwidth"] == 16
    assert p["model.layers.0.self_attn.q_proj.weight"][0]["bitwidth"] == 4
    assert p["model.layers.0.mlp.gate_proj.weight"][0]["bitwidth"] == 8
    sym8 = p["model.layers.0.mlp.gate_proj.weight"][0]
    assert sym8["is_symmetric"] == "True" and sym8["offset"] == -128  # AIMET's convention
    assert enc["activation_encodings"]["/model/layers.0/mlp/down_proj/MatMul_output_0"][0][
        "bitwidth"] == 16
    # written out and read back: the same bitwidths; as recipe overrides on a plain W8A8
    # recipe, a second quantization reproduces every tensor's precision
    out = tmp_path / "enc.json"
    out.write_text(json.dumps(enc))
    acts, params = read_encodings(out)
    overrides, unnamed = encodings_to_overrides(out, graphs / "decode.onnx", "W8A8")
    assert unnamed == []
    again = dict(recipe, overrides=overrides)
    quantize_llm(graphs, tmp_path / "b", again, corpus, tiny_qwen_dir)
    acts_b, params_b = read_encodings_from_model(tmp_path / "b" / "decode.onnx", tmp_path)
    assert params_b == params  # every weight
    # every layer output a rule names (the MatMuls); where precisions meet, the quantizer's
    # own converts may sit on either side of the boundary, which no recipe rule expresses
    matmul_outs = {k for k in acts if k.endswith("MatMul_output_0")}
    assert len(matmul_outs) > 10
    assert {k: acts_b[k] for k in matmul_outs} == {k: acts[k] for k in matmul_outs}


def read_encodings_from_model(model, tmp_path):
    from studio.engine.encodings import read_encodings, write_encodings

    write_encodings(model, tmp_path / "b.json")
    return read_encodings(tmp_path / "b.json")


def test_the_encodings_schema_refuses_what_the_published_format_does_not_allow(tmp_path):
    """The schema (written from AIMET's encoding format specification) catches the mistakes
    that make QNN's converter refuse a file; import names the first one in a line."""
    from studio.core.errors import StudioError
    from studio.engine.encodings import read_encodings, schema_problem

    good = {"bitwidth": 8, "dtype": "int", "is_symmetric": "False", "scale": 0.01,
            "offset": -114, "min": -1.14, "max": 1.41}
    assert schema_problem({"version": "0.6.1", "activation_encodings": {"x": [good]}}) is None
    assert schema_problem({"version": "0.6.1", "param_encodings": {
        "w": [{"dtype": "float", "bitwidth": 16}]}}) is None
    bad = {
        "is_symmetric as a bool": dict(good, is_symmetric=False),
        "bitwidth below 4": dict(good, bitwidth=2),
        "a fractional offset": dict(good, offset=-114.5),
        "a zero scale": dict(good, scale=0.0),
        "no scale": {k: v for k, v in good.items() if k != "scale"},
        "an unknown field": dict(good, block_size=64),
    }
    for why, entry in bad.items():
        data = {"version": "0.6.1", "activation_encodings": {"x": [entry]}}
        assert schema_problem(data), why
        f = tmp_path / "bad.json"
        f.write_text(json.dumps(data))
        with pytest.raises(StudioError) as err:
            read_encodings(f)
        msg = str(err.value)
        assert "\n" not in msg and "does not follow the QNN encodings format" in msg, why
        assert "activation_encodings/x/0" in msg, msg
    assert schema_problem({"version": "0.6.1", "activation_encodings": {"x": []}})
    assert schema_problem({"version": "0.6.1", "activation_encodings": {}, "extra": 1})


def test_the_mapped_calibration_gives_onnx_runtimes_own_ranges(
        tmp_path, qwen_graphs, tiny_qwen_dir, corpus):
    """The ranges computed over the graph's structure (no copy of its weights) are those
    ONNX Runtime's quantizer calibrates itself: the same tensors, the same min / max."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.calibrate import create_calibrator, load_tensors_data
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from studio.engine.calibration import build_calibration_feeds, calibration_windows
    from studio.engine.qdq import _takes_calibration_cache, calibration_reader, mapped_ranges

    if not _takes_calibration_cache():
        pytest.skip("this ONNX Runtime's quantizer reads no calibration cache")
    graphs, spec = qwen_graphs
    wins = calibration_windows(corpus, tiny_qwen_dir, spec["context_length"], 2)
    pre, _ = build_calibration_feeds(graphs, spec, wins, RecordingProgress(), decode_per_window=1)
    src = tmp_path / "prefill.onnx"
    src.write_bytes((graphs / "prefill.onnx").read_bytes())
    config = get_qnn_qdq_config(onnx.load(str(src)), calibration_reader(pre, RecordingProgress()),
                                calibrate_method=CalibrationMethod.MinMax,
                                activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    mine = load_tensors_data(mapped_ranges(src, config, pre, RecordingProgress())).data
    theirs_cal = create_calibrator(src, config.op_types_to_quantize,
                                   augmented_model_path=str(tmp_path / "aug.onnx"))
    theirs_cal.collect_data(calibration_reader(pre, RecordingProgress()))
    theirs = theirs_cal.compute_data().data
    assert len(mine) > 100 and set(mine) == set(theirs)
    for name, t in theirs.items():
        np.testing.assert_allclose(mine[name].range_value, t.range_value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_one_pass_augmentation_writes_onnx_runtimes_graph(tmp_path, qwen_graphs, per_channel):
    """The calibration graph the studio writes in one pass is ONNX Runtime's own, node for node
    (the same names, inputs and order) and output for output; only the random names of the
    added shape and axes constants differ."""
    import onnx
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    from studio.engine.qdq import augment_min_max

    src = tmp_path / "prefill.onnx"
    src.write_bytes((qwen_graphs[0] / "prefill.onnx").read_bytes())
    graphs = []
    for name, augment in (("ort", MinMaxCalibrater.augment_graph), ("one-pass", augment_min_max)):
        cal = MinMaxCalibrater(src, augmented_model_path=str(tmp_path / f"{name}.onnx"),
                               per_channel=per_channel)
        augment(cal)
        graphs.append(onnx.load(str(tmp_path / f"{name}.onnx")).graph)
    ort_graph, mine = graphs

    def constants(g):  # the added int64 constants, by name (their names are random uuids)
        return {i.name: onnx.numpy_helper.to_array(i).tolist() for i in g.initializer
                if i.name.count("-") == 4}

    def nodes(g):  # each added constant named by its value
        named = {k: f"const{v}" for k, v in constants(g).items()}
        return [(n.op_type, n.name, [named.get(x, x) for x in n.input], list(n.output),
                 [onnx.helper.get_attribute_value(a) for a in n.attribute]) for n in g.node]

    assert len(ort_graph.node) > 2 * len(onnx.load(str(src)).graph.node)
    assert nodes(mine) == nodes(ort_graph)
    assert [(o.name, o.type.tensor_type.elem_type) for o in mine.output] == [
        (o.name, o.type.tensor_type.elem_type) for o in ort_graph.output]
    assert sorted(map(str, constants(mine).values())) == sorted(
        map(str, constants(ort_graph).values()))


def test_the_qnn_preprocessing_runs_only_when_a_fusion_applies(tmp_path, qwen_graphs):
    """The preprocessing's whole-graph session is skipped for a decoder (no fusion of it
    applies) and kept for a graph with an Erf GELU, which it fuses."""
    import onnx
    from onnx import TensorProto, helper

    from studio.engine.qdq import preprocess_fuses

    assert not preprocess_fuses(qwen_graphs[0] / "decode.onnx")
    c = {k: helper.make_tensor(k, TensorProto.FLOAT, [], [v])
         for k, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))}
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    g = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                          list(c.values()))
    path = tmp_path / "gelu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert preprocess_fuses(path)


@pytest.mark.parametrize("recipe", [
    {"scheme": "W8A16", "weight_granularity": "per_tensor"},
    {"scheme": "W4A16", "weight_granularity": "per_channel"},
    {"scheme": "W8A8", "weight_granularity": "per_channel",
     "overrides": {"*layers.0.mlp.down_proj": "INT16", "*.1.mlp.up_proj.weight": "INT4",
                   "*layers.1.self_attn.o_proj": "FP16"}},
    {"scheme": "W4A16", "weight_granularity": "per_block", "block_size": 32},
], ids=["w8a16-tensor", "w4a16-channel", "w8a8-mixed-float", "w4a16-blocks"])
def test_weights_quantized_a_slice_at_a_time_give_onnx_runtimes_graph(
        tmp_path, monkeypatch, qwen_graphs, tiny_qwen_dir, corpus, recipe):
    """The large weights quantized here a slice of rows at a time (the quantizer given
    stand-ins with their minima and maxima) give ONNX Runtime's own QDQ graph byte for byte:
    per tensor, per channel, 4-, 8- and 16-bit weights, a layer left in float; block-wise
    weights stay with the quantizer's own path."""
    import onnx

    from studio.engine import qdq_weights
    from studio.engine.calibration import build_calibration_feeds, calibration_windows
    from studio.engine.qdq import quantize_graph

    graphs, spec = qwen_graphs
    wins = calibration_windows(corpus, tiny_qwen_dir, spec["context_length"], 2)
    pre, _ = build_calibration_feeds(graphs, spec, wins, RecordingProgress(), decode_per_window=1)
    src = tmp_path / "src" / "prefill.onnx"
    src.parent.mkdir()
    onnx.save_model(onnx.load(str(graphs / "prefill.onnx")), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.data", size_threshold=1024)
    before = (src.parent / "weights.data").read_bytes()
    monkeypatch.setattr(qdq_weights, "STREAM_ABOVE", 1 << 40)
    plain = tmp_path / "plain" / "q.onnx"
    plain.parent.mkdir()
    quantize_graph(src, plain, recipe, pre)
    monkeypatch.setattr(qdq_weights, "STREAM_ABOVE", 1)
    monkeypatch.setattr(qdq_weights, "SLICE_BYTES", 4 << 10)  # several slices per weight
    prog = RecordingProgress()
    streamed = tmp_path / "streamed" / "q.onnx"
    streamed.parent.mkdir()
    quantize_graph(src, streamed, recipe, pre, prog)
    logged = " ".join(prog.lines)
    if recipe["weight_granularity"] == "per_block":
        assert "a slice at a time" not in logged
    else:
        n = int(logged.split(" large weights quantized a slice at a time")[0].split()[-1])
        assert n >= 8, logged
    assert "quantizing the whole graph at once" not in logged
    assert streamed.read_bytes() == plain.read_bytes()
    assert (src.parent / "weights.data").read_bytes() == before  # the input is untouched
    assert sorted(p.name for p in streamed.parent.iterdir()) == ["q.onnx"]


def test_the_embedding_table_at_8_bits(tmp_path, qwen_graphs, qwen_generator, tiny_qwen_dir,
                                       corpus):
    """``quantization.embedding = "INT8"``: the token table (a Gather's data, stored at the
    activations' 16 bits by default) at 8 bits, the rest of the recipe as it was; the graph
    stays whole on the HTP and close to FP32."""
    import onnx

    from studio.engine import qnn
    from studio.engine.quant_recipe import embedding_table
    from studio.engine.quantize import quantize_llm

    graphs, _ = qwen_graphs
    table = embedding_table(onnx.load(str(graphs / "decode.onnx"), load_external_data=False))
    assert table == "model.embed_tokens.weight"
    dtypes = {}
    for embedding in ("auto", "INT8"):
        out = tmp_path / embedding
        quantize_llm(graphs, out, {"scheme": "W4A16", "samples": 2, "embedding": embedding},
                     corpus, tiny_qwen_dir)
        model = onnx.load(str(out / "decode.onnx"))
        inits = {t.name: t for t in model.graph.initializer}
        dtypes[embedding] = onnx.helper.tensor_dtype_to_np_dtype(
            inits[table + "_quantized"].data_type).name
        gen = _generator(out, json.loads((out / "graph.json").read_text()))
        ids = _text_ids(tiny_qwen_dir, corpus[5000:], 40)
        assert _cos(qwen_generator.teacher_forced_logits(ids),
                    gen.teacher_forced_logits(ids)) > 0.8
    assert dtypes == {"auto": "uint16", "INT8": "uint8"}
    rep = qnn.placement_report(tmp_path / "INT8" / "decode.onnx", "snapdragon-8-gen-3")
    assert rep["all_on_npu"], rep["cpu_nodes"][:5]
