"""Recipe sweeps: variants of one project, their points, the Pareto front and the best one.

A sweep is declared in the project file::

    [[sweeps]]
    name = "seed-grid"
    stages = ["export", "quantize", "compile", "validate"]   # default: up to validation
    best = "smallest"     # smallest | most-accurate | fastest (among points passing gates)
    [sweeps.axes]
    "quantization.weight_granularity" = ["per_tensor", "per_channel"]
    "quantization.scheme" = ["W8A16", "W8A8"]
    "quantization.overrides" = [{}, {"lm_head" = "INT16", "lm_head.weight" = "INT16"}]

An axis names any setting of the project (``section.key``), ``targets`` (a chip or a list of
chips), or one override rule (``quantization.overrides.PATTERN`` = precisions, ``""`` for no
rule). A grid takes every combination of the axes; ``points = [{...}, ...]`` lists the
points instead. Every value is checked against its setting's declaration before any point is
made (a value no point could take is refused in one line). A point is the project with its
settings applied and validated: a point whose combination the project refuses (W4A16
per_tensor, say) is *invalid*, with the project's one-line reason, and the sweep goes on
without it.

Pure: no I/O here. The service layer runs the points through the stage graph.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.fsutil import sha256_json
from studio.core.recipe import PRECISIONS
from studio.core.settings import SECTION_KEYS, SECTIONS, check_type, check_value
from studio.core.stagegraph import Project, check_stage_names

#: How the best point is chosen, among the points that ran and passed every gate.
BEST_RULES: dict[str, str] = {
    "smallest": "the fewest deployed bytes; ties go to the more accurate point",
    "most-accurate": "the highest accuracy; ties go to the smaller point",
    "fastest": "the highest estimated decode tok/s; ties go to the more accurate point",
}
# sections whose keys shape the plan or name the project, not what a stage computes
_NOT_SWEEPABLE = {"pipeline", "sweeps", "schema_version", "name"}
_SPEC_KEYS = {"name", "axes", "points", "stages", "best", "description"}
POINT_STATES = ("pending", "running", "succeeded", "failed", "invalid", "cancelled")


@dataclass(frozen=True)
class Point:
    """One variant: its settings (axis key -> value) and a stable id from them."""

    index: int
    settings: Mapping[str, Any]

    @property
    def id(self) -> str:
        return sha256_json(dict(sorted(self.settings.items())))[:12]

    @property
    def label(self) -> str:
        return f"p{self.index + 1}"

    def describe(self) -> str:
        return ", ".join(f"{k}={format_value(v)}" for k, v in self.settings.items())


@dataclass(frozen=True)
class SweepSpec:
    name: str
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    points: tuple[Mapping[str, Any], ...] = ()  # explicit points (instead of a grid)
    stages: tuple[str, ...] = ()  # () = the kind's stages up to validation
    best: str = "smallest"
    description: str = ""

    def size(self) -> int:
        """The number of points, counted without making them."""
        return len(self.points) if self.points else math.prod(len(v) for _, v in self.axes)

    def expand(self) -> list[Point]:
        """Every point, in order: the explicit list, else the grid of the axes."""
        if self.points:
            return [Point(i, dict(p)) for i, p in enumerate(self.points)]
        keys = [k for k, _ in self.axes]
        return [Point(i, dict(zip(keys, combo, strict=True))) for i, combo in
                enumerate(itertools.product(*(vals for _, vals in self.axes)))]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.description:
            d["description"] = self.description
        if self.stages:
            d["stages"] = list(self.stages)
        d["best"] = self.best
        if self.points:
            d["points"] = [dict(p) for p in self.points]
        else:
            d["axes"] = {k: list(v) for k, v in self.axes}
        return d


def format_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={x}" for k, x in v.items()) + "}" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    return "\"\"" if v == "" else str(v)


# ---- settings of a point ----------------------------------------------------------------------
def check_axis_key(key: str, project: Project) -> None:
    """A one-line error unless ``key`` names a setting a sweep may vary."""
    if key == "targets":
        return
    section, _, leaf = key.partition(".")
    if section == "quantization" and leaf.startswith("overrides."):
        if not leaf[len("overrides."):].strip():
            raise StudioError(f"sweep axis {key!r}: name a layer pattern after overrides.")
        return
    if section in _NOT_SWEEPABLE or leaf not in SECTION_KEYS.get(section, ()):
        sweepable = sorted(s for s in SECTION_KEYS if s not in _NOT_SWEEPABLE)
        raise StudioError(
            f"sweep axis {key!r} is not a project setting: use section.key (sections: "
            f"{', '.join(sweepable)}), targets, or quantization.overrides.PATTERN")
    if key == "model.kind":
        raise StudioError("sweep axis 'model.kind' cannot vary: a kind has its own stages")


def check_axis_value(key: str, value: Any, where: str = "sweep axis") -> None:
    """A one-line error unless ``value`` is one the setting ``key`` takes on its own: its
    declared type and range (:mod:`studio.core.settings`), known chips for ``targets``, a
    precision (or ``""``: no rule) for an override rule. Checked for every value before any
    point runs; only a combination of values the project refuses makes a point *invalid*."""
    if key == "targets":
        chips = [value] if isinstance(value, str) else value
        if not isinstance(chips, list) or not chips or not all(
                isinstance(c, str) for c in chips):
            raise StudioError(f"{where} targets = {format_value(value)}: give a chip or a list "
                              "of chips (see studio targets)")
        for c in chips:
            try:
                get_chip(c)
            except StudioError as exc:  # names the known targets
                raise StudioError(f"{where} targets: {exc.message}") from None
        return
    section, _, leaf = key.partition(".")
    if section == "quantization" and leaf.startswith("overrides."):
        if value not in ("", None) and value not in PRECISIONS:
            raise StudioError(f"{where} {key} = {format_value(value)} is not one of "
                              f"{', '.join(PRECISIONS)} (or \"\": no rule)")
        return
    spec, hint = SECTIONS[section].specs()[leaf]
    check_type(f"{where} {key}", value, hint)
    check_value(f"{where} {key}", value, spec)
    if key in ("quantization.overrides", "quantization.vision_overrides"):
        for pattern, prec in value.items():
            if prec not in PRECISIONS:
                raise StudioError(f"{where} {key}[{pattern!r}] = {prec!r} is not one of "
                                  f"{', '.join(PRECISIONS)}")


# ---- parsing ------------------------------------------------------------------------------
def _axis_values(key: str, raw: Any) -> tuple[Any, ...]:
    if not isinstance(raw, list) or not raw:
        raise StudioError(f"sweep axis {key!r} needs a non-empty list of values")
    if len(raw) > MAX_POINTS:  # before the values are compared with each other
        raise StudioError(f"sweep axis {key!r} has {len(raw)} values; a sweep has at most "
                          f"{MAX_POINTS} points")
    seen: list[Any] = []
    for v in raw:
        if v in seen:
            raise StudioError(f"sweep axis {key!r} lists {format_value(v)} twice")
        seen.append(v)
    return tuple(raw)


def parse_spec(raw: Any, project: Project, where: str = "sweeps") -> SweepSpec:
    """A validated :class:`SweepSpec` from a ``[[sweeps]]`` table (or the CLI's axes)."""
    if not isinstance(raw, dict):
        raise StudioError(f"{where} must be a table with a name and axes (or points)")
    bad = set(raw) - _SPEC_KEYS
    if bad:
        raise StudioError(f"{where}: unknown key {sorted(bad)[0]!r} (allowed: "
                          f"{', '.join(sorted(_SPEC_KEYS))})")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip() or any(c in name for c in "/\\"):
        raise StudioError(f"{where} needs a name (text without slashes)")
    where = f"sweep {name!r}"
    axes_raw, points_raw = raw.get("axes") or {}, raw.get("points") or []
    if not isinstance(axes_raw, dict) or not isinstance(points_raw, list):
        raise StudioError(f"{where}: axes is a table (setting = [values]) and points a list "
                          "of tables")
    if bool(axes_raw) == bool(points_raw):
        raise StudioError(f"{where}: give either axes (a grid) or points (a list), not "
                          f"{'both' if axes_raw else 'neither'}")
    axes = []
    for key, vals in axes_raw.items():
        check_axis_key(key, project)
        axes.append((key, _axis_values(key, vals)))
        for v in axes[-1][1]:  # each value on its own, before any point is made
            check_axis_value(key, v)
    if len(points_raw) > MAX_POINTS:
        raise StudioError(f"{where} lists {len(points_raw)} points; at most {MAX_POINTS}")
    points: list[dict[str, Any]] = []
    for i, p in enumerate(points_raw):
        if not isinstance(p, dict) or not p:
            raise StudioError(f"{where}: point {i + 1} must be a table of settings")
        for key, v in p.items():
            check_axis_key(key, project)
            check_axis_value(key, v, f"{where}: point {i + 1}:")
        points.append(dict(p))
    stages = raw.get("stages", [])
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise StudioError(f"{where}: stages must be a list of stage names")
    if stages:
        check_stage_names(stages, project.model.kind)
    best = raw.get("best", "smallest")
    if not isinstance(best, str) or best not in BEST_RULES:
        raise StudioError(f"{where}: best = {best!r} is not one of {', '.join(BEST_RULES)}")
    # counted from the axes' lengths: a large grid is refused before it is expanded
    n = len(points) if points else math.prod(len(vals) for _, vals in axes)
    if n > MAX_POINTS:
        raise StudioError(f"{where} has {n} points; at most {MAX_POINTS}: split it, or list "
                          "the points you want")
    return SweepSpec(name.strip(), tuple(axes), tuple(points), tuple(stages), best,
                     str(raw.get("description", "")))


MAX_POINTS = 256


def parse_axis_arg(arg: str) -> tuple[str, list[Any]]:
    """``--axis KEY=V1,V2`` (a JSON list after ``=`` for tables: ``KEY=[{}, {...}]``)."""
    key, eq, values = arg.partition("=")
    if not eq or not key.strip() or not values.strip():
        raise StudioError(f"--axis {arg!r}: write KEY=VALUE1,VALUE2 (e.g. "
                          "quantization.scheme=W8A16,W8A8)")
    values = values.strip()
    if values.startswith("["):
        try:
            parsed = json.loads(values)
        except ValueError as exc:
            raise StudioError(f"--axis {key}: the values are not a JSON list ({exc})") from None
        if not isinstance(parsed, list):
            raise StudioError(f"--axis {key}: give a JSON list of values")
        return key.strip(), parsed
    out: list[Any] = []
    for v in values.split(","):
        v = v.strip()
        try:
            out.append(json.loads(v))  # numbers and true/false; text stays text
        except ValueError:
            out.append("" if v in ("none", "-") else v)
        if isinstance(out[-1], (dict, list)) or out[-1] is None:
            out[-1] = v
    return key.strip(), out


# ---- results: the Pareto front and the best point -----------------------------------------------
@dataclass
class PointResult:
    """What a finished point gives the comparison (a figure is None when it did not run)."""

    point: Point
    state: str
    accuracy: float | None = None  # higher is better
    size_bytes: float | None = None  # lower is better (what the target stores and loads)
    tokens_per_s: float | None = None  # higher is better
    gates_passed: bool | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(
        x > y for x, y in zip(a, b, strict=True))


def pareto_front(results: Sequence[PointResult], speed: bool = False) -> list[int]:
    """Indices of the points no other point beats on accuracy *and* size (deployed bytes;
    and, with
    ``speed``, estimated tok/s): better or equal on every objective, better on one."""
    def objectives(r: PointResult) -> tuple[float, ...] | None:
        # a point that ran is placed even when a gate failed (the front shows what the
        # recipe space offers); the best point must pass every gate
        if r.accuracy is None or r.size_bytes is None:
            return None
        if speed and r.tokens_per_s is None:
            return None
        obj = (r.accuracy, -r.size_bytes)
        return (*obj, r.tokens_per_s) if speed and r.tokens_per_s is not None else obj

    objs = [objectives(r) for r in results]
    front = []
    for i, oi in enumerate(objs):
        if oi is None or any(math.isnan(x) for x in oi):
            continue
        if not any(oj is not None and j != i and _dominates(oj, oi) for j, oj in enumerate(objs)):
            front.append(i)
    return front


def best_point(results: Sequence[PointResult], rule: str) -> int | None:
    """The index of the best point by ``rule`` (see :data:`BEST_RULES`) among those that
    succeeded with every gate passing; None when no point qualifies."""
    if rule not in BEST_RULES:
        raise StudioError(f"best = {rule!r} is not one of {', '.join(BEST_RULES)}")
    ok = [i for i, r in enumerate(results) if r.state == "succeeded" and r.gates_passed
          and r.accuracy is not None]
    if rule == "smallest":
        ok = [i for i in ok if results[i].size_bytes is not None]
        return min(ok, key=lambda i: (results[i].size_bytes, -(results[i].accuracy or 0)),
                   default=None)
    if rule == "fastest":
        ok = [i for i in ok if results[i].tokens_per_s is not None]
        return max(ok, key=lambda i: (results[i].tokens_per_s, results[i].accuracy or 0),
                   default=None)
    return max(ok, key=lambda i: (results[i].accuracy or 0, -(results[i].size_bytes or 0)),
               default=None)
