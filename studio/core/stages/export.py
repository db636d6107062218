"""The export stage: a checkpoint to FP32 ONNX prefill and decode graphs, part by part.

Owns ``model.source``, the ``[export]`` keys and reads ``targets`` (for ``export.parts =
"auto"``, hashed by what it takes of them: ``stagegraph.KEY_IDENTITIES``)."""

from __future__ import annotations

from studio.core.keys import MAX_CONTEXT, StageSettings, project_key, setting
from studio.core.parts import DEFAULT_MAX_PART_BYTES, MAX_PARTS
from studio.core.stagedecl import GIB, StageDecl, StageMemory


class Source(StageSettings):
    """The model: the checkpoint (or ONNX file, or sample) every stage builds on."""

    source: str = setting("model.source", "", "the checkpoint folder, the .onnx file or "
                          "sample:NAME", required=True, ref="checkpoint")


class Shapes(StageSettings):
    """The exported graphs' prompt and context lengths."""

    prompt_length: int = setting("export.prompt_length", 32, "P: the tokens the prefill graph "
                                 "takes per pass", min=1, max=MAX_CONTEXT)
    context_length: int = setting("export.context_length", 128, "C: the tokens the KV cache "
                                  "holds", min=2, max=MAX_CONTEXT)


class ExportSettings(Source, Shapes):
    parts: int | str = setting("export.parts", 1, "runs of consecutive blocks exported, "
                               "quantized and compiled one at a time: N, or auto (the fewest "
                               "whose 8-bit weights each fit export.max_part_mb)", min=1,
                               max=MAX_PARTS)
    max_part_mb: int = setting("export.max_part_mb", DEFAULT_MAX_PART_BYTES // 1_000_000,
                               "the budget of one part's compiled weights, in MB (one HTP "
                               "graph must stay under about 2 GB)", min=1, max=2048)
    image_size: int = setting("export.image_size", 448, "a vision-language model's image side "
                              "in pixels (square; a multiple of patch x merge, 28 for "
                              "Qwen2-VL): the vision encoder's fixed input. Text models "
                              "ignore it", min=28, max=1792)
    # export.parts = "auto" asks the targets' NPUs (stagegraph.KEY_IDENTITIES)
    targets: list[str] = project_key("targets")


#: Fitted to the measured peaks (benchmarks/README.md) so that no measured peak is above its
#: prediction, and none is more than 25 % below it. Export, since it holds one copy of a
#: part's weights (torch's exporter made to let go of the last part's, the embedding and the
#: head traced as graph inputs): the Qwen2-0.5B shape in 3 parts (largest 211 M parameters,
#: 0.79 GiB: 2.36 GiB measured), the Qwen2-1.5B shape in 5 (374 M, 1.39 GiB: 2.93 GiB), and
#: the largest parts of the Qwen2.5-3B shape (388 M, 1.45 GiB: 2.97 GiB) and of the
#: Llama-3.1-8B shape (743 M, 2.77 GiB: 5.38 GiB), those two measured in two blocks
#: (``bench_scale.py --sizes qwen2.5-3b-2l,llama3.1-8b-2l --parts 2``): 1.2 GiB + 1.55 x the
#: part, errors +2 %, +15 %, +16 %, +2 %; the head needs no term of its own any more (it had
#: 3.25 x while the check and the tracer held copies of it: 6.45 and 10.59 GiB for the same
#: 3 B and 8 B parts).
MEMORY = StageMemory(base=int(1.2 * GIB), per_weight_byte=1.55, per_head_byte=0.0)

DECL = StageDecl("export", "Export", (), settings_class=ExportSettings, role="export",
                 takes_parts=True, resumes=True, memory=MEMORY,
                 # measured on the Qwen2.5-3B shape's two largest parts, W8A16: 3.0 GB for
                 # 444 M parameters
                 disk_per_parameter=6.8,
                 help="PyTorch → ONNX prefill and decode graphs (FP32, fixed shapes)")
