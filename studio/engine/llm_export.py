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
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.families import FAMILIES, SLIDING, Family
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.lazyimport import lazy_module
from studio.core.parts import Part, whole
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.engine import vision_input, weightstore
from studio.engine.checkpoint_load import (
    check_checkpoint,
    load_causal_lm,
    reference_ids,
    special_ids,
    text_view,
)
from studio.engine.export_check import check_export
from studio.engine.llm_runtime import (
    DEFAULT_MASK_VALUE,
    StaticKVGenerator,
    make_cpu_session,
    mask_windows,
)
from studio.engine.llm_wrapper import (
    build_wrapper,
    check_rope,
    io_names,
    layer_types_of,
    rope_positions,
    traced_weights,
)
from studio.engine.onnxio import (
    SPEC_FORMAT,
    save_onnx_atomic,
    weight_bytes,
    weight_free,
)
from studio.engine.torch_onnx import initializers_kept, write_initializers
from studio.engine.vision import check_image_export, export_vision
from studio.engine.vision_input import VISION_FILE
from studio.engine.weightstore import WeightStore, shared_store

onnx = lazy_module("onnx")
torch = lazy_module("torch")

OPSET = 17
#: new tokens per pass of the verify graph: the last token plus up to 4 drafted ones
DEFAULT_VERIFY_LENGTH = 5


def _example_inputs(spec: dict, graph: str, sliding: bool, part: Part | None = None):
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
    graph = model.graph
    outputs = {o.name for o in graph.output}
    _module_prefixes(graph, module_names)
    inits = _unshare_initializers(graph, outputs)
    _drop_noop_casts(model, outputs)
    _name_matmul_weights(graph, inits, module_names)


def _module_prefixes(graph, module_names: set[str]) -> None:
    """1. Node and tensor names under the HF model's module paths (``/model/layers.0/...``);
    the RoPE table's Gathers named for their table."""
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


def _unshare_initializers(graph, outputs: set[str]) -> dict[str, Any]:
    """2. Identity(initializer) -> a copy of the initializer under the Identity's output
    name; the initializers by name."""
    inits = {t.name: t for t in graph.initializer}
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
    return inits


def _drop_noop_casts(model, outputs: set[str]) -> None:
    """3. No-op Casts (float32 -> float32 around RMSNorm and softmax) go."""
    graph = model.graph
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


def _name_matmul_weights(graph, inits: dict[str, Any], module_names: set[str]) -> None:
    """4. MatMul weights (``onnx::MatMul_123``) under their Linear module's parameter name."""
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


def trace_graph(wrapper, spec: dict, graph: str, raw: Path, part: Part | None = None
                 ) -> tuple[list[str], list[str]]:
    """Trace ``graph`` of ``wrapper`` into the ONNX file ``raw`` as torch writes it; returns
    the input and output names it must have (:func:`finish_graph` checks them)."""
    sliding = mask_windows(spec)[1] is not None
    ins, outs = io_names(spec["num_layers"], graph, sliding, part, bool(spec.get("vision")))
    args = _example_inputs(spec, graph, sliding, part)
    inputs = traced_weights(wrapper, part or whole(spec["num_layers"]))
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


def finish_graph(raw: Path, path: Path, module_names: set[str], ins: list[str],
                  outs: list[str], graph: str, store: WeightStore | None = None) -> None:
    """The traced ``raw`` graph tidied (:func:`_tidy_graph`), checked and moved to ``path``
    (one copy of its weights in memory at a time: the model is dropped before the checker
    reads the file). A graph past :data:`studio.engine.weightstore.SHARE_ABOVE` weight bytes
    keeps them as external data: in ``store`` (the folder's file the graphs of a part share)
    or in its own ``<graph>.onnx.data``; a smaller one embeds them."""
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


def export_graph(wrapper, spec: dict, graph: str, path: Path, progress: Progress,
                  part: Part | None = None, store: WeightStore | None = None) -> None:
    tmp_dir = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{graph}-export."))
    try:
        raw = tmp_dir / f"{graph}.onnx"
        ins, outs = trace_graph(wrapper, spec, graph, raw, part)
        progress.check()
        finish_graph(raw, path, {name for name, _ in wrapper.named_modules() if name}, ins,
                      outs, graph, store)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def graph_io(path: Path) -> dict:
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
    check_rope(model.config, C)


