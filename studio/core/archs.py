"""What the performance model and the device plan know of a model without its weights: the
schemes' bits (:class:`Scheme`) and a checkpoint's sizes from its ``config.json``
(:class:`Arch`, a vision-language model's tower :class:`VisionArch`), from a file, a
checkpoint folder or a config bundled with the studio (``resources/configs``). Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.families import (
    FAMILIES,
    MAX_PARAMS,
    SLIDING,
    UNLISTED,
    config_limit,
    family_of,
    layer_types,
)
from studio.core.resources import resources_dir

CONFIGS_DIR = resources_dir() / "configs"


# --------------------------------------------------------------------------- schemes


@dataclass(frozen=True)
class Scheme:
    """Bits per stored weight, per activation, and per KV-cache element."""

    name: str
    weight_bits: int
    act_bits: int
    kv_bits: int
    description: str
    float_acts: bool = False

    @property
    def weight_bytes(self) -> float:
        return self.weight_bits / 8

    @property
    def act_bytes(self) -> float:
        return self.act_bits / 8

    @property
    def kv_bytes(self) -> float:
        return self.kv_bits / 8


SCHEMES: dict[str, Scheme] = {
    "W4A16": Scheme("W4A16", 4, 16, 16, "4-bit weights, 16-bit integer activations and KV"),
    "W4": Scheme("W4", 4, 16, 16, "4-bit weights, 16-bit float activations and KV", True),
    "W8A16": Scheme("W8A16", 8, 16, 16, "8-bit weights, 16-bit integer activations and KV"),
    "W8A8": Scheme("W8A8", 8, 8, 8, "8-bit weights, 8-bit activations and KV"),
    "FP16": Scheme("FP16", 16, 16, 16, "16-bit float weights, activations and KV", True),
}


def get_scheme(name: str) -> Scheme:
    key = str(name).strip().upper()
    if key not in SCHEMES:
        raise StudioError(f"unknown scheme {name!r}; known schemes: {', '.join(SCHEMES)}")
    return SCHEMES[key]


# --------------------------------------------------------------------------- architecture

#: the vision-language families whose vision tower the model knows
VISION_FAMILIES = tuple(f.model_type for f in FAMILIES.values() if f.vision)


@dataclass(frozen=True)
class VisionArch:
    """The sizes of a vision-language model's vision tower (Qwen2-VL / Qwen2.5-VL): a ViT over
    ``patch`` x ``patch`` patches (two frames of one image, ``temporal_patch``), ``depth``
    blocks — Qwen2.5-VL's attend within windows of ``window`` patches a side except the
    ``full_blocks`` — and a merger that turns each ``merge`` x ``merge`` patches into one
    token of the language model's width."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    merge: int
    out_hidden: int
    temporal_patch: int = 2
    in_chans: int = 3
    gated_mlp: bool = True
    window: int | None = None  # patches a side of a window-attention block; None: all full
    full_blocks: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, vc: Mapping[str, Any], model_type: str, where: str) -> VisionArch:
        def need(key: str, *alts: str) -> int:
            for k in (key, *alts):
                v = vc.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    if v > config_limit(k):
                        raise StudioError(f"{where}: vision_config '{k}' = {v} must be between "
                                          f"1 and {config_limit(k)}: the config is damaged or "
                                          "not a model's")
                    return v
            raise StudioError(f"{where}: vision_config has no positive '{key}'")

        qwen25 = model_type == "qwen2_5_vl"
        # Qwen2-VL names the ViT's width embed_dim and the language model's hidden_size;
        # Qwen2.5-VL names them hidden_size and out_hidden_size
        depth = need("depth")
        hidden = need("hidden_size") if qwen25 else need("embed_dim")
        out = need("out_hidden_size") if qwen25 else need("hidden_size")
        patch, merge = need("patch_size", "spatial_patch_size"), need("spatial_merge_size")
        # Qwen2-VL's vision MLP is fc1 / fc2 at mlp_ratio x the width; Qwen2.5-VL's is gated
        inter = (need("intermediate_size") if qwen25 or vc.get("intermediate_size")
                 else int(hidden * float(vc.get("mlp_ratio", 4))))
        window_px = vc.get("window_size") if qwen25 else None
        full = tuple(int(i) for i in vc.get("fullatt_block_indexes") or ())
        return cls(depth=depth, hidden=hidden, intermediate=inter,
                   heads=need("num_heads"), patch=patch, merge=merge, out_hidden=out,
                   temporal_patch=int(vc.get("temporal_patch_size") or 2),
                   in_chans=int(vc.get("in_chans") or vc.get("in_channels") or 3),
                   gated_mlp=qwen25,
                   window=int(window_px) // patch if isinstance(window_px, int) else None,
                   full_blocks=full)

    def grid(self, image: int) -> int:
        """Patches a side for a square ``image`` (pixels, a multiple of patch x merge)."""
        unit = self.patch * self.merge
        if image < unit or image % unit:
            raise StudioError(f"the image must be a multiple of {unit} pixels a side (the "
                              f"patch {self.patch} x the merge {self.merge}), not {image}")
        return image // self.patch

    def patches(self, image: int) -> int:
        return self.grid(image) ** 2

    def tokens(self, image: int) -> int:
        """The language model's tokens for one image: the patches merged ``merge`` x ``merge``."""
        return self.patches(image) // (self.merge ** 2)

    @property
    def params(self) -> int:
        h, m = self.hidden, self.merge ** 2
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate
        embed = self.in_chans * self.temporal_patch * self.patch ** 2 * h
        merger = (h * m) * (h * m) + (h * m) * self.out_hidden
        return embed + self.depth * (4 * h * h + mlp) + merger


