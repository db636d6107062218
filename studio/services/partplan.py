"""The part plan of a causal-LM checkpoint project: how the export stage will split it and
what each stage that holds a part's weights is predicted to take of this host's memory —
read by the Model page, the doctor, the work queue and a sweep's scheduler (light: the
checkpoint's headers only, nothing loaded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from studio.core.hostmem import STAGE_MEMORY, available_memory, predicted_peak
from studio.core.parts import compiled_bytes
from studio.core.project import Project
from studio.core.recipe import DEFAULT_WEIGHT_ROUNDING
from studio.core.units import format_bytes
from studio.engine import hf_import
from studio.engine.llm_parts import auto_device_count, checkpoint_layout, export_plan


@dataclass(frozen=True)
class PartPlan:
    """How the export stage will split the project's checkpoint (``export.parts``,
    ``export.max_part_mb``), and what each stage that holds a part's weights is predicted
    to take of this host's memory (:mod:`studio.core.hostmem`)."""

    parts: list[dict[str, Any]]  # name, blocks (first, last), parameters, bytes_8bit
    peaks: dict[str, int]  # stage -> predicted peak RSS (bytes)
    available: int  # free memory now (bytes)

    def text(self) -> str:
        n = len(self.parts)
        largest = max(self.parts, key=lambda p: p["parameters"])
        where = "one part" if n == 1 else f"{n} parts"
        lines = f"Plan: {where}" + ("" if n == 1 else " of blocks " + ", ".join(
            f"{p['blocks'][0]}–{p['blocks'][1]}" for p in self.parts))
        lines += (f"; the largest holds {largest['parameters'] / 1e6:,.1f} M parameters "
                  f"({format_bytes(largest['bytes_8bit'])} at 8 bits)")
        peaks = ", ".join(f"{stage} {b / 2**30:.1f} GiB" for stage, b in self.peaks.items())
        return (f"{lines}. Predicted peak memory (estimated): {peaks}; "
                f"{self.available / 2**30:.1f} GiB free now.")


def part_plan(project: Project) -> PartPlan | None:
    """The part plan of a causal-LM checkpoint project from its weight files' headers
    (nothing loaded); None for other projects. Raises the export stage's own refusal when
    the settings cannot split the model."""
    if project.model["kind"] != "causal-lm":
        return None
    source = project.input_path(project.model["source"])
    layout = checkpoint_layout(source)
    device = (auto_device_count(hf_import.open_checkpoint(source), layout, project.targets,
                                project.export["prompt_length"], project.export["context_length"])
              if project.export["parts"] == "auto" else None)
    plan = export_plan(source, project.export["parts"], project.export["max_part_mb"], layout,
                       device)
    sizes = [p.parameters for p in plan]
    head = layout.head_in_graph()
    rounding = project.quantization["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING
    peaks = {stage: predicted_peak(stage, sizes, head, rounding) or 0 for stage in STAGE_MEMORY}
    return PartPlan(
        parts=[{"name": p.name, "blocks": (p.start, p.stop - 1), "parameters": p.parameters,
                "bytes_8bit": compiled_bytes(p.parameters, 8)} for p in plan],
        peaks=peaks, available=available_memory())
