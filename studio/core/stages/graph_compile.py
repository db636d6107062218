"""The graph-compile stage: an encoder's or ONNX graph's context binary per target chip."""

from __future__ import annotations

from studio.core.stagedecl import GRAPH_KINDS, Need, StageDecl
from studio.core.stages.compile import HtpCompile
from studio.core.stages.graph_quantize import Placement


class GraphCompileSettings(Placement, HtpCompile):
    pass


DECL = StageDecl("graph-compile", "Compile", (Need("graph-quantize"),), fan_out="target",
                 kinds=GRAPH_KINDS, settings_class=GraphCompileSettings, role="compile")
