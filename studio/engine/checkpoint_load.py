"""A Hugging Face checkpoint as the exporter reads it: its folder checked, the causal LM (or a
vision-language model's language model, :func:`text_view`) loaded, its special tokens and
the reference ids the export check runs on."""

from __future__ import annotations

import json
from pathlib import Path

from studio.core import families
from studio.core.errors import StudioError
from studio.core.families import FAMILIES
from studio.core.lazyimport import lazy_module

torch = lazy_module("torch")
tokenizers = lazy_module("tokenizers")
transformers = lazy_module("transformers")

REFERENCE_TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
)


def check_checkpoint(checkpoint_dir: Path) -> dict:
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.exists():
        raise StudioError(
            f"checkpoint folder {checkpoint_dir} does not exist; pick a Hugging Face model folder"
        )
    if not checkpoint_dir.is_dir() or not (checkpoint_dir / "config.json").is_file():
        raise StudioError(
            f"{checkpoint_dir} is not a Hugging Face checkpoint (no config.json); "
            "pick the folder written by save_pretrained"
        )
    try:
        config = json.loads((checkpoint_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StudioError(f"cannot read {checkpoint_dir / 'config.json'}: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        labels = ", ".join(f"{f.label} ({f.model_type})" for f in FAMILIES.values())
        raise StudioError(
            f"model type {model_type!r} is not supported by the static-KV exporter; "
            f"use a checkpoint of one of: {labels}"
        )
    if not any(checkpoint_dir.glob("*.safetensors")) and not any(checkpoint_dir.glob("*.bin")):
        raise StudioError(
            f"{checkpoint_dir} has no weights (*.safetensors or *.bin); download the full checkpoint"
        )
    # a vision-language config's language-model keys at the top (its vision_config stays)
    return families.text_config(config, FAMILIES[model_type])


def load_causal_lm(checkpoint_dir: Path):
    """Load a checkpoint as float32 with the eager attention (what the graphs reproduce). A
    vision-language checkpoint is loaded whole (its vision tower too): :func:`text_view`
    gives its language model in a text model's shape."""
    cfg = check_checkpoint(checkpoint_dir)
    vision = FAMILIES[cfg["model_type"]].vision
    try:
        auto = (transformers.AutoModelForImageTextToText if vision
                else transformers.AutoModelForCausalLM)
        model = auto.from_pretrained(
            str(checkpoint_dir), dtype=torch.float32, attn_implementation="eager"
        )
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudioError(f"cannot load {checkpoint_dir} with transformers: {first}") from None
    model.eval()
    return model


class TextView:
    """A vision-language model seen as its language model, in the shape the static-KV
    wrapper reads from a text model: ``.model`` (``embed_tokens``, ``layers``, ``norm``,
    ``rotary_emb``), ``.config`` (the text config), ``.lm_head`` — the checkpoint's own
    modules; ``.full`` the whole model (transformers' reference runs it)."""

    def __init__(self, full):
        self.full = full
        self.model = full.model.language_model
        self.config = full.config.get_text_config()
        self.lm_head = full.lm_head


def text_view(model):
    """The language model of ``model``: itself for a text model, a :class:`TextView` of a
    vision-language one."""
    inner = getattr(model, "model", None)
    return TextView(model) if hasattr(inner, "language_model") else model


def _token_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def special_ids(model) -> tuple[list[int], int | None]:
    gen = getattr(model, "generation_config", None)
    eos = _token_ids(getattr(gen, "eos_token_id", None)) or _token_ids(model.config.eos_token_id)
    pad = getattr(gen, "pad_token_id", None)
    if pad is None:
        pad = model.config.pad_token_id
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    return eos, pad


def _tokenizer_dir(checkpoint_dir: Path) -> Path | None:
    if (Path(checkpoint_dir) / "tokenizer.json").is_file():
        return Path(checkpoint_dir)
    return None


def reference_ids(checkpoint_dir: Path, length: int, vocab: int) -> list[int]:
    ids: list[int] = []
    tok_dir = _tokenizer_dir(checkpoint_dir)
    if tok_dir is not None:
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
            text = REFERENCE_TEXT * (8 + length // 16)
            ids = [i for i in tok.encode(text, add_special_tokens=False).ids if i < vocab]
        except Exception:  # noqa: BLE001 - a tokenizer we cannot read: fall back to fixed ids
            ids = []
    if len(ids) < length:
        ids = ids + [(7 * k + 3) % vocab for k in range(length - len(ids))]
    return ids[:length]
