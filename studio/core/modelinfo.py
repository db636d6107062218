"""The studio's description of a model: one shape for every format (HF, ONNX, ...).

Importers in :mod:`studio.engine` fill a :class:`ModelInfo`; views, analyses and recipes
read it. Pure data: no torch, no transformers, no files.

Sizes follow the seed articles:

* weight bytes = parameters × bytes per parameter of the precision (a tied embedding /
  ``lm_head`` pair is one tensor, counted once);
* KV cache bytes = 2 (K and V) × layers × KV heads × head dim × context × bytes per
  element × batch. Grouped-query attention enters through the KV heads, an INT8 cache
  through ``bytes_per_elem=1``, a sliding window by capping the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from studio.core.errors import StudioError

#: Bytes per stored parameter for each weight precision the studio knows.
BYTES_PER_PARAM: dict[str, float] = {
    "FP32": 4.0,
    "FP16": 2.0,
    "BF16": 2.0,
    "INT16": 2.0,
    "INT8": 1.0,
    "INT4": 0.5,
}

#: Layer kinds an importer may report.
LAYER_KINDS = ("embedding", "attention", "mlp", "norm", "lm_head", "vision", "other")

FORMATS = ("hf", "onnx")


def bytes_per_param(precision: str) -> float:
    """Bytes per parameter of ``precision`` (``"FP32"``, ``"fp16"``, ``"INT4"`` ...)."""
    key = str(precision).strip().upper()
    try:
        return BYTES_PER_PARAM[key]
    except KeyError:
        known = ", ".join(BYTES_PER_PARAM)
        raise StudioError(f"unknown precision {precision!r}; known: {known}") from None


@dataclass
class LayerInfo:
    """One layer (a module with weights) of a model.

    ``name`` is the module path (``model.layers.0.self_attn.q_proj``), ``block`` the index
    of the transformer block it sits in (``None`` for the embedding, the final norm and
    the head), ``params`` the number of parameters it stores, ``shapes`` the shape of each
    of its tensors (``{"weight": (256, 256), "bias": (256,)}``). A head that shares its
    weight with the embedding has ``tied_to`` set to the embedding's name and ``params``
    0 (the tensor is counted once, on the embedding).
    """

    name: str
    block: int | None
    kind: str
    params: int
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tied_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "block": self.block,
            "kind": self.kind,
            "params": self.params,
            "shapes": {k: list(v) for k, v in self.shapes.items()},
        }
        if self.tied_to is not None:
            d["tied_to"] = self.tied_to
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerInfo:
        return cls(
            name=str(d["name"]),
            block=None if d.get("block") is None else int(d["block"]),
            kind=str(d["kind"]),
            params=int(d["params"]),
            shapes={str(k): tuple(int(x) for x in v) for k, v in d.get("shapes", {}).items()},
            tied_to=d.get("tied_to"),
        )


@dataclass
class ModelInfo:
    """What the studio knows about a model without running it."""

    source: str
    format: str
    architecture: str
    family: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    max_positions: int
    parameters: int
    layers: list[LayerInfo] = field(default_factory=list)
    #: dtype of the stored weights (``"float32"``, ``"bfloat16"``...), when known.
    dtype: str | None = None
    #: sliding attention window of the checkpoint's own config, when it uses one.
    sliding_window: int | None = None
    rope_theta: float | None = None

    # -- sizes ---------------------------------------------------------------------------

    def weight_bytes(self, precision: str = "FP32") -> int:
        """Bytes of all weights stored at ``precision`` (tied embedding counted once)."""
        return math.ceil(self.parameters * bytes_per_param(precision))

    def weight_bytes_by_precision(self) -> dict[str, int]:
        return {p: self.weight_bytes(p) for p in ("FP32", "FP16", "INT8", "INT4")}

    def kv_cache_bytes(
        self,
        context_len: int,
        bytes_per_elem: float = 2,
        window: int | None = None,
        batch: int = 1,
    ) -> int:
        """Bytes of the K and V caches for ``context_len`` tokens.

        2 × layers × KV heads × head dim × min(context, window) × bytes × batch.
        """
        if context_len < 0 or batch < 1 or bytes_per_elem <= 0:
            raise StudioError(
                f"KV cache size needs context >= 0, batch >= 1 and bytes per element > 0 "
                f"(got context {context_len}, batch {batch}, bytes {bytes_per_elem})"
            )
        if window is not None and window < 1:
            raise StudioError(f"a sliding window must be at least 1 token (got {window})")
        tokens = context_len if window is None else min(context_len, window)
        per_token = 2 * self.num_layers * self.num_kv_heads * self.head_dim
        return math.ceil(per_token * tokens * bytes_per_elem * batch)

    @property
    def gqa_group(self) -> int:
        """Query heads sharing one KV head (1 = plain multi-head attention)."""
        return self.num_heads // max(1, self.num_kv_heads)

    # -- layers --------------------------------------------------------------------------

    def layer(self, name: str) -> LayerInfo:
        for lay in self.layers:
            if lay.name == name:
                return lay
        raise StudioError(f"no layer named {name!r} in {self.source}")

    def block_layers(self, block: int) -> list[LayerInfo]:
        return [lay for lay in self.layers if lay.block == block]

    def params_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lay in self.layers:
            out[lay.kind] = out.get(lay.kind, 0) + lay.params
        return out

    # -- serialisation -------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.format,
            "architecture": self.architecture,
            "family": self.family,
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "tied_embeddings": self.tied_embeddings,
            "max_positions": self.max_positions,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "sliding_window": self.sliding_window,
            "rope_theta": self.rope_theta,
            "layers": [lay.to_dict() for lay in self.layers],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelInfo:
        def opt_int(key: str) -> int | None:
            return None if d.get(key) is None else int(d[key])

        return cls(
            source=str(d["source"]),
            format=str(d["format"]),
            architecture=str(d["architecture"]),
            family=str(d["family"]),
            num_layers=int(d["num_layers"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_heads=int(d["num_heads"]),
            num_kv_heads=int(d["num_kv_heads"]),
            head_dim=int(d["head_dim"]),
            vocab_size=int(d["vocab_size"]),
            tied_embeddings=bool(d["tied_embeddings"]),
            max_positions=int(d["max_positions"]),
            parameters=int(d["parameters"]),
            layers=[LayerInfo.from_dict(x) for x in d.get("layers", [])],
            dtype=d.get("dtype"),
            sliding_window=opt_int("sliding_window"),
            rope_theta=None if d.get("rope_theta") is None else float(d["rope_theta"]),
        )
