"""A stage's settings beside the stage: each stage's settings class is exactly the keys its
artifact key hashes (the same keys as before they moved: artifact keys do not change), each
key is declared once, and the stage modules read their settings only through the class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from studio.core.keys import Key, StageSettings
from studio.core.settings import SECTIONS, setting_keys
from studio.core.stagegraph import DECLARATIONS, STAGE_KEYS, STAGES

STAGE_MODULES = Path(__file__).resolve().parents[2] / "studio" / "worker" / "stages"

#: each stage's keys before its settings moved beside it: what its artifact key hashes
#: (a change here changes the stage's artifact keys: make it on purpose)
KEYS: dict[str, set[str]] = {
    "ablation": {
        "export.context_length", "model.source", "pruning.drop_blocks", "validation.heldout_text",
        "validation.heldout_tokens"},
    "autoprecision": {"autoprecision.max_perplexity_change", "autoprecision.metric",
        "autoprecision.min_logits_cosine", "autoprecision.min_top1_agreement",
        "autoprecision.on_htp"},
    "bundle": {
        "bundle.dlc", "bundle.draft", "bundle.new_tokens", "bundle.parts", "bundle.prefill_length",
        "bundle.prompts", "bundle.score_tokens", "bundle.weight_sharing", "htp.fp16_relaxation",
        "htp.graph_io", "htp.optimization_level", "htp.vtcm_mb", "model.chat_template",
        "model.draft", "model.draft_embedding", "model.source", "quantization.block_size",
        "quantization.calibration_method", "quantization.calibration_samples",
        "quantization.calibration_text", "quantization.embedding", "quantization.kv_cache",
        "quantization.overrides", "quantization.rounding_samples", "quantization.scheme",
        "quantization.weight_granularity", "quantization.weight_rounding", "run.prompt",
        "validation.greedy_tokens", "validation.heldout_text"},
    "compile": {
        "bundle.prefill_length", "bundle.weight_sharing", "htp.fp16_relaxation", "htp.graph_io",
        "htp.optimization_level", "htp.vtcm_mb", "model.source", "quantization.block_size",
        "quantization.calibration_method", "quantization.calibration_samples",
        "quantization.calibration_text", "quantization.embedding", "quantization.overrides",
        "quantization.rounding_samples", "quantization.scheme", "quantization.weight_granularity",
        "quantization.weight_rounding"},
    "draft": {"export.context_length", "export.prompt_length", "model.draft"},
    "export": {"export.context_length", "export.image_size", "export.max_part_mb", "export.parts",
        "export.prompt_length", "model.source", "targets"},
    "graph-compile": {
        "htp.fp16_relaxation", "htp.graph_io", "htp.optimization_level", "htp.vtcm_mb",
        "quantization.placement", "quantization.scheme"},
    "graph-profile": {"profile.repeats", "quantization.placement", "quantization.scheme"},
    "graph-quantize": {
        "graph.calibration", "graph.validation", "model.kind", "quantization.calibration_method",
        "quantization.calibration_samples", "quantization.calibration_text",
        "quantization.overrides", "quantization.placement", "quantization.scheme",
        "quantization.weight_granularity", "quantization.weight_rounding"},
    "graph-run": {"graph.repeats", "quantization.placement", "quantization.scheme"},
    "graph-validate": {"model.kind", "quantization.placement", "quantization.scheme"},
    "import": {"graph.seq_len", "graph.shapes", "model.kind", "model.source"},
    "layerdiff": {"htp.fp16_relaxation", "htp.graph_io", "htp.optimization_level", "htp.vtcm_mb",
        "layerdiff.fp16_step", "layerdiff.graph", "layerdiff.part", "layerdiff.tensors",
        "layerdiff.windows", "quantization.block_size", "quantization.kv_cache",
        "quantization.scheme", "quantization.weight_granularity", "validation.heldout_text"},
    "profile": {
        "htp.fp16_relaxation", "htp.graph_io", "htp.optimization_level", "htp.performance_mode",
        "htp.vtcm_mb", "profile.repeats", "quantization.block_size", "quantization.scheme",
        "quantization.weight_granularity"},
    "quantize": {"quantization.block_size", "quantization.calibration_images",
        "quantization.calibration_method", "quantization.calibration_samples",
        "quantization.calibration_text", "quantization.embedding", "quantization.kv_cache",
        "quantization.overrides", "quantization.rounding_samples", "quantization.scheme",
        "quantization.vision_overrides", "quantization.vision_scheme",
        "quantization.weight_granularity", "quantization.weight_rounding"},
    "report": {
        "gates.max_perplexity_increase", "gates.min_logits_cosine", "gates.min_output_cosine",
        "gates.min_ranking_top1", "gates.min_top1_agreement", "name"},
    "run": {"htp.performance_mode", "model.chat_template", "quantization.scheme", "run.image",
        "run.max_new_tokens", "run.prompt"},
    "sensitivity": {
        "quantization.calibration_samples", "quantization.calibration_text", "quantization.scheme",
        "quantization.weight_granularity", "sensitivity.confirm_on_htp", "sensitivity.confirm_top",
        "sensitivity.heldout_tokens", "sensitivity.high", "sensitivity.low",
        "validation.heldout_text"},
    "validate": {
        "model.chat_template", "quantization.scheme", "run.prompt", "validation.device_tokens",
        "validation.greedy_prompts", "validation.greedy_tokens", "validation.heldout_images",
        "validation.heldout_text", "validation.heldout_tokens"},
    "waterfall": {
        "model.source", "quantization.calibration_samples", "quantization.calibration_text",
        "quantization.scheme", "quantization.weight_granularity", "validation.heldout_text",
        "validation.heldout_tokens", "waterfall.k", "waterfall.new_tokens", "waterfall.window"},
}


@pytest.mark.parametrize("decl", DECLARATIONS, ids=lambda d: d.name)
def test_each_stage_settings_class_covers_exactly_its_declared_keys(decl):
    assert decl.settings_class is not StageSettings, f"{decl.name} declares no settings class"
    assert decl.settings == decl.settings_class.names()
    assert set(decl.settings) == KEYS[decl.name]
    assert len(decl.settings) == len(set(decl.settings))  # no key twice


def test_every_key_is_declared_once_with_a_type():
    seen: dict[str, Key] = {}
    for decl in DECLARATIONS:
        for key in decl.settings_class.keys():
            assert key.type is not None and key.owner, key.key
            assert seen.setdefault(key.key, key) is key, f"{key.key} is declared twice"
    for name, cls in SECTIONS.items():
        for leaf, key in cls._keys.items():
            assert key.key == f"{name}.{leaf}"
            assert key is STAGE_KEYS.get(key.key, key), f"{key.key}: not the stage's own key"
    assert set(STAGE_KEYS) <= setting_keys()


def _string_setting_reads(path: Path) -> list[str]:
    """Calls and subscripts in a module that name a project setting by a string."""
    known = setting_keys()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        args: list[ast.expr] = []
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(
                    func.value, ast.Name) and func.value.id == "ctx" and args and isinstance(
                    args[0], ast.Constant) and isinstance(args[0].value, str):
                out.append(f"{path.name}:{node.lineno} ctx.get({args[0].value!r})")
        elif isinstance(node, ast.Subscript):
            args = [node.slice]
        out += [f"{path.name}:{node.lineno} {a.value!r}" for a in args
                if isinstance(a, ast.Constant) and a.value in known and "." in str(a.value)]
    return out


def test_no_stage_module_reads_a_setting_by_its_name():
    modules = sorted(STAGE_MODULES.glob("*.py"))
    assert len(modules) > len(DECLARATIONS)
    found = [hit for m in modules for hit in _string_setting_reads(m)]
    assert not found, "read these through the stage's settings class: " + "; ".join(found)


def test_a_stage_reads_its_settings_as_typed_attributes():
    s = STAGES["quantize"].settings_class(
        {k: SECTIONS[k.split(".")[0]].default(k.split(".")[1]) for k in KEYS["quantize"]},
        {"quantization.calibration_text": "/data/calibration.txt"})
    assert s.scheme == "W8A16" and s.recipe()["samples"] == s.calibration_samples
    assert s.path(s.calibration_text) == Path("/data/calibration.txt")
    with pytest.raises(AttributeError):
        s.scheme = "W8A8"
