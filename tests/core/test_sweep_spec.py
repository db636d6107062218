"""Sweep definitions: parsing, points, settings applied, the Pareto front, the best point."""

from __future__ import annotations

import pytest

from studio.core import project as projectfile
from studio.core.commands import CommandStack, SetValue, SetValues
from studio.core.errors import StudioError
from studio.core.project import apply_point
from studio.core.sweep import (
    Point,
    PointResult,
    best_point,
    pareto_front,
    parse_axis_arg,
    parse_spec,
)

SEED = {"name": "seed-grid", "axes": {
    "quantization.weight_granularity": ["per_tensor", "per_channel"],
    "quantization.scheme": ["W8A16", "W8A8"],
    "quantization.overrides": [{}, {"lm_head": "INT16", "*.self_attn.scores": "INT16"}]}}


@pytest.fixture
def project():
    return projectfile.new_project("p", "sample:tiny-coder")


def test_grid_points_are_every_combination_with_stable_ids(project):
    spec = parse_spec(SEED, project)
    points = spec.expand()
    assert len(points) == 8
    assert [p.label for p in points] == [f"p{i}" for i in range(1, 9)]
    assert points[0].settings == {"quantization.weight_granularity": "per_tensor",
                                  "quantization.scheme": "W8A16",
                                  "quantization.overrides": {}}
    assert len({p.id for p in points}) == 8
    # the id is the settings' own, whatever their order or the point's index
    again = Point(5, dict(reversed(list(points[0].settings.items()))))
    assert again.id == points[0].id


def test_explicit_points_and_the_project_file_round_trip(project, tmp_path):
    table = {"name": "two", "best": "most-accurate", "stages": ["export", "quantize"],
             "points": [{"quantization.scheme": "W8A8"},
                        {"quantization.scheme": "W8A16", "targets": "snapdragon-8-elite"}]}
    spec = parse_spec(table, project)
    assert [dict(p.settings) for p in spec.expand()] == table["points"]
    data = project.to_dict()
    data["sweeps"] = [SEED, table]
    p = projectfile.from_dict(data)
    path = tmp_path / "p.qstudio"
    projectfile.save(p, path)
    again = projectfile.load(path)
    assert [s["name"] for s in again.sweeps] == ["seed-grid", "two"]
    assert again.sweeps[0]["axes"]["quantization.overrides"][1] == {
        "lm_head": "INT16", "*.self_attn.scores": "INT16"}


@pytest.mark.parametrize("table, words", [
    ({"name": "x", "axes": {"quantization.nope": [1]}}, "is not a project setting"),
    ({"name": "x", "axes": {"pipeline.stages": [["export"]]}}, "is not a project setting"),
    ({"name": "x", "axes": {"model.kind": ["encoder"]}}, "cannot vary"),
    ({"name": "x", "axes": {"quantization.scheme": []}}, "non-empty list"),
    ({"name": "x", "axes": {"quantization.scheme": ["W8A8", "W8A8"]}}, "twice"),
    ({"name": "x"}, "neither"),
    ({"name": "x", "axes": {"quantization.scheme": ["W8A8"]},
      "points": [{"quantization.scheme": "W8A8"}]}, "both"),
    ({"name": "x", "axes": {"quantization.scheme": ["W8A8"]}, "best": "cheapest"},
     "not one of smallest"),
    ({"name": "x", "axes": {"quantization.scheme": ["W8A8"]}, "stages": ["import"]},
     "for encoder and onnx-graph"),
    ({"name": "x", "axes": {"quantization.scheme": ["W8A8"]}, "colour": 1}, "unknown key"),
    ({"axes": {"quantization.scheme": ["W8A8"]}}, "needs a name"),
    # every value on its own against its setting, before any point is made
    ({"name": "x", "axes": {"quantization.scheme": ["BOGUS", "W8A8"]}},
     "sweep axis quantization.scheme = 'BOGUS' is not one of W8A16"),
    ({"name": "x", "axes": {"quantization.calibration_samples": [4, 0]}},
     "sweep axis quantization.calibration_samples must be at least 1, not 0"),
    ({"name": "x", "axes": {"export.prompt_length": ["16"]}}, "must be a int, not str"),
    ({"name": "x", "axes": {"targets": ["snapdragon-8-gen-3", "nonsense"]}},
     "sweep axis targets: unknown target 'nonsense'"),
    ({"name": "x", "axes": {"quantization.overrides.lm_head": ["INT16", "INT3"]}},
     "quantization.overrides.lm_head = INT3 is not one of INT4"),
    ({"name": "x", "axes": {"quantization.overrides": [{}, {"lm_head": "INT3"}]}},
     "quantization.overrides['lm_head'] = 'INT3' is not one of"),
    ({"name": "x", "points": [{"quantization.scheme": "W8A8"},
                              {"quantization.weight_granularity": "per_row"}]},
     "point 2: quantization.weight_granularity = 'per_row' is not one of"),
    ({"name": "x", "axes": {"quantization.calibration_samples": list(range(1, 20)),
                            "quantization.block_size": [16, 32, 64, 128],
                            "export.prompt_length": [8, 16, 24, 32]}}, "at most 256"),
])
def test_bad_sweeps_get_one_line(project, table, words):
    with pytest.raises(StudioError) as err:
        parse_spec(table, project)
    assert words in err.value.message
    assert "\n" not in err.value.message


