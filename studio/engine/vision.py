"""The vision side of a vision-language model (Qwen2-VL / Qwen2.5-VL): the image's way in.

A vision-language checkpoint is exported as the language model's static-KV graphs (see
:mod:`studio.engine.llm_export`) plus ``vision.onnx``, the vision encoder for up to
``export.image_size`` squared pixels (a multiple of patch x merge pixels a side: its
capacity in patches is fixed, as the HTP needs). Everything here is what the host does
around those graphs, as transformers does it:

- :func:`load_image` / :func:`image_patches`: the picture resized as transformers'
  ``Qwen2VLImageProcessor`` resizes it (``smart_resize``: its aspect kept, each side a
  multiple of patch x merge, its pixels within the processor's min_pixels and the encoder's
  capacity), scaled, normalized with the checkpoint's ``preprocessor_config.json`` mean and
  std and cut into the encoder's patches (``[grid_h * grid_w, 3 * 2 * patch * patch]``, two
  frames of one image, in the processor's order) — any grid, square or not;
- :func:`encoder_feeds` / :func:`encode`: the patches in the order the tower runs them
  (Qwen2.5-VL's window order), padded to the encoder's capacity, with each patch's grid
  position (the 2-D rotary embedding) and the groups its attention stays within (the image,
  Qwen2.5-VL's windows); the rows that come back in the processor's order;
- :func:`image_prompt` / :func:`mrope_positions`: the prompt's ids with the image's
  placeholder tokens and the language model's multimodal (3-row) positions and the offset
  that later tokens' positions carry (``rope delta``);
- :func:`export_vision`: the encoder traced from the checkpoint's own modules (the Conv3d
  patch embedding as the MatMul it is; attention masked by the groups, the rotary tables
  gathered by the positions);
- :func:`calibration_images`: images generated here (no downloads) for calibration and the
  held-out check when the project names no folder of its own.

Heavy libraries (torch, PIL) are imported inside functions.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import IMAGE_SUFFIXES

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
        import math

        side = math.isqrt(self.min_pixels - 1) + 1  # the ceiling of the square root
        return max(1, -(-side // self.unit)) * self.unit

    @property
    def high(self) -> int:
        """The largest side: the last multiple of ``unit`` whose square is within max_pixels
        (0: none)."""
        import math

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
    from studio.core.archs import VisionArch

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
    from studio.core.archs import VisionArch

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
    from PIL import Image, UnidentifiedImageError

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
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise StudioError(f"{path} is not an image this studio can read ({exc}); give a PNG or "
                          "JPEG file") from None


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """(height, width) a picture is resized to, as transformers' Qwen2-VL ``smart_resize``
    computes it: each side a multiple of ``factor``, the pixels within [min_pixels,
    max_pixels], the aspect kept as closely as that allows."""
    import math

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
    from PIL import Image

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
    import io

    from PIL import Image

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


def _linear_patch_embed(patch_embed):
    """The patch embedding's Conv3d (kernel = stride = one patch) as the Linear it is over
    flattened patches: the HTP runs it as one MatMul."""
    import torch

    w = patch_embed.proj.weight.detach()
    lin = torch.nn.Linear(w[0].numel(), w.shape[0], bias=patch_embed.proj.bias is not None)
    lin.weight = torch.nn.Parameter(w.reshape(w.shape[0], -1).clone())
    if patch_embed.proj.bias is not None:
        lin.bias = torch.nn.Parameter(patch_embed.proj.bias.detach().clone())

    class LinearPatchEmbed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = lin

        def forward(self, x):
            return self.proj(x)

    return LinearPatchEmbed()


def rotary_tables(visual, rows: int):
    """The tower's 2-D rotary embedding for grid positions 0..rows-1, one axis: (cos, sin)
    [rows, head_dim / 4], computed as the checkpoint's rotary module computes them
    (``position * inv_freq`` in float32, times its attention scaling)."""
    import torch

    rot = visual.rotary_pos_emb
    freqs = torch.arange(rows)[:, None].float() * rot.inv_freq.float()[None]
    scale = float(getattr(rot, "attention_scaling", 1.0))
    return freqs.cos() * scale, freqs.sin() * scale


def _masked_block(blk, x, cos, sin, mask, rotate):
    """One block of the tower, the checkpoint's own modules (its norms, qkv and output
    projections, MLP) around transformers' eager attention with an additive ``mask`` where
    transformers splits the sequence by its ``cu_seqlens`` (same softmax over the same keys,
    masked ones at ``mask``'s value)."""
    import torch

    attn = blk.attn
    n = x.shape[0]
    q, k, v = attn.qkv(blk.norm1(x)).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3
                                                                            ).unbind(0)
    q, k = rotate(q, k, cos, sin)
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    w = torch.matmul(q, k.transpose(2, 3)) * attn.scaling + mask
    w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    o = torch.matmul(w, v).transpose(1, 2).reshape(n, -1)
    x = x + attn.proj(o)
    return x + blk.mlp(blk.norm2(x))


