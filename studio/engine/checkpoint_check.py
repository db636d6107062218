"""Checkpoint checks that take seconds, run before any stage (``studio new``, preflight).

- the config names a supported family (:func:`hf_import.open_checkpoint`);
- the weights are complete: every safetensors file holds all the bytes its header promises,
  and every tensor the config implies is there with the shape the config implies (the model
  is built on PyTorch's ``meta`` device, so no weight is loaded);
- the tokenizer is there (``tokenizer.json``), loads, and its vocabulary fits the model's
  embedding;
- a draft model's vocabulary equals its target's;
- a vision-language checkpoint has its image processor (``preprocessor_config.json``) and a
  tokenizer with the vision tokens its config names.

Each failure is a :class:`StudioError` naming the file and what to do.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.families import family_of
from studio.core.fsutil import sha256_file
from studio.core.lazyimport import lazy_module
from studio.engine import hf_import, vision_input
from studio.engine.chat_template import prompt_format
from studio.engine.hf_import import safetensors_layout

tokenizers = lazy_module("tokenizers")
torch = lazy_module("torch")
transformers = lazy_module("transformers")

# Bump when the checks change: cached verdicts of older checks are not reused.
CHECKS_VERSION = 3


def _safetensors_end(path: Path) -> tuple[int, int]:
    """(bytes the header promises, bytes the file has); the header is checked against itself
    first (:func:`studio.engine.hf_import.safetensors_layout`)."""
    _tensors, length, end = safetensors_layout(path)
    return 8 + length + end, path.stat().st_size


def check_weights_complete(folder: Path) -> None:
    for f in hf_import.safetensors_files(folder):
        need, have = _safetensors_end(f)
        if have < need:
            raise StudioError(
                f"{f} is truncated ({have:,} of {need:,} bytes): copy or download the weights "
                "again"
            )
        if have > need:
            raise StudioError(
                f"{f} holds {have - need:,} bytes past the data its header describes: the "
                "header does not match the data (a damaged or edited file)"
            )


def expected_tensors(folder: Path) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Every tensor the config implies and its shape, and the names that may be absent
    because they are tied to another tensor."""
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise StudioError(f"config.json in {folder} cannot be read by transformers: {exc}") from None
    family = family_of(getattr(config, "model_type", None))
    vision = bool(family and family.vision)
    with torch.device("meta"):
        auto = (transformers.AutoModelForImageTextToText if vision
                else transformers.AutoModelForCausalLM)
        model = auto.from_config(config)
    shapes = {_saved_name(k) if vision else k: tuple(v.shape)
              for k, v in model.state_dict().items()}
    tied: set[str] = set()
    if getattr(config, "tie_word_embeddings", False) or getattr(
            config.get_text_config() if hasattr(config, "get_text_config") else config,
            "tie_word_embeddings", False):
        tied = {k for k in shapes if k.startswith("lm_head.")}
    return shapes, tied


