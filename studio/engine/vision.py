"""The vision side of a vision-language model (Qwen2-VL / Qwen2.5-VL): the image's way in.

A vision-language checkpoint is exported as the language model's static-KV graphs (see
:mod:`studio.engine.llm_export`) plus ``vision.onnx``, the vision encoder for up to
``export.image_size`` squared pixels (a multiple of patch x merge pixels a side: its
capacity in patches is fixed, as the HTP needs). Everything here is what the host does
around those graphs, as transformers does it:

The image input — the spec, the processor's sizes, patches and positions — is
:mod:`studio.engine.vision_input`:

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

import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.recipe import is_float_scheme, weight_bits
from studio.engine import rewrites
from studio.engine.export_check import PositionCheck
from studio.engine.llm_runtime import DEFAULT_MASK_VALUE, cpu_generator, make_cpu_session
from studio.engine.onnxio import load_spec, save_onnx_atomic
from studio.engine.qdq import quantize_graph
from studio.engine.threads import HOST_THREADS
from studio.engine.torch_onnx import initializers_kept, write_initializers
from studio.engine.vision_input import (
    ENCODER_INPUTS,
    VISION_FILE,
    ImagePatches,
    VisionSpec,
    calibration_images,
    encoder_feeds,
    image_files,
    image_patches,
    image_prompt,
    load_image,
    vision_spec,
)

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")
if TYPE_CHECKING:  # a checker reads the module itself
    import torch
else:
    torch = lazy_module("torch")


def _linear_patch_embed(patch_embed):
    """The patch embedding's Conv3d (kernel = stride = one patch) as the Linear it is over
    flattened patches: the HTP runs it as one MatMul."""
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
    rot = visual.rotary_pos_emb
    freqs = torch.arange(rows)[:, None].float() * rot.inv_freq.float()[None]
    scale = float(getattr(rot, "attention_scaling", 1.0))
    return freqs.cos() * scale, freqs.sin() * scale


def _masked_block(blk, x, cos, sin, mask, rotate):
    """One block of the tower, the checkpoint's own modules (its norms, qkv and output
    projections, MLP) around transformers' eager attention with an additive ``mask`` where
    transformers splits the sequence by its ``cu_seqlens`` (same softmax over the same keys,
    masked ones at ``mask``'s value)."""
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
        with torch.no_grad(), warnings.catch_warnings(), initializers_kept() as weights:
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(wrapper, example, str(tmp), input_names=list(ENCODER_INPUTS),
                              output_names=["image_embeds"], opset_version=opset, dynamo=False,
                              do_constant_folding=True, export_params=not external)
            weights = dict(weights)
    finally:
        visual.patch_embed = kept  # the checkpoint's own module back

    if external:  # traced without its weights: they go to <tmp>.data a tensor at a time
        write_initializers(tmp, weights)
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