def test_the_project_file_refuses_two_sweeps_of_one_name(project):
    data = project.to_dict()
    data["sweeps"] = [SEED, SEED]
    with pytest.raises(StudioError, match="two sweeps are named 'seed-grid'"):
        projectfile.from_dict(data)


def test_a_point_applies_its_settings_and_an_invalid_one_says_why(project):
    project.quantization["overrides"] = {"lm_head": "INT8", "*.mlp.down_proj": "INT16"}
    v = apply_point(project, {"quantization.scheme": "W8A8",
                              "quantization.overrides.lm_head": "INT16",
                              "quantization.overrides.*.mlp.down_proj": "",
                              "targets": "snapdragon-8-elite"})
    assert v.quantization["scheme"] == "W8A8"
    assert v.quantization["overrides"] == {"lm_head": "INT16"}
    assert v.targets == ["snapdragon-8-elite"]
    assert project.quantization["scheme"] == "W8A16"  # the project itself is untouched
    with pytest.raises(StudioError, match="W4A16 with per_tensor"):
        apply_point(project, {"quantization.scheme": "W4A16",
                              "quantization.weight_granularity": "per_tensor"})


def test_axis_arguments():
    assert parse_axis_arg("quantization.scheme=W8A16,W8A8") == (
        "quantization.scheme", ["W8A16", "W8A8"])
    assert parse_axis_arg("quantization.calibration_samples=4, 8") == (
        "quantization.calibration_samples", [4, 8])
    assert parse_axis_arg('quantization.overrides=[{}, {"lm_head": "INT16"}]') == (
        "quantization.overrides", [{}, {"lm_head": "INT16"}])
    assert parse_axis_arg("quantization.overrides.lm_head=none,INT16")[1] == ["", "INT16"]
    with pytest.raises(StudioError, match="KEY=VALUE1,VALUE2"):
        parse_axis_arg("quantization.scheme")


def _r(i, acc, size, state="succeeded", gates=True, tps=None):
    return PointResult(Point(i, {"i": i}), state, accuracy=acc, size_bytes=size,
                       tokens_per_s=tps, gates_passed=gates)


def test_pareto_front_and_best_point():
    results = [
        _r(0, 0.999, 100),   # front: most accurate
        _r(1, 0.990, 50),    # front: smallest
        _r(2, 0.990, 80),    # dominated by 1 (same accuracy, bigger)
        _r(3, 0.995, 70, state="failed", gates=False),  # front, but fails a gate
        _r(4, None, None, state="invalid", gates=None),
    ]
    assert pareto_front(results) == [0, 1, 3]
    assert best_point(results, "smallest") == 1
    assert best_point(results, "most-accurate") == 0
    assert best_point(results, "fastest") is None  # no speed figures
    results[0].tokens_per_s, results[1].tokens_per_s = 20.0, 25.0
    assert best_point(results, "fastest") == 1
    assert best_point([_r(0, 0.9, 1, state="failed", gates=False)], "smallest") is None


def test_set_values_is_one_undo_step(project):
    stack = CommandStack(project)
    stack.push(SetValues([SetValue("quantization", "scheme", "W8A8"),
                          SetValue("quantization", "weight_granularity", "per_tensor")],
                         "Apply sweep point p3"))
    assert (project.quantization["scheme"], project.quantization["weight_granularity"]) == (
        "W8A8", "per_tensor")
    assert stack.undo_text == "Apply sweep point p3"
    stack.undo()
    assert (project.quantization["scheme"], project.quantization["weight_granularity"]) == (
        "W8A16", "per_channel")
    stack.redo()
    assert project.quantization["scheme"] == "W8A8"
    # together invalid: nothing changes
    with pytest.raises(StudioError):
        stack.push(SetValues([SetValue("quantization", "scheme", "W4A16"),
                              SetValue("quantization", "weight_granularity", "per_tensor")]))
    assert project.quantization["scheme"] == "W8A8"
