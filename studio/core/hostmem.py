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
    weight bytes."""

    base: int
    per_weight_byte: float

    def peak(self, fp32_bytes: int) -> int:
        return int(self.base + self.per_weight_byte * max(0, int(fp32_bytes)))

    def largest_part_within(self, available: int) -> int:
        """The largest part (FP32 weight bytes) whose peak fits ``available``."""
        return max(0, int((available - self.base) / self.per_weight_byte))


#: Fitted to the measured peaks of export and quantize (the Qwen2-0.5B shape in 2 and 3
#: parts, a 16 x 1024 Qwen2 with the 152 k vocabulary in one part) and raised to cover the
#: Qwen2-1.5B shape in 5 parts (the export's resident set grows a little from part to part:
#: allocator retention), so that no measured peak is above its prediction; errors 0 to +19 %
#: (benchmarks/README.md).
STAGE_MEMORY: dict[str, StageMemory] = {
    "export": StageMemory(base=int(3.35 * GIB), per_weight_byte=1.1),
    "quantize": StageMemory(base=int(1.8 * GIB), per_weight_byte=2.3),
}

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


def predicted_peak(stage: str, part_parameters: list[int]) -> int | None:
    """The stage's predicted peak RSS over parts of ``part_parameters`` (None: the stage
    holds no part's weights, or is not modelled)."""
    model = STAGE_MEMORY.get(stage)
    if model is None or not part_parameters:
        return None
    return model.peak(4 * max(part_parameters))


def check_fits(stage: str, part_parameters: list[int], available: int | None = None) -> None:
    """Refuse ``stage`` over parts of ``part_parameters`` when its predicted peak does not
    fit the memory free now (less :data:`HEADROOM`): one line with the need, what is free,
    and about how many parts would fit."""
    need = predicted_peak(stage, part_parameters)
    if need is None:
        return
    free = (available_memory() if available is None else int(available)) - HEADROOM
    if need <= free:
        return
    model = STAGE_MEMORY[stage]
    n = len(part_parameters)
    largest = max(part_parameters)
    fits = model.largest_part_within(free)
    if fits <= 0:
        advice = "free memory (close other programs) or use a machine with more"
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