def _saved_name(name: str) -> str:
    """A vision-language model's tensor under the name its checkpoints store it by:
    transformers 5 nests the language model (``model.language_model.layers.0...``) and the
    tower (``model.visual...``) and saves them as ``model.layers.0...`` and ``visual...``."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith("model.visual."):
        return name[len("model."):]
    return name


def _stored_names(held: dict[str, Any]) -> dict[str, Any]:
    return {_saved_name(k): v for k, v in held.items()}


def check_weights_match_config(folder: Path) -> None:
    held = _stored_names(hf_import._tensor_shapes(folder))
    present = {k: v[0] for k, v in held.items()}
    expected, tied = expected_tensors(folder)
    missing = sorted(k for k in expected if k not in present and k not in tied)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise StudioError(
            f"the weights in {folder} lack {', '.join(missing[:3])}{more} that config.json "
            "implies: the checkpoint is incomplete or config.json belongs to another model"
        )
    dtypes = {k: v[1] for k, v in held.items()}
    for name, shape in expected.items():
        dtype = dtypes.get(name, "")
        if name in present and not (dtype.startswith("float") or dtype == "bfloat16"):
            raise StudioError(
                f"{name} in {folder} is stored as {dtype}, not a floating-point type: the "
                "weights' header is damaged or they are not this model's weights"
            )
        if name in present and tuple(present[name]) != tuple(shape):
            raise StudioError(
                f"{name} in {folder} has shape {list(present[name])} but config.json implies "
                f"{list(shape)}: the weights do not belong to this config.json"
            )


def check_identity(folder: Path) -> dict[str, Any]:
    """What the checks read of a checkpoint folder, as a content key for their verdict: of
    each ``*.safetensors`` file its header and its size (no check reads the weights' data:
    completeness is the size the header promises, the shapes and dtypes are the header's),
    of every other file its bytes. Two folders with one identity get one verdict; a byte
    changed in a header, a config, a tokenizer or a file truncated gives another. Weights
    in a torch pickle are hashed whole (the check loads their shapes from the pickle)."""
    folder = Path(folder)
    files: dict[str, Any] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        name = str(p.relative_to(folder))
        if p.suffix == ".safetensors" and p.parent == folder:
            files[name] = {"size": p.stat().st_size, "header": _header_digest(p)}
        else:
            files[name] = sha256_file(p)
    return {"files": files}


def _header_digest(path: Path) -> str:
    """The SHA-256 of a safetensors file's 8-byte length and the header it gives (as much of
    it as the file holds: a damaged length is the checks' to report)."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        head = fh.read(8)
        h.update(head)
        if len(head) == 8:
            (length,) = struct.unpack("<Q", head)
            h.update(fh.read(min(length, hf_import.MAX_HEADER_BYTES)))
    return h.hexdigest()


def load_tokenizer(folder: Path):
    """The checkpoint's fast tokenizer (``tokenizer.json``), or a StudioError."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise StudioError(
            f"{folder} has no tokenizer.json: save the model's (fast) tokenizer beside "
            "config.json (tokenizer.save_pretrained)"
        )
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exceptions
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StudioError(f"{path} cannot be loaded ({first}): replace it with the model's "
                          "own tokenizer.json") from None


def check_tokenizer(folder: Path, vocab_size: int) -> Any:
    tok = load_tokenizer(folder)
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > vocab_size:
        raise StudioError(
            f"the tokenizer in {folder} has {n:,} tokens but the model's embedding has "
            f"{vocab_size:,} rows: the tokenizer belongs to another model"
        )
    return tok


def check_checkpoint(folder: Path) -> dict[str, Any]:
    """All checks of one checkpoint folder, the cheap ones first (the weights against the
    config builds the model's skeleton: seconds); returns what was checked."""
    folder = Path(folder)
    info = hf_import.open_checkpoint(folder)
    check_weights_complete(folder)
    tok = check_tokenizer(folder, info.vocab_size)
    check_weights_match_config(folder)

    family = family_of(info.family)
    if family is not None and family.vision:
        check_vision_parts(folder, tok)
    return {"architecture": info.architecture, "tensors": len(info.layers),
            "tokenizer_tokens": tok.get_vocab_size(with_added_tokens=True)}


def check_vision_parts(folder: Path, tok) -> None:
    """A vision-language checkpoint's image processor and the tokenizer's vision tokens."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    pre = vision_input.read_preprocessor(folder)
    vision_input.make_vision_spec(config, pre, _any_image_size(config, folder),
                            str(config.get("model_type")), str(folder))
    vision_input.check_special_tokens(tok, config, str(folder))


def _any_image_size(config: dict[str, Any], folder: Path) -> int:
    """The smallest image the tower takes (patch x merge pixels): the checks need a size."""
    vc = config.get("vision_config") or {}
    try:
        return int(vc.get("patch_size") or 14) * int(vc.get("spatial_merge_size") or 2)
    except (TypeError, ValueError):
        raise StudioError(f"config.json in {folder}: the vision_config's patch_size and "
                          "spatial_merge_size must be numbers") from None


def check_draft(target: Path, draft: Path) -> None:
    """A draft model must speak its target's vocabulary, token for token."""
    check_checkpoint(draft)
    a, b = load_tokenizer(target).get_vocab(True), load_tokenizer(draft).get_vocab(True)
    if a != b:
        differ = len(set(a.items()) ^ set(b.items()))
        raise StudioError(
            f"the draft model {draft} has another vocabulary than the target {target} "
            f"({differ:,} entries differ): a draft must use the target's tokenizer"
        )


def prompt_length(folder: Path, prompt: str, chat_template: str = "none") -> int:
    """How many tokens the runtime will feed for ``prompt`` (special tokens included),
    through the checkpoint's chat template as ``model.chat_template`` says."""
    return len(prompt_format(folder, chat_template).ids(load_tokenizer(folder), prompt))
