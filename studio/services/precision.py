"""Per-layer precision as the recipe sets it: the table the Precision page, ``studio info
--json`` and the report show. The rule itself lives in :mod:`studio.core.recipe`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.fsutil import check_destination
from studio.core.modelinfo import ModelInfo, bytes_per_param
from studio.core.project import Project
from studio.core.recipe import (
    ACTIVATION_POINTS,
    SCHEME_PRECISIONS,
    activation_bits,
    activation_points,
    block_prefix,
    effective_precisions,
    is_float_scheme,
    override_refusal,
    unmatched_patterns,
)
from studio.engine.encodings import encodings_to_overrides, write_encodings
from studio.services.history import current_keys

# Layer kinds whose weights are MatMul weights (quantized as weights); the others (the
# embedding table, norms) are treated as activations.
WEIGHTED_KINDS = ("attention", "mlp", "lm_head", "linear")


def quantizable(info: ModelInfo) -> list[tuple[str, int | None, str, str | None]]:
    """(name, block, kind, tied_to) of every layer the recipe can set, in model order: the
    model's layers, and after each block's layers its key activations
    (:data:`studio.core.recipe.ACTIVATION_POINTS`, kind ``"activation"``)."""
    out: list[tuple[str, int | None, str, str | None]] = []
    pending: tuple[str, int] | None = None  # the block whose points come next

    def flush() -> None:
        if pending is not None:
            out.extend((n, pending[1], "activation", None) for n in activation_points(pending[0]))

    for lay in info.layers:
        prefix = block_prefix(lay.name) if lay.block is not None else None
        if pending is not None and (prefix is None or prefix != pending[0]):
            flush()
            pending = None
        if prefix is not None and lay.block is not None:
            pending = (prefix, lay.block)
        out.append((lay.name, lay.block, lay.kind, lay.tied_to))
    flush()
    return out


def layer_precisions(project: Project, info: ModelInfo) -> list[dict[str, Any]]:
    """Every layer of the model (and each block's key activations) with its effective weight
    and activation precision and the rule that set each (one dict per layer, model order)."""
    layers = quantizable(info)
    names = [name for name, *_ in layers]
    weighted = {lay.name for lay in info.layers if lay.kind in WEIGHTED_KINDS}
    rows = []
    for (_, block, kind, tied_to), eff in zip(
            layers, effective_precisions(names, project.quantization, weighted), strict=True):
        d = eff.to_dict()
        d.update(block=block, kind=kind, tied_to=tied_to)
        if kind == "activation":
            d["description"] = ACTIVATION_POINTS[_point_key(d["layer"])]
        rows.append(d)
    return rows


def _point_key(name: str) -> str:
    return next(k for k in ACTIVATION_POINTS if name.endswith("." + k))


def unmatched(project: Project, info: ModelInfo) -> list[str]:
    """Override patterns that cover no layer (nor key activation) of the model."""
    return unmatched_patterns([name for name, *_ in quantizable(info)],
                              project.quantization["overrides"])


def _current_artifact(studio, stage: str):
    """The stored artifact of ``stage`` for the project as it is now, or a StudioError."""
    key = current_keys(studio.project, [stage]).get(stage)
    art = studio.store.get(key) if key else None
    if art is None:
        raise StudioError(
            f"no {stage} result for the current settings: run studio --batch "
            f"{studio.project.path} --stages {stage} first"
        )
    return art


def export_overrides(studio, out) -> dict[str, int]:
    """Write the per-tensor encodings of the current quantized decode graph as a QNN / AIMET
    encodings-override JSON (``qnn-onnx-converter --quantization_overrides``)."""
    out = check_destination(Path(out))  # the one rule for a user's path: before any work
    art = _current_artifact(studio, "quantize")
    return write_encodings(art.path / "decode.onnx", out)


def import_overrides(studio, path) -> tuple[dict[str, str], list[str]]:
    """Turn an encodings JSON into recipe overrides (added after the existing ones, as one
    undoable edit) and save the project. Returns (the overrides added, tensors that no rule
    can name)."""
    art = _current_artifact(studio, "export")
    q = studio.project.quantization
    added, unnamed = encodings_to_overrides(path, art.path / "decode.onnx", q["scheme"])
    merged = {k: v for k, v in q["overrides"].items() if k not in added}
    merged.update(added)
    studio.set("quantization", "overrides", merged)
    studio.save()
    return added, unnamed


def adopt_autoprecision(studio) -> dict[str, str]:
    """Copy the current auto-precision result's rules into ``quantization.overrides`` (after
    the existing ones, as one undoable edit) and save the project; returns the rules. The
    rules are ordinary recipe patterns: edit or remove them like any other."""
    art = _current_artifact(studio, "autoprecision")
    try:
        res = json.loads((art.path / "result.json").read_text())
    except (OSError, ValueError):
        raise StudioError(f"the stored auto-precision result {art.path} is unreadable: run "
                          f"studio --batch {studio.project.path} --stages autoprecision "
                          "again") from None
    if not res.get("met"):
        raise StudioError(
            "the auto-precision target was not met, so there are no rules to adopt: loosen "
            "[autoprecision]'s target or choose another sensitivity.high, then run it again"
        )
    rules = dict(res.get("overrides") or {})
    q = studio.project.quantization
    merged = {k: v for k, v in q["overrides"].items() if k not in rules}
    merged.update(rules)
    if merged != q["overrides"]:
        studio.set("quantization", "overrides", merged)
        studio.save()
    return rules

# ---- the layer grid ----------------------------------------------------------------------------
#: the stages "apply" runs after an edit of the recipe: what it changes, up to its accuracy
APPLY_STAGES: tuple[str, ...] = ("quantize", "compile", "validate")
MODEL_ROW = "model"


def target_chips(project: Project) -> list:
    """The catalog entries of the project's targets (what :func:`recipe.refusal` checks)."""
    return [get_chip(t) for t in project.targets]


