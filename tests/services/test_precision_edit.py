"""Layer-precision edits as override rules (what the Precision page's grid writes), the grid's
shape, and the changes against the scheme — on the shipped tiny-coder's real ModelInfo, every
result checked with the recipe's own rule (``core.recipe.effective_precisions``)."""

from __future__ import annotations

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.modelinfo import LayerInfo, ModelInfo
from studio.core.recipe import effective_precisions
from studio.services.precision import (
    grid_layout,
    layer_precisions,
    quantizable,
    scheme_diff,
    weighted_layers,
)
from studio.services.precision_edit import compact_patterns, plan_edit


@pytest.fixture(scope="module")
def info() -> ModelInfo:
    from studio.services.projects import describe_model

    return describe_model(pf.new_project("t", "sample:tiny-coder"))


@pytest.fixture
def project() -> pf.Project:
    return pf.new_project("t", "sample:tiny-coder", ["snapdragon-8-gen-3"])


def state(project, info) -> dict[str, tuple[str, str]]:
    names = [n for n, *_ in quantizable(info)]
    return {lp.layer: (lp.weight, lp.activation) for lp in effective_precisions(
        names, project.quantization, weighted_layers(info))}


def column(info, sub: str) -> list[str]:
    return [n for n, *_ in quantizable(info) if n.endswith("." + sub) and ".layers." in n]


def test_the_grid_has_blocks_and_module_kinds_from_the_rows(project, info):
    g = grid_layout(layer_precisions(project, info))
    assert g.rows == ["model", "block 0", "block 1", "block 2", "block 3"]
    assert g.columns[:3] == ["model.embed_tokens", "model.norm", "lm_head"]
    assert g.titles[:3] == ["embed_tokens", "norm", "lm_head"]
    # the key activations sit after the module that computes them, the residual last
    blocks = g.columns[3:]
    assert blocks.index("self_attn.scores") == blocks.index("self_attn.o_proj") + 1
    assert blocks.index("self_attn.softmax") == blocks.index("self_attn.scores") + 1
    assert blocks[-1] == "residual" and "mlp.down_proj" in blocks
    assert len(g.cells) == len(quantizable(info))
    assert g.layer_at(*g.cells["model.layers.2.mlp.up_proj"]) == "model.layers.2.mlp.up_proj"
    assert g.layer_at(0, g.columns.index("residual")) is None  # the model row has no residual


def test_other_families_bring_their_own_columns():
    layers = [LayerInfo("model.embed_tokens", None, "embedding", 10)]
    for b in range(2):
        layers += [LayerInfo(f"model.layers.{b}.self_attn.qkv_proj", b, "attention", 30),
                   LayerInfo(f"model.layers.{b}.self_attn.o_proj", b, "attention", 10),
                   LayerInfo(f"model.layers.{b}.mlp.gate_up_proj", b, "mlp", 40),
                   LayerInfo(f"model.layers.{b}.mlp.down_proj", b, "mlp", 20)]
    layers.append(LayerInfo("lm_head", None, "lm_head", 10))
    info = ModelInfo("x", "hf", "Phi3ForCausalLM", "phi3", 2, 4, 8, 1, 1, 4, 10, False, 64,
                     200, layers)
    g = grid_layout(layer_precisions(pf.new_project("t", "sample:tiny-coder"), info))
    assert g.titles == ["embed_tokens", "lm_head", "qkv_proj", "o_proj", "scores", "softmax",
                        "gate_up_proj", "down_proj", "residual"]


def test_a_whole_column_is_one_rule(project, info):
    edit = plan_edit(project, info, column(info, "mlp.down_proj"), "activations", "INT8")
    assert edit.overrides == {"*.down_proj": "INT8"}
    assert edit.label == "Set the activations of 4 layers to INT8"
    project.quantization["overrides"] = edit.overrides
    s = state(project, info)
    assert all(s[n] == ("INT8", "INT8") for n in column(info, "mlp.down_proj"))
    assert sum(1 for v in s.values() if v[1] == "INT8") == 4


def test_a_whole_block_is_one_rule_and_weights_skip_layers_without(project, info):
    block = [n for n, b, *_ in quantizable(info) if b == 1]
    edit = plan_edit(project, info, block, "weights", "INT4")
    assert edit.overrides == {"model.layers.1.*.weight": "INT4"}
    assert len(edit.skipped) == 5  # two norms, scores, softmax, residual
    project.quantization["overrides"] = edit.overrides
    s = state(project, info)
    assert all(s[n][0] == "INT4" for n in block if s[n][0])
    assert s["model.layers.2.mlp.up_proj"] == ("INT8", "INT16")


