"""The compile stage: QNN context binaries of the quantized graphs, per target chip.

Owns the ``[htp]`` keys a compile bakes into its binaries (:class:`HtpCompile`: every stage
that compiles a graph for the HTP reads them) and the ``[bundle]`` keys that shape the
deployable binaries it builds (Genie's AR-N prefill graph, the shared-weights binary)."""

from __future__ import annotations

from typing import Any

from studio.core.keys import MAX_CONTEXT, StageSettings, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.export import Source
from studio.core.stages.quantize import Recipe, Weights


class HtpCompile(StageSettings):
    """The [htp] settings a compile bakes into its context binaries."""

    optimization_level: int = setting(
        "htp.optimization_level", 0, "the compiler's graph finalization optimization (the "
        "EP's htp_graph_finalization_optimization_mode): 1 prepares fastest, 3 optimizes most",
        min=0, max=3, hint="(0: the backend's default)")
    vtcm_mb: int = setting("htp.vtcm_mb", 0, "VTCM the compiled graphs may use, in MB", min=0,
                           max=64, hint="(0: the chip's whole VTCM, from the catalog)")
    fp16_relaxation: bool = setting(
        "htp.fp16_relaxation", False, "float ops left in a quantized graph run in FP16 instead "
        "of FP32 (the EP's enable_htp_fp16_precision; always on for the FP16 scheme)")
    graph_io: str = setting(
        "htp.graph_io", "quantized", "the compiled graphs' inputs and outputs: float (the NPU "
        "quantizes the KV cache, the mask and the hand-offs and dequantizes the new rows and "
        "logits at every pass) or quantized (it takes and gives the integers it computes "
        "with; the host keeps the cache as they are and reads the logits)",
        choices=("float", "quantized"))

    def htp_settings(self) -> dict[str, Any]:
        """The [htp] compile settings by their name in the section (what
        :func:`studio.core.recipe.htp_refusals` reads)."""
        return {"optimization_level": self.optimization_level, "vtcm_mb": self.vtcm_mb,
                "fp16_relaxation": self.fp16_relaxation, "graph_io": self.graph_io}


class CompiledWeights(Weights, HtpCompile):
    """What a compile of the recipe's graphs takes as QNN options (the weights' blocks too)."""


class Prefill(StageSettings):
    """The deployable binaries' shape: Genie's AR-N prefill graph, shared weights."""

    prefill_length: int = setting("bundle.prefill_length", 0, "tokens per pass of the AR-N "
                                  "prefill graph", min=0, cap=MAX_CONTEXT,
                                  hint="(0: the export's prompt length, 1: no prefill graph)")
    weight_sharing: str = setting(
        "bundle.weight_sharing", "auto", "one context binary per part whose prefill and decode "
        "graphs share their weights (compiled beside the separate binaries the simulator "
        "runs, checked against them by structure; the simulator cannot load it: a device "
        "executes it)", choices=("auto", "on", "off"),
        hint="(auto: on where there is a prefill graph to share with)")


class CompileSettings(Source, Recipe, CompiledWeights, Prefill):
    pass


# the deployable binaries (studio.engine.deploy): Genie's AR-N prefill graph is exported
# from the checkpoint and quantized here, with the recipe's calibration
DECL = StageDecl("compile", "Compile", (Need("export"), Need("quantize")), fan_out="target",
                 settings_class=CompileSettings, role="compile", takes_parts=True,
                 resumes=True,
                 disk_per_parameter=4.7,  # per target: the Qwen2.5-3B shape, 2.1 GB / 444 M
                 help="QNN context binaries per target chip")
