"""Streamed export of a decoder in parts, and the graphs of its parts run as one.

A checkpoint is read through its weight files a part at a time (:mod:`studio.core.parts`):
the model is built on torch's meta device (no memory), the modules of one part are given
storage and filled from the memory-mapped ``*.safetensors`` (or ``*.bin``) files, widened
to float32, exported, checked and given back before the next part is read. bf16 / fp16
weights are widened only for the part in flight, so the peak memory follows the largest
part, not the model.

The export check stays the whole-context check of :func:`studio.engine.export_check.check_export`
(the same tolerance, every position of the context teacher-forced, prefill then one decode
step per position), but runs part by part: the reference is transformers' own modules of
each part over the whole sequence (with the graphs' additive masks), the graphs are each
part's prefill and decode graphs fed the previous part's *graph* outputs; only the logits of
the last part are compared, so the figures are the chain's end to end.

The parts' graphs run as one through :class:`studio.engine.chain.ChainSession`.
"""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from studio.core.catalog import get_chip
from studio.core.deviceplan import Dims, device_part_count
from studio.core.errors import StudioError
from studio.core.families import FAMILIES
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.lazyimport import lazy_module
from studio.core.parts import AUTO_WEIGHT_BITS, DEFAULT_MAX_PART_BYTES, Layout, Part, plan_parts
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.engine import partresume
from studio.engine.checkpoint_load import check_checkpoint, reference_ids
from studio.engine.export_check import EXPORT_CHECK_RTOL, PositionCheck
from studio.engine.llm_export import (
    DEFAULT_VERIFY_LENGTH,
    check_lengths,
    check_model,
    export_graph,
    finish_graph,
    graph_io,
    model_spec,
    trace_graph,
)
from studio.engine.llm_runtime import DEFAULT_MASK_VALUE, make_cpu_session, mask_windows
from studio.engine.llm_wrapper import build_wrapper, layer_types_of, rope_positions
from studio.engine.part_runner import iter_parts, run_part_graphs
from studio.engine.weightstore import graph_bytes, shared_store

safetensors = lazy_module("safetensors")
torch = lazy_module("torch")
transformers = lazy_module("transformers")

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


# ---- the checkpoint's layout, from its files' headers --------------------------------------
def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise StudioError(f"{path} is not a safetensors file (it is {len(head)} bytes); "
                              "download the checkpoint again")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise StudioError(f"{path} has a corrupt safetensors header; download it again")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise StudioError(f"{path} has a corrupt safetensors header; download it again") from None
    header.pop("__metadata__", None)
    return header


def tensor_shapes(checkpoint_dir: Path) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """Every weight of the checkpoint: name -> (dtype, shape, file), from the safetensors
    headers (nothing is loaded); ``*.bin`` files are opened memory-mapped."""
    checkpoint_dir = Path(checkpoint_dir)
    out: dict[str, tuple[str, tuple[int, ...], Path]] = {}
    files = sorted(checkpoint_dir.glob("*.safetensors"))
    for f in files:
        for name, info in _safetensors_header(f).items():
            out[name] = (str(info["dtype"]), tuple(int(d) for d in info["shape"]), f)
    if not files:
        for f in sorted(checkpoint_dir.glob("*.bin")):
            state = torch.load(f, map_location="cpu", mmap=True, weights_only=True)
            for name, t in state.items():
                out[name] = (str(t.dtype).replace("torch.", ""), tuple(t.shape), f)
    return out


