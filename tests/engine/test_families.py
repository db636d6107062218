"""Every supported family, end to end on tiny random checkpoints (real files, no mocks):
checkpoint -> export_llm (P=16, C=128) -> the studio's CPU runtime, greedy, against
transformers' own generate(), past the sliding window where there is one."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError

P, C = 16, 128
WINDOW = 32
PROMPT = 12  # a padded prefill: 12 of the 16 prefill slots
NEW = 100  # new tokens: positions up to 111, far past the window
TEXT = "import os\n\ndef read_file(path):\n    with open(path) as fh:\n        return fh.read()\n"

COMMON = dict(
    vocab_size=2048,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.2,  # the default 0.02 gives flat logits and one repeated token
    eos_token_id=0,
    pad_token_id=1,
    bos_token_id=None,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 500000.0,
}
HEAD = 16  # hidden 64 / 4 heads
PHI35_ROPE = {  # Phi-3.5-mini: longrope, short factors used within the original length
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0 + 0.05 * i for i in range(HEAD // 2)],
    "long_factor": [1.5 + 0.5 * i for i in range(HEAD // 2)],
}

# name -> (model_type, config, expected layer types, graphs take a sliding_attention_mask)
S, F = "sliding_attention", "full_attention"
FAMILIES: dict[str, tuple[str, dict, list[str], bool]] = {
    "qwen2": ("qwen2", dict(tie_word_embeddings=False), [F, F], False),
    "qwen2.5": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6), [F, F], False),
    "llama2": ("llama", dict(num_key_value_heads=4, tie_word_embeddings=False), [F, F], False),
    "llama3": (
        "llama",
        dict(tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE),
        [F, F],
        False,
    ),
    "mistral": ("mistral", dict(sliding_window=WINDOW), [S, S], False),
    "qwen3": ("qwen3", dict(head_dim=HEAD, tie_word_embeddings=True), [F, F], False),
    "phi3": ("phi3", dict(sliding_window=WINDOW), [S, S], False),
    "phi3.5": (  # window longer than the cache: nothing to mask; longrope scaling 512 / 256
        "phi3",
        dict(
            sliding_window=4 * C, rope_parameters=PHI35_ROPE, original_max_position_embeddings=256
        ),
        [S, S],
        False,
    ),
    "gemma2": (
        "gemma2",
        dict(  # untied: a tied random model with the sqrt(hidden) embedding scale only
            # ever predicts its input token (one token repeated)
            tie_word_embeddings=False,
            head_dim=HEAD,
            query_pre_attn_scalar=HEAD,
            sliding_window=WINDOW,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        [S, F],
        True,
    ),
    # Ministral: Mistral's modules with a per-layer list of windows (one declaration in
    # studio/core/families.py)
    "ministral": (
        "ministral",
        dict(head_dim=HEAD, sliding_window=WINDOW, layer_types=[S, F]),
        [S, F],
        True,
    ),
    # Older config keys (rope_theta, rope_scaling, torch_dtype, use_sliding_window), half
    # precision weights: see _write_old_keys.
    "llama3.2-bf16": (
        "llama",
        dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
        [F, F],
        False,
    ),
    "qwen2.5-fp16": (
        "qwen2",
        dict(
            tie_word_embeddings=True,
            rope_theta=1e6,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=1,
        ),
        [F, S],
        True,
    ),
}
OLD_KEYS = {"llama3.2-bf16": "bfloat16", "qwen2.5-fp16": "float16"}


def _sample_tokenizer() -> Path:
    from studio.core.samples import sample_path

    return sample_path("tiny-coder")


def _write_old_keys(folder: Path, dtype: str) -> dict:
    """Rewrite config.json the way published checkpoints still carry it."""
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope_type = rope.get("rope_type", "default")
    cfg["rope_scaling"] = None if rope_type == "default" else rope
    cfg.pop("dtype", None)
    cfg["torch_dtype"] = dtype
    cfg.pop("layer_types", None)  # Qwen: derived from use_sliding_window / max_window_layers
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def build_checkpoint(name: str, folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, extra, _, _ = FAMILIES[name]
    torch.manual_seed(seed)
    # a deep copy: config classes edit the rope dicts they are given
    config = AutoConfig.for_model(model_type, **copy.deepcopy({**COMMON, **extra}))
    model = AutoModelForCausalLM.from_config(config)
    if name in OLD_KEYS:
        model = model.to(getattr(torch, OLD_KEYS[name]))
    model.save_pretrained(str(folder))
    if name in OLD_KEYS:
        _write_old_keys(folder, OLD_KEYS[name])
    tok = _sample_tokenizer()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tok / f, folder / f)
    return folder


class _Exports:
    """Checkpoints and exports, built once per module on first use."""

    def __init__(self, root: Path):
        self.root = root
        self.done: dict[str, tuple[Path, Path, dict]] = {}

    def __call__(self, name: str) -> tuple[Path, Path, dict]:
        if name not in self.done:
            from studio.engine.llm_export import export_llm

            ckpt = build_checkpoint(name, self.root / "ckpt" / name)
            spec = export_llm(ckpt, self.root / "graphs" / name, P, C)
            self.done[name] = (ckpt, self.root / "graphs" / name, spec)
        return self.done[name]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> _Exports:
    return _Exports(tmp_path_factory.mktemp("families"))


def _generator(graphs: Path, spec: dict):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    return StaticKVGenerator(
        make_cpu_session(graphs / "prefill.onnx"), make_cpu_session(graphs / "decode.onnx"), spec
    )


def _prompt() -> list[int]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(_sample_tokenizer() / "tokenizer.json")).encode(TEXT).ids
    assert len(ids) >= PROMPT
    return ids[:PROMPT]


def _hf_greedy(ckpt: Path, prompt: list[int], n: int) -> list[int]:
    import torch

    from studio.engine.checkpoint_load import load_causal_lm

    model = load_causal_lm(ckpt)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,  # no EOS stop
            pad_token_id=1,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_matches_transformers_over_the_whole_cache(exports, name):
    ckpt, graphs, spec = exports(name)
    _, _, layer_types, sliding_input = FAMILIES[name]

    # The spec: layer types and window, and the check over the whole context.
    assert spec["layer_types"] == layer_types
    if S in layer_types:
        assert spec["sliding_window"] == FAMILIES[name][1]["sliding_window"]
    check = spec["export_check"]
    assert check["positions"] == C and check["prefill_positions"] == P
    assert check["first_bad_position"] is None and check["top1_agreement"] == 1.0
    assert check["max_abs_logit_diff"] < 1e-4 < check["tolerance"]
    inputs = [i["name"] for i in spec["graphs"]["decode"]["inputs"]]
    assert ("sliding_attention_mask" in inputs) is sliding_input
    assert "prompt_len" not in spec and "context_len" not in spec

    # Greedy tokens from the studio's runtime equal generate(), token for token.
    prompt = _prompt()
    want = _hf_greedy(ckpt, prompt, NEW)
    got = _generator(graphs, spec).greedy(prompt, NEW, eos_id=None)
    assert got["stopped"] == "max_new_tokens"
    first_diff = next(
        (i for i, (a, b) in enumerate(zip(got["tokens"], want, strict=True)) if a != b), None
    )
    assert len(want) == NEW >= 90 and len(set(want)) > 8, want  # not a degenerate repeat
    assert got["tokens"] == want, f"{name}: first differing token {first_diff} of {NEW}"


def test_spec_families_and_dtypes(exports):
    _, _, gemma = exports("gemma2")
    assert gemma["family"] == "Gemma 2"
    assert (gemma["attn_logit_softcapping"], gemma["final_logit_softcapping"]) == (50.0, 30.0)
    _, _, llama = exports("llama3.2-bf16")
    assert llama["rope_type"] == "llama3" and llama["checkpoint_dtype"] == "bfloat16"
    assert llama["dtype"] == "float32"  # exported in FP32 whatever the checkpoint holds
    _, _, qwen = exports("qwen2.5-fp16")
    assert qwen["checkpoint_dtype"] == "float16" and qwen["sliding_window"] == WINDOW
    _, _, mistral = exports("mistral")
    # Every layer slides: attention_mask itself is windowed, no second mask input.
    names = [i["name"] for i in mistral["graphs"]["prefill"]["inputs"]]
    assert names == ["input_ids", "position_ids", "attention_mask"]


def test_masks_are_what_transformers_layers_see():
    """The host's masks against transformers' own mask functions, position by position."""
    import torch
    from transformers.masking_utils import (
        causal_mask_function,
        sliding_window_causal_mask_function,
    )

    from studio.engine.llm_runtime import decode_mask, prefill_mask

    def allowed(fn, q, kv):
        b = h = torch.tensor(0)
        return bool(fn(b, h, torch.tensor(q), torch.tensor(kv)))

    for window, fn in ((None, causal_mask_function), (5, sliding_window_causal_mask_function(5))):
        m = prefill_mask(8, 8, -100.0, window)
        want = np.array([[allowed(fn, q, k) for k in range(8)] for q in range(8)])
        assert ((m == 0) == want).all()
        for pos in range(12):
            d = decode_mask(pos, 12, -100.0, window)
            want = [allowed(fn, pos, k) for k in range(pos)]
            assert list(d[:pos] == 0) == want and d[12] == 0 and (d[pos:12] == -100).all()
    # padding rows of a short prompt see only themselves
    m = prefill_mask(3, 6, -100.0, 2)
    assert (m[4] == [-100, -100, -100, -100, 0, -100]).all() and (
        m[2] == [-100, 0, 0, -100, -100, -100]
    ).all()


def test_graph_that_ignores_the_window_is_caught(exports, tmp_path, monkeypatch):
    """An exporter that treats Mistral's sliding layers as full ones fails the export check
    at position W, the first that must not see key 0; nothing is left behind as an export."""
    from studio.engine import llm_export

    ckpt, _, _ = exports("mistral")
    monkeypatch.setattr(llm_export, "layer_types_of", lambda config, family: [F] * 2)
    with pytest.raises(StudioError, match=f"from position {WINDOW} of 48 ") as err:
        llm_export.export_llm(ckpt, tmp_path / "o", 8, 48)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "o" / "graph.json").exists()


@pytest.mark.parametrize(
    ("broken", "first_bad"),
    [("no window", WINDOW), ("window + 1", WINDOW), ("window - 1", WINDOW - 1)],
)
def test_host_mask_errors_are_caught(exports, monkeypatch, broken, first_bad):
    """Good graphs fed a wrong window (Gemma 2: only its sliding layer changes; top-1 may
    survive, the logits do not): the check names the first position the error matters."""
    from studio.engine import llm_runtime
    from studio.engine.checkpoint_load import load_causal_lm, reference_ids
    from studio.engine.export_check import check_export

    ckpt, graphs, spec = exports("gemma2")
    model = load_causal_lm(ckpt)
    ids = reference_ids(ckpt, C, spec["vocab_size"])
    change = {"no window": None, "window + 1": WINDOW + 1, "window - 1": WINDOW - 1}[broken]
    for builder in ("prefill_mask", "decode_mask"):
        orig = getattr(llm_runtime, builder)

        def wrong(n_or_pos, length, value, window=None, _f=orig):
            return _f(n_or_pos, length, value, change if window else None)

        monkeypatch.setattr(llm_runtime, builder, wrong)
    check, kept = check_export(model, _generator(graphs, spec), ids, keep=4)
    assert check["first_bad_position"] == first_bad and check["positions"] == C
    assert check["max_abs_logit_diff"] > 100 * check["tolerance"]
    assert check["max_abs_logit_diff"] > 1e4 * spec["export_check"]["max_abs_logit_diff"]
    assert kept.shape == (4, spec["vocab_size"])


def test_graphs_and_spec_must_agree_on_the_window(exports):
    _, graphs, spec = exports("gemma2")
    with pytest.raises(StudioError, match="takes a sliding_attention_mask"):
        _generator(graphs, dict(spec, sliding_window=C + 1))
    _, graphs, spec = exports("qwen2")
    with pytest.raises(StudioError, match="takes no sliding_attention_mask; re-export"):
        _generator(graphs, dict(spec, sliding_window=WINDOW, layer_types=[S, F]))


def test_longrope_past_its_original_length_is_refused(tmp_path):
    """Past original_max_position_embeddings transformers switches longrope to its long
    factors mid-generation, which one cos/sin table cannot follow."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from studio.engine.llm_export import export_llm

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "phi3",
        **COMMON,
        rope_parameters=copy.deepcopy(PHI35_ROPE),
        original_max_position_embeddings=64,
    )
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(tmp_path / "ck"))
    with pytest.raises(StudioError, match="choose a context length C <= 64"):
        export_llm(tmp_path / "ck", tmp_path / "o", P, C)
    assert not (tmp_path / "o").exists()


