"""FP32 static-KV export and the host runtime, against transformers itself (no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import Cancelled, StudioError
from studio.core.progress import RecordingProgress

TINY_P, TINY_C = 16, 64  # the qwen_graphs fixture's shapes


def _hf_greedy(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n,
            eos_token_id=eos,
            pad_token_id=1,
        )
    return out[0, len(prompt) :].tolist()


def _prompt(folder: Path, text: str, n: int) -> list[int]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids
    assert len(ids) >= n
    return ids[:n]


def test_export_writes_graphs_spec_and_reference(qwen_graphs):
    import onnx

    out, spec = qwen_graphs
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "decode.onnx",
        "graph.json",
        "prefill.onnx",
        "reference.npz",
        "verify.onnx",
    ]  # no temp files left
    assert json.loads((out / "graph.json").read_text()) == spec
    assert spec["num_layers"] == 2 and spec["num_kv_heads"] == 2 and spec["head_dim"] == 16
    assert (
        spec["vocab_size"] == 256 and spec["prompt_length"] == TINY_P and spec["context_length"] == TINY_C
    )
    assert spec["eos_token_id"] == 0 and spec["pad_token_id"] == 1 and spec["model_type"] == "qwen2"
    check = spec["export_check"]
    assert check["positions"] == TINY_C and check["prefill_positions"] == TINY_P
    assert check["max_abs_logit_diff"] < 1e-4 and check["top1_agreement"] == 1.0
    assert check["first_bad_position"] is None
    assert spec["layer_types"] == ["full_attention"] * 2 and spec["sliding_window"] is None
    assert "prompt_len" not in spec and "context_len" not in spec

    pre = onnx.load(str(out / "prefill.onnx"))
    dec = onnx.load(str(out / "decode.onnx"))
    assert pre.opset_import[0].version == 17

    def shapes(values):
        return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    assert shapes(pre.graph.input) == {
        "input_ids": [1, TINY_P],
        "position_ids": [1, TINY_P],
        "attention_mask": [1, 1, TINY_P, TINY_P],
    }
    assert shapes(pre.graph.output)["logits"] == [1, TINY_P, 256]
    assert shapes(pre.graph.output)["present_value_1"] == [1, 2, TINY_P, 16]
    dec_in = shapes(dec.graph.input)
    assert list(dec_in)[:5] == [
        "input_ids",
        "position_ids",
        "attention_mask",
        "past_key_0",
        "past_value_0",
    ]
    assert dec_in["attention_mask"] == [1, 1, 1, TINY_C + 1]
    assert dec_in["past_key_1"] == [1, 2, TINY_C, 16]
    dec_out = shapes(dec.graph.output)
    assert dec_out["logits"] == [1, 1, 256] and dec_out["present_key_0"] == [1, 2, 1, 16]
    assert spec["graphs"]["decode"]["inputs"][3] == {
        "name": "past_key_0",
        "dtype": "float32",
        "shape": [1, 2, TINY_C, 16],
    }

    # Weights carry their HF names; RoPE is a table, not Sin/Cos of positions.
    inits = {t.name for t in dec.graph.initializer}
    assert {"model.layers.0.mlp.up_proj.weight", "lm_head.weight", "rope_cos", "rope_sin"} <= inits
    ops = {n.op_type for n in dec.graph.node}
    assert "Sin" not in ops and "Cos" not in ops and "Identity" not in ops
    assert any(n.name.startswith("/model/layers.1/self_attn/") for n in dec.graph.node)

    ref = np.load(out / "reference.npz")
    assert ref["logits"].shape == (len(ref["input_ids"]), 256) and len(ref["input_ids"]) > TINY_P


def test_greedy_matches_transformers_generate(qwen_generator, hf_qwen, tiny_qwen_dir, corpus):
    for n in (7, TINY_P):  # a padded prompt and a full one
        prompt = _prompt(tiny_qwen_dir, corpus[1000:], n)
        want = _hf_greedy(hf_qwen, prompt, 32, eos=0)
        got = qwen_generator.greedy(prompt, 32, eos_id=0)
        assert got["tokens"] == want and len(set(want)) > 8  # not a degenerate repeat
        assert got["prefill_s"] > 0 and len(got["step_s"]) == len(want) - 1
    # Without an EOS, the whole budget is used.
    got = qwen_generator.greedy(prompt, 32)
    assert len(got["tokens"]) == 32 and got["stopped"] == "max_new_tokens"
    assert got["tokens"] == _hf_greedy(hf_qwen, prompt, 32, eos=None)


def test_a_prompt_longer_than_the_prefill_graph_is_prefilled_in_chunks(
    qwen_generator, hf_qwen, tiny_qwen_dir, corpus
):
    prompt = _prompt(tiny_qwen_dir, corpus[2000:], TINY_P + 20)  # P=16: 1 + 20 chunks
    want = _hf_greedy(hf_qwen, prompt, 16, eos=None)
    got = qwen_generator.generate(prompt, 16)
    assert got["tokens"] == want and got["prompt_chunks"] == 21
    assert got["ttft_s"] > 0 and len(got["step_s"]) == 15


def test_sampling_and_stop_sequences(qwen_generator, tiny_qwen_dir, corpus):
    from studio.core.sampling import Sampler, SamplingConfig

    prompt = _prompt(tiny_qwen_dir, corpus[1000:], 7)
    cfg = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95, seed=3)
    a = qwen_generator.generate(prompt, 24, sampler=Sampler(cfg))["tokens"]
    b = qwen_generator.generate(prompt, 24, sampler=Sampler(cfg))["tokens"]
    greedy = qwen_generator.generate(prompt, 24)["tokens"]
    assert a == b and a != greedy  # seeded: repeatable, and not the greedy text
    stop_at = greedy[5]
    got = qwen_generator.generate(prompt, 24, stop=lambda toks: toks[-1] == stop_at)
    assert got["stopped"] == "stop" and got["tokens"] == greedy[: greedy.index(stop_at) + 1]


def test_teacher_forced_logits_match_torch(qwen_generator, hf_qwen, tiny_qwen_dir, corpus):
    import torch

    ids = _prompt(tiny_qwen_dir, corpus[3000:], 40)  # prefill 16, then 24 decode steps
    got = qwen_generator.teacher_forced_logits(ids, progress=RecordingProgress())
    with torch.no_grad():
        want = hf_qwen(input_ids=torch.tensor([ids]), use_cache=False).logits[0].numpy()
    assert got.shape == (40, 256) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    short = qwen_generator.teacher_forced_logits(ids[:5])
    np.testing.assert_allclose(short, want[:5], atol=1e-4, rtol=1e-4)


def test_generator_limits_and_progress(qwen_generator):
    with pytest.raises(StudioError, match="KV cache holds"):
        qwen_generator.greedy([5] * TINY_C, 4)
    with pytest.raises(StudioError, match="empty"):
        qwen_generator.greedy([], 4)
    with pytest.raises(StudioError, match="KV cache"):
        qwen_generator.teacher_forced_logits([5] * (TINY_C + 1))
    assert qwen_generator.greedy([5, 6], 0)["tokens"] == []

    # A full cache stops generation: C slots, the first new token needs none.
    out = qwen_generator.greedy(list(range(2, 2 + TINY_P)), 500)
    assert out["stopped"] == "context_full" and len(out["tokens"]) == TINY_C - TINY_P + 1

    seen = []
    prog = RecordingProgress(cancel_after=4)
    with pytest.raises(Cancelled):
        qwen_generator.greedy(
            [5, 6, 7], 30, on_step=lambda i, t: seen.append((i, t)), progress=prog
        )
    assert [i for i, _ in seen] == list(range(len(seen))) and 3 <= len(seen) <= 5


def _retype_edges(src: Path, dst: Path) -> None:
    """A real graph edit: int32 positions, float16 mask and KV cache at the graph edges."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src))
    g = model.graph
    retype = {"position_ids": TensorProto.INT32, "attention_mask": TensorProto.FLOAT16}
    retype.update({i.name: TensorProto.FLOAT16 for i in g.input if i.name.startswith("past_")})
    casts = []
    for inp in g.input:
        if inp.name in retype:
            orig = inp.type.tensor_type.elem_type
            for node in g.node:
                for k, name in enumerate(node.input):
                    if name == inp.name:
                        node.input[k] = inp.name + "__orig"
            casts.append(helper.make_node("Cast", [inp.name], [inp.name + "__orig"], to=orig))
            inp.type.tensor_type.elem_type = retype[inp.name]
    for out in g.output:
        if out.name.startswith("present_"):
            for node in g.node:
                for k, name in enumerate(node.output):
                    if name == out.name:
                        node.output[k] = out.name + "__f32"
                for k, name in enumerate(node.input):
                    if name == out.name:
                        node.input[k] = out.name + "__f32"
            casts.append(
                helper.make_node("Cast", [out.name + "__f32"], [out.name], to=TensorProto.FLOAT16)
            )
            out.type.tensor_type.elem_type = TensorProto.FLOAT16
    nodes = (
        casts[: sum(1 for c in casts if c.input[0] in retype)]
        + list(g.node)
        + [c for c in casts if c.output[0].startswith("present_")]
    )
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


