"""Edits of per-layer precision as override rules: what the layer grid writes.

An edit names layers (cells of the grid), a part (weights, activations, the whole layer, or
back to the scheme) and a precision. It becomes override rules appended to
``quantization.overrides`` (the last rule wins), as few as the selection allows: a whole
column of the grid is one rule (``*.down_proj``), a whole block one rule
(``model.layers.3``), the rest one rule per layer. Rules the edit makes pointless (they only
cover edited layers and no longer change anything) are dropped. Every rule is checked with
:func:`studio.core.recipe.covers` before it is used, and the result with
:func:`studio.core.recipe.effective_precision`: the editor never re-implements the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.project import Project
from studio.core.recipe import (
    FLOAT_PRECISIONS,
    PART_TITLES,
    SCHEME_PRECISIONS,
    block_prefix,
    covers,
    effective_precision,
    is_float_scheme,
    refusal,
)
from studio.services.precision import quantizable, target_chips, weighted_layers

#: the part that puts layers back to what the scheme gives them
SCHEME_PART = "scheme"


@dataclass
class Edit:
    """The overrides an edit gives, and what it did in words."""

    overrides: dict[str, str]
    label: str
    rules: list[str] = field(default_factory=list)  # the rules it wrote, "pattern = PREC"
    removed: list[str] = field(default_factory=list)  # rules it dropped as pointless
    skipped: list[str] = field(default_factory=list)  # layers it left alone (no weights)

    def changes(self, before: dict[str, str]) -> bool:
        return self.overrides != before or list(self.overrides) != list(before)


def compact_patterns(selected: set[str], universe: list[str], weight: bool = False) -> list[str]:
    """Patterns that cover exactly ``selected`` among ``universe`` (layer names, model order):
    one per whole column (all blocks), one per whole block, one per remaining layer; with
    ``weight`` the weight-only forms (``*.down_proj.weight``)."""

    def final(base: str) -> str:
        return base + ".weight" if weight else base

    def covered(pattern: str) -> set[str]:
        return {n for n in universe if covers(pattern, n)}

    columns: dict[str, set[str]] = {}
    blocks: dict[str, set[str]] = {}
    for n in universe:
        prefix = block_prefix(n)
        if prefix is not None and n.startswith(prefix + "."):
            columns.setdefault(n[len(prefix) + 1:], set()).add(n)
            blocks.setdefault(prefix, set()).add(n)
    remaining = set(selected)
    patterns: list[str] = []
    if len(blocks) > 1:
        for sub, members in columns.items():
            if not members <= remaining:
                continue
            for base in dict.fromkeys((f"*.{sub.rsplit('.', 1)[-1]}", f"*.{sub}")):
                if covered(final(base)) == members:
                    patterns.append(final(base))
                    remaining -= members
                    break
    for prefix, members in blocks.items():
        if len(members) > 1 and members <= remaining:
            pattern = f"{prefix}.*.weight" if weight else prefix
            if covered(pattern) == members:
                patterns.append(pattern)
                remaining -= members
    patterns += [final(n) for n in universe if n in remaining]
    return patterns


def _state(name: str, q: dict, overrides: dict[str, str], weighted: set[str]) -> tuple[str, str]:
    lp = effective_precision(name, q["scheme"], q["weight_granularity"], overrides,
                             has_weight=name in weighted)
    return lp.weight, lp.activation


def prune(overrides: dict[str, str], q: dict, names: list[str], weighted: set[str],
          scope: set[str]) -> tuple[dict[str, str], list[str]]:
    """Drop rules that cover only layers of ``scope`` and change nothing any more (earliest
    first). Returns the rules kept and the patterns dropped."""
    out, dropped = dict(overrides), []
    for pattern in list(out):
        covered = [n for n in names if covers(pattern, n)]
        if not covered or not set(covered) <= scope:
            continue
        trial = {k: v for k, v in out.items() if k != pattern}
        if all(_state(n, q, trial, weighted) == _state(n, q, out, weighted) for n in covered):
            out = trial
            dropped.append(pattern)
    return out, dropped


def _who(layers: list[str]) -> str:
    return layers[0] if len(layers) == 1 else f"{len(layers)} layers"


def plan_edit(project: Project, info: ModelInfo, layers: list[str], part: str,
              precision: str = "") -> Edit:
    """The overrides that give ``layers`` ``precision`` for ``part`` (``weights``,
    ``activations``, ``layer``, or ``scheme``: back to the scheme's precisions). A
    StudioError says why the targets' HTP cannot run the choice (nothing is changed)."""
    q = project.quantization
    order = [name for name, *_ in quantizable(info)]
    known = set(order)
    unknown = [n for n in layers if n not in known]
    if unknown:
        raise StudioError(f"{unknown[0]!r} is not a layer of {info.source}")
    if not layers:
        raise StudioError("select one or more layers first")
    sel = [n for n in order if n in set(layers)]
    weighted = weighted_layers(info)
    scheme = q["scheme"]
    with_w = [n for n in sel if n in weighted]
    if part == SCHEME_PART:
        if is_float_scheme(scheme):
            raise StudioError(refusal("layer", "FP16", scheme=scheme) or "")
        return _reset(project, order, sel, weighted)
    why = refusal(part, precision, has_weight=bool(with_w), chips=target_chips(project),
                  scheme=scheme, layer=sel[0] if len(sel) == 1 else "")
    if why:
        if part == "weights" and not with_w and len(sel) > 1:
            why = (f"none of the {len(sel)} selected layers has weights (activations, norms, "
                   "the embedding lookup): set their activations instead")
        raise StudioError(why)
    rules: list[tuple[str, str]] = []
    skipped: list[str] = []
    if part == "weights" or (part == "layer" and precision not in FLOAT_PRECISIONS):
        rules += [(p, precision) for p in compact_patterns(set(with_w), sorted(
            weighted & known, key=order.index), weight=True)]
        skipped = [n for n in sel if n not in weighted] if part == "weights" else []
    if part != "weights":
        rules += [(p, precision) for p in compact_patterns(set(sel), order)]
    overrides = dict(q["overrides"])
    for pattern, prec in rules:
        overrides.pop(pattern, None)
        overrides[pattern] = prec
    overrides, dropped = prune(overrides, q, order, weighted, set(sel))

    def wanted(n: str) -> bool:
        w, a = _state(n, q, overrides, weighted)
        if part == "weights":
            return n not in weighted or w == precision
        if part == "activations" or (part == "layer" and n not in weighted):
            return a == precision
        return (w, a) == (precision, precision)

    wrong = [n for n in sel if not wanted(n)]
    if wrong:  # the rule and the rules it wrote disagree: never write such an edit
        raise StudioError(f"the rules written for {wrong[0]} do not give it {precision}: "
                          "report this as a bug")
    if part == "layer":
        label = (f"Keep {_who(sel)} in {precision}" if precision in FLOAT_PRECISIONS
                 else f"Set {_who(sel)} to {precision} (weights and activations)")
    else:
        label = f"Set the {PART_TITLES[part]} of {_who(sel)} to {precision}"
    return Edit(overrides, label, [f"{p} = {v}" for p, v in rules if p in overrides], dropped,
                skipped)


def _reset(project: Project, order: list[str], sel: list[str], weighted: set[str]) -> Edit:
    """Back to the scheme: drop the rules that cover only these layers, then add rules for
    those a wider rule still changes."""
    q = project.quantization
    w0, a0 = SCHEME_PRECISIONS[q["scheme"]]
    scope = set(sel)
    overrides = dict(q["overrides"])
    dropped = []
    for pattern in list(overrides):
        covered = {n for n in order if covers(pattern, n)}
        if covered and covered <= scope:
            overrides.pop(pattern)
            dropped.append(pattern)
    rules: list[tuple[str, str]] = []
    off_a = {n for n in sel if _state(n, q, overrides, weighted)[1] != a0}
    rules += [(p, a0) for p in compact_patterns(off_a, order)]
    for pattern, prec in rules:
        overrides.pop(pattern, None)
        overrides[pattern] = prec
    off_w = {n for n in sel if n in weighted and _state(n, q, overrides, weighted)[0] != w0}
    wrules = [(p, w0) for p in compact_patterns(off_w, [n for n in order if n in weighted],
                                                weight=True)]
    for pattern, prec in wrules:
        overrides.pop(pattern, None)
        overrides[pattern] = prec
    rules += wrules
    overrides, more = prune(overrides, q, order, weighted, scope)
    wrong = [n for n in sel
             if _state(n, q, overrides, weighted) != (w0 if n in weighted else "", a0)]
    if wrong:
        raise StudioError(f"the rules written for {wrong[0]} do not give it the scheme's "
                          "precisions: report this as a bug")
    return Edit(overrides, f"Reset {_who(sel)} to the scheme ({q['scheme']})",
                [f"{p} = {v}" for p, v in rules if p in overrides], dropped + more)