def vision_wrapper(visual, vs: VisionSpec, mask_value: float):
    """``(pixel_values [patches, patch_dim], patch_positions [patches, 2], attention_groups
    [2, patches]) -> image_embeds [patches / merge², hidden]`` over the checkpoint's own
    vision tower ``visual`` (``model.model.visual``) at the encoder's capacity, for any grid
    within it (:func:`encoder_feeds`: the host orders and pads the patches): the patch
    embedding (swapped for its Linear form — the caller puts the original back), the rotary
    embedding gathered by the positions, the blocks with attention masked to the groups
    (Qwen2.5-VL's window blocks within a window, its full-attention blocks and every
    Qwen2-VL block within the image), the merger."""
    import sys

    import torch

    rotate = sys.modules[type(visual.blocks[0].attn).__module__].apply_rotary_pos_emb_vision
    full = getattr(visual, "fullatt_block_indexes", None)
    full = set(range(len(visual.blocks))) if full is None else {int(i) for i in full}
    cos_t, sin_t = rotary_tables(visual, vs.rotary_rows)

    def mask(groups):
        same = groups[:, None] == groups[None, :]
        return torch.where(same, torch.tensor(0.0), torch.tensor(float(mask_value)))[None, None]

    class VisionEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.visual = visual

        def forward(self, pixel_values, patch_positions, attention_groups):
            x = self.visual.patch_embed(pixel_values)
            h, w = patch_positions[:, 0], patch_positions[:, 1]
            cos = torch.cat([cos_t[h], cos_t[w]], dim=-1)
            sin = torch.cat([sin_t[h], sin_t[w]], dim=-1)
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
            image_mask, window_mask = mask(attention_groups[0]), mask(attention_groups[1])
            for i, blk in enumerate(self.visual.blocks):
                x = _masked_block(blk, x, cos, sin, image_mask if i in full else window_mask,
                                  rotate)
            return self.visual.merger(x)

    visual.patch_embed = _linear_patch_embed(visual.patch_embed)
    wrapper = VisionEncoder()
    wrapper.eval()
    return wrapper


def reference_image_embeds(model, patches: ImagePatches) -> np.ndarray:
    """transformers' own image features for ``patches`` (the checkpoint's code, its Conv3d),
    in the processor's order."""
    import torch

    grid = torch.tensor([[1, patches.grid_h, patches.grid_w]], dtype=torch.long)
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(patches.pixels), grid,
                                             return_dict=True)
    emb = out.pooler_output
    if isinstance(emb, (list, tuple)):
        emb = torch.cat(list(emb), 0)
    return emb.float().numpy()


