"""The typed settings: one declaration per section, read by attribute, still a dict of keys."""

from __future__ import annotations

import copy
import json
import pickle
import tomllib
from pathlib import Path

import pytest
import tomli_w

from studio.core import project as pf
from studio.core.commands import CommandStack, SetValue
from studio.core.errors import StudioError
from studio.core.keys import StageSettings, setting
from studio.core.recipe import (
    DEFAULT_GATES,
    QUANTIZED_SCHEMES,
    SCHEMES,
    activation_bits,
    is_float_precision,
    is_float_scheme,
    weight_bits,
)
from studio.core.settings import (
    SECTION_KEYS,
    SECTIONS,
    Gates,
    Quantization,
    check_settings_declared,
    spec_of,
)
from studio.core.stagegraph import DECLARATIONS, StageDecl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/tiny-coder/tiny-coder.qstudio"


def test_sections_are_read_by_attribute_and_by_key():
    p = pf.load(EXAMPLE)
    assert p.quantization.scheme == p.quantization["scheme"] == "W8A16"
    assert p.export.context_length == p.export["context_length"] == 128
    assert isinstance(p.quantization, Quantization)
    assert p.quantization.get("overrides", {}) == {} and p.quantization.get("nope", 3) == 3
    assert dict(p.gates) == DEFAULT_GATES and p.gates == DEFAULT_GATES  # equal to a plain dict
    assert list(p.run) == list(p.run.keys()) == ["prompt", "max_new_tokens", "devices",
                                                      "image", "speculative_overlap"]
    assert dict(p.run.items())["devices"] == p.run.devices == list(p.run.values())[2]
    assert "scheme" in p.quantization and "nope" not in p.quantization
    assert len(p.quantization) == len(SECTION_KEYS["quantization"])
    assert {**p.export} == {"prompt_length": 32, "context_length": 128, "parts": 1,
                          "max_part_mb": 1500, "image_size": 448}


def test_sections_copy_pickle_and_serialise_as_they_are():
    p = pf.load(EXAMPLE)
    q = copy.deepcopy(p)
    assert q == p and q.quantization is not p.quantization
    q.quantization.overrides["lm_head"] = "INT16"
    assert p.quantization.overrides == {}  # nothing shared
    assert pickle.loads(pickle.dumps(p)) == p
    assert type(copy.deepcopy(p.gates)) is Gates
    assert json.loads(json.dumps(p.quantization)) == p.quantization
    assert tomllib.loads(tomli_w.dumps({"q": p.quantization}))["q"] == p.quantization
    assert tomllib.loads(pf.dumps(p))["quantization"] == p.quantization.to_dict()
    plain = p.export.copy()
    assert type(plain) is dict and plain == p.export


def test_a_key_or_attribute_no_declaration_has_is_refused():
    p = pf.load(EXAMPLE)
    with pytest.raises(StudioError, match=r"unknown key 'shceme' in \[quantization\]"):
        p.quantization["shceme"] = "W8A8"
    with pytest.raises(AttributeError, match="no setting 'shceme'"):
        p.quantization.shceme = "W8A8"  # type: ignore[attr-defined]
    with pytest.raises(StudioError, match="unknown key"):
        p.quantization.update(shceme="W8A8")
    with pytest.raises(KeyError):
        p.quantization["shceme"]  # noqa: B018
    assert "shceme" not in p.quantization


def test_a_deleted_key_takes_its_default_and_a_section_keeps_every_key():
    p = pf.load(EXAMPLE)
    p.quantization.scheme = "W8A8"
    p.quantization.update(calibration_samples=3)
    assert p.quantization["calibration_samples"] == 3
    del p.quantization["scheme"]
    assert p.quantization.scheme == "W8A16"
    assert p.quantization.pop("calibration_samples") == 3
    assert p.quantization.calibration_samples == Quantization.default("calibration_samples")
    assert len(p.quantization) == len(SECTION_KEYS["quantization"])
    with pytest.raises(StudioError, match="needs the key 'source'"):
        del p.model["source"]


def test_a_plain_dict_assigned_to_a_section_becomes_that_section():
    p = pf.load(EXAMPLE)
    p.gates = {k: 0.5 for k in DEFAULT_GATES}
    assert isinstance(p.gates, Gates) and p.gates.min_logits_cosine == 0.5
    with pytest.raises(StudioError, match="unknown key 'bogus' in"):
        p.gates = {"bogus": 1.0}


def test_commands_set_keys_through_the_mapping_and_validate_the_whole_project():
    p = pf.load(EXAMPLE)
    stack = CommandStack(p)
    stack.push(SetValue("quantization", "scheme", "W8A8"))
    assert p.quantization.scheme == "W8A8"
    for bad, match in ((SetValue("quantization", "scheme", "W3A3"), "is not one of"),
                       (SetValue("run", "devices", [["cpu"]]), r"run.devices\[0\] must be a str"),
                       (SetValue("profile", "repeats", 10**9), "between 1 and 50"),
                       (SetValue("quantization", "shceme", "W8A8"), "unknown key 'shceme'"),
                       (SetValue("colour", "x", 1), r"unknown section \[colour\]")):
        with pytest.raises(StudioError, match=match):
            stack.push(bad)
    assert p.quantization.scheme == "W8A8" and p.run.devices == ["cpu", "htp-sim"]
    stack.undo()
    assert p.quantization.scheme == "W8A16"


def test_every_setting_has_a_doc_and_every_default_is_valid():
    p = pf.from_dict({"schema_version": 1, "model": {"source": "sample:tiny-coder"}})
    for name, cls in SECTIONS.items():
        assert cls.name == name
        for key, (spec, _) in cls.specs().items():
            assert spec.doc and "\n" not in spec.doc, f"{name}.{key}"
        assert set(getattr(p, name)) == set(SECTION_KEYS[name])


