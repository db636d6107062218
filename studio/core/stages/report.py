"""The report stage: an HTML + JSON report of the run, judged by the project's gates. Owns
the ``[gates]`` keys and reads ``name``."""

from __future__ import annotations

from studio.core.keys import StageSettings, project_key, setting
from studio.core.recipe import DEFAULT_GATES, GATE_HELP
from studio.core.stagedecl import MODEL_KINDS, StageDecl


class Gates(StageSettings):
    """The accuracy gates a run's figures must pass."""

    min_logits_cosine: float = setting("gates.min_logits_cosine",
                                       DEFAULT_GATES["min_logits_cosine"],
                                       GATE_HELP["min_logits_cosine"], min=0, max=1)
    max_perplexity_increase: float = setting("gates.max_perplexity_increase",
                                             DEFAULT_GATES["max_perplexity_increase"],
                                             GATE_HELP["max_perplexity_increase"], min=0)
    min_top1_agreement: float = setting("gates.min_top1_agreement",
                                        DEFAULT_GATES["min_top1_agreement"],
                                        GATE_HELP["min_top1_agreement"], min=0, max=1)
    min_output_cosine: float = setting("gates.min_output_cosine",
                                       DEFAULT_GATES["min_output_cosine"],
                                       GATE_HELP["min_output_cosine"], min=0, max=1)
    min_ranking_top1: float = setting("gates.min_ranking_top1",
                                      DEFAULT_GATES["min_ranking_top1"],
                                      GATE_HELP["min_ranking_top1"], min=0, max=1)

    def gates(self) -> dict[str, float]:
        """The gates by their name in ``[gates]``."""
        return {k.name: self.read_key(k) for k in Gates.keys()}


class ReportSettings(Gates):
    name: str = project_key("name")


DECL = StageDecl("report", "Report", (), needs_all=True, cache=False,
                 settings_class=ReportSettings, takes_parts=True, kinds=MODEL_KINDS,
                 role="report", reads_history=True, help="an HTML + JSON report of the run")