def test_a_mixed_selection_gets_exact_rules_and_redundant_ones_go(project, info):
    picked = ["model.layers.0.self_attn.q_proj", "lm_head"]
    edit = plan_edit(project, info, picked, "layer", "FP16")
    assert edit.overrides == {"model.layers.0.self_attn.q_proj": "FP16", "lm_head": "FP16"}
    project.quantization["overrides"] = edit.overrides
    # the whole q_proj column to INT8 activations: the exact q_proj rule is now pointless
    edit = plan_edit(project, info, column(info, "self_attn.q_proj"), "activations", "INT8")
    assert edit.overrides == {"lm_head": "FP16", "*.q_proj": "INT8"}
    assert edit.removed == ["model.layers.0.self_attn.q_proj"]
    project.quantization["overrides"] = edit.overrides
    s = state(project, info)
    assert s["model.layers.0.self_attn.q_proj"] == ("INT8", "INT8") and s["lm_head"] == (
        "FP16", "FP16")
    # the scheme's own precision writes nothing
    same = plan_edit(project, info, ["model.layers.3.mlp.up_proj"], "activations", "INT16")
    assert not same.changes(project.quantization["overrides"])


def test_back_to_the_scheme_removes_or_outvotes_rules(project, info):
    project.quantization["overrides"] = {"*.down_proj": "FP16", "lm_head": "INT8"}
    edit = plan_edit(project, info, ["model.layers.2.mlp.down_proj", "lm_head"], "scheme")
    assert edit.overrides == {"*.down_proj": "FP16", "model.layers.2.mlp.down_proj": "INT16"}
    assert edit.removed == ["lm_head"]
    project.quantization["overrides"] = edit.overrides
    s = state(project, info)
    assert s["model.layers.2.mlp.down_proj"] == ("INT8", "INT16") == s["lm_head"]
    assert s["model.layers.1.mlp.down_proj"] == ("FP16", "FP16")


def test_refused_edits_change_nothing(project, info):
    before = dict(project.quantization["overrides"])
    with pytest.raises(StudioError, match="INT4 is for weights only"):
        plan_edit(project, info, column(info, "mlp.up_proj"), "activations", "INT4")
    with pytest.raises(StudioError, match="none of the 4 selected layers has weights"):
        plan_edit(project, info, column(info, "residual"), "weights", "INT8")
    project.targets = ["qcm6490"]
    with pytest.raises(StudioError, match="fp16 = false"):
        plan_edit(project, info, ["lm_head"], "layer", "FP16")
    assert project.quantization["overrides"] == before


def test_compact_patterns_only_use_rules_that_cover_exactly_the_selection(info):
    names = [n for n, *_ in quantizable(info)]
    # mlp.up_proj of every block, and one layer more
    sel = set(column(info, "mlp.up_proj")) | {"model.layers.0.mlp.gate_proj"}
    assert compact_patterns(sel, names) == ["*.up_proj", "model.layers.0.mlp.gate_proj"]
    # three of four blocks: no column rule
    assert compact_patterns(set(column(info, "residual")[:3]), names) == [
        "model.layers.0.residual", "model.layers.1.residual", "model.layers.2.residual"]


def test_changes_against_the_scheme_count_layers_and_weight_bytes(project, info):
    assert scheme_diff(project, info)["counts"]["layers"] == 0
    project.quantization["overrides"] = {"*.down_proj.weight": "INT4", "lm_head": "INT8"}
    d = scheme_diff(project, info)
    assert d["counts"] == {"layers": 5, "weights": 4, "activations": 1}
    per_layer = info.layer("model.layers.0.mlp.down_proj").params
    assert d["weight_bytes"]["change"] == -4 * per_layer // 2  # INT8 -> INT4: half a byte each
    assert d["weight_bytes"]["source"] == "formula"
    assert {r["layer"] for r in d["layers"]} >= {"lm_head", "model.layers.3.mlp.down_proj"}


def test_preflight_refuses_float_parts_on_a_target_without_float(tmp_path):
    """``studio --batch`` refuses, before any stage runs, what the page refuses."""
    from studio.core.stagegraph import plan
    from studio.services.pipeline import preflight

    p = pf.new_project("t", "sample:tiny-coder", ["snapdragon-8-gen-3", "qcm6490"],
                       quantization={"overrides": {"lm_head": "FP16"}})
    pf.save(p, tmp_path / "t.qstudio")
    with pytest.raises(StudioError, match=r"'lm_head' = FP16: .*qcm6490.*fp16 = false"):
        preflight(p, plan(p, ["compile"]))
    preflight(p, plan(p, ["compile"], ["snapdragon-8-gen-3"]))  # that target runs float
    preflight(p, plan(p, ["quantize"]))  # no target involved
    p.quantization["overrides"] = {}
    p.quantization["scheme"] = "FP16"
    with pytest.raises(StudioError, match="the FP16 scheme needs float support"):
        preflight(p, plan(p, ["validate"]))
