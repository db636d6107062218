"""The draft stage: a draft model's graphs for speculative decoding. Owns ``model.draft``."""

from __future__ import annotations

from studio.core.keys import StageSettings, setting
from studio.core.stagedecl import StageDecl
from studio.core.stages.export import Shapes


class Draft(StageSettings):
    draft: str = setting("model.draft", "", "a draft checkpoint for speculative decoding "
                         "(\"\": none)", ref="checkpoint")


class DraftSettings(Draft, Shapes):
    pass


DECL = StageDecl("draft", "Draft model", (), optional=True, settings_class=DraftSettings,
                 role="draft", preflight=("draft",))
