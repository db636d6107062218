"""The graph-profile stage: an encoder's or ONNX graph's op-level profile on each NPU device."""

from __future__ import annotations

from studio.core.stagedecl import GRAPH_KINDS, Need, StageDecl
from studio.core.stages.graph_quantize import Placement
from studio.core.stages.profile import Repeats


class GraphProfileSettings(Placement, Repeats):
    pass


DECL = StageDecl("graph-profile", "Profile", (Need("import"), Need("graph-quantize"),
                                              Need("graph-compile", per_chip=True)),
                 fan_out="device", measures=True, npu_only=True, kinds=GRAPH_KINDS,
                 settings_class=GraphProfileSettings, role="profile", headline=True)
