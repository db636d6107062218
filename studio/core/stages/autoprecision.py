"""The autoprecision stage: the fewest raised layers that meet the accuracy target.
Owns the ``[autoprecision]`` keys."""

from __future__ import annotations

from studio.core.keys import StageSettings, setting
from studio.core.stagedecl import Need, StageDecl


class AutoprecisionSettings(StageSettings):
    metric: str = setting("autoprecision.metric", "perplexity", "the target: perplexity within "
                          "max_perplexity_change of FP32, the mean logits cosine at least "
                          "min_logits_cosine, or the top-1 agreement at least "
                          "min_top1_agreement", choices=("perplexity", "cosine", "top1"))
    max_perplexity_change: float = setting("autoprecision.max_perplexity_change", 0.02,
                                           "the perplexity change allowed, either way", min=0,
                                           hint="(0.02 = 2 %)")
    min_logits_cosine: float = setting("autoprecision.min_logits_cosine", 0.999, "the mean "
                                       "logits cosine vs FP32 required", above=0, max=1)
    min_top1_agreement: float = setting("autoprecision.min_top1_agreement", 0.95, "the "
                                        "teacher-forced top-1 agreement with FP32 required",
                                        above=0, max=1)
    on_htp: str = setting("autoprecision.on_htp", "", "a chip whose HTP simulator measures "
                          "each step (\"\": the host QDQ model, faster, but its rounding is "
                          "not the HTP's)")


DECL = StageDecl("autoprecision", "Auto precision", (Need("export"), Need("sensitivity")),
                 optional=True, settings_class=AutoprecisionSettings, role="autoprecision",
                 help="the fewest raised layers that meet the accuracy target")
