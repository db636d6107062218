"""HF checkpoint import on tiny random checkpoints of each supported family (real files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.core.errors import StudioError
from studio.core.families import FAMILIES, layer_types
from studio.core.modelinfo import ModelInfo
from studio.engine import hf_import

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _build(kind: str):
    import torch
    from transformers import (
        Gemma2Config,
        Gemma2ForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MinistralConfig,
        MinistralForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(0)
    if kind == "qwen2":  # Qwen2: biases on q/k/v, untied head
        return Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=False, **SMALL))
    if kind == "qwen2.5":  # Qwen2.5-style: tied head, rope 1e6, sliding window declared but off
        return Qwen2ForCausalLM(
            Qwen2Config(
                tie_word_embeddings=True,
                rope_theta=1_000_000.0,
                use_sliding_window=False,
                sliding_window=128,
                max_window_layers=2,
                **SMALL,
            )
        )
    if kind == "llama":  # Llama: explicit head_dim (16, not hidden/heads = 8), MQA
        cfg = dict(SMALL, num_key_value_heads=1)
        return LlamaForCausalLM(LlamaConfig(head_dim=16, tie_word_embeddings=False, **cfg))
    if kind == "mistral":  # Mistral: sliding window attention
        return MistralForCausalLM(MistralConfig(sliding_window=64, **SMALL))
    if kind == "ministral":  # Ministral: Mistral's modules, a per-layer list of windows
        return MinistralForCausalLM(
            MinistralConfig(
                head_dim=8,  # its config class derives none
                sliding_window=64,
                layer_types=["full_attention", "sliding_attention"],
                **SMALL,
            )
        )
    if kind == "qwen3":  # Qwen3: q/k norms, explicit head_dim
        return Qwen3ForCausalLM(Qwen3Config(head_dim=8, tie_word_embeddings=True, **SMALL))
    if kind == "phi3":  # Phi-3: fused qkv_proj and gate_up_proj, sliding window
        return Phi3ForCausalLM(
            Phi3Config(
                sliding_window=48, pad_token_id=0, eos_token_id=1, bos_token_id=None, **SMALL
            )
        )
    if kind == "gemma2":  # Gemma 2: pre/post feed-forward norms, alternating windows
        return Gemma2ForCausalLM(
            Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=32, **SMALL)
        )
    raise AssertionError(kind)


KINDS = ["qwen2", "qwen2.5", "llama", "mistral", "ministral", "qwen3", "phi3", "gemma2"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind in KINDS:
        model = _build(kind)
        model.save_pretrained(root / kind)
        out[kind] = (root / kind, model)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_parameter_count_equals_torch(checkpoints, kind):
    folder, model = checkpoints[kind]
    assert hf_import.match(folder)
    info = hf_import.open_checkpoint(folder)
    assert isinstance(info, ModelInfo)
    assert info.format == "hf"
    assert info.parameters == sum(p.numel() for p in model.parameters())
    assert sum(lay.params for lay in info.layers) == info.parameters
    # Every layer's count is that of the torch module of the same name.
    for lay in info.layers:
        if lay.tied_to is None:
            module = model.get_submodule(lay.name)
            assert lay.params == sum(p.numel() for p in module.parameters()), lay.name
            for leaf, shape in lay.shapes.items():
                assert tuple(getattr(module, leaf).shape) == shape
    assert info.weight_bytes("FP32") == 4 * info.parameters
    assert info.weight_bytes("FP16") == 2 * info.parameters
    assert info.weight_bytes("INT8") == info.parameters
    assert info.weight_bytes("INT4") == (info.parameters + 1) // 2
    assert info.dtype == "float32"
    assert ModelInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


def test_qwen2_description(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["qwen2"][0])
    assert (info.architecture, info.family) == ("Qwen2ForCausalLM", "qwen2")
    assert (info.num_layers, info.hidden_size, info.intermediate_size) == (2, 32, 48)
    assert (info.num_heads, info.num_kv_heads, info.head_dim) == (4, 2, 8)
    assert (info.vocab_size, info.max_positions) == (96, 256)
    assert info.tied_embeddings is False
    assert info.sliding_window is None
    # 96*32 embedding + 2 blocks + final norm 32 + untied head 96*32; each block:
    # norms 2*32, q 32*32+32, k 16*32+16, v 16*32+16, o 32*32, mlp 3*32*48
    block = 2 * 32 + (1024 + 32) + (512 + 16) + (512 + 16) + 1024 + 3 * 32 * 48
    assert info.parameters == 96 * 32 + 2 * block + 32 + 96 * 32 == 21_792
    # Layers in data-flow order, grouped by block.
    names = [lay.name for lay in info.layers]
    assert names[:4] == [
        "model.embed_tokens",
        "model.layers.0.input_layernorm",
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
    ]
    assert names[-2:] == ["model.norm", "lm_head"]
    k = info.layer("model.layers.1.self_attn.k_proj")
    assert (k.block, k.kind) == (1, "attention")
    assert k.shapes == {"weight": (16, 32), "bias": (16,)}  # GQA: 2 KV heads x 8
    kinds = info.params_by_kind()
    assert set(kinds) == {"embedding", "attention", "mlp", "norm", "lm_head"}
    assert kinds["mlp"] == 2 * 3 * 32 * 48
    # KV cache by the formula: 2 x 2 layers x 2 KV heads x 8 x context x bytes.
    assert info.kv_cache_bytes(100) == 12_800
    assert info.kv_cache_bytes(100, bytes_per_elem=1) == 6_400
    assert info.kv_cache_bytes(100, window=32) == 4_096


def test_qwen25_style_tied_embeddings(checkpoints):
    folder, model = checkpoints["qwen2.5"]
    info = hf_import.open_checkpoint(folder)
    assert info.tied_embeddings is True
    assert info.rope_theta == 1_000_000.0
    assert info.sliding_window is None  # declared, but use_sliding_window is false
    head = info.layer("lm_head")
    assert (head.params, head.tied_to, head.kind) == (0, "model.embed_tokens", "lm_head")
    assert head.shapes == {"weight": (96, 32)}
    # The shared matrix is counted once: one head fewer than the untied Qwen2.
    untied = hf_import.open_checkpoint(checkpoints["qwen2"][0])
    assert untied.parameters - info.parameters == 96 * 32
    assert info.weight_bytes("FP16") == 2 * sum(p.numel() for p in model.parameters())


def test_llama_head_dim_and_mqa(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["llama"][0])
    assert (info.architecture, info.family) == ("LlamaForCausalLM", "llama")
    assert (info.num_heads, info.num_kv_heads, info.head_dim) == (4, 1, 16)
    assert info.gqa_group == 4
    assert info.layer("model.layers.0.self_attn.q_proj").shapes == {"weight": (64, 32)}
    assert info.layer("model.layers.0.self_attn.v_proj").shapes == {"weight": (16, 32)}
    # 2 x 2 layers x 1 KV head x 16 x 1000 tokens x 2 bytes
    assert info.kv_cache_bytes(1000) == 128_000
    assert info.tied_embeddings is False


def test_mistral_sliding_window(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["mistral"][0])
    assert (info.architecture, info.family) == ("MistralForCausalLM", "mistral")
    assert info.sliding_window == 64
    assert info.kv_cache_bytes(1000, window=info.sliding_window) == 2 * 2 * 2 * 8 * 64 * 2


def test_ministral_windows_per_layer(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["ministral"][0])
    assert (info.architecture, info.family) == ("MinistralForCausalLM", "ministral")
    assert info.sliding_window == 64  # one of its two layers slides
    cfg = json.loads((checkpoints["ministral"][0] / "config.json").read_text())
    want = ["full_attention", "sliding_attention"]
    assert layer_types(cfg, FAMILIES["ministral"], 2) == want
    cfg.pop("layer_types")  # no list: every layer slides, as in Mistral
    assert layer_types(cfg, FAMILIES["ministral"], 2) == ["sliding_attention"] * 2


def test_qwen3_q_k_norms(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["qwen3"][0])
    assert (info.architecture, info.family, info.head_dim) == ("Qwen3ForCausalLM", "qwen3", 8)
    block = [lay.name.rsplit(".", 1)[-1] for lay in info.layers if lay.block == 0]
    assert block == [
        "input_layernorm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj",
        "post_attention_layernorm", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip
    q_norm = info.layer("model.layers.0.self_attn.q_norm")
    assert (q_norm.kind, q_norm.params, q_norm.shapes) == ("norm", 8, {"weight": (8,)})
    assert info.tied_embeddings and info.sliding_window is None


def test_phi3_fused_projections(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["phi3"][0])
    assert (info.architecture, info.family) == ("Phi3ForCausalLM", "phi3")
    block = [lay.name.rsplit(".", 1)[-1] for lay in info.layers if lay.block == 1]
    assert block == [
        "input_layernorm", "qkv_proj", "o_proj", "post_attention_layernorm", "gate_up_proj",
        "down_proj",
    ]  # fmt: skip
    qkv = info.layer("model.layers.1.self_attn.qkv_proj")
    assert (qkv.kind, qkv.shapes) == ("attention", {"weight": ((4 + 2 * 2) * 8, 32)})
    gate_up = info.layer("model.layers.1.mlp.gate_up_proj")
    assert (gate_up.kind, gate_up.shapes) == ("mlp", {"weight": (2 * 48, 32)})
    assert info.params_by_kind()["mlp"] == 2 * 3 * 32 * 48
    assert info.sliding_window == 48  # Phi-3 slides in every layer once a window is set


def test_gemma2_norms_and_windows(checkpoints):
    info = hf_import.open_checkpoint(checkpoints["gemma2"][0])
    assert (info.architecture, info.family) == ("Gemma2ForCausalLM", "gemma2")
    block = [lay.name.rsplit(".", 1)[-1] for lay in info.layers if lay.block == 0]
    assert block == [
        "input_layernorm", "q_proj", "k_proj", "v_proj", "o_proj", "post_attention_layernorm",
        "pre_feedforward_layernorm", "gate_proj", "up_proj", "down_proj",
        "post_feedforward_layernorm",
    ]  # fmt: skip
    kinds = {lay.name.rsplit(".", 1)[-1]: lay.kind for lay in info.layers if lay.block == 0}
    assert kinds["pre_feedforward_layernorm"] == kinds["post_feedforward_layernorm"] == "norm"
    assert info.tied_embeddings and info.sliding_window == 32
    cfg = json.loads((checkpoints["gemma2"][0] / "config.json").read_text())
    types = ["sliding_attention", "full_attention"]
    assert layer_types(cfg, FAMILIES["gemma2"], 2) == types
    cfg.pop("layer_types")  # an older Gemma 2 config: alternating by default
    assert layer_types(cfg, FAMILIES["gemma2"], 2) == types


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoint_with_older_config_keys(tmp_path, checkpoints, dtype):
    """A published-style checkpoint: bf16 / fp16 weights, rope_theta / rope_scaling /
    torch_dtype / use_sliding_window instead of rope_parameters / dtype / layer_types."""
    import torch

    _, model = checkpoints["qwen2.5"]
    model.to(getattr(torch, dtype)).save_pretrained(tmp_path)
    model.to(torch.float32)
    cfg = json.loads((tmp_path / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg.pop("dtype", None)
    cfg.pop("layer_types", None)
    cfg.update(
        rope_theta=rope["rope_theta"], rope_scaling=None, torch_dtype=dtype,
        use_sliding_window=True, sliding_window=64, max_window_layers=1,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = hf_import.open_checkpoint(tmp_path)
    assert info.dtype == dtype and info.rope_theta == 1_000_000.0
    assert info.sliding_window == 64
    assert layer_types(cfg, FAMILIES["qwen2"], 2) == ["full_attention", "sliding_attention"]
    assert info.weight_bytes("FP16") == 2 * sum(p.numel() for p in model.parameters())
    cfg["use_sliding_window"] = False  # declared but off, as in published Qwen2.5 configs
    assert layer_types(cfg, FAMILIES["qwen2"], 2) == ["full_attention"] * 2


def test_sharded_checkpoint(tmp_path, checkpoints):
    _, model = checkpoints["qwen2"]
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    info = hf_import.open_checkpoint(tmp_path)
    assert info.parameters == sum(p.numel() for p in model.parameters())


def test_torch_bin_checkpoint(tmp_path, checkpoints):
    import torch

    folder, model = checkpoints["qwen2.5"]
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")  # holds the tied copy too
    info = hf_import.open_checkpoint(tmp_path)
    assert info.tied_embeddings
    assert info.parameters == sum(p.numel() for p in model.parameters())


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    ).save_pretrained(tmp_path)
    assert hf_import.match(tmp_path)  # looks like a checkpoint ...
    with pytest.raises(StudioError) as err:  # ... of a family the studio does not support
        hf_import.open_checkpoint(tmp_path)
    msg = str(err.value)
    assert "unsupported architecture GPT2LMHeadModel (model_type gpt2)" in msg
    for name in (
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Phi3ForCausalLM",
        "Gemma2ForCausalLM",
        "Qwen2 / Qwen2.5",
        "Llama 2 / 3.x",
        "Phi-3 / Phi-3.5",
        "Gemma 2",
    ):
        assert name in msg
    for family in FAMILIES.values():  # and every other family of the table
        assert family.label in msg and all(a in msg for a in family.architectures)
    assert "\n" not in msg


def test_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert not hf_import.match(tmp_path)
    with pytest.raises(
        StudioError,
        match="not a Hugging Face checkpoint .no config.json.; "
        "expected a Hugging Face checkpoint folder",
    ):
        hf_import.open_checkpoint(tmp_path)


def test_config_without_weights(tmp_path, checkpoints):
    (tmp_path / "config.json").write_bytes((checkpoints["llama"][0] / "config.json").read_bytes())
    with pytest.raises(StudioError, match="has a config.json but no model weights; expected"):
        hf_import.open_checkpoint(tmp_path)


def test_missing_path_file_and_broken_config(tmp_path):
    with pytest.raises(StudioError, match="no such folder"):
        hf_import.open_checkpoint(tmp_path / "nope")
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    assert not hf_import.match(f)
    with pytest.raises(StudioError, match="is a file"):
        hf_import.open_checkpoint(f)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(StudioError, match="not valid JSON"):
        hf_import.open_checkpoint(bad)


def test_corrupt_safetensors(tmp_path, checkpoints):
    (tmp_path / "config.json").write_bytes((checkpoints["qwen2"][0] / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(StudioError, match="not a readable safetensors file"):
        hf_import.open_checkpoint(tmp_path)


def test_engine_module_imports_no_heavy_library():
    import subprocess
    import sys

    code = (
        "import sys, studio.engine.hf_import\n"
        "heavy = {'torch', 'transformers', 'safetensors'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