def weighted_layers(info: ModelInfo) -> set[str]:
    """The layers whose weights the recipe quantizes (MatMul weights)."""
    return {lay.name for lay in info.layers if lay.kind in WEIGHTED_KINDS}


@dataclass
class GridLayout:
    """Where each layer sits in the block × module-kind grid.

    ``rows``: ``"model"`` (the layers outside the blocks: embedding, final norm, head) when
    there are any, then ``"block 0"``…; ``columns``: a key per module kind — the path inside
    the block (``self_attn.q_proj``, ``residual``) for block layers, the layer's name for the
    others — with a short ``titles`` entry each (the last part of the path, unless two kinds
    share it); ``cells``: layer -> (row, column)."""

    rows: list[str]
    row_blocks: list[int | None]
    columns: list[str]
    titles: list[str]
    cells: dict[str, tuple[int, int]]

    def layer_at(self, row: int, column: int) -> str | None:
        return self._at.get((row, column))

    def __post_init__(self) -> None:
        self._at = {rc: name for name, rc in self.cells.items()}


def grid_layout(rows: list[dict[str, Any]]) -> GridLayout:
    """The grid of :func:`layer_precisions` rows. Columns come from the rows (any family's
    module names, and pseudo-layers such as ``self_attn.scores``, appear by themselves), in
    model order (the layers outside the blocks first), with a block's key activations after
    the module that computes them."""
    where: dict[str, tuple[int | None, str]] = {}
    order: list[str] = []
    for r in rows:
        name, block = r["layer"], r["block"]
        prefix = block_prefix(name) if block is not None else None
        column = name[len(prefix) + 1:] if prefix and name.startswith(prefix + ".") else name
        if prefix is None:
            block = None
        where[name] = (block, column)
        if column not in order:
            order.append(column)
    kinds = {r["layer"]: r["kind"] for r in rows}
    points = [c for c in order
              if all(kinds[n] == "activation" for n, (_, col) in where.items() if col == c)]
    columns = [c for c in order if c not in points]
    for p in points:  # after the last real module of its parent (self_attn.*), else at the end
        parent = p.rsplit(".", 1)[0] + "." if "." in p else None
        at = max((i for i, c in enumerate(columns) if parent and c.startswith(parent)),
                 default=None)
        if at is None:
            block_cols = [i for i, c in enumerate(columns)
                          if any(b is not None and col == c for b, col in where.values())]
            at = max(block_cols, default=len(columns) - 1)
        columns.insert(at + 1, p)
    # the layers outside the blocks first: visible beside the blocks without scrolling
    outside = {c for b, c in where.values() if b is None}
    columns = [c for c in columns if c in outside] + [c for c in columns if c not in outside]
    lasts = [c.rsplit(".", 1)[-1] for c in columns]
    titles = [last if lasts.count(last) == 1 else c for c, last in zip(columns, lasts, strict=True)]
    blocks = sorted({b for b, _ in where.values() if b is not None})
    row_names = ([MODEL_ROW] if any(b is None for b, _ in where.values()) else []) + [
        f"block {b}" for b in blocks]
    row_blocks: list[int | None] = ([None] if row_names and row_names[0] == MODEL_ROW else []) + list(blocks)
    col_index = {c: i for i, c in enumerate(columns)}
    row_index = {b: i for i, b in enumerate(row_blocks)}
    cells = {name: (row_index[b], col_index[c]) for name, (b, c) in where.items()}
    return GridLayout(row_names, row_blocks, columns, titles, cells)


