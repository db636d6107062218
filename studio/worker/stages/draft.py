"""The draft model of speculative decoding, exported for the host CPU."""

from __future__ import annotations

from typing import Any

from studio.core.progress import Progress, SubProgress
from studio.core.stages.draft import DraftSettings
from studio.engine import hf_import
from studio.engine.llm_export import export_llm
from studio.worker.context import StageContext


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The draft model of speculative decoding, exported for the host CPU (FP32 prefill and
    decode graphs with the target's prompt and context lengths; checked like the target)."""
    s = DraftSettings.of(ctx.config)
    ckpt = s.path(s.draft)
    info = hf_import.open_checkpoint(ckpt)
    P, C = s.prompt_length, s.context_length
    export_llm(ckpt, ctx.out, P, C, progress=SubProgress(progress, 0.0, 0.98), verify_len=0)
    return {"summary": f"draft {info.architecture} ({info.num_layers} layers, "
                       f"{info.parameters:,} parameters) for the host CPU",
            "parameters": info.parameters}
