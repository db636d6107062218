"""How a project's prompts reach its model, said in one line: through the checkpoint's chat
template (where it comes from) or as written (and why). ``studio new``, ``studio info``, the
Model page and the playground show it; the runtimes apply the template the export carries
(:func:`studio.services.generate.prompt_format`)."""

from __future__ import annotations

from pathlib import Path

from studio.core.errors import StudioError
from studio.core.project import Project
from studio.engine.chat_template import prompt_format
from studio.services.vision import image_lines


def checkpoint_format(project: Project, raw: bool = False):
    """The prompt format of the project's checkpoint (a
    :class:`studio.engine.chat_template.PromptFormat`); None for a project that is not a
    causal LM. A template that cannot be read or compiled is a StudioError."""
    if project.model.get("kind") != "causal-lm":
        return None

    folder = Path(project.input_path(project.model["source"]))
    return prompt_format(folder, project.model.chat_template, raw)


def template_line(project: Project) -> str:
    """One line: the chat template and where it comes from, none in the checkpoint, or why
    it cannot be used ("" for a project that is not a causal LM)."""
    try:
        fmt = checkpoint_format(project)
    except StudioError as exc:
        return f"chat template: {exc.message}"
    return fmt.line() if fmt is not None else ""


def project_lines(project: Project) -> list[str]:
    """What ``studio new`` and ``studio info`` say of a causal LM's prompts: the chat
    template line and, for a vision-language model, its image and lengths with the source of
    each number."""
    line = template_line(project)
    return ([f"prompts   {line}"] if line else []) + image_lines(project)
