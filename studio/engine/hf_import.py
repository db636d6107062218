"""Import of local Hugging Face checkpoint folders into a :class:`ModelInfo`.

Supported: decoder-only causal LMs of the families of :data:`studio.core.families.FAMILIES`
(the static-KV exporter's families: their architecture names, required config keys, block
module names, tied-embedding default and sliding layers come from there). The importer reads
``config.json`` and the *headers* of the safetensors files (tensor names, dtypes, shapes):
parameter counts are exact and no weight is loaded. Checkpoints that only have
``pytorch_model.bin`` fall back to torch (memory-mapped, weights only). Both generations of config keys are read: ``rope_parameters`` / ``dtype`` /
``layer_types`` (transformers 5) and ``rope_theta`` / ``rope_scaling`` / ``torch_dtype`` /
``use_sliding_window`` + ``max_window_layers`` (published checkpoints).

Like every format importer: ``match(path)`` says whether this importer claims a path,
``open_checkpoint(path)`` returns the model description or raises a one-line
:class:`StudioError`.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from studio.core import families
from studio.core.errors import StudioError
from studio.core.families import SLIDING, Family
from studio.core.fsutil import check_nesting, read_input
from studio.core.lazyimport import lazy_module
from studio.core.modelinfo import LayerInfo, ModelInfo

torch = lazy_module("torch")

_EXPECTED = (
    "a Hugging Face checkpoint folder with config.json and weights "
    "(model.safetensors, sharded model-*.safetensors with model.safetensors.index.json, "
    "or pytorch_model.bin)"
)

_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

_BLOCK_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def match(path: str | Path) -> bool:
    """True when ``path`` is a folder that holds a ``config.json`` (this importer's input)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def open_checkpoint(path: str | Path) -> ModelInfo:
    """Describe the checkpoint folder at ``path`` without loading its weights."""
    folder = Path(path).expanduser()
    if not folder.exists():
        raise StudioError(f"no such folder: {folder}; expected {_EXPECTED}")
    if not folder.is_dir():
        raise StudioError(f"{folder} is a file; expected {_EXPECTED}")
    if not (folder / "config.json").is_file():
        raise StudioError(
            f"{folder} is not a Hugging Face checkpoint (no config.json); expected {_EXPECTED}"
        )
    config = _read_config(folder)
    architecture, family = _architecture(config, folder)
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        raise StudioError(
            f"{folder} holds a pre-quantized checkpoint ({method}); import the floating-point "
            "checkpoint and let the studio quantize it"
        )
    tensors = _tensor_shapes(folder)
    return _describe(folder, config, architecture, family, tensors)


# -- config --------------------------------------------------------------------------------


#: the largest config.json / weights index read
MAX_CONFIG_BYTES = 64 << 20


def _read_config(folder: Path) -> dict[str, Any]:
    raw = read_input(folder / "config.json", MAX_CONFIG_BYTES, "config.json")
    try:
        config = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise StudioError(
            f"config.json in {folder} is not valid JSON (line {exc.lineno}: {exc.msg})"
        ) from None
    except (RecursionError, UnicodeDecodeError) as exc:
        raise StudioError(f"cannot read config.json in {folder}: "
                          f"{'nested too deeply' if isinstance(exc, RecursionError) else exc}"
                          ) from None
    check_nesting(config, f"config.json in {folder}")
    if not isinstance(config, dict):
        raise StudioError(f"config.json in {folder} is not a JSON object")
    return config


def _architecture(config: dict[str, Any], folder: Path) -> tuple[str, Family]:
    model_type = str(config.get("model_type", "?"))
    archs = config.get("architectures") or []
    if archs:
        architecture = str(archs[0])
    else:  # older configs: infer from the model type
        by_type = families.family_of(model_type)
        architecture = by_type.architectures[0] if by_type else f"? (model_type {model_type})"
    family = families.family_of_architecture(architecture)
    if family is None or family.model_type != model_type:
        supported = ", ".join(families.architectures())
        raise StudioError(
            f"unsupported architecture {architecture} (model_type {model_type}) in {folder}; "
            f"supported: {supported} (the {families.labels()} families)"
        )
    return architecture, family


def _need_int(config: dict[str, Any], key: str, folder: Path, required: bool = True
              ) -> int | None:
    """``config[key]``, a whole number from 1 to its limit
    (:func:`studio.core.families.config_limit`), or one line (None when it is left out and
    not ``required``)."""
    value = config.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise StudioError(f"config.json in {folder} lacks an integer {key!r}")
    high = families.config_limit(key)
    if not 1 <= value <= high:
        raise StudioError(f"config.json in {folder}: {key} = {value} must be between 1 and "
                          f"{high}: the config is damaged or not a model's")
    return value


def _config_int(config: dict[str, Any], key: str, folder: Path) -> int:
    """``config[key]``, which must be there: a whole number from 1 to its limit, or one
    line."""
    value = _need_int(config, key, folder)
    if value is None:  # never: required
        raise StudioError(f"config.json in {folder} lacks an integer {key!r}")
    return value


# -- weights -------------------------------------------------------------------------------

Tensors = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype name)


