"""The bundle stage: a Genie bundle of the compile stage's binaries for each target, checked
on them (greedy text, held-out scores). Owns the ``[bundle]`` keys but the two that shape the
compile's binaries (:class:`studio.core.stages.compile.Prefill`), and
``model.draft_embedding``."""

from __future__ import annotations

from studio.core.drafttable import DRAFT_TABLE_MODES
from studio.core.keys import MAX_CONTEXT, MAX_TOKENS, setting
from studio.core.stagedecl import Need, StageDecl
from studio.core.stages.compile import CompiledWeights, Prefill
from studio.core.stages.draft import Draft
from studio.core.stages.export import Source
from studio.core.stages.quantize import KvCache, Recipe
from studio.core.stages.run import Prompt
from studio.core.stages.validate import Greedy, Heldout

#: bundle.dlc = auto writes the DLC files up to this many bytes of quantized graph weights
DLC_AUTO_BYTES = 2 << 30


class BundleSettings(Source, Recipe, CompiledWeights, Prefill, Heldout, Prompt, Greedy, Draft,
                     KvCache):
    new_tokens: int = setting("bundle.new_tokens", 96, "the Genie check: tokens generated per "
                              "prompt (fewer when the context is shorter)", min=1,
                              cap=MAX_CONTEXT)
    prompts: int = setting("bundle.prompts", 3, "the Genie check: held-out prompts whose greedy "
                           "text Genie must match", min=1, max=8)
    parts: int = setting("bundle.parts", 0, "the parts of the bundle: the compile stage's "
                         "(export.parts); another count is refused", min=0, cap=1024,
                         hint="(0: the compile stage's parts)")
    dlc: str = setting(
        "bundle.dlc", "auto", "the DLC files of the quantized graphs beside the binaries, for "
        "Qualcomm's own on-device tools (Genie does not read them; each holds a graph's "
        "weights again)", choices=("auto", "on", "off"),
        hint=f"(auto: where the quantized graphs hold at most {DLC_AUTO_BYTES >> 30} GiB of "
             "weights; at 8 B they would double the bundle)")
    score_tokens: int = setting("bundle.score_tokens", 64, "held-out tokens scored against "
                                "FP32 on the bundle's own binaries (the figures of what "
                                "ships)", min=0, cap=MAX_TOKENS, hint="(0: none)")
    draft_in_bundle: str = setting("bundle.draft", "auto", "the draft model (model.draft) in "
                                   "the bundle, for the app's CPU (its ONNX graphs, the token "
                                   "table it reads, how to run it beside the target), checked "
                                   "against plain greedy decoding over the bundle's binaries: "
                                   "auto (with a draft model) or off", choices=("auto", "off"))
    draft_embedding: str = setting(
        "model.draft_embedding", "auto", "the draft's token table: the target's where "
        "vocabulary, width and values match (auto), the target's whenever vocabulary and width "
        "match (target: the draft was distilled on it), or its own (own)",
        choices=DRAFT_TABLE_MODES)


DECL = StageDecl("bundle", "Genie bundle", (Need("export"), Need("quantize"),
                                            Need("compile", per_chip=True)),
                 fan_out="target", optional=True, settings_class=BundleSettings,
                 role="bundle", takes_parts=True,
                 # its result holds validate's figures of the binaries it ships (with
                 # bundle.score_tokens): the gates judge them too
                 gated=True,
                 # the compile's size again; counted once, not per target
                 disk_per_parameter=4.7, disk_once=True)
