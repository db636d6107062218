"""Per-layer precision as the recipe sets it: the table the Precision page, ``studio info
--json`` and the report show. The rule itself lives in :mod:`studio.core.recipe`."""

from __future__ import annotations

from typing import Any

from studio.core.modelinfo import ModelInfo
from studio.core.project import Project
from studio.core.recipe import (
    ACTIVATION_POINTS,
    activation_points,
    block_prefix,
    effective_precisions,
    unmatched_patterns,
)

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
    from studio.core.errors import StudioError
    from studio.services.history import current_keys

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
    from pathlib import Path

    from studio.engine.encodings import write_encodings

    art = _current_artifact(studio, "quantize")
    return write_encodings(art.path / "decode.onnx", Path(out))


def import_overrides(studio, path) -> tuple[dict[str, str], list[str]]:
    """Turn an encodings JSON into recipe overrides (added after the existing ones, as one
    undoable edit) and save the project. Returns (the overrides added, tensors that no rule
    can name)."""
    from studio.engine.encodings import encodings_to_overrides

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
    import json

    from studio.core.errors import StudioError

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
