"""The waterfall stage: the optimization waterfall (each step's speed and accuracy).
Owns the ``[waterfall]`` keys."""

from __future__ import annotations

from studio.core.keys import MAX_CONTEXT, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.export import Source
from studio.core.stages.quantize import Calibration, Scheme, Weights
from studio.core.stages.validate import HeldoutTokens


class WaterfallSettings(Source, Scheme, Calibration, HeldoutTokens):
    weight_granularity = Weights.weight_granularity
    window: int = setting("waterfall.window", 0, "the attention window of the windowed step",
                          min=0, cap=MAX_CONTEXT, hint="(0: half the context)")
    k: int = setting("waterfall.k", 4, "the speculative step's draft tokens per pass", min=1,
                     max=16)
    new_tokens: int = setting("waterfall.new_tokens", 48, "tokens generated per timing", min=2,
                              cap=MAX_CONTEXT)


DECL = StageDecl("waterfall", "Optimization waterfall", (Need("export"), Need("ablation")),
                 optional=True, settings_class=WaterfallSettings, role="waterfall")