def test_a_stage_that_declares_a_setting_no_section_has_fails_at_import():
    check_settings_declared(DECLARATIONS)  # what settings runs when it is imported

    class Typo(StageSettings):  # declared after the sections were assembled
        schem: str = setting("quantization.schem", "", "a misspelt key")

    typo = StageDecl("quantize", "Quantize", settings_class=Typo)
    with pytest.raises(ValueError, match="the quantize stage declares the setting "
                                         "'quantization.schem'.*scheme, weight_granularity"):
        check_settings_declared((typo,))
    with pytest.raises(ValueError, match="'nosuch.key' is not a setting"):
        check_settings_declared((), {"nosuch.key": "checkpoint"})


def test_the_import_of_settings_runs_the_check(monkeypatch):
    """With a stage key in a section the file does not have (a misspelt section), the
    settings module does not import."""
    import sys
    import types

    import studio.core.settings as st
    import studio.core.stagegraph as sg

    class Typo(StageSettings):
        repeats: int = setting("profil.repeats", 5, "a misspelt section")

    typo = StageDecl("profile", "Profile", settings_class=Typo)
    declarations = tuple(typo if d.name == "profile" else d for d in sg.DECLARATIONS)
    monkeypatch.setattr(sg, "DECLARATIONS", declarations)
    monkeypatch.setattr(sg, "STAGE_KEYS", sg.stage_keys(declarations))
    module = types.ModuleType("settings_over_a_typo")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(ValueError, match="the profile stage declares the setting "
                                         "'profil.repeats'"):
        exec(compile(Path(st.__file__).read_text(), st.__file__, "exec"), module.__dict__)


def test_the_limits_live_in_the_declaration():
    assert spec_of("profile.repeats").max == 50
    assert spec_of("quantization.scheme").allowed() == SCHEMES
    assert spec_of("model.kind").allowed() == ("causal-lm", "encoder", "onnx-graph")


def test_the_scheme_vocabulary_answers_what_fp16_comparisons_meant():
    assert [s for s in SCHEMES if is_float_scheme(s)] == ["FP16"]
    assert QUANTIZED_SCHEMES == ("W8A16", "W8A8", "W4A16")
    assert [activation_bits(s) for s in SCHEMES] == [16, 8, 16, 16]
    assert [weight_bits(s) for s in SCHEMES] == [8, 8, 4, 16]
    assert is_float_precision("FP32") and not is_float_precision("INT16")
    assert not is_float_scheme("W3A3")


# ---- generated files: every mutation of a declared setting is a project or one line -----------
def _values_for(key: str):
    """Hypothesis values for one declared setting: valid ones, its limits and past them, and
    values of every other TOML type (nested lists and tables included)."""
    from hypothesis import strategies as st

    section, _, leaf = key.partition(".")
    spec, hint = SECTIONS[section].specs()[leaf]
    scalars = st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=True,
                        allow_infinity=True), st.text(max_size=12), st.booleans())
    anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                            max_leaves=6)
    near = [st.just(v) for v in (spec.min, spec.max, spec.cap, spec.above) if v is not None]
    near += [st.just(int(v) + d) for v in (spec.min, spec.max, spec.cap) if v is not None
             for d in (-1, 1)]
    choices = spec.allowed() if not callable(spec.choices) else None
    options = [anything, *near]
    if choices:
        options.append(st.sampled_from(choices))
    if hint is str:
        options.append(st.text(max_size=20))
    return st.one_of(*options)


def test_generated_mutations_load_or_fail_in_one_line():
    from hypothesis import HealthCheck, given
    from hypothesis import settings as hsettings
    from hypothesis import strategies as st

    base = pf.load(EXAMPLE).to_dict()
    keys = sorted(f"{s}.{k}" for s, ks in SECTION_KEYS.items() for k in ks
                  if not (s == "model" and k == "source"))  # a missing checkpoint: preflight

    @st.composite
    def mutated(draw):
        data = copy.deepcopy(base)
        for key in draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
            section, _, leaf = key.partition(".")
            data[section][leaf] = draw(_values_for(key))
        return data

    @hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutated())
    def check(data):
        try:
            p = pf.from_dict(data)
        except StudioError as exc:
            assert "\n" not in exc.message and len(exc.message) < 600, exc.message
        else:
            assert pf.from_dict(p.to_dict()) == p  # what loads saves and loads back

    check()


def test_per_token_activations_are_refused_with_the_reason_and_what_comes_closest(tmp_path):
    """The seed's per-token activation axis: the HTP runs static Q/DQ (the QNN EP refuses
    DynamicQuantizeLinear and MatMulInteger), so the setting is refused in one line; the
    shipped sample's grid says what it sweeps instead."""
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny-coder" / "tiny-coder.qstudio"
    text = example.read_text()
    f = tmp_path / "t.qstudio"
    f.write_text(text.replace("[quantization]", '[quantization]\nactivation_granularity = '
                                                '"per_token"', 1))
    with pytest.raises(StudioError) as err:
        pf.load(f)
    assert "per_token cannot run on the HTP" in err.value.message
    assert "DynamicQuantizeLinear" in err.value.message and "W8A16" in err.value.message
    f.write_text(text.replace("[quantization]", '[quantization]\nactivation_granularity = '
                                                '"per_tensor"', 1))
    assert pf.load(f).quantization["activation_granularity"] == "per_tensor"
    grid = next(s for s in tomllib.loads(text)["sweeps"] if s["name"] == "seed-grid")
    assert "per token cannot run on the HTP" in grid["description"]
