"""The layerdiff stage: FP32 against host QDQ against the HTP simulator, tensor by tensor.
Owns the ``[layerdiff]`` keys."""

from __future__ import annotations

from studio.core.keys import setting
from studio.core.layerdiff import MAX_WINDOWS, TENSOR_MODES
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.compile import CompiledWeights
from studio.core.stages.quantize import KvCache
from studio.core.stages.validate import Heldout


class LayerdiffSettings(CompiledWeights, Heldout, KvCache):
    windows: int = setting("layerdiff.windows", 2, "held-out windows of P tokens compared",
                           min=1, max=MAX_WINDOWS)
    tensors: str = setting("layerdiff.tensors", "modules", "which tensors: blocks (the "
                           "residual stream between blocks), modules (and every module's "
                           "output), all", choices=TENSOR_MODES)
    graph: str = setting("layerdiff.graph", "prefill", "which graph: prefill, or decode (one "
                         "step over an FP32 cache)", choices=("prefill", "decode"))
    fp16_step: bool = setting("layerdiff.fp16_step", False, "also run the FP32 graph on the "
                              "HTP in FP16, without quantization (a bisection's first step; "
                              "chips with FP16)")
    part: int = setting("layerdiff.part", 0, "for a model exported in parts: the part compared "
                        "(1..parts), fed what the FP32 parts before it hand on, its hand-off "
                        "run on to the logits by the FP32 parts after it", min=0, cap=1024,
                        hint="(0: a model exported whole)")


DECL = StageDecl("layerdiff", "Layer diff", (Need("export"), Need("quantize"),
                                             Need("compile", per_chip=True)),
                 fan_out="target", optional=True, settings_class=LayerdiffSettings,
                 role="layerdiff", takes_parts=True,
                 help="FP32 vs host QDQ vs HTP simulator, tensor by tensor (where they part)")
