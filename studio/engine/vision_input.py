"""A vision-language model's image input (Qwen2-VL / Qwen2.5-VL), before and around its
encoder: the vision entry of a graph spec (:class:`VisionSpec`), the checkpoint's image
processor and its pixel range, a picture resized and cut into patches as transformers'
processor does (:func:`load_image`, :func:`image_patches`), the encoder's feeds in the
tower's order (:func:`encoder_feeds`), the prompt's image placeholder and the language
model's multimodal positions (:func:`image_prompt`, :func:`mrope_positions`), and
calibration images generated here. numpy only (PIL inside functions); the encoder itself is
:mod:`studio.engine.vision`."""


from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.archs import VisionArch
from studio.core.errors import StudioError
from studio.core.fsutil import IMAGE_SUFFIXES
from studio.core.lazyimport import lazy_module

PIL = lazy_module("PIL")
Image = lazy_module("PIL.Image")

VISION_FILE = "vision.onnx"
PREPROCESSOR_FILE = "preprocessor_config.json"
#: transformers' defaults for Qwen2-VL's image processor (OpenAI CLIP's mean and std)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: the special tokens a Qwen2-VL tokenizer must hold, as config.json names their ids
SPECIAL_TOKENS = ("vision_start_token_id", "vision_end_token_id", "image_token_id")


