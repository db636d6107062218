"""This host's memory, and what a stage over a model in parts takes of it.

A stage over a model exported in parts holds one part in memory at a time, so its peak
resident set is a base (the libraries, the tokenizer, the tied head's copy in the export
check, the calibration windows) plus a multiple of the *largest part's* FP32 weight bytes,
whatever the model's depth. :data:`STAGE_MEMORY` holds that line for the stages that hold a
part's weights (:attr:`studio.core.stagedecl.StageDecl.memory`, declared beside the stage in
``studio/core/stages``), fitted to ``benchmarks/bench_scale.py`` runs on this kind of
machine (random Qwen2 shapes in bf16, prompt 16 / context 128, W8A16, 2 calibration samples;
the figures and the fit are in the benchmark's README). :func:`check_fits` refuses a stage
whose predicted peak exceeds the memory free now, in one line that names the part count that
would fit: the kernel's OOM killer never ends a run.

Pure Python: reads ``/proc/meminfo``, imports no heavy library.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from studio.core.errors import StudioError
from studio.core.stagedecl import GIB, StageMemory
from studio.core.stagegraph import DECLARATIONS, STAGES

__all__ = ["GIB", "HEADROOM", "STAGE_MEMORY", "StageMemory", "available_memory", "check_fits",
           "predicted_peak"]


#: stage -> its memory line, for the stages that hold a part's weights (each declares its
#: line: :attr:`StageDecl.memory`, the fit beside it)
STAGE_MEMORY: dict[str, StageMemory] = {d.name: d.memory for d in DECLARATIONS
                                        if d.memory is not None}


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
    decl = STAGES.get(stage)
    return decl.memory_line(rounding) if decl is not None else None


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