def gemms_as_matmuls(model) -> int:
    """The tower's Linear layers (traced as ``Gemm(x, W, b, transB=1)`` on its 2-D rows) as
    ``MatMul(x, W^T) + b``, the form of the language model's graphs: the weight stored
    ``[in, out]`` under its checkpoint name, so per-layer precisions, block-wise weights and
    the quantizer's MatMul rules apply to the encoder as to the language model. Returns how
    many were rewritten."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    out_nodes, n = [], 0
    for node in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        w = inits.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if (w is None or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                or attrs.get("beta", 1.0) != 1.0 or len(w.dims) != 2):
            out_nodes.append(node)
            continue
        arr = numpy_helper.to_array(w)
        if attrs.get("transB", 0):
            arr = np.ascontiguousarray(arr.T)
        w.CopyFrom(numpy_helper.from_array(arr, w.name))
        base = node.name[:-len("Gemm")] if node.name.endswith("Gemm") else node.name + "/"
        has_bias = len(node.input) > 2 and node.input[2]
        mm_out = f"{base}MatMul_output_0" if has_bias else node.output[0]
        out_nodes.append(helper.make_node("MatMul", [node.input[0], w.name], [mm_out],
                                          name=f"{base}MatMul"))
        if has_bias:
            out_nodes.append(helper.make_node("Add", [mm_out, node.input[2]], [node.output[0]],
                                              name=f"{base}Add"))
        n += 1
    del g.node[:]
    g.node.extend(out_nodes)
    return n


#: a vision tower with more FP32 weight bytes than this keeps them in ``vision.onnx.data``
#: beside the graph (one ONNX file holds at most 2 GB: Qwen2.5-VL-3B's tower is 2.7 GB)
EXTERNAL_ABOVE = 1 << 30


def export_vision(visual, vs: VisionSpec, path: Path, opset: int,
                  mask_value: float | None = None) -> dict[str, Any]:
    """Trace the vision tower ``visual`` (``model.model.visual``) into ``path`` (FP32) at the
    encoder's capacity (:func:`vision_wrapper`; masked attention scores at ``mask_value``,
    the language model's); its weights inside the file, or past :data:`EXTERNAL_ABOVE` bytes
    in ``<path>.data``, written a tensor at a time. Returns its graph I/O description."""
    import torch

    from studio.engine.llm_export import (
        DEFAULT_MASK_VALUE,
        _initializers_kept,
        _write_initializers,
    )

    kept = visual.patch_embed
    feeds, _ = encoder_feeds(ImagePatches(np.zeros((vs.patches, vs.patch_dim), np.float32),
                                          vs.grid, vs.grid, vs.merge), vs)
    example = tuple(torch.from_numpy(feeds[k]) for k in ENCODER_INPUTS)
    nbytes = sum(p.numel() * p.element_size() for p in visual.parameters())
    external = nbytes > EXTERNAL_ABOVE
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.onnx")
    try:
        wrapper = vision_wrapper(visual, vs, DEFAULT_MASK_VALUE if mask_value is None
                                 else mask_value)
        with torch.no_grad(), warnings.catch_warnings(), _initializers_kept() as weights:
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(wrapper, example, str(tmp), input_names=list(ENCODER_INPUTS),
                              output_names=["image_embeds"], opset_version=opset, dynamo=False,
                              do_constant_folding=True, export_params=not external)
            weights = dict(weights)
    finally:
        visual.patch_embed = kept  # the checkpoint's own module back
    import onnx

    from studio.engine.llm_export import save_onnx_atomic

    if external:  # traced without its weights: they go to <tmp>.data a tensor at a time
        _write_initializers(tmp, weights)
    m = onnx.load(str(tmp))  # with the weights: the Linear layers into their MatMul form
    gemms_as_matmuls(m)
    save_onnx_atomic(m, path, external=external)
    tmp.unlink()
    tmp.with_name(tmp.name + ".data").unlink(missing_ok=True)
    return {"file": path.name, "external_data": external, "weight_bytes": nbytes,
            "inputs": [{"name": "pixel_values", "dtype": "float32",
                        "shape": [vs.patches, vs.patch_dim]},
                       {"name": "patch_positions", "dtype": "int64", "shape": [vs.patches, 2]},
                       {"name": "attention_groups", "dtype": "int64",
                        "shape": [2, vs.patches]}],
            "outputs": [{"name": "image_embeds", "dtype": "float32",
                         "shape": [vs.tokens, vs.embed_dim]}]}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-30)


#: the encoder's check: max |ONNX - transformers| within this x max(1, max |feature|)
ENCODER_CHECK_RTOL = 1e-3


def encoder_session(graphs_dir: Path, threads: int | None = None):
    """The FP32 vision encoder of an export on the host CPU (ONNX Runtime)."""
    from studio.engine.llm_runtime import make_cpu_session
    from studio.engine.threads import HOST_THREADS

    path = Path(graphs_dir) / VISION_FILE
    if not path.is_file():
        raise StudioError(f"{graphs_dir} has no {VISION_FILE}: re-run the export")
    return make_cpu_session(path, threads or HOST_THREADS)


def encode(session, patches: ImagePatches, vs: VisionSpec) -> np.ndarray:
    """The encoder's image rows [tokens, hidden] (float32) for one image's patches, in the
    processor's order (the order of its image tokens in the prompt)."""
    feeds, order = encoder_feeds(patches, vs)
    out = np.asarray(session.run(["image_embeds"], feeds)[0], dtype=np.float32)
    rows = np.empty((patches.tokens, out.shape[1]), dtype=np.float32)
    rows[order] = out[:patches.tokens]
    return rows


