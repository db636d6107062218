"""The torch module the static-KV graphs are traced from: a family's decoder wrapped with
its KV cache, masks and RoPE tables as the graphs take them (:data:`WRAPPERS`), the graphs'
input and output names (:func:`io_names`), the layer types and RoPE positions of a config,
and a part's weights as traced inputs."""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from studio.core import families
from studio.core.errors import StudioError
from studio.core.families import FULL, SLIDING, Family
from studio.core.lazyimport import lazy_module
from studio.core.parts import Part, whole
from studio.engine.llm_runtime import SLIDING_MASK
from studio.engine.onnxio import (
    IMAGE_EMBEDS,
)
from studio.engine.torch_onnx import HEAD_INPUT

if TYPE_CHECKING:  # a checker reads the module itself
    import torch
else:
    torch = lazy_module("torch")


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


def check_rope(config, context_len: int) -> str:
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
    base = causal_lm.model
    part = part or whole(len(base.layers))
    plan = _WrapperPlan.of(causal_lm, family, layer_types, sliding_input, part, rotary)

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
            cos, sin = _rope_tables(rotary or base.rotary_emb, int(rope_rows or context_len))
            # persistent: exported as initializers named rope_cos / rope_sin
            self.register_buffer("rope_cos", cos)
            self.register_buffer("rope_sin", sin)
            if plan.mrope:
                self.register_buffer("mrope_select", _mrope_select(
                    plan.mrope, int(self.rope_cos.shape[-1]) // 2), persistent=False)
            self.emit_hidden = False  # the last part returns its norm's output (export check)
            # the modules whose weight the trailing inputs stand for while tracing (see
            # traced_weights)
            self.weight_inputs: list[Any] = []

        def forward(self, first, position_ids, attention_mask, *rest):
            if self.weight_inputs:
                n = len(self.weight_inputs)
                with _weights_from(self.weight_inputs, rest[-n:]):
                    return self._forward(first, position_ids, attention_mask, *rest[:-n])
            return self._forward(first, position_ids, attention_mask, *rest)

        def _forward(self, first, position_ids, attention_mask, *rest):
            return _static_kv_forward(self, plan, first, position_ids, attention_mask, rest)

    wrapper = StaticKVWrapper()
    wrapper.eval()
    return wrapper


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


@dataclass(frozen=True)
class _WrapperPlan:
    """What the wrapper's forward needs to know of the checkpoint and its family (see
    :class:`~studio.core.families.Family`): the part's blocks, the layers' cache keyword,
    which read the sliding mask, the embedding scale and the final soft cap, the multimodal
    rotary sections and the image token."""

    part: Part
    layers: list[int]
    cache_kw: str
    sliding_input: bool
    uses_window: list[bool]
    embed_scale: float | None
    final_cap: Any
    mrope: Any
    image_token: Any

    @classmethod
    def of(cls, causal_lm, family: Family, layer_types: list[str], sliding_input: bool,
           part: Part, rotary) -> _WrapperPlan:
        base = causal_lm.model
        config = causal_lm.config
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
        # the multimodal rotary embedding (Qwen2-VL): head-dim columns taken from the
        # temporal, height or width position, section by section
        mrope = getattr(rotary or base.rotary_emb, "mrope_section", None) \
            if family.vision else None
        image_token = getattr(getattr(causal_lm, "full", None), "config", None)
        image_token = getattr(image_token, "image_token_id", None)
        return cls(part, list(part.layers), cache_kw, sliding_input, uses_window, embed_scale,
                   final_cap, mrope, image_token)


def _rope_tables(rotary, rows: int):
    """The RoPE cos / sin tables of positions 0 .. rows - 1 from the rotary module, float32."""
    with torch.no_grad():
        pos = torch.arange(rows, dtype=torch.long)[None]
        probe = torch.zeros(1, rows, 1, dtype=torch.float32)
        cos, sin = rotary(probe, pos)
    return cos[0].to(torch.float32).clone(), sin[0].to(torch.float32).clone()


def _mrope_select(mrope, half: int):
    """[3, 1, 1, 2 * half]: which of the three position rows each rotary column takes."""
    axis = [k % 3 for k, n in enumerate(mrope) for _ in range(int(n))]
    if len(axis) != half:
        raise StudioError(f"the mrope_section {list(mrope)} covers {len(axis)} "
                          f"of the {half} rotary frequencies; fix config.json")
    sel = torch.zeros(3, 1, 1, 2 * half)
    for j, a in enumerate(axis):
        sel[a, 0, 0, j] = sel[a, 0, 0, j + half] = 1.0
    return sel


def _static_kv_forward(wrapper, plan: _WrapperPlan, first, position_ids, attention_mask,
                       rest):
    """The wrapper's forward (see :func:`io_names`): the hidden states in (embedded for the
    first part), the part's blocks over the KV cache, the norm and head for the last;
    returns the output and each block's new key and value rows."""
    part, layers = plan.part, plan.layers
    window_mask = rest[0] if plan.sliding_input else None
    past_flat = rest[1:] if plan.sliding_input else rest
    image = None
    if position_ids.dim() == 3:  # a VL prefill: its image rows come next
        image, past_flat = past_flat[0], past_flat[1:]
    if part.embeds:
        h = wrapper.model.embed_tokens(first)
        if plan.embed_scale is not None:
            h = h * torch.tensor(plan.embed_scale, dtype=h.dtype)
        if image is not None:  # the image tokens take the encoder's rows
            h = torch.where((first == int(plan.image_token)).unsqueeze(-1), image, h)
    else:
        h = first
    cos = torch.nn.functional.embedding(position_ids, wrapper.rope_cos)
    sin = torch.nn.functional.embedding(position_ids, wrapper.rope_sin)
    if position_ids.dim() == 3:  # [3, 1, S, D]: each column from its own row
        cos = (cos * wrapper.mrope_select).sum(0)
        sin = (sin * wrapper.mrope_select).sum(0)
    past = None
    if past_flat:
        past = {i: (past_flat[2 * j], past_flat[2 * j + 1])
                for j, i in enumerate(layers)}
    cache = _StepCache(past)
    for i in layers:
        out = wrapper.model.layers[i](
            h,
            attention_mask=window_mask if plan.uses_window[i] else attention_mask,
            position_ids=position_ids if position_ids.dim() == 2 else position_ids[0],
            position_embeddings=(cos, sin),
            use_cache=True,
            **{plan.cache_kw: cache},
        )
        h = out[0] if isinstance(out, tuple) else out
    if part.heads:
        h = wrapper.model.norm(h)
    if part.heads and not wrapper.emit_hidden:
        h = wrapper.lm_head(h)
        if plan.final_cap is not None:
            h = torch.tanh(h / plan.final_cap) * plan.final_cap
    outs = [h]
    for i in layers:
        outs += list(cache.new[i])
    return tuple(outs)


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




def traced_weights(wrapper, part: Part) -> list[tuple[Any, str, Any]]:
    """The embedding table and the output head: the largest weights, traced as graph inputs
    (then made initializers) rather than as parameters. The exporter's shape inference and
    constant folding copy a parameter-fed node's weight two and one more times (measured on
    an 8 B model's 128 k x 4096 head, 2 GiB: 6 GiB more while a graph is traced); a graph
    input is not copied. (module, input name, tensor) each."""
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


def build_wrapper(
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
