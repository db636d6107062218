"""This host's memory, and what a stage over a model in parts takes of it.

A stage over a model exported in parts holds one part in memory at a time, so its peak
resident set is a base (the libraries, the tokenizer, the tied head's copy in the export
check, the calibration windows) plus a multiple of the *largest part's* FP32 weight bytes,
whatever the model's depth. :data:`STAGE_MEMORY` holds that line for the stages that hold a
part's weights, fitted to ``benchmarks/bench_scale.py`` runs on this kind of machine (random
Qwen2 shapes in bf16, prompt 16 / context 128, W8A16, 2 calibration samples; the figures and
the fit are in the benchmark's README). :func:`check_fits` refuses a stage whose predicted
peak exceeds the memory free now, in one line that names the part count that would fit:
the kernel's OOM killer never ends a run.

Pure Python: reads ``/proc/meminfo``, imports no heavy library.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from studio.core.errors import StudioError

GIB = 1 << 30


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
#: 3 B and 8 B parts). Quantize, since the calibration holds no copy of the weights (ONNX
#: Runtime's calibrater over the graph's structure, run without prepacking) and the large
#: weights are quantized a slice at a time beside the quantizer (studio.engine.qdq_weights):
#: the same four, 2.42, 3.75, 3.33 and 5.99 GiB (before the slices: 2.66, 4.33, 5.25 and
#: 8.98; before the calibration's change: 3.32, not run, 6.05 and 10.71). What remains is
#: the calibration's two float sessions, which now read the part's weights through one
#: shared mapping of its file (``llm_runtime.make_cpu_session``; each used to map it
#: itself, the same pages counted once per mapping): the same four, 1.63, 2.43, 2.06 and
#: 3.36 GiB, 1.47 GiB + 0.70 x the part, errors +24 %, +1 %, +21 %, +1 % (before the shared
#: mapping: 1.0 GiB + 2.0 x). The head needs no term of its own any more.
STAGE_MEMORY: dict[str, StageMemory] = {
    "export": StageMemory(base=int(1.2 * GIB), per_weight_byte=1.55, per_head_byte=0.0),
    "quantize": StageMemory(base=int(1.47 * GIB), per_weight_byte=0.70, per_head_byte=0.0),
}

#: The quantize stage when the recipe rounds its weights (``weight_rounding`` other than
#: nearest): the rounding holds every rounded layer's inputs and candidates beside the part.
#: One measured run so far: the Qwen2-0.5B shape in one part (2.35 GiB with its tied head's
#: copy), SeqMSE on 8 windows, 12.42 GiB against 7.40 for nearest rounding: 4.5 x the part.
ROUNDING_MEMORY = StageMemory(base=int(1.05 * GIB), per_weight_byte=4.5, per_head_byte=1.85)

#: What the check leaves to everything else on the host (the GUI, the pipeline's process).
HEADROOM = 512 << 20


def available_memory() -> int:
    """Free memory now (MemAvailable), or the total when /proc says nothing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _line(stage: str, rounding: bool) -> StageMemory | None:
    return ROUNDING_MEMORY if stage == "quantize" and rounding else STAGE_MEMORY.get(stage)


def predicted_peak(stage: str, part_parameters: list[int], head_parameters: int = 0,
                   rounding: bool = False) -> int | None:
    """The stage's predicted peak RSS over parts of ``part_parameters`` (in order: the last
    holds the output head of ``head_parameters``); ``rounding``: the quantize stage rounds
    its weights (not nearest). None: the stage holds no part's weights, or is not
    modelled."""
    model = _line(stage, rounding)
    if model is None or not part_parameters:
        return None
    last = len(part_parameters) - 1
    return max(model.peak(4 * p, 4 * head_parameters if i == last else 0)
               for i, p in enumerate(part_parameters))


def check_fits(stage: str, part_parameters: list[int], available: int | None = None,
               head_parameters: int = 0, rounding: bool = False,
               last_block_parameters: int = 0) -> None:
    """Refuse ``stage`` over parts of ``part_parameters`` when its predicted peak does not
    fit the memory free now (less :data:`HEADROOM`): one line with the need, what is free,
    and about how many parts would fit — or, when the part that holds the output head (the
    head and ``last_block_parameters``, the last block) cannot fit however the model is
    split, that only memory helps."""
    need = predicted_peak(stage, part_parameters, head_parameters, rounding)
    model = _line(stage, rounding)
    if need is None or model is None:
        return
    free = (available_memory() if available is None else int(available)) - HEADROOM
    if need <= free:
        return
    n = len(part_parameters)
    largest = max(part_parameters)
    fits = model.largest_part_within(free - int(model.per_head_byte * 4 * head_parameters))
    # the part that holds the output head holds the head and at least the last block
    smallest = head_parameters + last_block_parameters
    floor = model.peak(4 * smallest, 4 * head_parameters) if head_parameters else 0
    if fits <= 0:
        advice = "free memory (close other programs) or use a machine with more"
    elif floor > free:
        advice = (f"free memory (close other programs) or use a machine with more: the part "
                  f"that holds the output head ({smallest / 1e6:,.0f} M parameters with "
                  f"the last block) "
                  f"needs about {floor / GIB:.1f} GiB however the model is split")
    else:
        # parts as even as a contiguous split allows: about total / per-part, and more for
        # the embedding's and head's parts
        total = 4 * sum(part_parameters)
        count = max(n + 1, math.ceil(total / fits) + 1)
        advice = (f"export in about {count} parts (export.parts = {count}, or "
                  f"export.max_part_mb = {max(1, fits // 4 // 1_000_000)}) or free memory")
    raise StudioError(
        f"the {stage} stage would need about {need / GIB:.1f} GiB (its largest part: "
        f"{largest / 1e6:,.0f} M parameters, {n} part{'s' if n != 1 else ''}) and "
        f"{max(0, free) / GIB:.1f} GiB are free: {advice}")
