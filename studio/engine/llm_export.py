"""FP32 ONNX export of a Hugging Face causal LM with a static KV cache.

Two static-shape graphs are written, both built from the checkpoint's own modules
(embedding, decoder layers, final norm, LM head) so the numerics are those of
``transformers``:

``prefill.onnx``
    ``input_ids`` int64 [1,P], ``position_ids`` int64 [1,P], ``attention_mask`` float32
    additive [1,1,P,P] -> ``logits`` [1,P,V], ``present_key_{i}`` / ``present_value_{i}``
    [1,KV,P,D].
``decode.onnx``
    ``input_ids`` [1,1], ``position_ids`` [1,1], ``attention_mask`` [1,1,1,C+1] (C cache
    slots, then the new token), ``past_key_{i}`` / ``past_value_{i}`` [1,KV,C,D] ->
    ``logits`` [1,1,V], ``present_key_{i}`` / ``present_value_{i}`` [1,KV,1,D]: only the
    new row; the host writes it into slot ``pos`` of its cache.

Sliding windows W shorter than C (Mistral, Phi-3, Gemma 2's alternating layers, Qwen with
``use_sliding_window``) are masks built by the host (``llm_runtime.prefill_mask`` /
``decode_mask``): when every layer slides, ``attention_mask`` is windowed; when only some
do, both graphs take one more input, ``sliding_attention_mask`` (same shape as
``attention_mask``), read by the layers whose type is ``sliding_attention``
(``llm_runtime.mask_windows``). ``graph.json`` records ``layer_types`` (one per layer) and
``sliding_window``.

What a family needs beyond the shared wrapper is declared once, in the family table
:data:`studio.core.families.FAMILIES`: which layers slide, the final logit soft-capping and
the embedding scale (Gemma 2), and which wrapper of :data:`WRAPPERS` builds its graphs.
Attention soft-capping, q/k norms, fused qkv / gate-up projections and pre/post norms live
in the checkpoint's own modules, which the graphs reuse.

After the export the graphs are checked over the whole context against the checkpoint in
transformers (see :func:`check_export`).

RoPE is applied from ``position_ids`` through a cos/sin table of ``rope_positions`` rows
(up to 4 x C, see :func:`rope_positions`: a ring-buffer cache runs past C) (``rope_cos`` /
``rope_sin`` initializers, computed by the checkpoint's rotary module) gathered per
position: no Sin/Cos on quantized angles, which 8-bit activations would ruin. GQA heads
are repeated inside the graph (the HF eager attention). The additive mask uses a finite
``mask_value`` (-100 by default, recorded in graph.json): exact in FP32 and kind to
quantization, where a -1e9 mask would swamp the attention scores' range.

MatMul weights get their HF parameter names (``model.layers.0.mlp.up_proj.weight``, stored
transposed [in, out]) so quantization overrides can name them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from studio.core import families
from studio.core.errors import StudioError
from studio.core.families import FAMILIES, FULL, SLIDING, Family
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.parts import Part, whole
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.engine.export_check import check_export
from studio.engine.llm_runtime import DEFAULT_MASK_VALUE, SLIDING_MASK, mask_windows
from studio.engine.onnxio import (
    IMAGE_EMBEDS,
    SPEC_FORMAT,
    save_onnx_atomic,
    weight_bytes,
    weight_free,
)
from studio.engine.torch_onnx import HEAD_INPUT, initializers_kept, write_initializers
from studio.engine.weightstore import WeightStore, shared_store

OPSET = 17
#: new tokens per pass of the verify graph: the last token plus up to 4 drafted ones
DEFAULT_VERIFY_LENGTH = 5
REFERENCE_TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
)


# ---------------------------------------------------------------------------- spec helpers


def io_names(num_layers: int, graph: str, sliding: bool = False,
             part: Part | None = None, vision: bool = False) -> tuple[list[str], list[str]]:
    """Input and output names of the ``prefill``, ``decode`` or ``verify`` graph
    (``sliding``: the graphs take a ``sliding_attention_mask`` too). ``verify`` is the
    decode graph for N new tokens at once (an AR-N graph over the static cache).

    ``part``: the graph of one part (:mod:`studio.core.parts`): a part after the first takes
    the previous part's residual stream instead of the ids, a part before the last hands
    its own on instead of the logits, and each carries the KV cache of its own blocks.

    ``vision``: a vision-language model's prefill graph takes ``image_embeds`` [1, P, hidden]
    too (the encoder's rows at the image tokens' places) and ``position_ids`` [3, 1, P] (the
    multimodal positions); its other graphs are a text model's."""
    part = part or whole(num_layers)
    ins = ["input_ids" if part.embeds else str(part.hidden_in), "position_ids", "attention_mask"]
    if sliding:
        ins.append(SLIDING_MASK)
    if vision and graph == "prefill":
        ins.append(IMAGE_EMBEDS)
    if graph in ("decode", "verify"):
        for i in part.layers:
            ins += [f"past_key_{i}", f"past_value_{i}"]
    outs = ["logits" if part.heads else str(part.hidden_out)]
    for i in part.layers:
        outs += [f"present_key_{i}", f"present_value_{i}"]
    return ins, outs


