"""Per-layer precision as the recipe sets it: the table the Precision page, ``studio info
--json`` and the report show. The rule itself lives in :mod:`studio.core.recipe`."""

from __future__ import annotations

from typing import Any

from studio.core.modelinfo import ModelInfo
from studio.core.project import Project
from studio.core.recipe import effective_precisions, unmatched_patterns

# Layer kinds whose weights are MatMul weights (quantized as weights); the others (the
# embedding table, norms) are treated as activations.
WEIGHTED_KINDS = ("attention", "mlp", "lm_head", "linear")


def layer_precisions(project: Project, info: ModelInfo) -> list[dict[str, Any]]:
    """Every layer of the model with its effective weight and activation precision and the
    rule that set each (one dict per layer, in model order)."""
    names = [lay.name for lay in info.layers]
    weighted = {lay.name for lay in info.layers if lay.kind in WEIGHTED_KINDS}
    rows = []
    for lay, eff in zip(info.layers, effective_precisions(names, project.quantization, weighted),
                        strict=True):
        d = eff.to_dict()
        d.update(block=lay.block, kind=lay.kind, tied_to=lay.tied_to)
        rows.append(d)
    return rows


def unmatched(project: Project, info: ModelInfo) -> list[str]:
    """Override patterns that cover no layer of the model."""
    return unmatched_patterns([lay.name for lay in info.layers],
                              project.quantization["overrides"])


def _current_artifact(studio, stage: str):
    """The stored artifact of ``stage`` for the project as it is now, or a StudioError."""
    from studio.core.errors import StudioError
    from studio.services.history import current_keys

    key = current_keys(studio.project).get(stage)
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
