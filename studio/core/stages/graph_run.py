"""The graph-run stage: an encoder's or ONNX graph's latency per inference on each device.
Owns ``graph.repeats``."""

from __future__ import annotations

from studio.core.keys import setting
from studio.core.stagedecl import GRAPH_KINDS, Need, StageDecl
from studio.core.stages.graph_quantize import Placement


class GraphRunSettings(Placement):
    repeats: int = setting("graph.repeats", 5, "timed inferences the run stage takes", min=1,
                           max=1000)


DECL = StageDecl("graph-run", "Run", (Need("import"), Need("graph-quantize"),
                                      Need("graph-compile", per_chip=True)),
                 fan_out="device", measures=True, kinds=GRAPH_KINDS,
                 settings_class=GraphRunSettings, role="run", headline=True)