# ---------------------------------------------------------------------------- checkpoint


def _check_checkpoint(checkpoint_dir: Path) -> dict:
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
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = _check_checkpoint(checkpoint_dir)
    vision = FAMILIES[cfg["model_type"]].vision
    try:
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(
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


def _special_ids(model) -> tuple[list[int], int | None]:
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


def _reference_ids(checkpoint_dir: Path, length: int, vocab: int) -> list[int]:
    ids: list[int] = []
    tok_dir = _tokenizer_dir(checkpoint_dir)
    if tok_dir is not None:
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
            text = REFERENCE_TEXT * (8 + length // 16)
            ids = [i for i in tok.encode(text, add_special_tokens=False).ids if i < vocab]
        except Exception:  # noqa: BLE001 - a tokenizer we cannot read: fall back to fixed ids
            ids = []
    if len(ids) < length:
        ids = ids + [(7 * k + 3) % vocab for k in range(length - len(ids))]
    return ids[:length]


# ---------------------------------------------------------------------------- the wrapper


def layer_types_of(config, family: Family) -> list[str]:
    """One attention type per layer (``full_attention`` / ``sliding_attention``) of a loaded
    transformers config, by the family table's rule (:func:`studio.core.families.layer_types`;
    the config class has already derived ``layer_types`` from ``use_sliding_window`` /
    ``max_window_layers`` where the family has them). A sliding layer without a window is a
    full one; a ``layer_types`` list that does not fit the layers is refused."""
    n = int(config.num_hidden_layers)
    given = getattr(config, "layer_types", None)
    if family.reads_layer_types and getattr(config, "sliding_window", None) is not None and (
        given is not None and len(given) != n
    ):
        raise StudioError(
            f"config.json lists {len(given)} layer_types for {n} layers; "
            "fix the checkpoint's config"
        )
    types = families.layer_types(config.to_dict(), family, n)
    unknown = sorted(set(types) - {FULL, SLIDING})
    if unknown:
        raise StudioError(
            f"layer types {unknown} are not supported by the static-KV exporter "
            f"(only {FULL} and {SLIDING})"
        )
    return types


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(params, dict):
        return str(params.get("rope_type") or params.get("type") or "default")
    return "default"


def _check_rope(config, context_len: int) -> str:
    """Refuse RoPE variants a fixed cos/sin table of C rows cannot reproduce.

    The table is the checkpoint's rotary module run once over positions 0..C-1. RoPE types
    that change their frequencies with the sequence length seen so far do so only past a
    limit: ``dynamic`` past ``max_position_embeddings`` (C never exceeds it), ``longrope``
    past ``original_max_position_embeddings`` (then transformers uses its short factors for
    the first tokens of a generation and its long ones later, which one table cannot).
    """
    rope = _rope_type(config)
    if rope == "longrope":
        params = getattr(config, "rope_parameters", None) or {}
        original = params.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if original is not None and context_len > int(original):
            raise StudioError(
                f"longrope switches from its short to its long factors past "
                f"original_max_position_embeddings={original} tokens, which a fixed table "
                f"cannot follow; choose a context length C <= {original}"
            )
    return rope


#: How far past the C cache slots the RoPE table reaches: generation with a sliding window
#: (a ring buffer over the C slots) can place tokens at positions up to this many contexts.
ROPE_CONTEXTS = 4


def rope_positions(config, context_len: int) -> int:
    """Rows of the RoPE table: ``ROPE_CONTEXTS`` x C, never past ``max_position_embeddings``
    (nor a longrope's ``original_max_position_embeddings``, where its factors switch)."""
    rows = ROPE_CONTEXTS * int(context_len)
    limits = [getattr(config, "max_position_embeddings", None)]
    if _rope_type(config) == "longrope":
        params = getattr(config, "rope_parameters", None) or {}
        limits.append(params.get("original_max_position_embeddings")
                      or getattr(config, "original_max_position_embeddings", None))
    for lim in limits:
        if lim:
            rows = min(rows, int(lim))
    return max(rows, int(context_len))


def _decoder_wrapper(
    causal_lm, context_len: int, family: Family, layer_types: list[str], sliding_input: bool,
    rope_rows: int | None = None, part: Part | None = None, rotary=None,
):
    """A static-shape module over the HF modules of a Llama-style decoder (``model``'s
    ``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``, then ``lm_head``); its forward
    matches io_names().

    ``layer_types`` says which mask each layer reads: with ``sliding_input`` the layers of
    type ``sliding_attention`` read the extra ``sliding_attention_mask`` input.

    ``part``: only blocks ``part.start .. part.stop - 1`` (see :mod:`studio.core.parts`), the
    embedding when the part is the first and the norm and head when it is the last; the
    other modules of ``causal_lm`` are never touched (a streamed export leaves them on the
    meta device). ``rotary``: the rotary embedding module to build the RoPE table from
    (default ``causal_lm.model.rotary_emb``).
    """
    import inspect
    import math

    import torch

    class _StepCache:
        """The part of the HF Cache protocol the attention uses: update()."""

        def __init__(self, past):
            self.past = past  # {layer index: (key, value)} or None
            self.new: dict[int, tuple] = {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.new[layer_idx] = (key_states, value_states)
            if self.past is None:
                return key_states, value_states
            pk, pv = self.past[layer_idx]
            return torch.cat([pk, key_states], dim=2), torch.cat([pv, value_states], dim=2)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            if self.past is None:
                return 0
            key = self.past.get(layer_idx) or next(iter(self.past.values()))
            return int(key[0].shape[2])

    base = causal_lm.model
    config = causal_lm.config
    part = part or whole(len(base.layers))
    params = inspect.signature(base.layers[part.start].forward).parameters
    cache_kw = next(
        (k for k in ("cache", "past_key_values", "past_key_value") if k in params), None
    )
    if cache_kw is None:
        raise StudioError(
            "this transformers version's decoder layer takes no cache argument; use transformers 5.x"
        )
    # Family differences outside the decoder layers (see Family).
    embed_scale = None
    if part.embeds and family.embed_scale and not hasattr(base.embed_tokens, "embed_scale"):
        embed_scale = math.sqrt(int(config.hidden_size))
    final_cap = getattr(config, family.final_softcap, None) if family.final_softcap else None
    uses_window = [sliding_input and t == SLIDING for t in layer_types]
    layers = list(part.layers)
    # the multimodal rotary embedding (Qwen2-VL): head-dim columns taken from the temporal,
    # height or width position, section by section
    mrope = getattr(rotary or base.rotary_emb, "mrope_section", None) if family.vision else None
    image_token = getattr(getattr(causal_lm, "full", None), "config", None)
    image_token = getattr(image_token, "image_token_id", None)

    class _Holder(torch.nn.Module):
        """Holds the part's modules under the checkpoint's own names (``model.layers.5``):
        earlier blocks are parameterless placeholders, so indices stay absolute."""

    class StaticKVWrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = _Holder()
            self.model.layers = torch.nn.ModuleList(
                [base.layers[i] if i >= part.start else torch.nn.Identity()
                 for i in range(part.stop)])
            if part.embeds:
                self.model.embed_tokens = base.embed_tokens
            if part.heads:
                self.model.norm = base.norm
                self.lm_head = causal_lm.lm_head
            with torch.no_grad():
                rows = int(rope_rows or context_len)
                pos = torch.arange(rows, dtype=torch.long)[None]
                probe = torch.zeros(1, rows, 1, dtype=torch.float32)
                cos, sin = (rotary or base.rotary_emb)(probe, pos)
            # persistent: exported as initializers named rope_cos / rope_sin
            self.register_buffer("rope_cos", cos[0].to(torch.float32).clone())
            self.register_buffer("rope_sin", sin[0].to(torch.float32).clone())
            if mrope:
                half = int(self.rope_cos.shape[-1]) // 2
                axis = [k % 3 for k, n in enumerate(mrope) for _ in range(int(n))]
                if len(axis) != half:
                    raise StudioError(f"the mrope_section {list(mrope)} covers {len(axis)} "
                                      f"of the {half} rotary frequencies; fix config.json")
                sel = torch.zeros(3, 1, 1, 2 * half)
                for j, a in enumerate(axis):
                    sel[a, 0, 0, j] = sel[a, 0, 0, j + half] = 1.0
                self.register_buffer("mrope_select", sel, persistent=False)
            self.emit_hidden = False  # the last part returns its norm's output (export check)
            # the modules whose weight the trailing inputs stand for while tracing (see
            # _traced_weights)
            self.weight_inputs: list[Any] = []

        def forward(self, first, position_ids, attention_mask, *rest):
            if self.weight_inputs:
                n = len(self.weight_inputs)
                with _weights_from(self.weight_inputs, rest[-n:]):
                    return self._forward(first, position_ids, attention_mask, *rest[:-n])
            return self._forward(first, position_ids, attention_mask, *rest)

        def _forward(self, first, position_ids, attention_mask, *rest):
            window_mask = rest[0] if sliding_input else None
            past_flat = rest[1:] if sliding_input else rest
            image = None
            if position_ids.dim() == 3:  # a VL prefill: its image rows come next
                image, past_flat = past_flat[0], past_flat[1:]
            if part.embeds:
                h = self.model.embed_tokens(first)
                if embed_scale is not None:
                    h = h * torch.tensor(embed_scale, dtype=h.dtype)
                if image is not None:  # the image tokens take the encoder's rows
                    h = torch.where((first == int(image_token)).unsqueeze(-1), image, h)
            else:
                h = first
            cos = torch.nn.functional.embedding(position_ids, self.rope_cos)
            sin = torch.nn.functional.embedding(position_ids, self.rope_sin)
            if position_ids.dim() == 3:  # [3, 1, S, D]: each column from its own row
                cos = (cos * self.mrope_select).sum(0)
                sin = (sin * self.mrope_select).sum(0)
            past = None
            if past_flat:
                past = {i: (past_flat[2 * j], past_flat[2 * j + 1])
                        for j, i in enumerate(layers)}
            cache = _StepCache(past)
            for i in layers:
                out = self.model.layers[i](
                    h,
                    attention_mask=window_mask if uses_window[i] else attention_mask,
                    position_ids=position_ids if position_ids.dim() == 2 else position_ids[0],
                    position_embeddings=(cos, sin),
                    use_cache=True,
                    **{cache_kw: cache},
                )
                h = out[0] if isinstance(out, tuple) else out
            if part.heads:
                h = self.model.norm(h)
            if part.heads and not self.emit_hidden:
                h = self.lm_head(h)
                if final_cap is not None:
                    h = torch.tanh(h / final_cap) * final_cap
            outs = [h]
            for i in layers:
                outs += list(cache.new[i])
            return tuple(outs)

    wrapper = StaticKVWrapper()
    wrapper.eval()
    return wrapper


@contextlib.contextmanager
def _weights_from(modules: list[Any], tensors) -> Iterator[None]:
    """Each module's ``weight`` is the matching tensor (a traced graph input) for the block."""
    kept = [m._parameters["weight"] for m in modules]
    try:
        for m, t in zip(modules, tensors, strict=True):
            m._parameters["weight"] = t
        yield
    finally:
        for m, w in zip(modules, kept, strict=True):
            m._parameters["weight"] = w




def _traced_weights(wrapper, part: Part) -> list[tuple[Any, str, Any]]:
    """The embedding table and the output head: the largest weights, traced as graph inputs
    (then made initializers) rather than as parameters. The exporter's shape inference and
    constant folding copy a parameter-fed node's weight two and one more times (measured on
    an 8 B model's 128 k x 4096 head, 2 GiB: 6 GiB more while a graph is traced); a graph
    input is not copied. (module, input name, tensor) each."""
    import torch

    out = []
    base = getattr(wrapper, "model", None)
    emb = getattr(base, "embed_tokens", None) if part.embeds else None
    if isinstance(emb, torch.nn.Embedding) and emb.weight.device.type != "meta":
        out.append((emb, "model.embed_tokens.weight", emb.weight))
    head = getattr(wrapper, "lm_head", None) if part.heads else None
    if (isinstance(head, torch.nn.Linear) and head.bias is None
            and head.weight.device.type != "meta"):
        # a view: a tied head's tensor is the embedding's, which the tracer would take for
        # the embedding's input
        out.append((head, HEAD_INPUT, head.weight.view(head.weight.shape)))
    return out


#: The static-KV wrappers by the name a family declares (``Family.wrapper``): the torch code
#: that turns a checkpoint's modules into the prefill / decode / verify graphs. Every family
#: of the table uses ``decoder``; an architecture whose modules differ gets a wrapper here.
WRAPPERS: dict[str, Callable[..., Any]] = {"decoder": _decoder_wrapper}


def _build_wrapper(
    causal_lm, context_len: int, family: Family, layer_types: list[str], sliding_input: bool,
    rope_rows: int | None = None, part: Part | None = None, rotary=None,
):
    """The family's wrapper (:data:`WRAPPERS`) over a loaded checkpoint."""
    build = WRAPPERS.get(family.wrapper)
    if build is None:
        raise StudioError(
            f"the {family.label} family names the export wrapper {family.wrapper!r}, which "
            f"the static-KV exporter does not have (it has {', '.join(WRAPPERS)})"
        )
    return build(causal_lm, context_len, family, layer_types, sliding_input, rope_rows, part,
                 rotary)


def _example_inputs(spec: dict, graph: str, sliding: bool, part: Part | None = None):
    import torch

    L, KV, D = spec["num_layers"], spec["num_kv_heads"], spec["head_dim"]
    P, C = spec["prompt_length"], spec["context_length"]
    part = part or whole(L)
    if graph == "prefill":
        S, K = P, P
    elif graph == "verify":
        S = int(spec["verify_length"])
        K = int(spec.get("verify_cache_slots") or C) + S
    else:
        S, K = 1, C + 1
    if part.embeds:
        first = torch.zeros(1, S, dtype=torch.long)
    else:
        first = torch.zeros(1, S, int(spec["hidden_size"]), dtype=torch.float32)
    pos = torch.arange(S, dtype=torch.long)[None]
    vl = bool(spec.get("vision")) and graph == "prefill"
    if vl:
        pos = pos[None].expand(3, 1, S).contiguous()
    mask = torch.zeros(1, 1, S, K, dtype=torch.float32)
    args = [first, pos, mask]
    if sliding:
        args.append(torch.zeros(1, 1, S, K, dtype=torch.float32))
    if vl:
        args.append(torch.zeros(1, S, int(spec["hidden_size"]), dtype=torch.float32))
    if graph in ("decode", "verify"):
        args += [torch.zeros(1, KV, K - S, D, dtype=torch.float32)
                 for _ in range(2 * len(part.layers))]
    return tuple(args)


def _tidy_graph(model, module_names: set[str]) -> None:
    """Make the traced graph name things the way the checkpoint does.

    - Node and tensor names get the module path of the HF model: the tracer drops the
      wrapper's ``model`` prefix (``/layers.0/mlp/up_proj/MatMul`` becomes
      ``/model/layers.0/mlp/up_proj/MatMul``), so patterns like ``model.layers.0.*``
      work on ONNX names as on HF names.
    - Initializers the tracer shared by value (``Identity`` of another initializer,
      e.g. all-ones norm weights) become initializers of their own again, so every
      weight is an initializer under its own parameter name.
    - float32 -> float32 Casts (RMSNorm, softmax) are dropped.
    - MatMul weight initializers (``onnx::MatMul_123``) take the parameter name of their
      Linear module (``model.layers.0.mlp.up_proj.weight``, stored transposed [in, out]).
    """
    import onnx

    graph = model.graph

    # 1. module-path prefixes
    prefixes: dict[str, str] = {}
    for node in graph.node:
        parts = [p for p in node.name.split("/") if p]
        if len(parts) >= 2 and parts[0] not in module_names and f"model.{parts[0]}" in module_names:
            prefixes["/" + parts[0] + "/"] = "/model/" + parts[0] + "/"

    def fix(name: str) -> str:
        for old, new in prefixes.items():
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    if prefixes:
        for node in graph.node:
            node.name = fix(node.name)
            for k, name in enumerate(node.input):
                node.input[k] = fix(name)
            for k, name in enumerate(node.output):
                node.output[k] = fix(name)
        for vi in graph.value_info:
            vi.name = fix(vi.name)

    for node in graph.node:
        if node.op_type == "Gather" and node.input[0] in ("rope_cos", "rope_sin"):
            node.name = f"/rope/Gather_{node.input[0][5:]}"

    # 2. Identity(initializer) -> a copy of the initializer
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    keep = []
    for node in graph.node:
        if (
            node.op_type == "Identity"
            and node.input[0] in inits
            and node.output[0] not in outputs
            and node.output[0] not in inits
        ):
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[node.input[0]])
            copy.name = node.output[0]
            graph.initializer.append(copy)
            inits[copy.name] = copy
        else:
            keep.append(node)
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)

    # 3. no-op Casts (float32 -> float32 around RMSNorm and softmax) go
    typed = onnx.shape_inference.infer_shapes(weight_free(model))
    elem = {
        v.name: v.type.tensor_type.elem_type for v in (*typed.graph.value_info, *typed.graph.input)
    }
    bypass: dict[str, str] = {}
    keep = []
    for node in graph.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        src = bypass.get(node.input[0], node.input[0]) if node.input else ""
        if (
            node.op_type == "Cast"
            and to is not None
            and elem.get(src) == to
            and node.output[0] not in outputs
        ):
            bypass[node.output[0]] = src
        else:
            keep.append(node)
    if bypass:
        for node in keep:
            for k, name in enumerate(node.input):
                if name in bypass:
                    node.input[k] = bypass[name]
        del graph.node[:]
        graph.node.extend(keep)

    # 4. MatMul weights under their HF names
    taken = set(inits)
    renames: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        w = node.input[1]
        if w not in inits or not w.startswith("onnx::") or w in renames:
            continue
        parts = [p for p in node.name.split("/") if p]
        module = ".".join(parts[:-1])
        if module not in module_names:
            continue
        new = module + ".weight"
        if new in taken:
            continue
        renames[w] = new
        taken.add(new)
    for t in graph.initializer:
        if t.name in renames:
            t.name = renames[t.name]
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renames:
                node.input[k] = renames[name]


def _trace_graph(wrapper, spec: dict, graph: str, raw: Path, part: Part | None = None
                 ) -> tuple[list[str], list[str]]:
    """Trace ``graph`` of ``wrapper`` into the ONNX file ``raw`` as torch writes it; returns
    the input and output names it must have (:func:`_finish_graph` checks them)."""
    import torch

    sliding = mask_windows(spec)[1] is not None
    ins, outs = io_names(spec["num_layers"], graph, sliding, part, bool(spec.get("vision")))
    args = _example_inputs(spec, graph, sliding, part)
    inputs = _traced_weights(wrapper, part or whole(spec["num_layers"]))
    wrapper.weight_inputs = [m for m, _, _ in inputs]
    args = (*args, *(t for _, _, t in inputs))
    in_names = [*ins, *(name for _, name, _ in inputs)]
    with torch.no_grad(), warnings.catch_warnings(), initializers_kept() as weights, \
            _no_weight_inputs(wrapper):
        # dynamo=False is deliberate (it matches generate() exactly): hide the notice.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            wrapper,
            args,
            str(raw),
            input_names=in_names,
            output_names=outs,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
            export_params=False,
        )
    weights = dict(weights)
    weights.update({name: t for _, name, t in inputs})
    write_initializers(raw, weights)
    _forget_traced_constants()
    return ins, outs


