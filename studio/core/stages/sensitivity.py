"""The sensitivity stage: per-layer accuracy when one layer is raised or lowered (host QDQ).
Owns the ``[sensitivity]`` keys."""

from __future__ import annotations

from studio.core.keys import MAX_TOKENS, setting
from studio.core.recipe import PRECISIONS
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.quantize import Calibration, Scheme, Weights
from studio.core.stages.validate import Heldout


class SensitivitySettings(Scheme, Calibration, Heldout):
    weight_granularity = Weights.weight_granularity
    heldout_tokens: int = setting("sensitivity.heldout_tokens", 128, "held-out tokens scored "
                                  "per variant", min=16, cap=MAX_TOKENS)
    high: str = setting("sensitivity.high", "auto", "the precision a layer is raised to (auto: "
                        "INT16 over W8A8, FP16 over W8A16)", choices=("auto", *PRECISIONS))
    low: str = setting("sensitivity.low", "INT4", "the precision a layer is lowered to",
                       choices=("", *PRECISIONS), hint="(or \"\" to skip lowering)")
    confirm_on_htp: str = setting("sensitivity.confirm_on_htp", "", "a chip whose HTP "
                                  "simulator scores the top entries of the raise ranking again "
                                  "(\"\": host figures only)")
    confirm_top: int = setting("sensitivity.confirm_top", 3, "the entries of the raise ranking "
                               "confirmed on the HTP", min=1, max=64,
                               hint="(entries of the ranking scored again on the HTP "
                                    "simulator)")


DECL = StageDecl("sensitivity", "Sensitivity", (Need("export"),), optional=True,
                 settings_class=SensitivitySettings, role="sensitivity",
                 help="per-layer accuracy when one layer is raised or lowered (host QDQ)")
