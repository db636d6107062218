"""The ablation stage: pruning by ablation (the blocks whose removal costs the least
perplexity). Owns ``pruning.drop_blocks``."""

from __future__ import annotations

from studio.core.keys import setting
from studio.core.stagedecl import StageDecl
from studio.core.stages.export import Shapes, Source
from studio.core.stages.validate import HeldoutTokens


class AblationSettings(Source, HeldoutTokens):
    context_length = Shapes.context_length
    drop_blocks: int = setting("pruning.drop_blocks", 1, "pruning by ablation: the blocks "
                               "whose removal costs the least perplexity are dropped", min=1,
                               cap=1024, hint="(the blocks the pruned checkpoint leaves out)")


DECL = StageDecl("ablation", "Pruning ablation", (), optional=True,
                 settings_class=AblationSettings, role="ablation")
