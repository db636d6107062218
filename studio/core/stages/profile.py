"""The profile stage: an op-level profile of one decode step on each NPU device.
Owns ``profile.repeats`` (the graph stages' profile reads it too)."""

from __future__ import annotations

from studio.core.keys import StageSettings, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.compile import CompiledWeights
from studio.core.stages.run import HtpRun


class Repeats(StageSettings):
    repeats: int = setting("profile.repeats", 5, "times one decode step is profiled (the "
                           "median and spread are kept)", min=1, max=50,
                           hint="(each repeat profiles one decode step on the simulator; 5 "
                                "gives a median and a spread)")


class ProfileSettings(CompiledWeights, HtpRun, Repeats):
    pass


DECL = StageDecl("profile", "Profile", (Need("quantize"), Need("compile", per_chip=True)),
                 fan_out="device", measures=True, npu_only=True,
                 settings_class=ProfileSettings, role="profile", takes_parts=True,
                 headline=True,
                 help="op-level profile of one decode step on the HTP simulator")