def _forget_traced_constants() -> None:
    """Make torch's TorchScript exporter let go of the last graph's weights. It keeps the
    constants of the graph it last exported in a table of its own until the next export
    starts, so after a part is traced and given back its weights stayed in memory through
    the export check and the next part's tracing (measured on the 8 B shape's parts: 2.8
    GiB held twice). Exporting a one-weight graph replaces that table."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(torch.nn.Linear(1, 1), (torch.zeros(1, 1),), io.BytesIO(),
                          dynamo=False, opset_version=OPSET)


@contextlib.contextmanager
def _no_weight_inputs(wrapper) -> Iterator[None]:
    """The wrapper back to its own weights when the trace ends, however it ends."""
    try:
        yield
    finally:
        wrapper.weight_inputs = []


def _finish_graph(raw: Path, path: Path, module_names: set[str], ins: list[str],
                  outs: list[str], graph: str, store: WeightStore | None = None) -> None:
    """The traced ``raw`` graph tidied (:func:`_tidy_graph`), checked and moved to ``path``
    (one copy of its weights in memory at a time: the model is dropped before the checker
    reads the file). A graph past :data:`studio.engine.weightstore.SHARE_ABOVE` weight bytes
    keeps them as external data: in ``store`` (the folder's file the graphs of a part share)
    or in its own ``<graph>.onnx.data``; a smaller one embeds them."""
    import onnx

    from studio.engine import weightstore

    tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{graph}-final."))
    moved: list[Path] = []
    try:
        # the weights stay in the traced graph's .data file while the graph is tidied (it
        # renames and shares initializers, never changes their bytes)
        model = onnx.load(str(raw), load_external_data=False)
        _tidy_graph(model, module_names)
        model.producer_name = "qstudio"
        got_in = [i.name for i in model.graph.input]
        got_out = [o.name for o in model.graph.output]
        if got_in != ins or got_out != outs:
            raise StudioError(
                f"the exported {graph} graph has unexpected edges ({got_in[:4]}...); "
                "this checkpoint's modules are not supported by the static-KV exporter"
            )
        if weight_bytes(model) > weightstore.SHARE_ABOVE:
            written = weightstore.save_streamed(model, raw.parent, tmp_dir / path.name, store)
        else:
            onnx.load_external_data_for_model(model, str(raw.parent))
            written = save_onnx_atomic(model, tmp_dir / path.name)
        del model
        for f in written:
            os.replace(f, path.parent / f.name)
            moved.append(path.parent / f.name)
        # checked where it lies: a graph in the shared file finds it only beside it
        onnx.checker.check_model(str(path))
    except BaseException:
        for f in moved:
            f.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _export_graph(wrapper, spec: dict, graph: str, path: Path, progress: Progress,
                  part: Part | None = None, store: WeightStore | None = None) -> None:
    tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{graph}-export."))
    try:
        raw = tmp_dir / f"{graph}.onnx"
        ins, outs = _trace_graph(wrapper, spec, graph, raw, part)
        progress.check()
        _finish_graph(raw, path, {name for name, _ in wrapper.named_modules() if name}, ins,
                      outs, graph, store)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _graph_io(path: Path) -> dict:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def rows(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            out.append(
                {
                    "name": v.name,
                    "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
                    "shape": [d.dim_value for d in t.shape.dim],
                }
            )
        return out

    return {
        "file": path.name,
        "inputs": rows(model.graph.input),
        "outputs": rows(model.graph.output),
    }


# ---------------------------------------------------------------------------- entry point


def check_lengths(prompt_len: int, context_len: int, mask_value: float,
                  verify_len: int) -> tuple[int, int, int]:
    """The export's lengths (P, C, N) as ints, or a one-line error for ones no graph takes."""
    P, C, N = int(prompt_len), int(context_len), int(verify_len)
    if P < 1:
        raise StudioError(f"prompt length P must be at least 1 (got {P})")
    if C <= P:
        raise StudioError(
            f"context length C must be larger than prompt length P (got C={C}, P={P}); raise C or lower P"
        )
    if not mask_value < 0:
        raise StudioError(f"mask_value must be negative (got {mask_value})")
    if N > 1 and N >= C:
        raise StudioError(f"the verify graph's {N} tokens must be fewer than the context C={C}")
    return P, C, N


def check_model(model, cfg: dict, family: Family, C: int) -> None:
    """Refuse a checkpoint whose modules or positions the static-KV graphs cannot take."""
    base: Any = getattr(model, "model", None)
    for attr in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if base is None or not hasattr(base, attr):
            raise StudioError(
                f"model type {cfg.get('model_type')!r} lacks model.{attr}; "
                f"use a {family.label} checkpoint saved by transformers"
            )
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and C > max_pos:
        raise StudioError(
            f"context length C={C} exceeds the model's max_position_embeddings={max_pos}; lower C"
        )
    _check_rope(model.config, C)


def _model_spec(model, cfg: dict, family: Family, P: int, C: int, mask_value: float,
                N: int) -> dict[str, Any]:
    """graph.json's description of the model and its graphs (before the graphs' edges and
    the export check are added). ``model``: the loaded checkpoint, or its modules on the meta
    device (only shapes and the config are read)."""
    config = model.config
    base = model.model
    layer_types = layer_types_of(config, family)
    window = getattr(config, "sliding_window", None) if SLIDING in layer_types else None
    rope_type = _check_rope(config, C)
    rope_rows = rope_positions(config, C)
    attn = base.layers[0].self_attn
    num_heads = int(config.num_attention_heads)
    num_kv = int(getattr(config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // num_heads)
    full = getattr(model, "full", model)  # a VL model's whole (its config, its class)
    eos_ids, pad_id = _special_ids(full)
    return {
        "format": SPEC_FORMAT,
        "model_type": full.config.model_type,
        "family": family.label,
        "architecture": type(full).__name__,
        "num_layers": len(base.layers),
        "num_heads": num_heads,
        "num_kv_heads": num_kv,
        "head_dim": head_dim,
        "hidden_size": int(config.hidden_size),
        "vocab_size": int(config.vocab_size),
        "prompt_length": P,
        "context_length": C,
        "rope_positions": rope_rows,
        "layer_types": layer_types,
        "sliding_window": int(window) if window is not None else None,
        "rope_type": rope_type,
        "attn_logit_softcapping": _opt_float(config, family.attn_softcap),
        "final_logit_softcapping": _opt_float(config, family.final_softcap),
        "checkpoint_dtype": cfg.get("dtype") or cfg.get("torch_dtype"),
        "eos_token_id": eos_ids[0] if eos_ids else None,
        "eos_token_ids": eos_ids,
        "pad_token_id": pad_id,
        "mask_value": float(mask_value),
        "verify_length": N if N > 1 else None,
        "dtype": "float32",
        "opset": OPSET,
        "kv_layout": "[1, num_kv_heads, context_length, head_dim]; decode writes its new row into slot pos",
        "weights_layout": "MatMul weights are stored transposed ([in, out]) under their HF names",
    }


def export_llm(
    checkpoint_dir: Path,
    out_dir: Path,
    prompt_len: int,
    context_len: int,
    progress: Progress = NullProgress(),
    mask_value: float = DEFAULT_MASK_VALUE,
    verify_len: int = DEFAULT_VERIFY_LENGTH,
    image_size: int = 448,
) -> dict:
    """Export ``prefill.onnx`` / ``decode.onnx`` (FP32, opset 17), graph.json, reference.npz,
    and ``verify.onnx`` when ``verify_len`` > 1: the decode graph for ``verify_len`` new
    tokens at once over the same cache (speculative decoding's verify pass; chunked prefill
    of long prompts). A vision-language checkpoint adds ``vision.onnx``, its vision encoder
    for square images of ``image_size`` pixels (:mod:`studio.engine.vision`), and graph.json's
    ``vision`` entry; its prefill graph takes the image's rows and multimodal positions.

    The graphs are then checked over the whole context (:func:`check_export`): the figures
    go into the spec's ``export_check``, and a position where the graphs and transformers
    disagree raises :class:`StudioError` naming it. Returns the spec written to graph.json.
    """
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    P, C, N = check_lengths(prompt_len, context_len, mask_value, verify_len)
    cfg = _check_checkpoint(checkpoint_dir)
    if FAMILIES[cfg["model_type"]].vision:  # a size its image processor gives: before loading
        from studio.engine import vision_input

        vision_input.check_image_size(vision_input.processor_range(
            cfg, vision_input.read_preprocessor(checkpoint_dir), str(checkpoint_dir)),
            image_size, "export.image_size")
    progress.update(0.0, "loading checkpoint")
    progress.check()

    import numpy as np

    full = load_causal_lm(checkpoint_dir)
    model = text_view(full)  # a VL model's language model
    family = FAMILIES[cfg["model_type"]]
    check_model(model, cfg, family, C)
    layer_types = layer_types_of(model.config, family)
    rope_rows = rope_positions(model.config, C)
    spec = _model_spec(model, cfg, family, P, C, mask_value, N)
    sliding_input = mask_windows(spec)[1] is not None
    vs = None
    if family.vision:
        from studio.engine import vision_input

        vs = vision_input.make_vision_spec(cfg, vision_input.read_preprocessor(checkpoint_dir), image_size,
                                     cfg["model_type"], str(checkpoint_dir))
        if vs.tokens + 2 > P:
            raise StudioError(
                f"one {image_size} x {image_size} image is {vs.tokens} tokens (+2 around it), "
                f"more than the prefill graph's P={P}: raise export.prompt_length to at least "
                f"{vs.tokens + 2} or lower export.image_size")
        spec["vision"] = vs.to_json()

    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = _build_wrapper(model, C, family, layer_types, sliding_input, rope_rows)
    steps = [("prefill", 0.05, 0.25), ("decode", 0.25, 0.4)]
    if N > 1:
        steps.append(("verify", 0.4, 0.5))
    with shared_store(out_dir) as store:  # the graphs' weights once, when past SHARE_ABOVE
        for graph, a, b in steps:
            progress.check()
            progress.update(a, f"exporting {graph}.onnx")
            _export_graph(wrapper, spec, graph, out_dir / f"{graph}.onnx",
                          SubProgress(progress, a, b), store=store)
            progress.log(f"wrote {out_dir / f'{graph}.onnx'}")
    spec["graphs"] = {g: _graph_io(out_dir / f"{g}.onnx") for g, _, _ in steps}
    if vs is not None:
        from studio.engine.vision import export_vision
        from studio.engine.vision_input import VISION_FILE

        progress.update(0.45, f"exporting {VISION_FILE} (up to {vs.image_size} x "
                                f"{vs.image_size} px, {vs.tokens} image tokens)")
        spec["vision"]["graph"] = export_vision(full.model.visual, vs, out_dir / VISION_FILE,
                                                OPSET, mask_value)

    # The whole context, teacher-forced through both graphs, against transformers.
    progress.check()
    progress.update(0.5, f"checking the graphs against transformers over {C} positions")
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    gen = StaticKVGenerator(
        make_cpu_session(out_dir / "prefill.onnx"), make_cpu_session(out_dir / "decode.onnx"), spec
    )
    ids = _reference_ids(checkpoint_dir, C, spec["vocab_size"])
    n_ref = min(P + 8, C)
    check, ref_logits = check_export(
        full, gen, ids, keep=n_ref,
        progress=SubProgress(progress, 0.5, 0.97 if vs is None else 0.75)
    )
    spec["export_check"] = check
    progress.log(
        f"ONNX vs transformers over {check['positions']} positions: max |diff| "
        f"{check['max_abs_logit_diff']:.3g} (tolerance {check['tolerance']:.3g}), "
        f"top-1 agreement {check['top1_agreement']:.4f}"
    )
    if check["first_bad_position"] is not None:
        bad = check["first_bad_position"]
        raise StudioError(
            f"the exported graphs disagree with transformers from position {bad} of "
            f"{check['positions']} (prompt P={P}, context C={C}): max |logit diff| "
            f"{check['max_abs_logit_diff']:.3g} against a tolerance of {check['tolerance']:.3g}, "
            f"top-1 agreement {check['top1_agreement']:.4f}; this checkpoint is not supported "
            "by the static-KV exporter"
        )

    if vs is not None:  # an image prompt through the encoder and both graphs
        from studio.engine.vision import check_image_export

        progress.update(0.75, "checking an image prompt against transformers")
        spec["vision"]["export_check"] = check_image_export(
            full, out_dir, gen, vs, ids, SubProgress(progress, 0.75, 0.97))
        progress.log(_image_check_line(spec["vision"]["export_check"]))
        bad = spec["vision"]["export_check"]["first_bad_position"]
        if bad is not None or not spec["vision"]["export_check"]["encoder_ok"]:
            raise StudioError(
                "the exported vision-language graphs disagree with transformers on an image "
                f"prompt ({_image_check_line(spec['vision']['export_check'])}); this "
                "checkpoint is not supported by the exporter")
    buf = io.BytesIO()
    np.savez(
        buf, input_ids=np.asarray(ids[:n_ref], dtype=np.int64), logits=ref_logits.astype(np.float32)
    )
    atomic_write_bytes(out_dir / "reference.npz", buf.getvalue())
    spec["reference"] = {"file": "reference.npz", "tokens": n_ref}
    atomic_write_json(out_dir / "graph.json", spec)
    progress.update(1.0, "export done")
    return spec


def _image_check_line(c: dict) -> str:
    return (f"image prompt vs transformers over {c['positions']} positions: encoder on "
            f"{' and '.join(c.get('images') or [])} cosine "
            f"{c['encoder_cosine']:.6f} (max |diff| {c['encoder_max_abs_diff']:.3g}), max "
            f"|logit diff| {c['max_abs_logit_diff']:.3g} (tolerance {c['tolerance']:.3g}), "
            f"top-1 agreement {c['top1_agreement']:.4f}")


def export_ar_graph(checkpoint_dir: Path, spec: dict, new_tokens: int, cache_slots: int,
                    path: Path, progress: Progress = NullProgress()) -> dict:
    """An AR-N graph at ``path``: ``new_tokens`` tokens per pass over ``cache_slots`` cache
    slots (the verify graph's form with a cache of its own length). Genie's prefill graph is
    one: N new tokens over CL - N slots, CL being the decode graph's C + 1. Its tensors carry
    the decode graph's names, so it can be quantized with the decode graph's scales."""
    N, slots, C = int(new_tokens), int(cache_slots), int(spec["context_length"])
    if not 1 < N <= C or not 0 < slots <= C:
        raise StudioError(f"an AR-{N} graph over {slots} cache slots does not fit the context "
                          f"of {C}: choose 1 < N <= {C}")
    cfg = _check_checkpoint(Path(checkpoint_dir))
    model = text_view(load_causal_lm(Path(checkpoint_dir)))
    family = FAMILIES[cfg["model_type"]]
    wrapper = _build_wrapper(model, C, family, layer_types_of(model.config, family),
                             mask_windows(spec)[1] is not None,
                             rope_positions(model.config, C))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _export_graph(wrapper, dict(spec, verify_length=N, verify_cache_slots=slots), "verify",
                  Path(path), progress)
    return _graph_io(Path(path))


def _opt_float(config, key: str | None) -> float | None:
    value = getattr(config, key, None) if key else None
    return float(value) if value is not None else None


