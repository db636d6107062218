"""One family table: what `studio new --checkpoint` accepts (the checkpoint checks), what the
static-KV export supports and what the performance model knows are one declaration per family
(studio/core/families.py), read by all three. Tiny random checkpoints of every family of the
table, real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from studio.core import archs, families
from studio.core.errors import StudioError
from studio.core.families import FAMILIES, SLIDING
from studio.engine import checkpoint_check, checkpoint_load, hf_import, llm_export, llm_wrapper

TINY = dict(
    vocab_size=2048,  # the sample tokenizer's
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    sliding_window=64,
    bos_token_id=None,  # Phi-3's defaults lie past this vocabulary
    eos_token_id=0,
    pad_token_id=1,
)


def test_the_three_readers_hold_the_same_table():
    assert hf_import.families is families
    assert llm_export.FAMILIES is families.FAMILIES
    assert archs.FAMILIES is families.FAMILIES
    # every family's export wrapper exists, and every architecture names one family
    assert {f.wrapper for f in FAMILIES.values()} <= set(llm_wrapper.WRAPPERS)
    names = families.architectures()
    assert len(names) == len(set(names)) >= len(FAMILIES)
    for f in FAMILIES.values():
        assert families.family_of_architecture(f.architectures[0]) is f
        assert families.family_of(f.model_type) is f


def _checkpoint(model_type: str, folder: Path) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from studio.core.samples import sample_path

    if FAMILIES[model_type].vision:  # a vision tower beside the language model
        from tests.engine.conftest import corpus_text
        from tests.engine.vl_checkpoints import make_vl_checkpoint

        return make_vl_checkpoint(folder, model_type, corpus_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **TINY))
    model.save_pretrained(str(folder))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(sample_path("tiny-coder") / f, folder / f)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("table")
    return {t: _checkpoint(t, root / t) for t in FAMILIES}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_every_family_of_the_table_passes_all_three(checkpoints, model_type):
    folder = checkpoints[model_type]
    # `studio new --checkpoint` runs these checks (services.projects -> check_checkpoint)
    checked = checkpoint_check.check_checkpoint(folder)
    assert checked["architecture"] in FAMILIES[model_type].architectures
    info = hf_import.open_checkpoint(folder)
    assert info.family == model_type
    config = checkpoint_load.check_checkpoint(folder)  # the export's own check
    assert config["model_type"] == model_type
    arch = archs.Arch.from_config(config)
    assert arch.tied_embeddings == info.tied_embeddings
    types = families.layer_types(config, FAMILIES[model_type], info.num_layers)
    assert arch.sliding_layers == types.count(SLIDING)
    assert (arch.sliding_window is None) == (info.sliding_window is None)


def test_a_family_taken_out_of_the_table_is_gone_from_all_three(checkpoints, monkeypatch):
    folder = checkpoints["gemma2"]
    config = json.loads((folder / "config.json").read_text())
    monkeypatch.delitem(FAMILIES, "gemma2")
    with pytest.raises(StudioError, match="unsupported architecture Gemma2ForCausalLM"):
        checkpoint_check.check_checkpoint(folder)
    with pytest.raises(StudioError, match="'gemma2' is not supported by the static-KV"):
        checkpoint_load.check_checkpoint(folder)
    # the performance model estimates it as a decoder it does not know: untied, every
    # layer sliding
    config.pop("tie_word_embeddings", None)
    config.pop("layer_types", None)
    arch = archs.Arch.from_config(config)
    assert not arch.tied_embeddings and arch.sliding_layers == arch.layers
