"""The graph-quantize stage: an encoder's or ONNX graph's rewrites and quantization. Owns
``quantization.placement`` (:class:`Placement`: every graph stage reads it) and the
``[graph]`` samples."""

from __future__ import annotations

from studio.core.keys import setting
from studio.core.recipe import PLACEMENTS
from studio.core.stagedecl import GRAPH_KINDS, Need, StageDecl
from studio.core.stages.graph_import import Kind
from studio.core.stages.quantize import Calibration, Recipe, Scheme, Weights


class Placement(Scheme):
    """Where a graph's nodes run: what every graph stage after the import reads."""

    placement: str = setting("quantization.placement", "strict", "graphs: nodes the HTP "
                             "refuses fail the run, go to the CPU, or are rewritten",
                             choices=PLACEMENTS)


class GraphQuantizeSettings(Kind, Placement, Calibration):
    weight_granularity = Weights.weight_granularity
    calibration_method = Recipe.calibration_method
    overrides = Recipe.overrides
    weight_rounding = Recipe.weight_rounding
    calibration: str = setting("graph.calibration", "", "calibration samples (.npz / .npy; "
                               "\"\" for an encoder: its text through the tokenizer)",
                               ref="samples")
    validation: str = setting("graph.validation", "", "validation samples (\"\": the last "
                              "calibration samples)", ref="samples")


DECL = StageDecl("graph-quantize", "Quantize", (Need("import"),), kinds=GRAPH_KINDS,
                 settings_class=GraphQuantizeSettings, role="quantize",
                 preflight=("graph-calibration",))
