"""A decoder in parts: the plan, the streamed export (one part in memory at a time), the
parts' graphs chained as one, and quantization part by part (each part calibrated on the
previous part's FP32 outputs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from studio.core.errors import StudioError
from studio.core.parts import Layout, plan_parts, split
from studio.core.progress import RecordingProgress

TOKENIZER = ("tokenizer.json", "tokenizer_config.json")


# ---- the plan (pure) ----------------------------------------------------------------------------
def test_a_split_is_contiguous_and_as_even_as_the_embedding_allows():
    layout = Layout(blocks=(10,) * 8, embedding=25, norm=1, head=0, tied=True)
    for n in range(1, 9):
        parts = split(layout, n)
        assert [p.start for p in parts] == [0, *[p.stop for p in parts[:-1]]]
        assert parts[-1].stop == 8 and len(parts) == n
        assert sum(p.parameters for p in parts) == 80 + 25 + 26  # the tied head counted again
    three = split(layout, 3)
    # the first part carries the embedding (25 = 2.5 blocks) and the last the head (26)
    assert [(p.start, p.stop) for p in three] == [(0, 2), (2, 6), (6, 8)]
    assert three[0].embeds and not three[0].heads and three[-1].heads
    assert three[1].hidden_in == "hidden_states_after_1"
    assert three[1].hidden_out == "hidden_states_after_5"
    assert [p.name for p in three] == ["part1_of_3", "part2_of_3", "part3_of_3"]


def test_auto_takes_the_fewest_parts_that_fit_the_budget():
    layout = Layout(blocks=(100_000_000,) * 36, embedding=311_000_000, norm=2048, head=0,
                    tied=True)  # about Qwen2.5-3B: 3.6 B block + 0.31 B embedding parameters
    auto8 = plan_parts(layout, "auto", weight_bits=8, max_part_bytes=1_500_000_000)
    assert len(auto8) == 3 and all(p.parameters <= 1_500_000_000 for p in auto8)
    assert len(plan_parts(layout, "auto", 8, 1_500_000_000 * 3)) == 1
    assert len(plan_parts(layout, "auto", 4, 1_500_000_000)) == 2
    with pytest.raises(StudioError, match="raise export.max_part_mb"):
        plan_parts(layout, "auto", 8, 100_000_000)
    with pytest.raises(StudioError, match="splits into 1..36 parts, not 37"):
        plan_parts(layout, 37)


def test_the_setting_takes_a_count_or_auto():
    from studio.core.settings import Export

    assert Export.from_table({"parts": "auto"})["parts"] == "auto"
    for bad, says in (("two", 'give a number of parts or "auto"'), (0, "between 1 and"),
                      (1.5, "must be a int or str")):
        with pytest.raises(StudioError, match=says):
            Export.from_table({"parts": bad}).check()


# ---- the streamed export and the chain ----------------------------------------------------------
@pytest.fixture(scope="module")
def deep_checkpoint(tmp_path_factory) -> Path:
    """A random Qwen2 of 8 blocks x 256 in bfloat16 (the dtype published checkpoints carry),
    with the sample's tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from studio.core.samples import sample_path

    folder = tmp_path_factory.mktemp("deep")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=2048, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         initializer_range=0.1, eos_token_id=0, pad_token_id=1,
                         bos_token_id=None)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))
    for f in TOKENIZER:
        shutil.copy2(sample_path("tiny-coder") / f, folder / f)
    return folder


class _Killed(Exception):
    """What the tests' ``_KillAt`` raises: the stage dies there, as under ``kill -9``."""


class _KillAt(RecordingProgress):
    """Progress that ends the work (an exception nobody catches) at the first message
    starting with ``at``; records the logs."""

    def __init__(self, at: str | None = None):
        super().__init__()
        self.at = at

    def update(self, fraction: float, message: str = "") -> None:
        if self.at and message.startswith(self.at):
            raise _Killed(message)
        super().update(fraction, message)


