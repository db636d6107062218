"""The validate stage: FP32 against the host's quantized graphs against the HTP simulator,
per target (perplexity, logits, greedy agreement). Owns the ``[validation]`` keys."""

from __future__ import annotations

from studio.core.keys import MAX_TOKENS, StageSettings, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.quantize import Scheme
from studio.core.stages.run import Prompt


class Heldout(StageSettings):
    """The held-out text accuracy is measured on."""

    heldout_text: str = setting("validation.heldout_text", "sample:heldout", "the text "
                                "perplexity and agreement are measured on", ref="text")


class HeldoutTokens(Heldout):
    heldout_tokens: int = setting("validation.heldout_tokens", 256, "held-out tokens scored",
                                  min=16, cap=MAX_TOKENS)


class Greedy(StageSettings):
    greedy_tokens: int = setting("validation.greedy_tokens", 16, "tokens generated greedily "
                                 "to compare with FP32", min=1)


class ValidateSettings(Scheme, HeldoutTokens, Greedy, Prompt):
    greedy_prompts: int = setting("validation.greedy_prompts", 4, "prompts generated greedily "
                                  "on both runtimes: run.prompt, then prompts cut from the "
                                  "held-out text (a model in parts: run.prompt alone)", min=1,
                                  max=16)
    device_tokens: int = setting("validation.device_tokens", 0, "held-out tokens the device "
                                 "scores (the first ones); 0: all of them for a model in one "
                                 "part, the first 64 for a model in parts, whose host figures "
                                 "are scored part by part", min=0, cap=MAX_TOKENS)
    heldout_images: str = setting("validation.heldout_images", "", "a vision-language model: "
                                  "a folder of held-out images the encoder and the answers "
                                  "after them are checked on (\"\": images generated here, not "
                                  "the calibration ones)", ref="images")


DECL = StageDecl("validate", "Validate", (Need("export"), Need("quantize"),
                                          Need("compile", per_chip=True)), fan_out="target",
                 settings_class=ValidateSettings, role="validate", gated=True,
                 takes_parts=True, preflight=("prompt-fits",),
                 new_tokens="validation.greedy_tokens", headline=True,
                 help="FP32 vs quantized vs HTP simulator accuracy per target")
