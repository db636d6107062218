"""The graph-validate stage: an encoder's or ONNX graph's outputs against FP32, per target."""

from __future__ import annotations

from studio.core.stagedecl import GRAPH_KINDS, Need, StageDecl
from studio.core.stages.graph_import import Kind
from studio.core.stages.graph_quantize import Placement


class GraphValidateSettings(Kind, Placement):
    pass


DECL = StageDecl("graph-validate", "Validate", (Need("import"), Need("graph-quantize"),
                                                Need("graph-compile", per_chip=True)),
                 fan_out="target", kinds=GRAPH_KINDS, settings_class=GraphValidateSettings,
                 role="validate", gated=True, headline=True)