def test_generator_casts_to_graph_input_dtypes(qwen_graphs, qwen_generator, tmp_path):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out, spec = qwen_graphs
    _retype_edges(out / "decode.onnx", tmp_path / "decode16.onnx")
    gen = StaticKVGenerator(
        make_cpu_session(out / "prefill.onnx"), make_cpu_session(tmp_path / "decode16.onnx"), spec
    )
    assert gen.cache[0][0].dtype == np.float16
    ids = list(range(3, 33))
    a = gen.teacher_forced_logits(ids)
    b = qwen_generator.teacher_forced_logits(ids)
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert cos.min() > 0.999 and np.abs(a - b).max() < 0.02


def test_export_rejects_bad_input(tmp_path, tiny_qwen_dir):
    from studio.engine.llm_export import export_llm

    with pytest.raises(StudioError, match="context length C must be larger than prompt length P"):
        export_llm(tiny_qwen_dir, tmp_path / "o", 32, 32)
    with pytest.raises(StudioError, match="does not exist"):
        export_llm(tmp_path / "nope", tmp_path / "o", 8, 16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StudioError, match="not a Hugging Face checkpoint"):
        export_llm(tmp_path / "empty", tmp_path / "o", 8, 16)
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(StudioError, match="not supported"):
        export_llm(tmp_path / "gpt2", tmp_path / "o", 8, 16)
    with pytest.raises(StudioError, match="max_position_embeddings"):
        export_llm(tiny_qwen_dir, tmp_path / "o", 8, 4096)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_export_cancel_leaves_no_spec(tmp_path, tiny_qwen_dir):
    from studio.engine.llm_export import export_llm

    with pytest.raises(Cancelled):
        export_llm(tiny_qwen_dir, tmp_path / "o", 8, 16, progress=RecordingProgress(cancel_after=2))
    left = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert "graph.json" not in left and not [n for n in left if n.startswith(".")]