def timed_encode(session, image: np.ndarray, vs: VisionSpec) -> tuple[np.ndarray, float]:
    """The encoder's rows for one image ([3, H, W]) and the seconds the encoder took (the
    host's patching before it not counted)."""
    return timed_encode_pixels(session, image_patches(image, vs), vs)


def timed_encode_pixels(session, patches: ImagePatches, vs: VisionSpec
                        ) -> tuple[np.ndarray, float]:
    """The encoder's rows for one image's patches and the seconds it took."""
    import time

    t0 = time.perf_counter()
    rows = encode(session, patches, vs)
    return rows, time.perf_counter() - t0


def place_image(vs: VisionSpec, ids: list[int], tokens: int | None = None) -> list[int]:
    """The image's tokens (``tokens``; None: the capacity's) in a prompt: where its ids hold
    the one image placeholder (a chat template put
    ``<|vision_start|><|image_pad|><|vision_end|>`` there), expanded to the image's tokens as
    transformers' processor expands it; a prompt without one gets the image before it."""
    n = vs.tokens if tokens is None else int(tokens)
    at = [i for i, t in enumerate(ids) if t == vs.image_token_id]
    if not at:
        return image_prompt(vs, [], ids, n)
    i = at[0]
    if len(at) > 1 or not (0 < i < len(ids) - 1 and ids[i - 1] == vs.vision_start_token_id
                           and ids[i + 1] == vs.vision_end_token_id):
        raise StudioError(f"the prompt holds {len(at)} image placeholder(s) where one image "
                          "goes between <|vision_start|> and <|vision_end|>: give one image "
                          "per prompt")
    return [*ids[:i], *([vs.image_token_id] * n), *ids[i + 1:]]


def image_prompt_ids(spec: dict[str, Any], prompt_ids: list[int], image: Path | None,
                     encoder, gen) -> tuple[list[int], dict[str, Any] | None]:
    """An image prompt: the picture at ``image`` resized as transformers' processor resizes
    it (within the encoder's capacity) through ``encoder`` (its rows and grid set on ``gen``
    for the next prefill), its tokens where the prompt's ids hold its placeholder (a chat
    template's) or else before them (:func:`place_image`); with no image the prompt's ids.
    Returns (ids, the image's figures — its size, tokens, ``encoder_ms`` — or None).
    ``encoder`` None: the device runs its encoder with the generation (an agent: the patches
    go with the prompt, ``gen.set_pixels``; ``encoder_ms`` comes with its result)."""
    vs = vision_spec(spec)
    if image is None:
        return prompt_ids, None
    if vs is None:
        raise StudioError("this model takes no image: it is a text model (give an image to a "
                          "Qwen2-VL or Qwen2.5-VL project)")
    place_image(vs, prompt_ids)  # a misplaced placeholder: before any work
    patches = image_patches(load_image(Path(image), vs), vs)
    ids = place_image(vs, prompt_ids, patches.tokens)
    figures: dict[str, Any] = {"path": str(image), "image_size": vs.image_size,
                               "resized": [patches.grid_w * vs.patch, patches.grid_h * vs.patch],
                               "image_grid": list(patches.llm_grid),
                               "image_tokens": patches.tokens, "encoder_ms": None}
    if encoder is None:  # the device runs its encoder within the generation (an agent)
        gen.set_pixels(patches)
    else:
        rows, enc_s = timed_encode_pixels(encoder, patches, vs)
        gen.set_image(rows, patches.llm_grid)
        figures["encoder_ms"] = enc_s * 1e3
    return ids, figures


def image_timing(figures: dict[str, Any], out: dict[str, Any], prefill_s: float
                 ) -> dict[str, Any]:
    """An image prompt's figures completed from its generation ``out``: the encoder's time
    where the device ran it within the generation (an agent's ``encoder_s``), the prefill's
    (``prefill_s``, as the device reports it), and the time to first token as their sum."""
    if figures["encoder_ms"] is None:
        figures["encoder_ms"] = float(out.get("encoder_s") or 0.0) * 1e3
    figures["prefill_ms"] = float(prefill_s) * 1e3
    figures["time_to_first_token_ms"] = figures["encoder_ms"] + figures["prefill_ms"]
    return figures


