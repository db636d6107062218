"""The run stage: generate tokens on each device (the host CPU, the HTP simulator, a phone).

Owns the ``[run]`` keys a run reads, ``model.chat_template`` (how a prompt reaches the
model) and the run-side ``[htp]`` key (:class:`HtpRun`)."""

from __future__ import annotations

from studio.core.keys import StageSettings, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.quantize import Scheme

#: model.chat_template: the checkpoint's template, or the prompt as written
CHAT_TEMPLATES = ("checkpoint", "none")
#: the run-time performance modes the QNN HTP backend takes (the EP's htp_performance_mode,
#: qnn-net-run's --perf_profile); "" leaves the backend's default
PERFORMANCE_MODES = ("", "burst", "sustained_high_performance", "high_performance", "balanced",
                     "low_balanced", "power_saver", "low_power_saver", "high_power_saver",
                     "extreme_power_saver")


class HtpRun(StageSettings):
    """The [htp] settings the sessions that run compiled binaries take (the run and profile
    stages: their timings depend on them, the binaries do not)."""

    performance_mode: str = setting(
        "htp.performance_mode", "", "run time: the HTP's clock and power vote while the run "
        "and profile stages run the binaries (the EP's htp_performance_mode; qnn-net-run's "
        "--perf_profile on a phone; an agent applies it on its device). The simulator's "
        "timings do not follow it", choices=PERFORMANCE_MODES,
        hint="(empty: the backend's default)")


class Prompt(StageSettings):
    """The prompt generation starts from, and how it reaches the model."""

    prompt: str = setting("run.prompt", "def __init__(self", "the text generation starts from")
    chat_template: str = setting("model.chat_template", "checkpoint", "how a prompt reaches "
                                 "a causal LM: through the checkpoint's chat template "
                                 "(checkpoint: its chat_template.jinja or "
                                 "tokenizer_config.json's chat_template, one user message with "
                                 "the assistant's turn opened; as written where it has none) "
                                 "or as written (none)", choices=CHAT_TEMPLATES)


class RunSettings(Scheme, Prompt, HtpRun):
    max_new_tokens: int = setting("run.max_new_tokens", 16, "tokens generated per run", min=1)
    image: str = setting("run.image", "", "a vision-language model: the image the prompt is "
                         "about (\"\": the prompt alone)", ref="images")


DECL = StageDecl("run", "Run", (Need("export"), Need("compile", per_chip=True)),
                 fan_out="device", measures=True, settings_class=RunSettings, role="run",
                 takes_parts=True, preflight=("prompt-fits",),
                 new_tokens="run.max_new_tokens", headline=True,
                 help="generate tokens on the host CPU and the HTP simulator")