def test_llama_export_matches_generate(tmp_path_factory, tiny_llama_dir, corpus):
    from studio.engine.checkpoint_load import load_causal_lm
    from studio.engine.llm_export import export_llm
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out = tmp_path_factory.mktemp("llama-fp32")
    spec = export_llm(tiny_llama_dir, out, 8, 48)
    assert spec["model_type"] == "llama" and spec["export_check"]["max_abs_logit_diff"] < 1e-4
    assert spec["rope_type"] == "llama3" and spec["export_check"]["positions"] == 48
    gen = StaticKVGenerator(
        make_cpu_session(out / "prefill.onnx"), make_cpu_session(out / "decode.onnx"), spec
    )
    prompt = _prompt(tiny_llama_dir, corpus[500:], 6)
    want = _hf_greedy(load_causal_lm(tiny_llama_dir), prompt, 32, eos=None)
    assert gen.greedy(prompt, 32)["tokens"] == want and len(set(want)) > 8


def test_sample_model_matches_generate(tiny_coder_graphs, sample_model_dir):
    """The trained sample model: greedy tokens from the FP32 graphs equal generate()."""
    from studio.engine.calibration import load_tokenizer
    from studio.engine.checkpoint_load import load_causal_lm
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out, spec = tiny_coder_graphs
    assert spec["num_layers"] == 4 and spec["vocab_size"] == 2048
    assert spec["export_check"]["max_abs_logit_diff"] < 1e-3
    assert spec["export_check"]["positions"] == 128 and spec["export_check"]["top1_agreement"] == 1
    gen = StaticKVGenerator(
        make_cpu_session(out / "prefill.onnx"), make_cpu_session(out / "decode.onnx"), spec
    )
    model, tok = load_causal_lm(sample_model_dir), load_tokenizer(sample_model_dir)
    for text in ("def __init__(self", "import os\n\ndef read_file(path):\n"):
        prompt = tok.encode(text).ids
        want = _hf_greedy(model, prompt, 32, eos=spec["eos_token_id"])
        assert gen.greedy(prompt, 32, eos_id=spec["eos_token_id"])["tokens"] == want


def test_a_transposed_weight_is_written_a_slice_at_a_time_with_the_same_bytes(
        tmp_path, monkeypatch):
    """The exporter hands MatMul weights as transposed views; they are written in C order
    a few rows at a time (an 8 B model's head made contiguous at once is 2 GiB more)."""
    import io

    import numpy as np

    from studio.engine import torch_onnx

    monkeypatch.setattr(torch_onnx, "WRITE_CHUNK", 3 * 7 * 4)  # three rows of 7 floats
    w = np.arange(7 * 10, dtype=np.float32).reshape(7, 10)
    for arr in (w.T, w, w.T[2:9]):
        buf = io.BytesIO()
        torch_onnx._write_rows(buf, arr)
        assert buf.getvalue() == np.ascontiguousarray(arr).tobytes()


def test_constant_logits_are_named_with_the_inputs_the_graph_expects(qwen_graphs, tmp_path):
    """The seed's "outputs all zero": a prefill graph whose logits come out as one value (here
    a real graph with its logits multiplied by zero) stops the generation with one line that
    names the graph, the value and the inputs fed against the graph's own."""
    import onnx
    from onnx import TensorProto, helper

    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out, spec = qwen_graphs
    m = onnx.load(str(out / "prefill.onnx"))
    producer = next(n for n in m.graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "logits_raw"
    m.graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    m.graph.node.append(helper.make_node("Mul", ["logits_raw", "zero"], ["logits"]))
    onnx.save(m, str(tmp_path / "prefill.onnx"))
    gen = StaticKVGenerator(make_cpu_session(tmp_path / "prefill.onnx"),
                            make_cpu_session(out / "decode.onnx"), spec)
    with pytest.raises(StudioError) as err:
        gen.greedy([5, 6, 7], 4)
    msg = err.value.message
    assert msg.startswith("the prefill graph returned the same logit everywhere (")
    assert "inputs were probably not bound" in msg and "studio doctor" in msg
    assert "\n" not in msg