def check_shapes(vs: VisionSpec) -> list[np.ndarray]:
    """The export check's generated images: the encoder's full square, and one a token
    narrower (rows and columns differ: a picture that is not square; Qwen2.5-VL's last
    windows cut short) where the capacity leaves room."""
    image = calibration_images(1, vs.image_size, seed=7)[0]
    if vs.image_size <= vs.unit:
        return [image]
    return [image, image[:, :, :vs.image_size - vs.unit]]


def check_image_export(full, graphs_dir: Path, gen, vs: VisionSpec, text_ids: list[int],
                       progress=None) -> dict[str, Any]:
    """The export check of a vision-language model on an image prompt: generated images (a
    square at the encoder's capacity and one not square, :func:`check_shapes`) through
    ``vision.onnx`` against transformers' image features (cosine, max |diff|), then the
    prompt (two text tokens, the last image, text to the end of the context) teacher-forced
    through the graphs of ``gen`` against transformers run on the same ids and pixels (every
    position's logits, the text export check's rule)."""
    import torch

    from studio.engine.llm_export import PositionCheck

    session = encoder_session(graphs_dir)
    diff, top, cos = 0.0, 0.0, []
    for image in check_shapes(vs):
        patches = image_patches(image, vs)
        ref_rows = reference_image_embeds(full, patches)
        rows = encode(session, patches, vs)
        diff = max(diff, float(np.max(np.abs(rows - ref_rows))))
        top = max(top, float(np.max(np.abs(ref_rows))))
        cos.append(cosine(rows, ref_rows))
    tol = ENCODER_CHECK_RTOL * max(1.0, top)
    C = gen.context_len
    ids = image_prompt(vs, list(text_ids[:2]), list(text_ids[2:]), patches.tokens)[:C]
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = full(input_ids=x, pixel_values=torch.from_numpy(patches.pixels),
                   image_grid_thw=torch.tensor([[1, patches.grid_h, patches.grid_w]]),
                   mm_token_type_ids=(x == vs.image_token_id).int(),
                   use_cache=False).logits[0].float().numpy()
    V = gen.vocab_size
    check = PositionCheck()
    P = min(gen.prompt_len, len(ids))
    gen.set_image(rows, patches.llm_grid)
    pre = gen.prefill(ids[:P])
    for p in range(len(ids)):
        if progress is not None:
            progress.check()
            if p % 16 == 0:
                progress.update(p / len(ids), f"image prompt position {p}/{len(ids)}")
        got = pre[p][:V] if p < P else gen.step(ids[p], p)[:V]
        check.add(p, got, ref[p, :V])
    out = check.figures(P)
    out.update(encoder_cosine=min(cos), encoder_max_abs_diff=diff,
               encoder_tolerance=tol, encoder_ok=diff <= tol, image_tokens=vs.tokens,
               images=[f"{g.shape[2]} x {g.shape[1]} px" for g in check_shapes(vs)],
               prompt_image_tokens=patches.tokens, rope_offset=int(gen.rope_offset))
    return out


# ---------------------------------------------------------------------------- quantize


def images_for(folder: Path | None, count: int, vs: VisionSpec, seed: int) -> list[np.ndarray]:
    """``count`` images for the encoder: the first of ``folder``'s (sorted, repeated when it
    has fewer; each resized as transformers' processor resizes it, :func:`load_image`) or,
    with no folder, generated here from ``seed`` at the encoder's full size."""
    if folder is None:
        return calibration_images(count, vs.image_size, seed)
    files = image_files(folder)
    return [load_image(files[i % len(files)], vs) for i in range(int(count))]