def _stats(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file's inode and modification time: the same after a resume = not written again."""
    return {str(f.relative_to(folder)): (f.stat().st_ino, f.stat().st_mtime_ns)
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _greedy(folder: Path, n: int = 20) -> list[int]:
    from studio.engine.llm_runtime import cpu_generator
    from studio.engine.onnxio import load_spec

    return cpu_generator(folder, load_spec(folder)).greedy([5, 9, 33, 12, 7], n)["tokens"]


@pytest.mark.slow  # three real exports of an 8-block model
def test_parts_1_2_3_export_the_same_model(deep_checkpoint, tmp_path, monkeypatch):
    """The streamed export in 2 and 3 parts: each part's graphs hold only its own blocks'
    weights, the whole-context check gives the one-graph figures, and the chained parts
    generate the one graph's greedy tokens. The 3 parts' graphs keep their weights in
    part's one ``weights.data`` file, copied a slice at a time and shared by its graphs (as a
    real model's large parts do)."""
    import onnx

    from studio.engine import weightstore
    from studio.engine.llm_export import export_llm
    from studio.engine.llm_parts import checkpoint_layout, export_parts

    layout = checkpoint_layout(deep_checkpoint)
    assert layout.num_layers == 8 and layout.tied and layout.embedding == 2048 * 256
    whole = export_llm(deep_checkpoint, tmp_path / "p1", 16, 64, verify_len=1)
    tokens = _greedy(tmp_path / "p1")
    for n in (2, 3):
        resume = n == 3
        if n == 3:
            monkeypatch.setattr(weightstore, "SHARE_ABOVE", 0)
            # killed while part 3 is read: parts 1 and 2 are kept and not written again
            with pytest.raises(_Killed):
                export_parts(deep_checkpoint, tmp_path / "p3", 16, 64, parts=3, verify_len=1,
                             resume=True, progress=_KillAt("part 3/3: reading"))
            kept = {k: v for k, v in _stats(tmp_path / "p3").items()
                    if k.startswith(("part1_", "part2_")) and ".part-" not in k}
            assert len(kept) == 6  # prefill, decode and weights of each
        rec = _KillAt()
        spec = export_parts(deep_checkpoint, tmp_path / f"p{n}", 16, 64, parts=n, verify_len=1,
                            resume=resume, progress=rec)
        if resume:
            assert any("parts 1-2 of 3: kept from an interrupted run" in m for m in rec.lines)
            assert not any(m.startswith(("part 1/3", "part 2/3")) for _, m in rec.updates)
            now = _stats(tmp_path / "p3")
            assert {k: now[k] for k in kept} == kept
            assert not [k for k in now if ".part-" in k]  # no marks left in the export
        data = sorted((tmp_path / f"p{n}").rglob("*.data"))
        assert [f.name for f in data] == ([weightstore.WEIGHTS_FILE] * 3 if n == 3 else [])
        for f in data:  # the prefill and decode graphs' weights stored once
            pre, dec = (weightstore.graph_bytes(f.parent / g) for g in ("prefill.onnx",
                                                                          "decode.onnx"))
            assert f.stat().st_size < 0.6 * (pre + dec), (f, pre, dec)
        assert [p["name"] for p in spec["parts"]] == [f"part{i + 1}_of_{n}" for i in range(n)]
        chk, ref = spec["export_check"], whole["export_check"]
        assert chk["positions"] == ref["positions"] == 64 and chk["first_bad_position"] is None
        assert chk["top1_agreement"] == ref["top1_agreement"] == 1.0
        assert abs(chk["max_abs_logit_diff"] - ref["max_abs_logit_diff"]) < 2e-5
        for row in spec["parts"]:
            model = onnx.load(str(tmp_path / f"p{n}" / row["name"] / "decode.onnx"),
                              load_external_data=False)
            layers = {int(t.name.split(".")[2]) for t in model.graph.initializer
                      if t.name.startswith("model.layers.")}
            assert layers == set(range(row["start"], row["stop"]))
            names = {t.name for t in model.graph.initializer}
            assert ("model.embed_tokens.weight" in names) == (row["start"] == 0)
        assert _greedy(tmp_path / f"p{n}") == tokens


def test_a_part_count_the_model_cannot_take_is_refused(deep_checkpoint, tmp_path):
    from studio.engine.llm_parts import export_parts

    with pytest.raises(StudioError, match="splits into 1..8 parts, not 9"):
        export_parts(deep_checkpoint, tmp_path / "x", 16, 64, parts=9)
    assert not (tmp_path / "x").exists()


# ---- quantization part by part ------------------------------------------------------------------
def _activation_scales(folder: Path) -> dict[tuple, float]:
    """Each QuantizeLinear's scale by what it quantizes (the producing node's name, type and
    inputs: the tracer reuses tensor names across graphs, so a name alone is not enough)."""
    import onnx
    from onnx import numpy_helper

    out: dict[tuple, float] = {}
    for f in sorted(folder.rglob("decode.onnx")):
        model = onnx.load(str(f))
        inits = {t.name: t for t in model.graph.initializer}
        producer = {o: n for n in model.graph.node for o in n.output}
        for node in model.graph.node:
            if node.op_type != "QuantizeLinear" or node.input[1] not in inits:
                continue
            src = producer.get(node.input[0])
            if src is not None:
                key = (src.name, src.op_type, tuple(src.input))
                out[key] = float(numpy_helper.to_array(inits[node.input[1]]).ravel()[0])
    return out


@pytest.mark.slow  # four real exports and quantizations
def test_parts_calibrated_on_the_previous_parts_outputs_get_the_one_graph_encodings(
        tmp_path, sample_model_dir, monkeypatch):
    """The sample (4 blocks) in 1 and 2 parts, W8A16: every activation both graphs quantize
    gets the same scale (within float rounding), and both generate the same greedy text.
    The parts' graphs keep their weights in their part's shared ``weights.data`` file (as
    large parts do), FP32 and quantized."""
    from studio.core.resources import resources_dir
    from studio.engine import weightstore
    from studio.engine.llm_export import export_llm
    from studio.engine.llm_parts import export_parts
    from studio.engine.quantize import quantize_llm
    from studio.engine.quantize_parts import quantize_parts

    text = (resources_dir() / "data" / "calibration.py.txt").read_text(encoding="utf-8")
    recipe = {"scheme": "W8A16", "weight_granularity": "per_channel", "samples": 2}
    export_llm(sample_model_dir, tmp_path / "e1", 16, 64, verify_len=1)
    monkeypatch.setattr(weightstore, "SHARE_ABOVE", 0)
    export_parts(sample_model_dir, tmp_path / "e2", 16, 64, parts=2, verify_len=1)
    assert (tmp_path / "e2" / "part1_of_2" / weightstore.WEIGHTS_FILE).is_file()
    quantize_llm(tmp_path / "e1", tmp_path / "q1", recipe, text, sample_model_dir)
    # killed while part 2 is quantized, then run again: part 1 is kept (and what it hands
    # part 2 with it), and the figures below are the resumed run's
    with pytest.raises(_Killed):
        quantize_parts(tmp_path / "e2", tmp_path / "q2", recipe, text, sample_model_dir,
                       progress=_KillAt("part 2/2: quantizing"), resume=True)
    kept = {k: v for k, v in _stats(tmp_path / "q2").items()
            if k.startswith("part1_") and ".part-" not in k}
    rec = _KillAt()
    info = quantize_parts(tmp_path / "e2", tmp_path / "q2", recipe, text, sample_model_dir,
                          progress=rec, resume=True)
    assert any("part 1 of 2: kept from an interrupted run" in m for m in rec.lines)
    now = _stats(tmp_path / "q2")
    assert kept and {k: now[k] for k in kept} == kept
    assert not [k for k in now if ".part-" in k or ".quantize." in k]
    assert [p["name"] for p in info["parts"]] == ["part1_of_2", "part2_of_2"]
    for part in ("part1_of_2", "part2_of_2"):  # the quantized graphs share their weights too
        data = tmp_path / "q2" / part / weightstore.WEIGHTS_FILE
        both = sum(weightstore.graph_bytes(data.parent / g) for g in ("prefill.onnx",
                                                                      "decode.onnx"))
        assert data.is_file() and data.stat().st_size < 0.6 * both
    assert all(v > 0.99 for p in info["parts"] for v in p["check"].values())
    one, two = _activation_scales(tmp_path / "q1"), _activation_scales(tmp_path / "q2")
    common = set(one) & set(two)
    assert len(common) > 0.85 * len(one)  # the rest: renamed around the hand-off and RoPE
    worst = max(abs(one[k] - two[k]) / one[k] for k in common)
    assert worst < 1e-4, worst
    assert _greedy(tmp_path / "q2", 16) == _greedy(tmp_path / "q1", 16)


def test_the_reference_in_chunks_is_the_reference_at_once(deep_checkpoint):
    """The export check's reference (transformers' modules of a part over the whole context)
    runs a chunk of rows at a time over the rows before: the same outputs as all at once."""
    import numpy as np

    from studio.core.families import FAMILIES
    from studio.core.parts import split
    from studio.engine.llm_export import model_spec
    from studio.engine.llm_parts import StreamedCheckpoint, _reference_part, checkpoint_layout
    from studio.engine.llm_wrapper import build_wrapper, layer_types_of

    ck = StreamedCheckpoint(deep_checkpoint)
    family = FAMILIES[ck.cfg["model_type"]]
    spec = model_spec(ck.model, ck.cfg, family, 16, 64, -100.0, 1)
    part = split(checkpoint_layout(deep_checkpoint), 2)[0]
    ck.load(part)
    wrapper = build_wrapper(ck.model, 64, family, layer_types_of(ck.config, family), False,
                             None, part, rotary=ck.rotary)
    ids = np.arange(3, 67, dtype=np.int64)
    whole = _reference_part(wrapper, spec, ids, chunk=64)
    chunked = _reference_part(wrapper, spec, ids, chunk=7)
    assert whole.shape == (64, 256)
    # reordered sums only: within 2e-5 of the largest state
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=2e-5 * float(np.abs(whole).max()))
