"""Session-scoped real artifacts for the engine tests: tiny HF checkpoints, a tokenizer,
exported FP32 graphs. Everything is built from scratch in a temp folder (no downloads)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

TINY_P, TINY_C = 16, 64


def corpus_text() -> str:
    """Some real Python text from the standard library (offline, deterministic)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        (stdlib / f"{m}.py").read_text(encoding="utf-8") for m in ("textwrap", "bisect", "colorsys")
    ]
    return "\n".join(parts)


def _save_tokenizer(folder: Path, text: str, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"], show_progress=False
    )
    tok.train_from_iterator([text], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        clean_up_tokenization_spaces=False,
    ).save_pretrained(str(folder))


@pytest.fixture(scope="session")
def corpus() -> str:
    return corpus_text()


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory, corpus) -> Path:
    """Random Qwen2 (2 layers, hidden 64, 4 heads / 2 KV heads, vocab 256) + BPE tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        initializer_range=0.2,  # the default 0.02 makes a random model repeat one token
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
    )
    Qwen2ForCausalLM(config).save_pretrained(str(folder))
    _save_tokenizer(folder, corpus, 256)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, corpus) -> Path:
    """Random Llama (2 layers, hidden 64, GQA, untied head, rope scaling 'llama3')."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.2,
        eos_token_id=0,
        pad_token_id=1,
        bos_token_id=None,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
            "rope_theta": 500000.0,
        },
    )
    LlamaForCausalLM(config).save_pretrained(str(folder))
    _save_tokenizer(folder, corpus, 256)
    return folder


@pytest.fixture(scope="session")
def qwen_graphs(tmp_path_factory, tiny_qwen_dir) -> tuple[Path, dict]:
    """FP32 prefill/decode graphs of the tiny Qwen2 (P=16, C=64)."""
    from studio.engine.llm_export import export_llm

    out = tmp_path_factory.mktemp("qwen-fp32")
    spec = export_llm(tiny_qwen_dir, out, TINY_P, TINY_C)
    return out, spec


@pytest.fixture(scope="session")
def qwen_generator(qwen_graphs):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out, spec = qwen_graphs
    return StaticKVGenerator(
        make_cpu_session(out / "prefill.onnx"), make_cpu_session(out / "decode.onnx"), spec
    )


@pytest.fixture(scope="session")
def hf_qwen(tiny_qwen_dir):
    from studio.engine.checkpoint_load import load_causal_lm

    return load_causal_lm(tiny_qwen_dir)


SAMPLE_MODEL = Path(__file__).resolve().parents[2] / "resources" / "models" / "tiny-coder"
SAMPLE_DATA = Path(__file__).resolve().parents[2] / "resources" / "data"


@pytest.fixture(scope="session")
def sample_model_dir() -> Path:
    """The shipped sample model (trained Qwen2, 4 layers, hidden 256, vocab 2048)."""
    if not (SAMPLE_MODEL / "model.safetensors").is_file():
        pytest.skip("the sample model resources/models/tiny-coder is not built")
    return SAMPLE_MODEL


@pytest.fixture(scope="session")
def sample_data_dir() -> Path:
    if not (SAMPLE_DATA / "heldout.py.txt").is_file():
        pytest.skip("the sample texts in resources/data are not built")
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def tiny_coder_graphs(tmp_path_factory, sample_model_dir) -> tuple[Path, dict]:
    """The sample model exported with P=32, C=128."""
    from studio.engine.llm_export import export_llm

    out = tmp_path_factory.mktemp("tiny-coder-fp32")
    return out, export_llm(sample_model_dir, out, 32, 128)


@pytest.fixture(scope="session")
def tiny_coder_draft_graphs(tmp_path_factory) -> tuple[Path, dict]:
    """The shipped draft model (tiny-coder-draft) exported like tiny_coder_graphs, without
    a verify graph (a draft proposes one token at a time)."""
    from studio.engine.llm_export import export_llm

    draft = SAMPLE_MODEL.parent / "tiny-coder-draft"
    if not (draft / "model.safetensors").is_file():
        pytest.skip("the draft model resources/models/tiny-coder-draft is not built")
    out = tmp_path_factory.mktemp("tiny-coder-draft-fp32")
    return out, export_llm(draft, out, 32, 128, verify_len=0)


@pytest.fixture(scope="session")
def w8a16(tmp_path_factory, qwen_graphs, tiny_qwen_dir, corpus):
    """The tiny Qwen export quantized W8A16 per tensor (4 calibration samples): (folder,
    info, the progress it reported)."""
    from studio.core.progress import RecordingProgress
    from studio.engine.quantize import quantize_llm

    out = tmp_path_factory.mktemp("w8a16")
    recipe = {"scheme": "W8A16", "weight_granularity": "per_tensor", "samples": 4}
    prog = RecordingProgress()
    info = quantize_llm(qwen_graphs[0], out, recipe, corpus, tiny_qwen_dir, prog)
    return out, info, prog