def scheme_diff(project: Project, info: ModelInfo) -> dict[str, Any]:
    """The layers whose precision differs from the plain scheme (no overrides), with counts
    and the change of the weighted layers' weight bytes (parameters × bytes per parameter;
    ``source`` ``"formula"``: computed from the model's shape, nothing run).

    ``{"scheme", "layers": [{layer, weight, activation, base_weight, base_activation,
    weight_rule, activation_rule, weight_bytes_change}], "counts": {"layers", "weights",
    "activations"}, "weight_bytes": {"base", "recipe", "change", "source"}}``"""
    q = project.quantization
    w0, a0 = SCHEME_PRECISIONS[q["scheme"]]
    params = {lay.name: lay.params for lay in info.layers}
    out, n_w, n_a = [], 0, 0
    base_bytes = recipe_bytes = 0.0
    for r in layer_precisions(project, info):
        name = r["layer"]
        has_w = bool(r["weight"])
        bw = w0 if has_w else ""
        change = 0.0
        if has_w:
            base_bytes += params.get(name, 0) * bytes_per_param(w0)
            recipe_bytes += params.get(name, 0) * bytes_per_param(r["weight"])
            change = params.get(name, 0) * (bytes_per_param(r["weight"]) - bytes_per_param(w0))
        dw, da = r["weight"] != bw, r["activation"] != a0
        if dw or da:
            n_w += dw
            n_a += da
            out.append({"layer": name, "weight": r["weight"], "activation": r["activation"],
                        "base_weight": bw, "base_activation": a0,
                        "weight_rule": r["weight_rule"], "activation_rule": r["activation_rule"],
                        "weight_bytes_change": round(change)})
    return {
        "scheme": q["scheme"], "layers": out,
        "counts": {"layers": len(out), "weights": n_w, "activations": n_a},
        "weight_bytes": {"base": round(base_bytes), "recipe": round(recipe_bytes),
                         "change": round(recipe_bytes - base_bytes), "source": "formula"},
    }


def override_refusals(project: Project, info: ModelInfo | None,
                      overrides: dict[str, str] | None = None, chips: list | None = None
                      ) -> list[str]:
    """Why the targets' HTP (``chips``; default: the project's targets) cannot run rules of
    ``overrides`` (default: the project's), one sentence per refused rule
    (:func:`studio.core.recipe.override_refusal`). The Precision page refuses such edits;
    preflight refuses such a recipe before a run (without ``info``: the float checks only)."""
    rules = project.quantization["overrides"] if overrides is None else overrides
    scheme = project.quantization["scheme"]
    act = None if is_float_scheme(scheme) else activation_bits(scheme)
    if info is None:
        weighted: dict[str, bool] = {}
    else:
        w = weighted_layers(info)
        weighted = {name: name in w for name, *_ in quantizable(info)}
    chips = target_chips(project) if chips is None else chips
    return [why for pattern, prec in rules.items()
            if (why := override_refusal(pattern, prec, weighted, chips, act))]
