"""Vision-language projects: what `studio new` gives one (its image size, the lengths that
hold the image's tokens, a picture for the run stage) and whether a project takes an
image (the playground's picture box)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.families import family_of, text_config
from studio.core.fsutil import atomic_write_bytes
from studio.core.settings import MAX_CONTEXT
from studio.engine import vision_input
from studio.engine.chat_template import prompt_format
from studio.engine.checkpoint_check import load_tokenizer
from studio.engine.vision_input import DEFAULT_IMAGE_SIZE

#: a new vision-language project's prompt room past its image: text tokens in the prefill
VL_TEXT_TOKENS = 32
#: ... and the cache past the prefill: the answer's tokens
VL_ANSWER_TOKENS = 256


def vision_defaults(source: str, path: Path, sections: dict[str, Any],
                    size_name: str = "export.image_size") -> dict[str, Any]:
    """A new project of a vision-language checkpoint: ``export.image_size`` (given, where the
    checkpoint's image processor gives it; else 448 brought within the processor's range and
    the model's positions), a prefill that holds the image's tokens and some text, a cache
    with room for an answer after it — within ``max_position_embeddings`` —, an image for the
    run stage (generated beside the project file) and a prompt about it. What cannot fit is
    refused in one line (``size_name``: what set the image size). Other sources:
    ``sections`` unchanged."""
    folder = Path(source)
    config = None if source.startswith("sample:") else _vision_config(folder)
    if config is None:
        return sections

    export = dict(sections.get("export", {}))
    pre = vision_input.read_preprocessor(folder)
    rng = vision_input.processor_range(config, pre, str(folder))
    limit, limit_from = _position_limit(config)
    try:
        frame, around = prompt_frame(folder)
    except StudioError:  # a template that cannot be used: the template line says why
        frame, around = 2, "2 around them"
    given = export.get("image_size")
    if given is not None:
        vision_input.check_image_size(rng, int(given), size_name)
        size = int(given)
    else:
        size = _default_size(rng, limit, limit_from, frame, around)
    vs = vision_input.make_vision_spec(config, pre, size, str(config.get("model_type")), str(folder))
    if vs.tokens + frame + 2 > limit:
        fits = _largest_fitting(rng, limit, frame)
        raise StudioError(
            f"one {size} px image is {vs.tokens} tokens: with {around}, a text token and "
            f"an answer's, more than {limit_from} {limit}: "
            + (f"give {size_name} {fits} or less" if fits else
               "the checkpoint's image processor gives no image that small"))
    P, C = _lengths(vs.tokens + frame, export, limit, limit_from)
    export.update(image_size=size, prompt_length=P, context_length=C)
    run = dict(sections.get("run", {}))
    if not run.get("image"):
        picture = Path(path).with_name(Path(path).stem + "-image.png")
        if not picture.exists():
            atomic_write_bytes(picture, vision_input.png_bytes(
                vision_input.calibration_images(1, size, seed=42)[0]))
        run.update(image=picture.name, prompt=run.get("prompt") or "Describe this image.")
    return {**sections, "export": export, "run": run}


def _position_limit(config: dict[str, Any]) -> tuple[int, str]:
    """The longest context the model takes, and where that number comes from: its
    ``max_position_embeddings`` (the language model's), within the studio's own limit."""
    family = family_of(config.get("model_type"))
    text = text_config(config, family) if family is not None else config
    mpe = text.get("max_position_embeddings")
    if isinstance(mpe, int) and not isinstance(mpe, bool) and 0 < mpe <= MAX_CONTEXT:
        return mpe, "config.json's max_position_embeddings"
    return MAX_CONTEXT, "the studio's longest context (export.context_length)"


def prompt_frame(folder: Path, setting: str = "checkpoint") -> tuple[int, str]:
    """The tokens an image prompt holds besides the image's own and the prompt's text, and
    what they are: <|vision_start|> and <|vision_end|> (2), or everything the checkpoint's
    chat template writes around an image and a text (``model.chat_template``); the image
    goes before the text, so the prefill's first pass holds what comes before it."""
    fmt = prompt_format(folder, setting)
    if not fmt.applied:
        return 2, "2 around them"
    n = len(fmt.ids(load_tokenizer(folder), "", image=True, vision=True)) - 1
    return n, f"{n} the chat template writes around them"


def _tokens(rng, side: int) -> int:
    return (side // rng.unit) ** 2


def _largest_fitting(rng, limit: int, frame: int = 2) -> int:
    """The largest side the processor gives whose tokens, ``frame`` around them, a text
    token and an answer's fit ``limit`` positions (0: none)."""
    side = rng.high
    while side >= rng.low and _tokens(rng, side) + frame + 2 > limit:
        side -= rng.unit
    return side if side >= rng.low else 0


def _default_size(rng, limit: int, limit_from: str, frame: int = 2,
                  around: str = "2 around them") -> int:
    """448 px brought within the processor's range, then down until the positions hold the
    image with room for some text and as much for an answer (the smallest image where none
    does but it fits at all)."""
    if not _largest_fitting(rng, limit, frame):
        raise StudioError(
            f"the checkpoint's smallest image ({rng.low} px, {_tokens(rng, rng.low)} tokens, "
            f"{around}, a text token and an answer's) does not fit {limit_from} {limit}: "
            "no vision-language project of this checkpoint fits its positions")
    side = min(max(DEFAULT_IMAGE_SIZE, rng.low), rng.high)
    while side > rng.low and _tokens(rng, side) + frame + 2 * VL_TEXT_TOKENS > limit:
        side -= rng.unit
    return side


def _lengths(need: int, export: dict[str, Any], limit: int, limit_from: str
             ) -> tuple[int, int]:
    """(P, C): the given lengths where they hold the image and what goes around it
    (``need`` tokens) and fit ``limit``; else room for the image, some text and an answer,
    shortened to ``limit`` positions."""
    P, C = int(export.get("prompt_length", 0)), int(export.get("context_length", 0))
    chose_p = P < need
    if chose_p:
        P = need + VL_TEXT_TOKENS
    chose_c = C <= P
    if chose_c:
        C = P + VL_ANSWER_TOKENS
    if C > limit:
        if not chose_c:
            raise StudioError(f"export.context_length {C} is more than {limit_from} {limit}: "
                              f"give {limit} or less")
        C = limit
    if P >= C:
        if not chose_p:
            raise StudioError(f"export.prompt_length {P} leaves no room for an answer in "
                              f"{limit_from} {limit}: give {limit - 1} or less")
        P = C - 1
    return P, C


def image_lines(project) -> list[str]:
    """What a vision-language project's image and lengths are and where each number comes
    from (``studio new``, ``studio info``, the Model page); [] for other projects."""
    if project.model.get("kind") != "causal-lm":
        return []
    try:
        folder = Path(project.input_path(project.model["source"]))
    except StudioError:
        return []
    config = _vision_config(folder)
    if config is None:
        return []

    try:
        pre = vision_input.read_preprocessor(folder)
        rng = vision_input.processor_range(config, pre, str(folder))
    except StudioError as exc:
        return [f"image     {exc.message}"]
    size = int(project.export["image_size"])
    P, C = int(project.export["prompt_length"]), int(project.export["context_length"])
    tokens = _tokens(rng, size)
    limit, limit_from = _position_limit(config)
    try:
        frame, around = prompt_frame(folder, project.model.chat_template)
    except StudioError:  # the template line says why
        frame, around = 2, "2 around them"
    inside = "" if rng.holds(size) else " (outside that range: the export refuses it)"
    return [f"image     {size} px a side (export.image_size) -> {tokens} image tokens; the "
            f"checkpoint's image processor gives {rng.text()}{inside}",
            f"lengths   prompt {P} (export.prompt_length: the image's {tokens} tokens, "
            f"{around}, {max(P - tokens - frame, 0)} of text), context {C} "
            f"(export.context_length, {C - P} past the prompt) of {limit} ({limit_from})"]


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
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    family = family_of(config.get("model_type")) if isinstance(config, dict) else None
    return config if family is not None and family.vision else None