def _block_index(name: str) -> int | None:
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def exported_part_sizes(export_dir: Path, spec: dict) -> list[int]:
    """The parameters each part of an export holds (one part: the decode graph's own FP32
    weights, where a tied head is a second copy)."""
    rows = [int(p.get("parameters") or 0) for p in spec.get("parts") or []]
    return rows or [graph_bytes(Path(export_dir) / "decode.onnx") // 4]


def export_plan(checkpoint_dir: Path, parts: int | str, max_part_mb: int,
                layout: Layout | None = None, device_count: int | None = None) -> list[Part]:
    """The parts the export stage splits ``checkpoint_dir`` into for the settings
    ``export.parts`` and ``export.max_part_mb`` (from the weight files' headers, or the
    ``layout`` already read from them); with ``"auto"``, no fewer than ``device_count``
    (the target NPUs' own count: :func:`auto_device_count`)."""
    return plan_parts(layout or checkpoint_layout(checkpoint_dir), parts, AUTO_WEIGHT_BITS,
                      int(max_part_mb) * 1_000_000, at_least=device_count or 1)


def auto_device_count(info, layout: Layout, targets, prompt_length: int,
                      context_length: int) -> int | None:
    """The fewest parts whose context binaries fit every target chip's NPU
    (:func:`studio.core.deviceplan.device_part_count`) for a checkpoint described by ``info``
    (a ModelInfo); None when no target knows its limit."""
    return device_part_count(layout, Dims.of(info), [get_chip(t) for t in targets],
                             int(prompt_length), int(context_length))


def checkpoint_layout(checkpoint_dir: Path) -> Layout:
    """Parameters per block, embedding, final norm and head of a checkpoint, from the
    headers of its weight files (exact; nothing is loaded)."""
    cfg = check_checkpoint(Path(checkpoint_dir))
    L = int(cfg.get("num_hidden_layers") or 0)
    blocks = [0] * L
    embedding = norm = head = 0
    for name, (_, shape, _) in tensor_shapes(Path(checkpoint_dir)).items():
        n = 1
        for d in shape:
            n *= d
        if name.startswith(("visual.", "model.visual.")):
            continue  # a vision-language model's tower: not a part of the language model
        b = _block_index(name)
        if b is not None and b < L:
            blocks[b] += n
        elif "embed_tokens" in name:
            embedding += n
        elif name.startswith("lm_head"):
            head += n
        else:
            norm += n
    if not L or not all(blocks) or not embedding:
        raise StudioError(f"{checkpoint_dir}: the weight files do not hold the {L} blocks and "
                          "the embedding that config.json names; download the checkpoint again")
    tied = head == 0
    return Layout(tuple(blocks), embedding, norm, head, tied)


# ---- loading a part at a time --------------------------------------------------------------
class StreamedCheckpoint:
    """A checkpoint whose modules live on the meta device until a part asks for them."""

    def __init__(self, checkpoint_dir: Path):
        self.dir = Path(checkpoint_dir)
        self.cfg = check_checkpoint(self.dir)
        try:
            self.config = transformers.AutoConfig.from_pretrained(str(self.dir))
            with torch.device("meta"):
                self.model = transformers.AutoModelForCausalLM.from_config(
                    self.config, attn_implementation="eager", dtype=torch.float32)
        except (OSError, ValueError, KeyError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StudioError(f"cannot build {self.dir} with transformers: {first}") from None
        self.model.eval()
        try:
            self.model.generation_config = transformers.GenerationConfig.from_pretrained(
                str(self.dir))
        except (OSError, ValueError):
            pass
        base = self.model.model
        rotary = type(base.rotary_emb)
        try:
            self.rotary = rotary(config=self.config)
        except TypeError:
            self.rotary = rotary(self.config)
        self.shapes = tensor_shapes(self.dir)
        self._open: dict[Path, Any] = {}

    def modules(self, part: Part) -> list[tuple[str, Any]]:
        base = self.model.model
        mods = [(f"model.layers.{i}", base.layers[i]) for i in part.layers]
        if part.embeds:
            mods.insert(0, ("model.embed_tokens", base.embed_tokens))
        if part.heads:
            mods += [("model.norm", base.norm), ("lm_head", self.model.lm_head)]
        return mods

    def _tensor(self, name: str):
        entry = self.shapes.get(name)
        if entry is None and name == "lm_head.weight":
            entry = self.shapes.get("model.embed_tokens.weight")  # a tied head
            name = "model.embed_tokens.weight"
        if entry is None:
            raise StudioError(f"{self.dir} has no weight {name!r}, which the {self.cfg.get('model_type')} "
                              "modules need; a streamed export reads the checkpoint's own names: "
                              "export it in one part (export.parts = 1)")
        file = entry[2]
        handle = self._open.get(file)
        if handle is None:
            if file.suffix == ".safetensors":
                handle = safetensors.safe_open(str(file), framework="pt")
            else:
                handle = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
            self._open[file] = handle
        return (handle.get_tensor(name) if file.suffix == ".safetensors"
                else cast(Any, handle)[name])

    def load(self, part: Part) -> None:
        """Give the part's modules float32 storage filled from the weight files."""
        with torch.no_grad():
            for prefix, module in self.modules(part):
                module.to_empty(device="cpu")
                for sub in module.modules():  # non-persistent buffers (scales, tables)
                    if len(list(sub.buffers(recurse=False))):
                        self.model._init_weights(sub)
                for name, value in module.state_dict().items():
                    value.copy_(self._tensor(f"{prefix}.{name}"))

    def release(self, part: Part) -> None:
        for _, module in self.modules(part):
            module.to("meta")
        self._open.clear()
        gc.collect()


# ---- the streamed export -------------------------------------------------------------------
#: rows of the sequence the reference runs at once: its attention scores stay at most
#: heads x chunk x n floats (134 MB for 16 heads at a 4096-token context)
REFERENCE_CHUNK = 512


def _chunk_mask(a: int, b: int, mv: float, window: int | None):
    """The additive mask of queries ``a..b-1`` over keys ``0..b-1`` (the cached ``0..a-1``
    first, then the chunk's own), causal, and windowed to ``window`` keys when given."""
    q = np.arange(a, b)[:, None]
    k = np.arange(b)[None, :]
    visible = k <= q
    if window is not None:
        visible &= k > q - int(window)
    return np.where(visible, 0.0, mv).astype(np.float32)


def _reference_part(wrapper, spec: dict, x, chunk: int = REFERENCE_CHUNK):
    """transformers' modules of one part over the whole sequence ``x`` (ids [n] or hidden
    states [n, H]) with the causal (and sliding) masks, ``chunk`` rows at a time over the
    keys and values of the rows before: the part's output [n, H] (the final norm's output
    for the last part, whose head the check applies row by row)."""
    n = int(x.shape[0])
    full, sliding = mask_windows(spec)
    mv = float(spec["mask_value"])
    x = np.asarray(x)
    past: list[Any] = []
    rows = []
    wrapper.emit_hidden = True  # the last part: its final norm's output, not [n, V] logits
    try:
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            args = [torch.from_numpy(x[a:b])[None], torch.arange(a, b, dtype=torch.long)[None],
                    torch.from_numpy(_chunk_mask(a, b, mv, full))[None, None]]
            if sliding is not None:
                args.append(torch.from_numpy(_chunk_mask(a, b, mv, sliding))[None, None])
            with torch.no_grad():
                outs = wrapper(*args, *past)
            rows.append(outs[0][0].float().numpy())
            new = list(outs[1:])
            past = new if not past else [torch.cat([p, t], dim=2) for p, t in zip(past, new,
                                                                                 strict=True)]
    finally:
        wrapper.emit_hidden = False
    return np.concatenate(rows)


def export_parts(
    checkpoint_dir: Path,
    out_dir: Path,
    prompt_len: int,
    context_len: int,
    parts: int | str = 2,
    weight_bits: int = 8,
    max_part_bytes: int | None = None,
    progress: Progress = NullProgress(),
    mask_value: float = DEFAULT_MASK_VALUE,
    verify_len: int = DEFAULT_VERIFY_LENGTH,
    check_positions: int | None = None,
    resume: bool = False,
) -> dict:
    """Export a checkpoint as the prefill / decode (/ verify) graphs of each of its parts,
    one part in memory at a time, into ``out_dir/<part name>/``, and check the chain over
    the whole context (or its first ``check_positions``) against transformers' modules.
    Writes graph.json (with ``parts``) and reference.npz; returns the spec.

    ``resume``: ``out_dir`` is a kept work folder (:mod:`studio.engine.partresume`): the
    parts an interrupted run finished there are kept and the export goes on from the first
    part it did not finish."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    P, C, N = check_lengths(prompt_len, context_len, mask_value, verify_len)
    progress.update(0.0, "reading the checkpoint's layout")
    layout = checkpoint_layout(checkpoint_dir)
    plan = plan_parts(layout, parts, weight_bits, max_part_bytes or DEFAULT_MAX_PART_BYTES)
    ck = StreamedCheckpoint(checkpoint_dir)
    family = FAMILIES[ck.cfg["model_type"]]
    check_model(ck.model, ck.cfg, family, C)
    spec = model_spec(ck.model, ck.cfg, family, P, C, mask_value, N)
    traits = (layer_types_of(ck.config, family), rope_positions(ck.config, C),
              mask_windows(spec)[1] is not None)
    ids = reference_ids(checkpoint_dir, C, spec["vocab_size"])
    n = min(len(ids), int(check_positions or C))
    ids = ids[:n]
    run = _PartsExport(ck, family, spec, plan, out_dir, C, n, min(P + 8, n),
                       ["prefill", "decode"] + (["verify"] if N > 1 else []), resume, progress,
                       *traits, ref=np.asarray(ids, dtype=np.int64))
    out_dir.mkdir(parents=True, exist_ok=True)
    first = run.keep_finished()
    for part in plan[first:]:
        run.export_part(part)
    check = {**run.compare.figures(min(P, n)), "parts": len(plan),
             "reference": "transformers modules, one part at a time, with the graphs' masks"}
    partresume.unmark(out_dir)
    rows = run.rows
    spec["parts"] = rows
    spec["graphs"] = rows[0]["graphs"] if len(plan) == 1 else {
        g: {"file": f"{g}.onnx", "parts": [r["name"] for r in rows]} for g in run.graphs}
    spec["export_check"] = check
    progress.log(f"ONNX vs transformers over {check['positions']} positions in {len(plan)} "
                 f"parts: max |diff| {check['max_abs_logit_diff']:.3g} (tolerance "
                 f"{check['tolerance']:.3g}), top-1 agreement {check['top1_agreement']:.4f}")
    if check["first_bad_position"] is not None:
        raise StudioError(
            f"the exported parts disagree with transformers from position "
            f"{check['first_bad_position']} of {check['positions']}: max |logit diff| "
            f"{check['max_abs_logit_diff']:.3g} against a tolerance of {check['tolerance']:.3g}; "
            "this checkpoint is not supported by the static-KV exporter")
    buf = io.BytesIO()
    kept, n_ref = run.kept, run.n_ref
    np.savez(buf, input_ids=np.asarray(ids[:n_ref], dtype=np.int64),
             logits=np.asarray(kept, dtype=np.float32).reshape(len(kept), spec["vocab_size"]))
    atomic_write_bytes(out_dir / "reference.npz", buf.getvalue())
    spec["reference"] = {"file": "reference.npz", "tokens": n_ref}
    atomic_write_json(out_dir / "graph.json", spec)
    progress.update(1.0, "export done")
    return spec


@dataclass
class _PartsExport:
    """One export of a checkpoint in parts, part after part: the checkpoint streamed a
    part at a time, the rows of the parts written, and the chain's check — the reference
    ids' hidden states in transformers (``ref``) and through the exported graphs (``got``)
    as the part before hands them on, the last part's logits compared position by position
    (the first ``n_ref`` kept for reference.npz)."""

    ck: Any
    family: Any
    spec: dict[str, Any]
    plan: list[Part]
    out_dir: Path
    C: int
    n: int
    n_ref: int
    graphs: list[str]
    resume: bool
    progress: Progress
    layer_types: list[str]  # which mask each layer reads
    rope_rows: int  # the RoPE table's positions
    sliding_input: bool  # the graphs take a sliding-window mask
    ref: Any
    got: Any = None
    rows: list[dict] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)
    compare: PositionCheck = field(default_factory=lambda: PositionCheck(EXPORT_CHECK_RTOL))

    def __post_init__(self) -> None:
        self.got = self.ref

    def keep_finished(self) -> int:
        """With ``resume``, the parts an interrupted run finished kept (their rows and the
        hidden states the last of them hands on); the index of the first part to export."""
        plan = self.plan
        done = partresume.keep_finished(self.out_dir, plan) if self.resume else {}
        first = 0
        while first in done and first < len(plan) - 1:
            first += 1
        if first:
            kept_from = partresume.handoff(self.out_dir / plan[first - 1].name)
            self.got, self.ref = kept_from["got"], kept_from["ref"]
            self.rows = [{k: v for k, v in done[i].items()} for i in range(first)]
            self.progress.log(f"part{'s 1-' if first > 1 else ' '}{first} of {len(plan)}: "
                              "kept from an interrupted run of this export")
        return first

    def export_part(self, part: Part) -> None:
        """One part: its blocks read, its graphs traced and written, then checked."""
        plan, progress = self.plan, self.progress
        share = 1.0 / len(plan)
        sub = SubProgress(progress, part.index * share, (part.index + 1) * share)
        progress.check()
        sub.update(0.0, f"part {part.index + 1}/{len(plan)}: reading blocks "
                        f"{part.start}-{part.stop - 1}")
        self.ck.load(part)
        wrapper = build_wrapper(self.ck.model, self.C, self.family, self.layer_types,
                                self.sliding_input, self.rope_rows, part, rotary=self.ck.rotary)
        folder = self.out_dir / part.name if len(plan) > 1 else self.out_dir
        if len(plan) > 1 and folder.exists():  # what an interrupted run left of this part
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        ref_out, want_all = self.trace_and_write(part, wrapper, folder, sub)
        self.rows.append({**part.as_dict(),
                          "graphs": {g: graph_io(folder / f"{g}.onnx") for g in self.graphs}})
        self.check_part(part, folder, ref_out, want_all, sub)

    def trace_and_write(self, part: Part, wrapper, folder: Path, sub: Progress
                        ) -> tuple[Any, Any]:
        """The part's graphs traced while its torch weights are in memory and written after
        they are given back (one copy of the part's weights at a time); transformers'
        reference through the part (its hidden states; the logits for the last part)."""
        plan, progress, graphs, spec = self.plan, self.progress, self.graphs, self.spec
        # traced while the part's torch weights are in memory, finished after they are given
        # back: one copy of the part's weights at a time
        raw_dir = Path(tempfile.mkdtemp(dir=folder, prefix=".traced."))
        try:
            traced = {}
            for g_i, graph in enumerate(graphs):
                progress.check()
                sub.update(0.05 + 0.3 * g_i / len(graphs), f"part {part.index + 1}/"
                                                           f"{len(plan)}: tracing {graph}.onnx")
                traced[graph] = trace_graph(wrapper, spec, graph, raw_dir / f"{graph}.onnx",
                                            part)
            module_names = {name for name, _ in wrapper.named_modules() if name}
            sub.update(0.35, f"part {part.index + 1}/{len(plan)}: transformers' reference")
            ref_out = _reference_part(wrapper, spec, self.ref)
            want_all = None
            if part.heads:  # the reference logits, before the head's weights are given back
                cap_key = self.family.final_softcap
                want_all = _reference_logits(self.ck.model.lm_head.weight.detach(), ref_out,
                                             spec["vocab_size"],
                                             getattr(self.ck.config, cap_key, None) if cap_key
                                             else None, folder)
            del wrapper
            self.ck.release(part)
            with shared_store(folder) as store:  # the part's graphs share its weights
                for g_i, graph in enumerate(graphs):
                    progress.check()
                    sub.update(0.4 + 0.1 * g_i / len(graphs), f"part {part.index + 1}/"
                                                              f"{len(plan)}: writing {graph}.onnx")
                    finish_graph(raw_dir / f"{graph}.onnx", folder / f"{graph}.onnx",
                                 module_names, *traced[graph], graph, store)
                    (raw_dir / f"{graph}.onnx").unlink()
                    (raw_dir / f"{graph}.onnx.data").unlink(missing_ok=True)
        finally:
            shutil.rmtree(raw_dir, ignore_errors=True)
        return ref_out, want_all

    def check_part(self, part: Part, folder: Path, ref_out, want_all, sub: Progress) -> None:
        """The exported part run on what the part before handed on: a middle part's hidden
        states handed to the next (marked finished with ``resume``); the last part's logits
        compared with transformers' (``want_all``)."""
        spec, n = self.spec, self.n
        if want_all is None:
            self.got = run_part_graphs(folder, part, spec, self.got, n, make_cpu_session,
                                       progress=SubProgress(sub, 0.5, 1.0))
            self.ref = ref_out
            if self.resume:  # finished: a re-run after a kill starts from the next part
                partresume.mark(folder, self.rows[-1], {"got": self.got, "ref": self.ref})
            return

        def on_logits(p: int, logits, want_all=want_all):
            want = np.array(want_all[p])
            self.compare.add(p, np.asarray(logits, dtype=np.float32)[: spec["vocab_size"]],
                             want)
            if p < self.n_ref:
                self.kept.append(want)

        try:
            run_part_graphs(folder, part, spec, self.got, n, make_cpu_session, on_logits,
                            SubProgress(sub, 0.5, 1.0))
        finally:
            _drop_memmap(want_all)


def export_part_ar_graphs(checkpoint_dir: Path, spec: dict, new_tokens: int, cache_slots: int,
                          out_dir: Path, progress: Progress = NullProgress()) -> list[Path]:
    """Every part's AR-N graph (:func:`iter_part_ar_graphs`), all exported."""
    return list(iter_part_ar_graphs(checkpoint_dir, spec, new_tokens, cache_slots, out_dir,
                                    progress))


def iter_part_ar_graphs(checkpoint_dir: Path, spec: dict, new_tokens: int, cache_slots: int,
                        out_dir: Path, progress: Progress = NullProgress()) -> Iterator[Path]:
    """The AR-N graph of each part of the model ``spec`` describes (exported in parts):
    ``new_tokens`` per pass over ``cache_slots`` cache slots, the verify graph's form
    (:func:`studio.engine.llm_export.export_ar_graph` for a whole model), read a part at a
    time from the checkpoint as :func:`export_parts` reads it; ``out_dir/<part>/ar.onnx``.
    Each takes and hands on what the part's decode graph does, under the same tensor names."""
    N, slots, C = int(new_tokens), int(cache_slots), int(spec["context_length"])
    if not 1 < N <= C or not 0 < slots <= C:
        raise StudioError(f"an AR-{N} graph over {slots} cache slots does not fit the context "
                          f"of {C}: choose 1 < N <= {C}")
    ck = StreamedCheckpoint(Path(checkpoint_dir))
    family = FAMILIES[ck.cfg["model_type"]]
    layer_types = layer_types_of(ck.config, family)
    rope_rows = rope_positions(ck.config, C)
    sliding_input = mask_windows(spec)[1] is not None
    ar_spec = dict(spec, verify_length=N, verify_cache_slots=slots)
    parts = list(iter_parts(spec))
    for part in parts:
        progress.check()
        progress.update(part.index / len(parts), f"part {part.index + 1}/{len(parts)}: "
                                                 f"exporting its AR-{N} graph")
        ck.load(part)
        try:
            wrapper = build_wrapper(ck.model, C, family, layer_types, sliding_input, rope_rows,
                                     part, rotary=ck.rotary)
            folder = Path(out_dir) / part.name
            folder.mkdir(parents=True, exist_ok=True)
            export_graph(wrapper, ar_spec, "verify", folder / "ar.onnx", progress, part)
            del wrapper
        finally:
            ck.release(part)
        # yielded as it is written: the caller can quantize it and let the FP32 graph go
        # before the next part's is exported (the 8 B shape's AR-16 graphs: 3.8 GB a part)
        yield folder / "ar.onnx"


def _reference_logits(head, hidden, vocab: int, cap: float | None, folder: Path):
    """transformers' logits at every position, ``hidden @ head.T`` (softcapped, cut to the
    vocabulary), a few positions at a time into a memory-mapped file in ``folder``: the head
    part's check then holds no copy of the head beside its graph's session (for an 8 B
    model's 128 k x 4096 head, 2 GiB less)."""
    hidden = np.asarray(hidden, dtype=np.float32)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".reference-logits.")
    os.close(fd)
    want = np.lib.format.open_memmap(name, mode="w+", dtype=np.float32,
                                     shape=(len(hidden), vocab))
    with torch.no_grad():
        for a in range(0, len(hidden), 64):
            rows = torch.from_numpy(hidden[a:a + 64]) @ head.to(torch.float32).T
            if cap is not None:
                rows = torch.tanh(rows / cap) * cap
            want[a:a + 64] = rows[:, :vocab].numpy()
    want.flush()
    return want


def _drop_memmap(array) -> None:
    """Remove the file behind a memory-mapped array made by :func:`_reference_logits`."""
    if array is None:
        return
    name = array.filename
    del array
    Path(name).unlink(missing_ok=True)