def model_spec(model, cfg: dict, family: Family, P: int, C: int, mask_value: float,
                N: int) -> dict[str, Any]:
    """graph.json's description of the model and its graphs (before the graphs' edges and
    the export check are added). ``model``: the loaded checkpoint, or its modules on the meta
    device (only shapes and the config are read)."""
    config = model.config
    base = model.model
    layer_types = layer_types_of(config, family)
    window = getattr(config, "sliding_window", None) if SLIDING in layer_types else None
    rope_type = check_rope(config, C)
    rope_rows = rope_positions(config, C)
    attn = base.layers[0].self_attn
    num_heads = int(config.num_attention_heads)
    num_kv = int(getattr(config, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // num_heads)
    full = getattr(model, "full", model)  # a VL model's whole (its config, its class)
    eos_ids, pad_id = special_ids(full)
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
    cfg = check_checkpoint(checkpoint_dir)
    if FAMILIES[cfg["model_type"]].vision:  # a size its image processor gives: before loading
        _check_image_size(cfg, checkpoint_dir, image_size)
    progress.update(0.0, "loading checkpoint")
    progress.check()

    full = load_causal_lm(checkpoint_dir)
    model = text_view(full)  # a VL model's language model
    family = FAMILIES[cfg["model_type"]]
    check_model(model, cfg, family, C)
    layer_types = layer_types_of(model.config, family)
    rope_rows = rope_positions(model.config, C)
    spec = model_spec(model, cfg, family, P, C, mask_value, N)
    sliding_input = mask_windows(spec)[1] is not None
    vs = _vision_spec(cfg, checkpoint_dir, image_size, P, spec) if family.vision else None

    out_dir.mkdir(parents=True, exist_ok=True)
    wrapper = build_wrapper(model, C, family, layer_types, sliding_input, rope_rows)
    _export_text_graphs(wrapper, spec, out_dir, N, progress)
    if vs is not None:
        _export_vision_graph(full, vs, spec, out_dir, mask_value, progress)

    # The whole context, teacher-forced through both graphs, against transformers.
    progress.check()
    progress.update(0.5, f"checking the graphs against transformers over {C} positions")

    gen = StaticKVGenerator(
        make_cpu_session(out_dir / "prefill.onnx"), make_cpu_session(out_dir / "decode.onnx"), spec
    )
    ids = reference_ids(checkpoint_dir, C, spec["vocab_size"])
    n_ref = min(P + 8, C)
    check, ref_logits = check_export(
        full, gen, ids, keep=n_ref,
        progress=SubProgress(progress, 0.5, 0.97 if vs is None else 0.75)
    )
    spec["export_check"] = check
    _judge_check(check, P, C, progress)
    if vs is not None:  # an image prompt through the encoder and both graphs
        _check_image_prompt(full, out_dir, gen, vs, ids, spec, progress)
    buf = io.BytesIO()
    np.savez(
        buf, input_ids=np.asarray(ids[:n_ref], dtype=np.int64), logits=ref_logits.astype(np.float32)
    )
    atomic_write_bytes(out_dir / "reference.npz", buf.getvalue())
    spec["reference"] = {"file": "reference.npz", "tokens": n_ref}
    atomic_write_json(out_dir / "graph.json", spec)
    progress.update(1.0, "export done")
    return spec


def _check_image_size(cfg: dict[str, Any], checkpoint_dir: Path, image_size: int) -> None:
    vision_input.check_image_size(vision_input.processor_range(
        cfg, vision_input.read_preprocessor(checkpoint_dir), str(checkpoint_dir)),
        image_size, "export.image_size")


def _export_vision_graph(full, vs, spec: dict[str, Any], out_dir: Path, mask_value: float,
                         progress: Progress) -> None:
    """A vision-language checkpoint's vision encoder (into the spec's ``vision``)."""
    progress.update(0.45, f"exporting {VISION_FILE} (up to {vs.image_size} x "
                            f"{vs.image_size} px, {vs.tokens} image tokens)")
    spec["vision"]["graph"] = export_vision(full.model.visual, vs, out_dir / VISION_FILE,
                                            OPSET, mask_value)


def _vision_spec(cfg: dict[str, Any], checkpoint_dir: Path, image_size: int, P: int,
                 spec: dict[str, Any]):
    """A vision-language checkpoint's image facts (into the spec's ``vision``); refused
    where one image does not fit the prefill graph."""
    vs = vision_input.make_vision_spec(cfg, vision_input.read_preprocessor(checkpoint_dir), image_size,
                                       cfg["model_type"], str(checkpoint_dir))
    if vs.tokens + 2 > P:
        raise StudioError(
            f"one {image_size} x {image_size} image is {vs.tokens} tokens (+2 around it), "
            f"more than the prefill graph's P={P}: raise export.prompt_length to at least "
            f"{vs.tokens + 2} or lower export.image_size")
    spec["vision"] = vs.to_json()
    return vs


def _export_text_graphs(wrapper, spec: dict[str, Any], out_dir: Path, N: int,
                        progress: Progress) -> None:
    """The prefill, decode (and with N > 1 verify) graphs, their weights stored once; their
    I/O into the spec's ``graphs``."""
    steps = [("prefill", 0.05, 0.25), ("decode", 0.25, 0.4)]
    if N > 1:
        steps.append(("verify", 0.4, 0.5))
    with shared_store(out_dir) as store:  # the graphs' weights once, when past SHARE_ABOVE
        for graph, a, b in steps:
            progress.check()
            progress.update(a, f"exporting {graph}.onnx")
            export_graph(wrapper, spec, graph, out_dir / f"{graph}.onnx",
                          SubProgress(progress, a, b), store=store)
            progress.log(f"wrote {out_dir / f'{graph}.onnx'}")
    spec["graphs"] = {g: graph_io(out_dir / f"{g}.onnx") for g, _, _ in steps}


def _judge_check(check: dict[str, Any], P: int, C: int, progress: Progress) -> None:
    """The export check's line; raises at the first position where the graphs and
    transformers disagree."""
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


def _check_image_prompt(full, out_dir: Path, gen, vs, ids: list[int], spec: dict[str, Any],
                        progress: Progress) -> None:
    """An image prompt through the encoder and both graphs against transformers (into the
    spec's ``vision``); raises where they disagree."""
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
    cfg = check_checkpoint(Path(checkpoint_dir))
    model = text_view(load_causal_lm(Path(checkpoint_dir)))
    family = FAMILIES[cfg["model_type"]]
    wrapper = build_wrapper(model, C, family, layer_types_of(model.config, family),
                             mask_windows(spec)[1] is not None,
                             rope_positions(model.config, C))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    export_graph(wrapper, dict(spec, verify_length=N, verify_cache_slots=slots), "verify",
                  Path(path), progress)
    return graph_io(Path(path))


def _opt_float(config, key: str | None) -> float | None:
    value = getattr(config, key, None) if key else None
    return float(value) if value is not None else None