def _tensor_shapes(folder: Path) -> Tensors:
    files = safetensors_files(folder)
    if files:
        tensors: Tensors = {}
        for f in files:
            tensors.update(_safetensors_header(f))
        return tensors
    bins = _torch_files(folder)
    if bins:
        return _torch_shapes(bins)
    raise StudioError(f"{folder} has a config.json but no model weights; expected {_EXPECTED}")


def _indexed_files(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` names; every one must exist."""
    raw = read_input(index, MAX_CONFIG_BYTES, "the weights index")
    try:
        weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise StudioError(f"{index} is not a valid weights index") from None
    if not all(isinstance(n, str) and n and "/" not in n and n not in (".", "..")
               for n in names):
        raise StudioError(f"{index} names weight shards that are not file names beside it")
    files = [index.parent / name for name in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise StudioError(f"{index.parent} lacks weight shards named in its index: {missing}")
    return files


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return _indexed_files(index)
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    return sorted(folder.glob("model-*.safetensors")) or sorted(
        f for f in folder.glob("*.safetensors") if not f.name.startswith("adapter_")
    )


#: bytes per element of each safetensors dtype
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
             "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100_000_000


def safetensors_layout(path: Path) -> tuple[dict[str, Any], int, int]:
    """(the tensors of a safetensors header: name -> dtype, shape, offsets; the header's
    length; the end of the data it describes), the header checked against itself: every dtype
    known, every shape whole numbers, each tensor's offsets spanning exactly its elements'
    bytes, the tensors tiling the data without gaps or overlaps. Any other header is a
    one-line error naming the tensor (a dtype of I64 over F32 data, say, spans twice the
    bytes). Whether the file holds the bytes is :func:`studio.engine.checkpoint_check`'s."""
    bad = f"{path} is not a readable safetensors file"
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise ValueError("file too short")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise ValueError("implausible header length")
            header = json.loads(fh.read(length))
    except (OSError, ValueError, RecursionError) as exc:
        raise StudioError(f"{bad} ({exc})") from None
    if not isinstance(header, dict):
        raise StudioError(f"{bad} (its header is not a table of tensors)")
    tensors: dict[str, Any] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name[:80]!r}"
        if not isinstance(meta, dict):
            raise StudioError(f"{where} has no dtype, shape and offsets in the header")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dtype not in _ITEMSIZE:
            raise StudioError(f"{where} has an unknown dtype {str(dtype)[:20]!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise StudioError(f"{where} has a shape that is not a list of whole numbers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise StudioError(f"{where} has data offsets that are not [begin, end]")
        numel = 1
        for d in shape:
            numel *= d
        need = numel * _ITEMSIZE[dtype]
        if offsets[1] - offsets[0] != need:
            raise StudioError(
                f"{where}: {dtype} x {shape} is {need:,} bytes but its offsets span "
                f"{offsets[1] - offsets[0]:,}: the header does not describe the data (a wrong "
                "dtype or shape)")
        tensors[name] = {"dtype": dtype, "shape": tuple(shape), "offsets": tuple(offsets)}
    pos = 0
    for name, t in sorted(tensors.items(), key=lambda kv: kv[1]["offsets"]):
        begin, end_ = t["offsets"]
        if begin != pos:
            raise StudioError(f"{path}: tensor {name[:80]!r} starts at byte {begin:,} of the "
                              f"data, not {pos:,}: the tensors "
                              f"{'overlap' if begin < pos else 'leave a gap'}")
        pos = end_
    return tensors, length, pos


def _safetensors_header(path: Path) -> Tensors:
    """Names, shapes and dtypes from a safetensors header (8-byte length + JSON), checked
    (:func:`safetensors_layout`)."""
    tensors, _length, _end = safetensors_layout(path)
    return {name: (t["shape"], _SAFETENSORS_DTYPES.get(t["dtype"], t["dtype"].lower()))
            for name, t in tensors.items()}


def _torch_files(folder: Path) -> list[Path]:
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        return _indexed_files(index)
    single = folder / "pytorch_model.bin"
    return [single] if single.is_file() else []


def _torch_shapes(files: list[Path]) -> Tensors:
    out: Tensors = {}
    for f in files:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # corrupt or not a torch file
            raise StudioError(f"cannot read torch weights {f}: {exc}") from None
        for name, t in state.items():
            out[name] = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
    return out


# -- description ---------------------------------------------------------------------------


def _kind(module: str, family: Family) -> str:
    leaf = module.rsplit(".", 1)[-1]
    if family.vision and module.startswith(("visual.", "model.visual.")):
        return "vision"  # the vision tower of a vision-language model
    if "embed_tokens" in module:
        return "embedding"
    if leaf == "lm_head":
        return "lm_head"
    if _block(module) is not None:
        kind = dict(family.block).get(leaf)
        if kind is not None:
            return kind
    if "norm" in leaf:
        return "norm"
    if ".self_attn." in f".{module}." or ".attn." in f".{module}.":
        return "attention"
    if ".mlp." in f".{module}.":
        return "mlp"
    return "other"


def _block(module: str) -> int | None:
    m = _BLOCK_RE.search(module + ".")
    return int(m.group(1)) if m else None


def _order(layer: LayerInfo, family: Family) -> tuple:
    """Embedding, then each block's modules in the family's data-flow order, the final
    norm, the head, anything else."""
    if layer.kind == "embedding":
        return (0, 0, 0, layer.name)
    if layer.block is not None:
        leaf = layer.name.rsplit(".", 1)[-1]
        flow = [name for name, _kind in family.block]
        return (1, layer.block, flow.index(leaf) if leaf in flow else 99, layer.name)
    if layer.kind == "norm":
        return (2, 0, 0, layer.name)
    if layer.kind == "lm_head":
        return (3, 0, 0, layer.name)
    return (4, 0, 0, layer.name)


def _describe(
    folder: Path, config: dict[str, Any], architecture: str, family: Family, tensors: Tensors
) -> ModelInfo:
    config = families.text_config(config, family)  # a VL model's language model's sizes
    sizes = {key: _config_int(config, key, folder) for key in family.config_keys}
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    num_layers, vocab = sizes["num_hidden_layers"], sizes["vocab_size"]
    kv_heads, head_dim = _attention_heads(config, folder, hidden, heads)
    layers, tied = _layer_table(folder, config, family, tensors)
    blocks = {lay.block for lay in layers if lay.block is not None}
    if len(blocks) != num_layers:
        raise StudioError(
            f"{folder}: config.json says {num_layers} layers but the weights hold "
            f"{len(blocks)} transformer blocks"
        )

    types = families.layer_types(config, family, num_layers)
    window = config.get("sliding_window") if SLIDING in types else None
    dtypes = Counter(dtype for _shape, dtype in tensors.values())
    dtype = dtypes.most_common(1)[0][0] if dtypes else None
    dtype = dtype or config.get("dtype") or config.get("torch_dtype")

    return ModelInfo(
        source=str(folder.resolve()),
        format="hf",
        architecture=architecture,
        family=family.model_type,
        num_layers=num_layers,
        hidden_size=hidden,
        intermediate_size=int(config.get("intermediate_size") or 0),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab_size=vocab,
        tied_embeddings=tied,
        max_positions=int(config.get("max_position_embeddings") or 0),
        parameters=sum(lay.params for lay in layers),
        layers=layers,
        dtype=dtype,
        sliding_window=int(window) if window else None,
        rope_theta=rope_theta(config),
    )


def _attention_heads(config: dict[str, Any], folder: Path, hidden: int, heads: int
                     ) -> tuple[int, int]:
    """The KV heads and the head dimension, checked against the attention heads."""
    kv_heads = _need_int(config, "num_key_value_heads", folder, required=False) or heads
    head_dim = _need_int(config, "head_dim", folder, required=False)
    if head_dim is None:
        if hidden % heads:
            raise StudioError(f"config.json in {folder}: hidden_size {hidden} is not a "
                              f"multiple of num_attention_heads {heads} (and no head_dim)")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise StudioError(f"config.json in {folder}: num_attention_heads {heads} is not a "
                          f"multiple of num_key_value_heads {kv_heads}")
    return kv_heads, head_dim


def _layer_table(folder: Path, config: dict[str, Any], family: Family, tensors: Tensors
                 ) -> tuple[list[LayerInfo], bool]:
    """A row per module of the weights (its parameters and shapes) in the model's order,
    the head as the embedding's where they are tied; and whether they are."""
    # Group tensors by module: "model.layers.0.self_attn.q_proj.weight" -> (module, "weight").
    modules: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, (shape, _dtype) in tensors.items():
        module, _, leaf = name.rpartition(".")
        modules.setdefault(module or name, {})[leaf] = shape

    embed = next((m for m in modules if _kind(m, family) == "embedding"), None)
    if embed is None:
        raise StudioError(f"{folder}: the weights have no token embedding (embed_tokens)")
    has_head = "lm_head" in modules
    # A checkpoint saved with tied embeddings stores the embedding only; one that stores
    # both but says they are tied (or whose family ties them when the config does not say)
    # is loaded tied by transformers (the head is ignored).
    tie_flag = config.get("tie_word_embeddings")
    if not has_head and tie_flag is False:
        raise StudioError(
            f"{folder}: config.json says the head is not tied to the embedding, "
            "but the weights have no lm_head.weight"
        )
    tied = (not has_head) or bool(family.tied_embeddings if tie_flag is None else tie_flag)

    layers: list[LayerInfo] = []
    for module, shapes in modules.items():
        kind = _kind(module, family)
        if kind == "lm_head" and tied:
            continue
        params = 0
        for shape in shapes.values():
            n = 1
            for d in shape:
                n *= d
            params += n
        layers.append(LayerInfo(module, _block(module), kind, params, dict(shapes)))
    if tied:
        layers.append(LayerInfo("lm_head", None, "lm_head", 0, dict(modules[embed]), tied_to=embed))
    layers.sort(key=lambda lay: _order(lay, family))
    return layers, tied


def rope_theta(config: dict[str, Any]) -> float | None:
    """RoPE base: ``rope_parameters.rope_theta`` (transformers 5) or ``rope_theta``."""
    params = config.get("rope_parameters")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    if theta is None:
        theta = config.get("rope_theta")
    return float(theta) if theta is not None else None
