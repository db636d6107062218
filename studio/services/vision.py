"""Vision-language projects: what `studio new` gives one (its image size, the lengths that
hold the image's tokens, a picture for the run stage) and whether a project takes an
image (the playground's picture box)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core.errors import StudioError

#: a new vision-language project's prompt room past its image: text tokens in the prefill
VL_TEXT_TOKENS = 32
#: ... and the cache past the prefill: the answer's tokens
VL_ANSWER_TOKENS = 256


def vision_defaults(source: str, path: Path, sections: dict[str, Any]) -> dict[str, Any]:
    """A new project of a vision-language checkpoint: ``export.image_size`` (given, or 448),
    a prefill that holds the image's tokens and some text, a cache with room for an answer
    after it, an image for the run stage (generated beside the project file) and a prompt
    about it. Other sources: ``sections`` unchanged."""
    folder = Path(source)
    config = None if source.startswith("sample:") else _vision_config(folder)
    if config is None:
        return sections
    from studio.engine import vision

    export = dict(sections.get("export", {}))
    size = int(export.get("image_size", 448))
    vs = vision.make_vision_spec(config, vision.read_preprocessor(folder), size,
                                 str(config.get("model_type")), str(folder))
    # the given lengths where they hold the image; else room for it, some text and an answer
    P = int(export.get("prompt_length", 0))
    if P < vs.tokens + 2:
        P = vs.tokens + 2 + VL_TEXT_TOKENS
    C = int(export.get("context_length", 0))
    if C <= P:
        C = P + VL_ANSWER_TOKENS
    export.update(image_size=size, prompt_length=P, context_length=C)
    run = dict(sections.get("run", {}))
    if not run.get("image"):
        from studio.core.fsutil import atomic_write_bytes

        picture = Path(path).with_name(Path(path).stem + "-image.png")
        if not picture.exists():
            atomic_write_bytes(picture, vision.png_bytes(
                vision.calibration_images(1, size, seed=42)[0]))
        run.update(image=picture.name, prompt=run.get("prompt") or "Describe this image.")
    return {**sections, "export": export, "run": run}


def vision_project(project) -> bool:
    """Whether a project's model is a vision-language checkpoint (it takes an image)."""
    if project.model.get("kind") != "causal-lm":
        return False
    try:
        folder = project.input_path(project.model["source"])
    except StudioError:
        return False
    return _vision_config(Path(folder)) is not None


def _vision_config(folder: Path) -> dict[str, Any] | None:
    """The ``config.json`` of a vision-language checkpoint folder; None for any other folder
    (or one the checkpoint checks will explain)."""
    import json

    from studio.core.families import family_of

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    family = family_of(config.get("model_type")) if isinstance(config, dict) else None
    return config if family is not None and family.vision else None
