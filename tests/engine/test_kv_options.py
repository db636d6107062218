"""KV cache options on the real sample export: INT8 KV (uint8 cache I/O) and the sliding
window (a ring buffer over the C slots), checked against transformers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from studio.core.errors import StudioError
from studio.engine.kvquant import (
    KV_SCALES_FILE,
    calibrate_kv_scales,
    int8_kv_model,
    kv_bytes,
    write_int8_kv_graphs,
)
from studio.engine.llm_runtime import cpu_generator
from studio.worker.stages.validate import nll


@pytest.fixture(scope="module")
def tokenizer(sample_model_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(sample_model_dir))


@pytest.fixture(scope="module")
def heldout_ids(tokenizer, sample_data_dir):
    return tokenizer((sample_data_dir / "heldout.py.txt").read_text()).input_ids


@pytest.fixture(scope="module")
def int8_graphs(tmp_path_factory, tiny_coder_graphs, tokenizer, sample_data_dir):
    src, spec = tiny_coder_graphs
    out = tmp_path_factory.mktemp("tiny-coder-kv8")
    calib = tokenizer((sample_data_dir / "calibration.py.txt").read_text()).input_ids
    scales = calibrate_kv_scales(cpu_generator(src, spec), calib)
    write_int8_kv_graphs(src, out, scales)
    for f in src.iterdir():  # graph.json and the rest, as the export wrote them
        if not (out / f.name).exists() and f.is_file():
            shutil.copy(f, out / f.name)
    return out, spec, scales


def _ppl(gen, ids, window):
    total = n = 0.0
    for start in range(0, len(ids) - window + 1, window):
        chunk = ids[start:start + window]
        a, b = nll(gen.teacher_forced_logits(chunk), chunk)
        total, n = total + a, n + b
    return float(np.exp(total / n))


@pytest.mark.slow
def test_int8_kv_halves_a_16_bit_cache_and_keeps_the_model(tiny_coder_graphs, int8_graphs,
                                                          heldout_ids, tokenizer):
    src, spec = tiny_coder_graphs
    out, _, scales = int8_graphs
    fp = cpu_generator(src, spec)
    q = cpu_generator(out, spec)
    assert q.cache[0][0].dtype == np.uint8
    measured = sum(a.nbytes for pair in q.cache for a in pair)
    assert measured == kv_bytes(spec, 8) == kv_bytes(spec, 16) // 2 == kv_bytes(spec, 32) // 4
    assert sum(a.nbytes for pair in fp.cache for a in pair) == kv_bytes(spec, 32)
    # per-head scales: one per KV head, and they differ between heads
    assert all(len(v) == spec["num_kv_heads"] for v in scales.values())
    assert any(len(set(v)) > 1 for v in scales.values())
    saved = json.loads((out / KV_SCALES_FILE).read_text())
    assert saved["granularity"] == "per_head" and saved["zero_point"] == 128
    C = spec["context_length"]
    ids = heldout_ids[:2 * C]
    p_fp, p_q = _ppl(fp, ids, C), _ppl(q, ids, C)
    assert abs(p_q / p_fp - 1) < 0.01, (p_fp, p_q)
    prompt = tokenizer("def fibonacci(n):").input_ids
    a = fp.generate(prompt, 32)["tokens"]
    b = q.generate(prompt, 32)["tokens"]
    assert sum(x == y for x, y in zip(a, b, strict=True)) >= 30


def test_int8_kv_for_the_htp_is_per_tensor_and_refuses_a_second_edit(tiny_coder_graphs,
                                                                    int8_graphs, tmp_path):
    src, _ = tiny_coder_graphs
    _, _, scales = int8_graphs
    write_int8_kv_graphs(src, tmp_path, scales, graphs=("decode",), per_head=False)
    model = onnx.load(str(tmp_path / "decode.onnx"))
    kv_nodes = [n for n in model.graph.node if "_kv8_" in n.name]
    assert kv_nodes and all(not n.attribute for n in kv_nodes)  # no axis: per tensor
    uint8 = onnx.TensorProto.UINT8
    assert all(i.type.tensor_type.elem_type == uint8
               for i in model.graph.input if i.name.startswith("past_"))
    assert all(o.type.tensor_type.elem_type == uint8
               for o in model.graph.output if o.name.startswith("present_"))
    with pytest.raises(StudioError, match="already INT8 KV"):
        int8_kv_model(model, scales)


def test_sliding_window_ring_buffer_matches_transformers_past_the_context(
        tiny_coder_graphs, sample_model_dir, heldout_ids):
    """With a window W, a ring buffer of C slots runs to 2.5 x C tokens and every position's
    logits match transformers' own sliding-window attention over the whole sequence."""
    import torch
    from transformers import AutoModelForCausalLM

    src, spec = tiny_coder_graphs
    C, P, W = spec["context_length"], spec["prompt_length"], 32
    n = int(2.5 * C)
    assert spec["rope_positions"] >= n
    ids = heldout_ids[:n]
    gen = cpu_generator(src, spec)
    gen.set_window(W)
    rows = list(gen.prefill(ids[:P]))
    rows += [gen.step(ids[p], p) for p in range(P, n)]
    ours = np.stack(rows)

    model = AutoModelForCausalLM.from_pretrained(str(sample_model_dir),
                                                 attn_implementation="eager")
    with torch.no_grad():
        full = model(torch.tensor([ids])).logits[0].numpy()
    cfg = model.config
    cfg.sliding_window, cfg.use_sliding_window, cfg.max_window_layers = W, True, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    model.model.has_sliding_layers = True
    for layer in model.model.layers:
        layer.attention_type = "sliding_attention"
        layer.self_attn.sliding_window = W
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() < 1e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    assert np.abs(full - ref)[W + 1:].max() > 0.1  # the window really changes the logits


def test_window_generation_runs_past_the_cache_and_stops_at_the_rope_table(tiny_coder_graphs,
                                                                          tokenizer):
    src, spec = tiny_coder_graphs
    gen = cpu_generator(src, spec)
    prompt = tokenizer("class Stack:\n    def __init__(self):").input_ids
    plain = gen.generate(prompt, 4 * spec["context_length"])
    assert plain["stopped"] in ("context_full", "eos")
    gen.set_window(spec["context_length"])
    out = gen.generate(prompt, spec["rope_positions"])
    if out["stopped"] != "eos":
        assert out["stopped"] == "context_full"
        assert len(prompt) + len(out["tokens"]) - 1 == spec["rope_positions"]
    with pytest.raises(StudioError, match="window must be 1..128"):
        gen.set_window(spec["context_length"] + 1)