@dataclass(frozen=True)
class VisionSpec:
    """graph.json's ``vision`` entry: what the host needs to feed the encoder and splice its
    output into the prompt."""

    image_size: int
    patch: int
    merge: int
    temporal_patch: int
    channels: int
    grid: int  # patches a side
    tokens: int  # the language model's tokens for one image (grid / merge, squared)
    embed_dim: int  # the width of one image token (the language model's hidden size)
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    mrope_section: tuple[int, ...]
    #: the pixels a picture is resized within (transformers' smart_resize): the image
    #: processor's min_pixels, and image_size squared (the encoder's capacity)
    min_pixels: int = 0
    max_pixels: int = 0
    #: Qwen2.5-VL's attention windows, in image tokens a side (0: Qwen2-VL, no windows)
    window: int = 0
    rescale: float = 1 / 255

    @property
    def patch_dim(self) -> int:
        return self.channels * self.temporal_patch * self.patch * self.patch

    @property
    def patches(self) -> int:
        """The encoder's capacity in patches (a square image of ``image_size``)."""
        return self.grid * self.grid

    @property
    def unit(self) -> int:
        """Pixels a side of one image token (patch x merge): image sides are multiples."""
        return self.patch * self.merge

    @property
    def rotary_rows(self) -> int:
        """The longest grid side (patches) an image within the capacity can have: its rotary
        tables' rows."""
        return self.tokens * self.merge

    @property
    def llm_grid(self) -> int:
        return self.grid // self.merge

    def to_json(self) -> dict[str, Any]:
        return {"file": VISION_FILE, "image_size": self.image_size, "patch_size": self.patch,
                "merge_size": self.merge, "temporal_patch_size": self.temporal_patch,
                "channels": self.channels, "grid": [1, self.grid, self.grid],
                "image_tokens": self.tokens, "embed_dim": self.embed_dim,
                "patch_dim": self.patch_dim,
                "image_token_id": self.image_token_id,
                "vision_start_token_id": self.vision_start_token_id,
                "vision_end_token_id": self.vision_end_token_id,
                "image_mean": list(self.mean), "image_std": list(self.std),
                "mrope_section": list(self.mrope_section),
                "min_pixels": self.min_pixels, "max_pixels": self.max_pixels,
                "window": self.window, "rescale_factor": self.rescale}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VisionSpec:
        try:
            return cls(image_size=int(d["image_size"]), patch=int(d["patch_size"]),
                       merge=int(d["merge_size"]), temporal_patch=int(d["temporal_patch_size"]),
                       channels=int(d["channels"]), grid=int(d["grid"][1]),
                       tokens=int(d["image_tokens"]), embed_dim=int(d["embed_dim"]),
                       image_token_id=int(d["image_token_id"]),
                       vision_start_token_id=int(d["vision_start_token_id"]),
                       vision_end_token_id=int(d["vision_end_token_id"]),
                       mean=tuple(float(x) for x in d["image_mean"]),  # type: ignore[arg-type]
                       std=tuple(float(x) for x in d["image_std"]),  # type: ignore[arg-type]
                       mrope_section=tuple(int(x) for x in d["mrope_section"]),
                       min_pixels=int(d["min_pixels"]), max_pixels=int(d["max_pixels"]),
                       window=int(d["window"]), rescale=float(d["rescale_factor"]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StudioError(f"graph.json's vision entry is incomplete ({exc}); re-run the "
                              "export") from None


def vision_spec(spec: dict[str, Any]) -> VisionSpec | None:
    """The vision entry of a graph.json (None for a text-only model)."""
    d = spec.get("vision")
    return VisionSpec.from_json(d) if d else None


# ---------------------------------------------------------------------------- checkpoint


def read_preprocessor(checkpoint_dir: Path) -> dict[str, Any]:
    """The checkpoint's ``preprocessor_config.json`` (its image processor's settings)."""
    path = Path(checkpoint_dir) / PREPROCESSOR_FILE
    if not path.is_file():
        raise StudioError(f"{checkpoint_dir} has no {PREPROCESSOR_FILE}: save the model's image "
                          "processor beside config.json (processor.save_pretrained)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StudioError(f"cannot read {path}: {exc}; save the image processor again") from None
    if not isinstance(data, dict):
        raise StudioError(f"{path} is not a JSON object; save the image processor again")
    for key, want in (("image_mean", 3), ("image_std", 3)):
        v = data.get(key)
        if v is not None and not (isinstance(v, list) and len(v) == want
                                  and all(isinstance(x, (int, float)) for x in v)):
            raise StudioError(f"{path}: {key} must be {want} numbers, not {v!r}")
    if any(float(x) <= 0 for x in data.get("image_std") or CLIP_STD):
        raise StudioError(f"{path}: image_std must be positive")
    return data


#: a new project's image side where the checkpoint's image processor gives it
DEFAULT_IMAGE_SIZE = 448
#: transformers' Qwen2VLImageProcessor defaults where preprocessor_config.json names none
#: (size.shortest_edge / size.longest_edge, in pixels)
PROCESSOR_MIN_PIXELS = 56 * 56
PROCESSOR_MAX_PIXELS = 28 * 28 * 1280


@dataclass(frozen=True)
class PixelRange:
    """The square images a checkpoint's image processor gives: transformers' ``smart_resize``
    keeps a side a multiple of ``unit`` (patch x merge) and the pixels within
    [``min_pixels``, ``max_pixels``]; a square picture of any size becomes one of the sides
    from :attr:`low` to :attr:`high`."""

    min_pixels: int
    max_pixels: int
    unit: int
    source: str  # where the two numbers come from

    @property
    def low(self) -> int:
        """The smallest side: the first multiple of ``unit`` whose square holds min_pixels."""
        side = math.isqrt(self.min_pixels - 1) + 1  # the ceiling of the square root
        return max(1, -(-side // self.unit)) * self.unit

    @property
    def high(self) -> int:
        """The largest side: the last multiple of ``unit`` whose square is within max_pixels
        (0: none)."""
        return math.isqrt(self.max_pixels) // self.unit * self.unit

    def holds(self, side: int) -> bool:
        return side % self.unit == 0 and self.low <= side <= self.high

    def text(self) -> str:
        return (f"{self.low}–{self.high} px a side ({self.source}: min_pixels "
                f"{self.min_pixels:,}, max_pixels {self.max_pixels:,}; multiples of "
                f"{self.unit} px)")


def pixel_range(preprocessor: dict[str, Any], unit: int, where: str) -> PixelRange:
    """The image sides the checkpoint's image processor gives, read as transformers reads
    them: ``min_pixels`` / ``max_pixels`` where the file names them (they override ``size``),
    else ``size.shortest_edge`` / ``size.longest_edge``, else transformers' defaults."""
    size = preprocessor.get("size")
    size = size if isinstance(size, dict) else {}
    got, names = [], []
    for key, nested, default in (("min_pixels", "shortest_edge", PROCESSOR_MIN_PIXELS),
                                 ("max_pixels", "longest_edge", PROCESSOR_MAX_PIXELS)):
        if preprocessor.get(key) is not None:
            value, name = preprocessor[key], key
        elif size.get(nested) is not None:
            value, name = size[nested], f"size.{nested}"
        else:
            value, name = default, f"{key}: transformers' default"
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise StudioError(f"{where}/{PREPROCESSOR_FILE}: {name} must be a positive number "
                              f"of pixels, not {value!r}: save the image processor again")
        got.append(int(value))
        names.append(name)
    if got[0] > got[1]:
        raise StudioError(f"{where}/{PREPROCESSOR_FILE}: {names[0]} {got[0]:,} is more than "
                          f"{names[1]} {got[1]:,}: save the image processor again")
    shown = ("transformers' defaults" if all("default" in n for n in names) else
             f"{PREPROCESSOR_FILE} " + " / ".join(n.split(":")[0] for n in names))
    rng = PixelRange(got[0], got[1], int(unit), shown)
    if rng.high < rng.low:
        raise StudioError(f"{where}/{PREPROCESSOR_FILE}: min_pixels {got[0]:,} and max_pixels "
                          f"{got[1]:,} hold no square image of a multiple of {unit} px (the "
                          "patch x the merge): fix the image processor's pixel range")
    return rng


def processor_range(config: dict[str, Any], preprocessor: dict[str, Any],
                    where: str) -> PixelRange:
    """:func:`pixel_range` for a checkpoint's ``config.json`` (its patch x merge)."""
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise StudioError(f"{where}: config.json has no vision_config")
    arch = VisionArch.from_config(vc, str(config.get("model_type")), where)
    return pixel_range(preprocessor, arch.patch * arch.merge, where)


def check_image_size(rng: PixelRange, side: int, name: str) -> None:
    """A one-line refusal of an image side the checkpoint's image processor does not give
    (``name``: what set it, ``--image-size`` or ``export.image_size``)."""
    if int(side) % rng.unit:
        raise StudioError(f"{name} {side} is not a multiple of {rng.unit} pixels a side (the "
                          f"patch x the merge): the checkpoint's image processor gives "
                          f"{rng.text()}")
    if not rng.holds(int(side)):
        raise StudioError(f"{name} {side} is outside the checkpoint's image processor, which "
                          f"gives {rng.text()}: give {name} from {rng.low} to {rng.high}, a "
                          f"multiple of {rng.unit}")


def make_vision_spec(config: dict[str, Any], preprocessor: dict[str, Any], image_size: int,
                     model_type: str, where: str) -> VisionSpec:
    """The vision entry for a checkpoint's ``config.json`` and image processor at one image
    size (square, ``image_size`` pixels a side)."""
    vc = config.get("vision_config")
    if not isinstance(vc, dict):
        raise StudioError(f"{where}: config.json has no vision_config")
    arch = VisionArch.from_config(vc, model_type, where)
    for key, mine in (("patch_size", arch.patch), ("merge_size", arch.merge),
                      ("temporal_patch_size", arch.temporal_patch)):
        theirs = preprocessor.get(key)
        if theirs is not None and int(theirs) != mine:
            raise StudioError(f"{where}: {PREPROCESSOR_FILE} says {key} {theirs} but the vision "
                              f"config {mine}: the image processor belongs to another model")
    grid = arch.grid(int(image_size))
    rng = pixel_range(preprocessor, arch.patch * arch.merge, where)
    rescale = preprocessor.get("rescale_factor", 1 / 255)
    if isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or rescale <= 0:
        raise StudioError(f"{where}/{PREPROCESSOR_FILE}: rescale_factor must be a positive "
                          f"number, not {rescale!r}")
    # Qwen2.5-VL's windows: window_size pixels a side, in image tokens (transformers'
    # vit_merger_window_size); Qwen2-VL attends to the whole image in every block
    window = (arch.window // arch.merge if arch.window and model_type == "qwen2_5_vl" else 0)
    ids = {}
    for key in SPECIAL_TOKENS:
        v = config.get(key)
        if not isinstance(v, int):
            raise StudioError(f"{where}: config.json lacks an integer {key}")
        ids[key] = v
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    rope = text.get("rope_parameters") or text.get("rope_scaling") or config.get(
        "rope_parameters") or config.get("rope_scaling") or {}
    section = rope.get("mrope_section") if isinstance(rope, dict) else None
    if not section:
        raise StudioError(f"{where}: config.json gives no mrope_section (the multimodal "
                          "rotary embedding's split)")
    return VisionSpec(
        image_size=int(image_size), patch=arch.patch, merge=arch.merge,
        temporal_patch=arch.temporal_patch, channels=arch.in_chans, grid=grid,
        tokens=(grid // arch.merge) ** 2, embed_dim=arch.out_hidden,
        mean=tuple(float(x) for x in preprocessor.get("image_mean") or CLIP_MEAN),  # type: ignore[arg-type]
        std=tuple(float(x) for x in preprocessor.get("image_std") or CLIP_STD),  # type: ignore[arg-type]
        mrope_section=tuple(int(x) for x in section),
        min_pixels=min(rng.min_pixels, int(image_size) ** 2), max_pixels=int(image_size) ** 2,
        window=int(window), rescale=float(rescale), **ids)


def check_special_tokens(tokenizer, config: dict[str, Any], where: str) -> None:
    """The tokenizer must hold the vision tokens config.json names, at those ids."""
    names = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
             "image_token_id": "<|image_pad|>"}
    for key, text in names.items():
        want = config.get(key)
        got = tokenizer.token_to_id(text)
        if got is None:
            raise StudioError(f"{where}: the tokenizer has no {text} token (config.json's "
                              f"{key} = {want}): save the model's own tokenizer")
        if want is not None and int(got) != int(want):
            raise StudioError(f"{where}: the tokenizer's {text} is id {got} but config.json's "
                              f"{key} is {want}: the tokenizer belongs to another model")


# ---------------------------------------------------------------------------- images


def read_picture(path: Path):
    """The picture at ``path`` as an RGB PIL image, as transformers' image processors read one
    (``convert_to_rgb``: transparency composited onto white); a file that is not one is a
    one-line error."""
    path = Path(path)
    if not path.is_file():
        raise StudioError(f"no image at {path}: give a PNG or JPEG file")
    try:
        with Image.open(path) as opened:
            opened.load()
            if "A" in opened.getbands() or opened.info.get("transparency") is not None:
                rgba = opened.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                return Image.alpha_composite(white, rgba).convert("RGB")
            return opened.convert("RGB")
    except (PIL.UnidentifiedImageError, OSError, ValueError) as exc:
        raise StudioError(f"{path} is not an image this studio can read ({exc}); give a PNG or "
                          "JPEG file") from None


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """(height, width) a picture is resized to, as transformers' Qwen2-VL ``smart_resize``
    computes it: each side a multiple of ``factor``, the pixels within [min_pixels,
    max_pixels], the aspect kept as closely as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise StudioError(f"the picture is {width} x {height} px: its aspect ratio is over 200 "
                          "(transformers' image processor refuses it too): crop it")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resized(picture, vs: VisionSpec) -> np.ndarray:
    """An RGB PIL picture as the encoder takes it: resized (bicubic, on its 8-bit pixels) to
    the size :func:`smart_resize` gives within ``vs``'s pixels, scaled by the processor's
    rescale factor — float32 [3, H, W], as transformers' processor computes it."""
    h, w = smart_resize(picture.height, picture.width, vs.unit, vs.min_pixels, vs.max_pixels)
    if (picture.width, picture.height) != (w, h):
        picture = picture.resize((w, h), Image.Resampling.BICUBIC)
    arr = np.asarray(picture, dtype=np.uint8).transpose(2, 0, 1)
    return (arr.astype(np.float64) * vs.rescale).astype(np.float32)


def load_image(path: Path, vs: VisionSpec) -> np.ndarray:
    """The picture at ``path`` as the encoder takes it (:func:`resized`): float32 [3, H, W],
    H and W what transformers' image processor gives it within the encoder's capacity."""
    return resized(read_picture(path), vs)


@dataclass(frozen=True)
class ImagePatches:
    """One image as the encoder takes it: its patches in transformers' processor order
    (``pixel_values``) on a grid of ``grid_h`` x ``grid_w`` patches (``image_grid_thw`` [1,
    grid_h, grid_w])."""

    pixels: np.ndarray  # [grid_h * grid_w, patch_dim] float32
    grid_h: int
    grid_w: int
    merge: int

    @property
    def tokens(self) -> int:
        """The language model's tokens for the image (the patches merged merge x merge)."""
        return self.grid_h * self.grid_w // (self.merge * self.merge)

    @property
    def llm_grid(self) -> tuple[int, int]:
        """The image tokens' grid (rows, columns)."""
        return self.grid_h // self.merge, self.grid_w // self.merge


def image_patches(image: np.ndarray, vs: VisionSpec) -> ImagePatches:
    """The encoder's input for one image ([3, H, W], scaled; each side a multiple of patch x
    merge, within the capacity): normalized, the frame repeated to the temporal patch, cut
    into patches in transformers' ``Qwen2VLImageProcessor`` order."""
    img = np.asarray(image, dtype=np.float32)
    if img.ndim != 3 or img.shape[0] != vs.channels:
        raise StudioError(f"the image is {list(img.shape)}, the encoder takes "
                          f"[{vs.channels}, H, W]: load it with load_image")
    _, H, W = img.shape
    if H % vs.unit or W % vs.unit or not H or not W:
        raise StudioError(f"the image is {W} x {H} px, the encoder takes sides that are "
                          f"multiples of {vs.unit} px: load it with load_image")
    T, C, p, m = vs.temporal_patch, vs.channels, vs.patch, vs.merge
    gh, gw = H // p, W // p
    if gh * gw > vs.patches:
        raise StudioError(f"the image is {W} x {H} px = {gh * gw // (m * m)} image tokens, "
                          f"more than the encoder's {vs.tokens} ({vs.image_size} x "
                          f"{vs.image_size} px): crop it to a less extreme aspect ratio, or "
                          "re-export with a larger export.image_size")
    mean = np.asarray(vs.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(vs.std, dtype=np.float32)[:, None, None]
    x = (img - mean) / std
    x = x.reshape(C, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], T, p, p))
    pixels = np.ascontiguousarray(x.reshape(gh * gw, C * T * p * p), dtype=np.float32)
    return ImagePatches(pixels, gh, gw, m)


def pixel_values(image: np.ndarray, vs: VisionSpec) -> np.ndarray:
    """transformers' ``pixel_values`` of one image (:func:`image_patches`' patches)."""
    return image_patches(image, vs).pixels


def vision_positions(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """Each patch's (row, column) on its grid, in the processor's order ([patches, 2] int64:
    transformers' ``get_vision_position_ids``, the 2-D rotary embedding's positions)."""
    h = np.repeat(np.arange(grid_h), grid_w).reshape(grid_h, grid_w)
    w = np.tile(np.arange(grid_w), grid_h).reshape(grid_h, grid_w)
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    return np.stack([h.reshape(shape).transpose(0, 2, 1, 3).ravel(),
                     w.reshape(shape).transpose(0, 2, 1, 3).ravel()], axis=-1).astype(np.int64)


def window_order(rows: int, cols: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window order of an image's tokens (``rows`` x ``cols``): the tokens
    window by window (``window`` tokens a side, row-major; the last row and column of windows
    cut short), row-major within each — transformers' ``get_vision_window_index`` —, and the
    window of each token in that order. ``window`` 0: one window, the processor's order."""
    n = rows * cols
    if not window:
        return np.arange(n), np.zeros(n, dtype=np.int64)
    nh, nw = -(-rows // window), -(-cols // window)
    padded = np.full((nh * window, nw * window), -1, dtype=np.int64)
    padded[:rows, :cols] = np.arange(n).reshape(rows, cols)
    padded = padded.reshape(nh, window, nw, window).transpose(0, 2, 1, 3).reshape(nh * nw, -1)
    order = padded[padded >= 0]
    ids = np.repeat(np.arange(nh * nw), (padded >= 0).sum(axis=1))
    return order, ids


#: the encoder graph's inputs
ENCODER_INPUTS = ("pixel_values", "patch_positions", "attention_groups")


def encoder_feeds(patches: ImagePatches, vs: VisionSpec) -> tuple[dict[str, np.ndarray],
                                                                   np.ndarray]:
    """The encoder's feeds for one image and the order its rows come back in: the patches in
    the order the tower runs them (merge groups in Qwen2.5-VL's window order; the
    processor's for Qwen2-VL) padded with zeros to the capacity (``pixel_values`` [patches,
    patch_dim]), each one's grid position (``patch_positions`` [patches, 2]) and its
    attention groups (``attention_groups`` [2, patches]: row 0 the image (0) or the padding
    (1), what the full-attention blocks attend within; row 1 its window, -1 for the padding).
    Returns (feeds, order): output row i is the image's token ``order[i]``."""
    m2 = patches.merge * patches.merge
    T, n, N = patches.tokens, patches.pixels.shape[0], vs.patches
    rows, cols = patches.llm_grid
    order, windows = window_order(rows, cols, vs.window)
    px = np.zeros((N, vs.patch_dim), dtype=np.float32)
    px[:n] = patches.pixels.reshape(T, m2, -1)[order].reshape(n, -1)
    pos = np.zeros((N, 2), dtype=np.int64)
    pos[:n] = vision_positions(patches.grid_h, patches.grid_w, patches.merge).reshape(
        T, m2, 2)[order].reshape(n, 2)
    groups = np.empty((2, N), dtype=np.int64)
    groups[0, :n], groups[0, n:] = 0, 1
    groups[1, :n], groups[1, n:] = np.repeat(windows, m2), -1
    return {"pixel_values": px, "patch_positions": pos, "attention_groups": groups}, order


def calibration_images(count: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` images ([3, size, size], 0..1) generated here: smooth colour fields with
    shapes, stripes and noise at several scales — varied enough to exercise the encoder's
    ranges, the same on every machine."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / max(size - 1, 1)
    out = []
    for i in range(int(count)):
        c0, c1 = rng.random(3), rng.random(3)
        angle = rng.random() * np.pi
        t = np.cos(angle) * xx + np.sin(angle) * yy
        img = c0[:, None, None] * (1 - t) + c1[:, None, None] * t
        kind = i % 4
        if kind == 0:  # a disc
            cx, cy, r = rng.random(), rng.random(), 0.15 + 0.3 * rng.random()
            inside = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
            img = np.where(inside[None], rng.random(3)[:, None, None], img)
        elif kind == 1:  # stripes
            f = 2 + 10 * rng.random()
            img = img * (0.6 + 0.4 * np.sign(np.sin(2 * np.pi * f * t)))[None]
        elif kind == 2:  # a rectangle
            x0, y0 = rng.random(2) * 0.6
            box = (xx > x0) & (xx < x0 + 0.35) & (yy > y0) & (yy < y0 + 0.35)
            img = np.where(box[None], rng.random(3)[:, None, None], img)
        img = img + rng.normal(0, 0.03 + 0.05 * rng.random(), img.shape)
        out.append(np.clip(img, 0.0, 1.0).astype(np.float32))
    return out


def png_bytes(image: np.ndarray) -> bytes:
    """An image ([3, S, S] in 0..1) as a PNG file's bytes."""
    buf = io.BytesIO()
    arr = (np.clip(image, 0, 1) * 255).round().astype(np.uint8).transpose(1, 2, 0)
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def image_files(folder: Path) -> list[Path]:
    """The images in ``folder`` (by suffix, sorted)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise StudioError(f"{folder} is not a folder of images")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise StudioError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


# ---------------------------------------------------------------------------- prompts


def image_prompt(vs: VisionSpec, before: list[int], after: list[int],
                 tokens: int | None = None) -> list[int]:
    """``before`` + <|vision_start|> + one <|image_pad|> per image token (``tokens``; None:
    the encoder's capacity, a square image of ``image_size``) + <|vision_end|> + ``after``:
    the ids transformers' processor makes for one image."""
    n = vs.tokens if tokens is None else int(tokens)
    return [*before, vs.vision_start_token_id, *([vs.image_token_id] * n),
            vs.vision_end_token_id, *after]


def mrope_positions(ids: list[int], vs: VisionSpec, grid: tuple[int, int] | None = None
                    ) -> tuple[np.ndarray, int]:
    """The language model's multimodal positions of ``ids`` ([3, n]: temporal, height,
    width) and the offset later tokens carry, as transformers' ``get_rope_index`` computes
    them for a still image on ``grid`` (its tokens' rows and columns; None: the square
    image of ``image_size``): text tokens count up on all three rows; an image's tokens sit
    on its grid (row, column) from the position it starts at, and the text after it resumes
    past the grid's longer side."""
    n = len(ids)
    pos = np.zeros((3, n), dtype=np.int64)
    gh, gw = grid if grid is not None else (vs.llm_grid, vs.llm_grid)
    cur, i = 0, 0
    while i < n:
        if ids[i] == vs.image_token_id:
            j = i
            while j < n and ids[j] == vs.image_token_id:
                j += 1
            if j - i != gh * gw:
                raise StudioError(f"the prompt holds {j - i} image tokens in a row where the "
                                  f"image has {gh * gw} ({gh} x {gw}): build it with "
                                  "image_prompt")
            pos[0, i:j] = cur
            pos[1, i:j] = cur + np.repeat(np.arange(gh), gw)
            pos[2, i:j] = cur + np.tile(np.arange(gw), gh)
            cur += max(gh, gw)
            i = j
        else:
            pos[:, i] = cur
            cur += 1
            i += 1
    delta = int(pos.max()) + 1 - n if n else 0
    return pos, delta


# ---------------------------------------------------------------------------- export
