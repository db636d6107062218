"""What the pages ask of the stage declarations (``studio.core.stagegraph``): a page names a
role ("validate", "run", "profile" …), never a stage name or a model kind, and gets the open
project's stage of that role. No Qt here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from studio.core.stagegraph import STAGES, kind_stages, stage_for_role

if TYPE_CHECKING:
    from studio.core.project import Project


def project_kind(project: Project | None) -> str:
    """The project's model kind ("" without a project)."""
    return project.model["kind"] if project is not None else ""


def article(word: str) -> str:
    """"a" or "an" before ``word`` (by its first letter: "an encoder", "an onnx-graph")."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def project_stage(project: Project | None, role: str) -> str:
    """The project's stage that plays ``role`` ("" without a project, or when its kind has
    none): ``graph-validate`` for an encoder's "validate"."""
    return stage_for_role(role, project_kind(project)) if project is not None else ""


def project_stages(project: Project | None) -> tuple[str, ...]:
    """Every stage of the project's kind, in declaration order (none without a project)."""
    return kind_stages(project_kind(project)) if project is not None else ()


def role_of(stage: str) -> str:
    """The role of a stage ("" for a name the declarations do not know: an old run's)."""
    decl = STAGES.get(stage)
    return decl.role if decl is not None else ""


def stage_title(stage: str) -> str:
    """The declared title of a stage (the name itself when it is not declared)."""
    decl = STAGES.get(stage)
    return decl.title if decl is not None else stage


def stage_help(stage: str) -> str:
    """The line a stage's menu entry shows: its declared help, else its title."""
    decl = STAGES.get(stage)
    return (decl.help or decl.title) if decl is not None else stage


def places_nodes(project: Project | None) -> bool:
    """Whether the project's compile stage places each node on the NPU or the CPU (it reads
    ``quantization.placement``): encoders and ONNX graphs. Their accuracy figures are shown
    beside that placement, on the Placement page."""
    stage = project_stage(project, "compile")
    return bool(stage) and "quantization.placement" in STAGES[stage].settings
