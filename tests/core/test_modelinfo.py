"""ModelInfo: sizes by the seed's formulas (hand-checked numbers) and serialisation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from studio.core.errors import StudioError
from studio.core.modelinfo import LayerInfo, ModelInfo, bytes_per_param


def make_info(**over) -> ModelInfo:
    # Shaped like Qwen2.5-0.5B: 24 layers, 14 query heads / 2 KV heads of 64, tied head.
    fields = dict(
        source="/models/qwen2.5-0.5b",
        format="hf",
        architecture="Qwen2ForCausalLM",
        family="qwen2",
        num_layers=24,
        hidden_size=896,
        intermediate_size=4864,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        vocab_size=151936,
        tied_embeddings=True,
        max_positions=32768,
        parameters=494_032_768,
        layers=[
            LayerInfo(
                "model.embed_tokens", None, "embedding", 136_134_656, {"weight": (151936, 896)}
            ),
            LayerInfo(
                "model.layers.0.self_attn.k_proj",
                0,
                "attention",
                114_816,
                {"weight": (128, 896), "bias": (128,)},
            ),
            LayerInfo("model.layers.0.mlp.down_proj", 0, "mlp", 4_358_144, {"weight": (896, 4864)}),
            LayerInfo("model.norm", None, "norm", 896, {"weight": (896,)}),
            LayerInfo(
                "lm_head",
                None,
                "lm_head",
                0,
                {"weight": (151936, 896)},
                tied_to="model.embed_tokens",
            ),
        ],
        dtype="bfloat16",
        rope_theta=1_000_000.0,
    )
    fields.update(over)
    return ModelInfo(**fields)


def test_weight_bytes_per_precision():
    info = make_info()
    assert info.weight_bytes("FP32") == 1_976_131_072
    assert info.weight_bytes("FP16") == 988_065_536
    assert info.weight_bytes("fp16") == 988_065_536
    assert info.weight_bytes("INT8") == 494_032_768
    assert info.weight_bytes("INT4") == 247_016_384
    assert info.weight_bytes_by_precision() == {
        "FP32": 1_976_131_072,
        "FP16": 988_065_536,
        "INT8": 494_032_768,
        "INT4": 247_016_384,
    }
    # An odd count of 4-bit weights still needs a whole byte for the last one.
    assert make_info(parameters=7).weight_bytes("INT4") == 4
    assert bytes_per_param("BF16") == 2


def test_unknown_precision_is_a_studio_error():
    with pytest.raises(StudioError, match="unknown precision 'FP8'.*FP32, FP16"):
        make_info().weight_bytes("FP8")


def test_kv_cache_bytes_by_the_formula():
    info = make_info()  # 2 x 24 layers x 2 KV heads x 64 x context x bytes
    assert info.kv_cache_bytes(4096) == 50_331_648  # FP16: 48 MiB
    assert info.kv_cache_bytes(4096, bytes_per_elem=1) == 25_165_824  # INT8 cache
    assert info.kv_cache_bytes(4096, bytes_per_elem=4) == 100_663_296  # FP32
    assert info.kv_cache_bytes(4096, window=1024) == 12_582_912  # sliding window caps it
    assert info.kv_cache_bytes(512, window=1024) == 6_291_456  # window larger: no effect
    assert info.kv_cache_bytes(4096, batch=2) == 100_663_296
    assert info.kv_cache_bytes(0) == 0
    assert info.gqa_group == 7


def test_kv_cache_gqa_versus_multi_head():
    # Llama-2-7B (32 layers, 32 heads of 128, no GQA): the classic 2 GiB at 4k context.
    mha = make_info(num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128)
    assert mha.kv_cache_bytes(4096) == 2 * 1024**3
    # Llama-3-8B: the same but 8 KV heads -> a quarter.
    gqa = make_info(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128)
    assert gqa.kv_cache_bytes(4096) == 512 * 1024**2
    assert gqa.kv_cache_bytes(4096, bytes_per_elem=1) == 256 * 1024**2


def test_kv_cache_rejects_nonsense():
    info = make_info()
    with pytest.raises(StudioError):
        info.kv_cache_bytes(-1)
    with pytest.raises(StudioError):
        info.kv_cache_bytes(128, window=0)
    with pytest.raises(StudioError):
        info.kv_cache_bytes(128, batch=0)


def test_round_trip_through_json():
    info = make_info()
    back = ModelInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert back == info
    assert back.layers[1].shapes["weight"] == (128, 896)
    assert back.layer("lm_head").tied_to == "model.embed_tokens"


def test_layer_helpers():
    info = make_info()
    assert [lay.name for lay in info.block_layers(0)] == [
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.mlp.down_proj",
    ]
    assert info.params_by_kind()["lm_head"] == 0
    with pytest.raises(StudioError, match="no layer named"):
        info.layer("model.layers.9.mlp.up_proj")


def test_core_module_imports_no_heavy_library():
    code = (
        "import sys, studio.core.modelinfo\n"
        "heavy = {'torch', 'transformers', 'onnx', 'onnxruntime', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
