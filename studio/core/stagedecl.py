"""What a stage declares: :class:`StageDecl` (its place in the graph, its settings class and
the facts about it that the rest of the studio reads) and :class:`StageMemory` (its memory
line).

Each stage's declaration sits in its own module, ``studio/core/stages/<stage>.py``, beside
its settings class (:class:`studio.core.keys.StageSettings`); :mod:`studio.core.stagegraph`
gathers them. What used to be tables in other files are fields here: the memory line
(:mod:`studio.core.hostmem`), the disk its artifacts take (``studio doctor``), the line the
Jobs page shows for it, whether its figures make the report's headline. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from studio.core.devices import DEVICE_KINDS
from studio.core.keys import StageSettings

GIB = 1 << 30

# What a project deploys: a causal LM from a checkpoint, a sentence encoder from its PyTorch
# weights, or any ONNX graph. Each kind has its own declared stages (the report is shared).
MODEL_KINDS: tuple[str, ...] = ("causal-lm", "encoder", "onnx-graph")
GRAPH_KINDS: tuple[str, ...] = ("encoder", "onnx-graph")
MODEL_KIND_HELP = {
    "causal-lm": "a language model from a Hugging Face checkpoint: export, quantize, compile, "
                 "validate (perplexity, logits), generate",
    "encoder": "a sentence encoder from its PyTorch weights: embeddings checked against FP32 "
               "and on a small retrieval set",
    "onnx-graph": "any ONNX network with static (or fixed) input shapes and .npz calibration "
                  "samples",
}


@dataclass(frozen=True)
class StageMemory:
    """Peak RSS of a stage over one part ~ ``base + per_weight_byte`` x the part's FP32
    weight bytes, ``+ per_head_byte`` x the output head's FP32 bytes for the part that holds
    the head (the export check keeps copies of it beside that part)."""

    base: int
    per_weight_byte: float
    per_head_byte: float = 0.0

    def peak(self, fp32_bytes: int, head_bytes: int = 0) -> int:
        return int(self.base + self.per_weight_byte * max(0, int(fp32_bytes))
                   + self.per_head_byte * max(0, int(head_bytes)))

    def largest_part_within(self, available: int) -> int:
        """The largest part (FP32 weight bytes) whose peak fits ``available``."""
        return max(0, int((available - self.base) / self.per_weight_byte))


@dataclass(frozen=True)
class Need:
    """An upstream stage: its single job, or (``per_chip``) its job for the same chip."""

    stage: str
    per_chip: bool = False


@dataclass(frozen=True)
class StageDecl:
    name: str
    title: str
    needs: tuple[Need, ...] = ()
    fan_out: str = ""  # "" | "target" (each target chip) | "device" (each device)
    # the stage's settings: the keys it reads, typed (studio.core.keys); ``settings`` (the
    # dotted keys its artifact key hashes) comes from it
    settings_class: type[StageSettings] = StageSettings
    needs_all: bool = False  # depends on every other job of the plan (the report)
    cache: bool = True  # False: always run (its content comes from the run history)
    optional: bool = False  # not in a new project's pipeline: asked for by name (--stages)
    # a measurement (timings on a device): cached like the others, but a run asked to
    # remeasure times it again, and later runs reuse the newest measurement
    measures: bool = False
    # for fan_out "device": only devices that run on an NPU (an agent's HTP, not its CPU)
    npu_only: bool = False
    # the model kinds (model.kind) whose pipeline the stage belongs to
    kinds: tuple[str, ...] = ("causal-lm",)
    # what the stage is across model kinds ("quantize" for quantize and graph-quantize, ...):
    # pages, reports and schedulers ask for a role, never for a stage name
    role: str = ""
    # its result holds the accuracy figures the project's gates judge
    gated: bool = False
    # it reads the run history (this run's settings, the comparison with the previous run)
    reads_history: bool = False
    # it takes a model exported in parts (studio.core.parts): the others refuse one
    takes_parts: bool = False
    # it works part by part and keeps the parts it finished across a kill: its work folder
    # is kept per key (studio.core.artifacts), and a re-run does only the rest
    resumes: bool = False
    # what the preflight checks before anything runs when the stage is planned
    # (studio.services.preflight.CHECKS): "draft" (a draft model is set), "overrides" (the
    # override rules name layers of the model), "graph-calibration" (an ONNX graph's
    # calibration samples are given), "prompt-fits" (the prompt fits the context)
    preflight: tuple[str, ...] = ()
    # with "prompt-fits": the setting whose new tokens must fit after the prompt
    new_tokens: str = ""
    # its peak memory over a model in parts (studio.core.hostmem: refused before it runs
    # when it would not fit; studio doctor's memory check); None: not modelled
    memory: StageMemory | None = None
    # its memory line when the recipe rounds its weights (other than nearest)
    rounding_memory: StageMemory | None = None
    # the disk its artifacts take per model parameter, in bytes (studio doctor's estimate;
    # per target chip for a stage over targets, once for ``disk_once``); 0: not counted
    disk_per_parameter: float = 0.0
    disk_once: bool = False
    # the line the Jobs page's "Run stage" menu shows beside the name ("": the title)
    help: str = ""
    # its own figures make the report's headline (the validate, run and profile stages'
    # figures, not the same quantities measured along the way by another stage)
    headline: bool = False
    settings: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", self.settings_class.names())

    @property
    def device_kinds(self) -> tuple[str, ...]:
        """For fan_out "device": the kinds whose devices run it (each kind declares its
        stages, :attr:`studio.core.devices.DeviceKind.stages`)."""
        return tuple(k for k, d in DEVICE_KINDS.items() if self.name in d.stages)

    @property
    def module(self) -> str:
        """The module of the stage's function (``studio.worker.stages.<module>``)."""
        return self.name.replace("-", "_")

    def memory_line(self, rounding: bool = False) -> StageMemory | None:
        """Its memory line (``rounding``: the recipe rounds its weights)."""
        return (self.rounding_memory or self.memory) if rounding else self.memory
