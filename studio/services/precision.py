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
