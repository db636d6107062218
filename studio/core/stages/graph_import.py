"""The import stage (``import``) of encoders and ONNX graphs: the graph with static shapes
(an encoder exported from its PyTorch weights). Owns ``model.kind`` and the ``[graph]``
shapes. (The module is not named ``import``, a keyword.)"""

from __future__ import annotations

from studio.core.keys import StageSettings, setting
from studio.core.stagedecl import GRAPH_KINDS, MODEL_KINDS, StageDecl
from studio.core.stages.export import Source


class Kind(StageSettings):
    kind: str = setting("model.kind", "causal-lm", "causal-lm (a checkpoint), encoder (a "
                        "sentence encoder's PyTorch weights) or onnx-graph (any ONNX file); "
                        "each kind runs its own declared stages", choices=MODEL_KINDS)


class ImportSettings(Kind, Source):
    shapes: dict[str, list[int]] = setting("graph.shapes", {}, "static input shapes: name -> "
                                           "dims, for inputs with symbolic dims")
    seq_len: int = setting("graph.seq_len", 128, "the encoder's sequence length", min=2,
                           max=512)


# encoders and ONNX graphs: the graph with static shapes, its rewrites and quantization, the
# placement on each chip, the check against FP32 per output, the latency per inference on
# each device
DECL = StageDecl("import", "Import", (), kinds=GRAPH_KINDS, settings_class=ImportSettings,
                 role="export")