def test_unsupported_family_names_the_supported_ones(tmp_path):
    from studio.engine.llm_export import export_llm

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text('{"model_type": "gemma3_text"}')
    with pytest.raises(StudioError) as err:
        export_llm(tmp_path / "ck", tmp_path / "o", P, C)
    msg = str(err.value)
    for label in (
        "Qwen2 / Qwen2.5",
        "Qwen3",
        "Llama 2 / 3.x",
        "Mistral",
        "Ministral",
        "Phi-3 / Phi-3.5",
        "Gemma 2",
    ):
        assert label in msg
    assert "\n" not in msg


def test_broken_family_table_is_caught(exports, tmp_path, monkeypatch):
    """Gemma 2 without its final soft-capping differs from the first position on."""
    from studio.engine import llm_export

    exports("gemma2")  # the checkpoint
    fam = llm_export.FAMILIES["gemma2"]
    monkeypatch.setitem(llm_export.FAMILIES, "gemma2", dataclasses.replace(fam, final_softcap=None))
    with pytest.raises(StudioError, match="from position 0 of 16 "):
        llm_export.export_llm(exports.root / "ckpt" / "gemma2", tmp_path / "o", 4, 16)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_key_activations_are_found_in_every_family(exports, name):
    """The recipe's pseudo-layers (attention scores, softmax output, residual stream) name
    real nodes of each family's graph: per block one Q·Kᵀ MatMul whose output reaches the
    softmax, one softmax, two residual adds that take the block's input stream."""
    import onnx

    from studio.core.recipe import activation_point

    _, graphs, spec = exports(name)
    model = onnx.load(str(graphs / "decode.onnx"), load_external_data=False)
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    by_point: dict[str, list] = {}
    for n in model.graph.node:
        point = activation_point(n.name)
        if point is not None:
            by_point.setdefault(point, []).append(n)
    blocks = len(spec["layer_types"])
    for b in range(blocks):
        scores = by_point[f"model.layers.{b}.self_attn.scores"]
        softmax = by_point[f"model.layers.{b}.self_attn.softmax"]
        residual = by_point[f"model.layers.{b}.residual"]
        assert [n.op_type for n in scores] == ["MatMul"], name
        assert [n.op_type for n in softmax] == ["Softmax"], name
        assert [n.op_type for n in residual] == ["Add", "Add"], name
        # Q·Kᵀ reaches the softmax through the scaling / capping / mask ops only
        frontier, seen = [scores[0]], set()
        for _ in range(8):
            frontier = [c for n in frontier for o in n.output for c in consumers.get(o, [])
                        if c.name not in seen]
            seen.update(c.name for c in frontier)
            if softmax[0].name in seen:
                break
        assert softmax[0].name in seen, f"{name} block {b}: scores do not reach the softmax"