def image_prompt_feeds(graphs_dir: Path, spec: dict[str, Any], windows: list[list[int]],
                       images: list[np.ndarray], decode_per_image: int = 2
                       ) -> tuple[list[dict], list[dict]]:
    """Calibration feeds of a vision-language model's image prompts: each image (through the
    FP32 encoder) placed after two tokens of a text window, text of the window after it up
    to P; the prefill graph's feed, then ``decode_per_image`` decode steps that continue the
    window's text (their positions carry the image's rope offset). (prefill, decode)."""
    from studio.engine.llm_runtime import cpu_generator

    vs = vision_spec(spec)
    if vs is None:
        return [], []
    P = int(spec["prompt_length"])
    gen = cpu_generator(graphs_dir, spec)
    enc = encoder_session(graphs_dir)
    pre, dec = [], []
    for i, img in enumerate(images):
        text = windows[i % len(windows)]
        patches = image_patches(img, vs)
        rows = encode(enc, patches, vs)
        room = max(0, P - patches.tokens - 4)
        ids = image_prompt(vs, text[:2], text[2:2 + room], patches.tokens)
        gen.set_image(rows, patches.llm_grid)
        pre.append({k: np.array(v, copy=True) for k, v in gen.prefill_feed(ids).items()})
        gen.prefill(ids)  # the image is still set: the same prompt fills the cache
        nxt = text[2 + room:2 + room + decode_per_image]
        for j, tok in enumerate(nxt):
            pos = len(ids) + j
            if pos >= gen.context_len:
                break
            dec.append(gen.decode_feed(int(tok), pos, copy=True))
            gen.step(int(tok), pos)
    return pre, dec


def quantize_vision(graphs_dir: Path, stage: Path, recipe: dict[str, Any],
                    images: list[np.ndarray], held: list[np.ndarray], progress=None,
                    vs: VisionSpec | None = None) -> dict[str, Any]:
    """``stage/vision.onnx``: the encoder after the rewrites the HTP needs (the exact GELU of
    the merger as one Gelu op: the HTP refuses Erf), quantized by the recipe's scheme and
    granularity on ``images`` (its own graph: the language model's per-layer overrides do not
    name its layers: ``quantization.vision_scheme`` and ``vision_overrides`` are its own
    recipe), or float for a float scheme; checked against the FP32 encoder on the ``held``
    images (cosine of the image rows, on the CPU)."""
    import shutil

    from studio.core.recipe import is_float_scheme
    from studio.engine import rewrites
    from studio.engine.llm_export import load_spec
    from studio.engine.llm_runtime import make_cpu_session
    from studio.engine.quantize import quantize_graph

    src = Path(graphs_dir) / VISION_FILE
    vs = vs or vision_spec(load_spec(graphs_dir))
    assert vs is not None
    work = Path(stage) / ".vision-float.onnx"
    names = [r.name for r in rewrites.PREPARE] + ["erf-gelu"]
    applied = rewrites.apply_rewrites(src, work, names)
    feeds = [encoder_feeds(image_patches(img, vs), vs)[0] for img in images]
    scheme = recipe.get("vision_scheme") or recipe["scheme"]
    info: dict[str, Any] = {"file": VISION_FILE, "rewrites": applied, "images": len(images),
                            "scheme": scheme}
    if is_float_scheme(scheme):
        shutil.move(str(work), str(Path(stage) / VISION_FILE))
        info["precision"] = "float (FP16 on the HTP)"
    else:
        from studio.core.recipe import weight_bits

        rec: dict[str, Any] = {k: recipe[k] for k in ("weight_granularity",
                                                       "calibration_method", "block_size")
                               if k in recipe}
        overrides = dict(recipe.get("vision_overrides") or {})
        rec.update(scheme=scheme, samples=len(feeds), overrides=overrides,
                   weight_rounding="nearest")
        if rec.get("weight_granularity") == "per_block" and weight_bits(scheme) != 4:
            rec["weight_granularity"] = "per_channel"  # blocks are for 4-bit weights
            info["weight_granularity_note"] = (f"per_block weights are 4-bit: the {scheme} "
                                               "encoder per channel")
        info["overrides"] = overrides
        if progress is not None:
            progress.update(0.0, f"quantizing {VISION_FILE} on {len(feeds)} images")
        q = quantize_graph(work, Path(stage) / VISION_FILE, rec, feeds)
        info.update({k: q[k] for k in ("matmul_precisions", "qdq_nodes", "calibration_feeds")
                     if k in q})
        work.unlink(missing_ok=True)
        work.with_name(work.name + ".data").unlink(missing_ok=True)
    ref = make_cpu_session(src)
    got = make_cpu_session(Path(stage) / VISION_FILE)
    cos = []
    for img in held:
        px = image_patches(img, vs)
        cos.append(cosine(encode(got, px, vs), encode(ref, px, vs)))
    info["check"] = {"encoder_cosine_min": min(cos) if cos else None,
                     "encoder_cosine_mean": float(np.mean(cos)) if cos else None,
                     "images": len(cos)}
    return info