@dataclass(frozen=True)
class Arch:
    """The sizes of a decoder-only transformer: all the model needs, no weights."""

    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool = False
    sliding_window: int | None = None
    sliding_layers: int = 0
    max_position: int | None = None
    rope_theta: float | None = None
    vision: VisionArch | None = None  # a vision-language model's vision tower

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params(self) -> int:
        h = self.hidden
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + bias

    @property
    def mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        """Linear weights of one block (norm weights are negligible and left out)."""
        return self.attn_params + self.mlp_params

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The lm_head's weights (shared with the embedding when tied, but read per token)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Stored parameters: a tied embedding / lm_head pair counted once."""
        head = 0 if self.tied_embeddings else self.head_params
        return self.layers * self.layer_params + self.embed_params + head

    def kv_context(self, layer: int, context: int) -> int:
        """KV positions layer ``layer`` attends over at ``context`` (a sliding window caps it)."""
        if self.sliding_window and layer < self.sliding_layers:
            return min(context, self.sliding_window)
        return context

    def kv_bytes_per_token(self, scheme: Scheme) -> float:
        """KV-cache bytes one token of context adds, all layers (K and V)."""
        return 2 * self.layers * self.kv_dim * scheme.kv_bytes

    def kv_cache_bytes(self, scheme: Scheme, context: int) -> float:
        return sum(2 * self.kv_dim * self.kv_context(i, context) * scheme.kv_bytes
                   for i in range(self.layers))

    def weight_bytes(self, scheme: Scheme) -> float:
        return self.params * scheme.weight_bytes

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> Arch:
        """From a Hugging Face ``config.json`` dict. A family of the studio's family table
        (:data:`studio.core.families.FAMILIES`) gives what the config leaves out (tied
        embeddings, attention biases) and which layers slide; another decoder is taken as
        untied, without biases, every layer sliding when the config sets a window."""
        cfg = dict(config)
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
            cfg = {**cfg, **cfg["text_config"]}
        where = f"config {name}" if name else "config"

        def need_int(*keys: str) -> int:
            for k in keys:
                v = cfg.get(k)
                if v is not None:
                    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                        raise StudioError(f"{where}: '{k}' must be a positive integer, not {v!r}")
                    if v > config_limit(k):
                        raise StudioError(f"{where}: '{k}' = {v} must be between 1 and "
                                          f"{config_limit(k)}: the config is damaged or not a "
                                          "model's")
                    return v
            raise StudioError(f"{where} has no '{keys[0]}'; give a Hugging Face config.json of "
                              f"a decoder-only transformer ({', '.join(FAMILIES)})")

        hidden = need_int("hidden_size", "n_embd", "d_model")
        layers = need_int("num_hidden_layers", "n_layer", "num_layers")
        heads = need_int("num_attention_heads", "n_head")
        kv_heads = need_int("num_key_value_heads") if cfg.get("num_key_value_heads") else heads
        head_dim = need_int("head_dim") if cfg.get("head_dim") else hidden // heads
        if not cfg.get("head_dim") and hidden % heads:
            raise StudioError(f"{where}: hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads}; add 'head_dim'")
        if heads % kv_heads:
            raise StudioError(f"{where}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
        intermediate = need_int("intermediate_size", "n_inner", "ffn_dim")
        vocab = need_int("vocab_size")
        model_type = str(cfg.get("model_type", "") or "unknown")
        family = family_of(model_type) or UNLISTED
        tied = cfg.get("tie_word_embeddings", family.tied_embeddings)
        if not isinstance(tied, bool):
            raise StudioError(f"{where}: 'tie_word_embeddings' must be true or false")
        window = cfg.get("sliding_window")
        sliding_layers = 0
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            sliding_layers = layer_types(cfg, family, layers).count(SLIDING)
        if sliding_layers == 0:
            window = None
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
        theta = cfg.get("rope_theta", rope.get("rope_theta") if rope else None)
        bias = bool(cfg.get("attention_bias", family.attention_bias))
        vc, top_type = config.get("vision_config"), str(config.get("model_type", ""))
        vision = (VisionArch.from_config(vc, top_type, where)
                  if isinstance(vc, Mapping) and top_type in VISION_FAMILIES else None)
        arch = cls(
            name=name or str(cfg.get("_name_or_path", "") or model_type),
            model_type=model_type, layers=layers, hidden=hidden, heads=heads,
            kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate, vocab=vocab,
            tied_embeddings=tied, attention_bias=bias, sliding_window=window,
            sliding_layers=min(sliding_layers, layers),
            max_position=cfg.get("max_position_embeddings"),
            rope_theta=float(theta) if isinstance(theta, int | float) else None,
            vision=vision,
        )
        total = arch.params + (vision.params if vision else 0)
        if total > MAX_PARAMS:  # sizes each within bounds, together past any model
            raise StudioError(f"{where} describes {total:.3g} parameters; at most "
                              f"{MAX_PARAMS:.0e} are estimated: the config is damaged or not "
                              "a model's")
        return arch


def load_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """A HF config dict from a ``config.json``, a checkpoint folder, or a bundled name."""
    p = Path(path)
    if not p.exists() and (CONFIGS_DIR / f"{path}.json").is_file():
        p = CONFIGS_DIR / f"{path}.json"
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise StudioError(f"{p.parent} has no config.json; give a checkpoint folder or a "
                              "config.json")
    if not p.is_file():
        bundled = ", ".join(sorted(f.stem for f in CONFIGS_DIR.glob("*.json")))
        raise StudioError(f"config {path} not found; give a config.json, a checkpoint folder, "
                          f"or a bundled name ({bundled})")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"{p} is not valid JSON ({e}); give a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise StudioError(f"{p} is not a JSON object; give a Hugging Face config.json")
    name = p.parent.name if p.name == "config.json" else p.stem
    return cfg, name


def load_arch(path: str | Path) -> Arch:
    cfg, name = load_config(path)
    return Arch.from_config(cfg, name)
