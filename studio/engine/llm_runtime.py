"""Greedy generation and teacher forcing over the static-KV prefill/decode graphs.

Works with any session object that has ONNX Runtime's ``run(output_names, feeds)`` and
``get_inputs()`` (CPU sessions here, QNN HTP sessions elsewhere). The host keeps one numpy
KV cache [1,KV,C,D] per layer and tensor; prefill fills slots ``0..n-1`` and every decode
step writes its new row into slot ``pos``. Feeds are cast to each graph input's own dtype,
so float16 or uint8 (INT8-KV) edges work too; the cache takes the dtype of the decode
graph's ``past_*`` inputs. A graph compiled with quantized I/O (:mod:`studio.engine.graphio`)
takes its masks as floats its session quantizes, and its cache rows as the integers it gives.

Sliding-window attention (Mistral, Phi-3, Gemma 2's alternating layers, Qwen with
``use_sliding_window``), for a window W shorter than the cache: a sliding layer's mask is
the causal mask with every key at distance >= W from its query masked, which is what
transformers' sliding layers see (``kv_idx > q_idx - W``); cache slot ``j`` holds position
``j``. When every layer slides, ``attention_mask`` itself is windowed; when only some do
(Gemma 2), the graphs take a second additive mask, ``sliding_attention_mask``, of the same
shape, read by the sliding layers (see :func:`mask_windows`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.progress import Progress
from studio.engine import qnn
from studio.engine.chain import chain_session, part_dirs
from studio.engine.graphio import encoded
from studio.engine.kv_masks import (
    DEFAULT_MASK_VALUE,
    SLIDING_MASK,
    decode_mask,
    mask_windows,
    prefill_mask,
    sliding_window_of,
)
from studio.engine.onnxio import IMAGE_EMBEDS, load_spec
from studio.engine.ort_types import ORT_TO_NUMPY
from studio.engine.threads import HOST_THREADS
from studio.engine.vision_input import mrope_positions, vision_spec
from studio.engine.weightstore import WEIGHTS_FILE

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
ort = lazy_module("onnxruntime")
transformers = lazy_module("transformers")

_ORT_TYPES = ORT_TO_NUMPY


def make_cpu_session(path: Path, threads: int = HOST_THREADS):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads.

    A float graph whose weights are external data is handed them as views of one read-only
    mapping of its weights file, shared by every session of this process over that file
    (:func:`shared_weights`): a part's prefill and decode sessions then hold its weights
    once, where each session mapping the file itself counted them once per session.
    """
    path = Path(path)
    if not path.is_file():
        raise StudioError(f"model file {path} does not exist; export or quantize the model first")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    held: list[Any] = []
    if external_weights(path):
        graph = onnx.load(str(path), load_external_data=False)
        if not any(n.op_type == "DequantizeLinear" for n in graph.graph.node):
            # ONNX Runtime maps the 4 KiB-aligned external data, so a float graph's weights
            # stay the file's (reclaimable) pages; prepacking would copy every MatMul weight
            # into the process (1.7 x the weights at load): a model in parts then holds no
            # anonymous copy of them. Not for a quantized graph: its integer weights are a
            # quarter of the bytes, and without prepacking each run dequantizes them again
            # (the 3 B shape's quantized part: 9 s a prefill against 0.8 s; its float part:
            # 1.2 s against 0.65 s)
            opts.add_session_config_entry("session.disable_prepacking", "1")
            for name, array in shared_weights(path, graph):
                value = ort.OrtValue.ortvalue_from_numpy(array)
                opts.add_initializer(name, value)
                held.append(value)
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    # ONNX Runtime reads the values handed to it for as long as the session lives
    sess._studio_shared_weights = held
    return sess


#: open read-only mappings of weights files, by (file, size, mtime): alive while a session
#: (through its arrays' views) holds one
_MAPPINGS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_weights(path: Path, graph: Any) -> list[tuple[str, Any]]:
    """(name, array) for each external-data initializer of ``graph`` (the structure of the
    graph at ``path``): views of the process's one read-only mapping of each data file."""
    out = []
    for init in graph.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in init.external_data}
        file = (Path(path).parent / info["location"]).resolve()
        stat = file.stat()
        key = (str(file), stat.st_size, stat.st_mtime_ns)
        mapping = _MAPPINGS.get(key)
        if mapping is None:
            mapping = np.memmap(file, dtype=np.uint8, mode="r")
            _MAPPINGS[key] = mapping
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
        offset = int(info.get("offset", 0))
        count = int(np.prod(init.dims, dtype=np.int64)) if len(init.dims) else 1
        length = int(info.get("length", count * dtype.itemsize))
        if length != count * dtype.itemsize or offset % dtype.alignment:
            raise StudioError(f"{path.name}: weight {init.name} has {length} bytes at offset "
                              f"{offset} in {file.name}, not its shape's; export the model again")
        out.append((init.name, mapping[offset:offset + length].view(dtype).reshape(tuple(init.dims))))
    return out


def quantized(path: Path) -> bool:
    """Whether the graph at ``path`` is a QDQ graph (read without its weights)."""
    model = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == "DequantizeLinear" for n in model.graph.node)


def external_weights(path: Path) -> bool:
    """Whether the graph at ``path`` keeps its weights as external data beside it."""
    path = Path(path)
    return (path.parent / WEIGHTS_FILE).is_file() or path.with_name(path.name + ".data").is_file()


def load_tokenizer(export_dir: Path):
    """The tokenizer an export carries (``<export>/tokenizer``)."""
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(Path(export_dir) / "tokenizer"))


def load_graph_spec(graphs_dir: Path) -> dict[str, Any]:
    """The ``graph.json`` of a folder of static-KV graphs (an export, a quantized or compiled
    model)."""
    return load_spec(Path(graphs_dir))


def cpu_generator(graph_dir: Path, spec: dict[str, Any], threads: int = HOST_THREADS,
                  fixed_feeds: dict[str, Any] | None = None) -> StaticKVGenerator:
    """A generator over the prefill / decode (and verify, when there is one) graphs of
    ``graph_dir`` on the host CPU (ONNX Runtime); a model in parts runs its parts' graphs
    chained (:mod:`studio.engine.chain`). ``fixed_feeds``: inputs fed as they are to every
    pass (a draft's token table read from its target's: :mod:`studio.engine.shared_table`)."""
    graph_dir = Path(graph_dir)

    def make(path: Path):  # graphs with quantized I/O: through their encodings
        return encoded(make_cpu_session(path, threads), Path(path).parent, Path(path).stem)

    has_verify = all((d / "verify.onnx").is_file() for d in part_dirs(spec, graph_dir))
    return StaticKVGenerator(chain_session(spec, graph_dir, "prefill", make),
                             chain_session(spec, graph_dir, "decode", make), spec,
                             chain_session(spec, graph_dir, "verify", make) if has_verify
                             else None, fixed_feeds)


def htp_session_maker(chip, fp16: bool,
                      run_options: dict[str, str] | None = None) -> Callable[[Path], Any]:
    """``make(path)``: the HTP session of the compiled context of the graph ``path`` names
    (``<graph>_ctx.onnx`` beside it), with the backend's run-time options."""
    def make(path: Path):
        ctx = Path(path).with_name(Path(path).stem + "_ctx.onnx")
        # compiled with quantized I/O: the host quantizes masks, dequantizes the logits
        return encoded(qnn.make_session(ctx, chip, strict=True, fp16=fp16,
                                        extra_options=run_options), ctx.parent,
                       Path(path).stem)

    return make


def htp_generator(compile_dir: Path, chip, spec: dict[str, Any], fp16: bool,
                  run_options: dict[str, str] | None = None) -> StaticKVGenerator:
    """A generator over the compiled prefill / decode contexts of ``compile_dir`` on this
    machine's QNN HTP backend (the simulator on x86) for ``chip``; a model in parts runs
    its parts' context binaries chained."""
    make = htp_session_maker(chip, fp16, run_options)
    compile_dir = Path(compile_dir)
    return StaticKVGenerator(chain_session(spec, compile_dir, "prefill", make),
                             chain_session(spec, compile_dir, "decode", make), spec)


def _input_dtypes(session) -> dict[str, Any]:
    out = {}
    for i in session.get_inputs():
        out[i.name] = np.dtype(_ORT_TYPES.get(getattr(i, "type", "tensor(float)"), "float32"))
    return out


def constant_output_error(graph: str, logits, session, feeds: dict) -> StudioError | None:
    """The seed's "outputs all zero": a pass whose logits are one value everywhere (a real
    model never gives that) most often ran on inputs that were not bound as the graph
    expects. The error names the graph's inputs against what was fed; None when the logits
    vary."""
    a = np.asarray(logits)
    if a.size < 2 or a.max() != a.min():
        return None
    want = {i.name: (list(i.shape), str(i.type)) for i in session.get_inputs()}
    fed = {k: (list(np.shape(v)), str(getattr(v, "dtype", type(v).__name__)))
           for k, v in feeds.items()}
    missing = [n for n in want if n not in fed]
    extra = [n for n in fed if n not in want]
    shapes = [f"{n} {fed[n][0]} for {want[n][0]}" for n in want if n in fed
              and all(isinstance(d, int) for d in want[n][0]) and fed[n][0] != want[n][0]]
    if missing or extra or shapes:
        why = "; ".join(x for x in (
            f"not fed: {', '.join(missing)}" if missing else "",
            f"fed but not inputs of the graph: {', '.join(extra)}" if extra else "",
            f"shapes: {', '.join(shapes)}" if shapes else "") if x)
    else:
        why = (f"the {len(want)} inputs fed match the graph's names and shapes, so the runtime "
               "did not bind them or the binary computes nothing: run studio doctor --device "
               "D, then studio bisect")
    return StudioError(f"the {graph} graph returned the same logit everywhere ({float(a.flat[0]) + 0.0:g} "
                       f"over {a.size} values): its inputs were probably not bound as the "
                       f"graph expects ({why})")


class StaticKVGenerator:
    """Runs prefill once, then one decode step per token, with a host-side KV cache."""

    def __init__(self, prefill_session, decode_session, spec: dict, verify_session=None,
                 fixed_feeds: dict[str, Any] | None = None):
        try:
            self.num_layers = int(spec["num_layers"])
            self.num_kv_heads = int(spec["num_kv_heads"])
            self.head_dim = int(spec["head_dim"])
            self.vocab_size = int(spec["vocab_size"])
            self.prompt_len = int(spec["prompt_length"])
            self.context_len = int(spec["context_length"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StudioError(f"graph spec is incomplete ({exc}); re-export the model") from None
        self.mask_value = float(spec.get("mask_value", DEFAULT_MASK_VALUE))
        # the RoPE table's rows: the positions the graphs can place a token at
        self.rope_positions = int(spec.get("rope_positions") or self.context_len)
        self.ring_window: int | None = None  # see set_window
        self.pad_id = int(spec.get("pad_token_id") or 0)
        self.window = sliding_window_of(spec)
        self._full_window, self._sliding_window = mask_windows(spec)
        self.fixed_feeds = dict(fixed_feeds or {})  # fed as they are (no copy) to every pass
        self.prefill_session = prefill_session
        self.decode_session = decode_session
        self.verify_session = verify_session
        self.verify_len = 0
        if verify_session is not None:
            self._ver_types = _input_dtypes(verify_session)
            shape = next((i.shape for i in verify_session.get_inputs()
                          if i.name == "input_ids"), None)
            if not shape or not isinstance(shape[-1], int) or shape[-1] < 2:
                raise StudioError("the verify graph has no static input_ids [1, N] with N > 1; "
                                  "re-export the model")
            self.verify_len = int(shape[-1])
        self._pre_types = _input_dtypes(prefill_session)
        self._dec_types = _input_dtypes(decode_session)
        L = self.num_layers
        self._kv_names = [(f"past_key_{i}", f"past_value_{i}") for i in range(L)]
        self._present = [n for i in range(L) for n in (f"present_key_{i}", f"present_value_{i}")]
        self._outputs = ["logits", *self._present]
        for name in ("input_ids", "position_ids", "attention_mask"):
            for graph, types in (("prefill", self._pre_types), ("decode", self._dec_types)):
                if name not in types:
                    raise StudioError(
                        f"the {graph} graph has no input {name!r}; it is not a static-KV graph"
                    )
        for pair in self._kv_names:
            for name in pair:
                if name not in self._dec_types:
                    raise StudioError(
                        f"the decode graph has no input {name!r}; graph and graph.json do not match"
                    )
        for graph, types in (("prefill", self._pre_types), ("decode", self._dec_types)):
            has = SLIDING_MASK in types
            if has and self._sliding_window is None:
                raise StudioError(
                    f"the {graph} graph takes a {SLIDING_MASK} but graph.json declares no "
                    "sliding layers with a window shorter than the context; graph and "
                    "graph.json do not match"
                )
            if not has and self._sliding_window is not None:
                raise StudioError(
                    f"graph.json declares sliding layers with a window of {self._sliding_window} "
                    f"tokens but the {graph} graph takes no {SLIDING_MASK}; re-export the model"
                )
        self.cache_dtype = [(self._dec_types[k], self._dec_types[v]) for k, v in self._kv_names]
        # a vision-language model: the prefill graph takes the image's rows and the
        # multimodal positions; later tokens' positions carry the prompt's rope offset

        self.vision = vision_spec(spec)
        if (self.vision is not None) != (IMAGE_EMBEDS in self._pre_types):
            raise StudioError(
                "graph.json and the prefill graph disagree on whether the model takes an "
                "image: re-export the model")
        self._image: Any = None  # the next prefill's image rows [tokens, hidden]
        self._image_grid: tuple[int, int] | None = None  # ... and their grid
        self._next_offset = 0
        self.rope_offset = 0
        self.cache: list[list[Any]] = []
        self.reset()

    # ------------------------------------------------------------------ low level

    def reset(self) -> None:
        shape = (1, self.num_kv_heads, self.context_len, self.head_dim)
        self.cache = [[np.zeros(shape, kd), np.zeros(shape, vd)] for kd, vd in self.cache_dtype]
        self.slot_pos = np.full(self.context_len, -1, dtype=np.int64)  # position in each slot
        self.rope_offset = 0

    def set_image(self, embeds, grid: tuple[int, int] | None = None) -> None:
        """The image rows (the vision encoder's output, [tokens, hidden]) the next prefill
        puts at its prompt's image tokens, and their grid (rows, columns of image tokens;
        None: the encoder's full square) for the multimodal positions (a vision-language
        model only); used once."""
        vs = self.vision
        if vs is None:
            raise StudioError("this model takes no image: it is not a vision-language model")
        gh, gw = (vs.llm_grid, vs.llm_grid) if grid is None else (int(grid[0]), int(grid[1]))
        arr = np.asarray(embeds, dtype=np.float32)
        if arr.shape != (gh * gw, vs.embed_dim) or gh * gw > vs.tokens:
            raise StudioError(f"the image rows are {list(arr.shape)}, the model takes "
                              f"[{gh * gw}, {vs.embed_dim}] for a {gh} x {gw} image (at most "
                              f"{vs.tokens} rows): run its vision encoder")
        self._image, self._image_grid = arr, (gh, gw)

    def _image_feeds(self, ids: list[int], types: dict) -> dict:
        """A VL prefill's ``position_ids`` [3, 1, P] and ``image_embeds`` [1, P, hidden]."""
        vs, P, n = self.vision, self.prompt_len, len(ids)
        assert vs is not None
        at = np.asarray(ids) == vs.image_token_id
        if at.any() and self._image is None:
            raise StudioError(f"the prompt holds {int(at.sum())} image tokens but no image was "
                              "given: give --image or leave the image tokens out")
        if not at.any() and self._image is not None:
            raise StudioError("an image was given but the prompt holds no image tokens: build "
                              "the prompt with the image's placeholder (image_prompt)")
        pos3, delta = mrope_positions(ids, vs, self._image_grid if at.any() else None)
        positions = np.zeros((3, 1, P), dtype=np.int64)
        positions[:, 0, :n] = pos3
        if n < P:  # the padding rows: masked, placed past the prompt
            positions[:, 0, n:] = int(pos3.max()) + 1 + np.arange(P - n)
        rows = np.zeros((1, P, vs.embed_dim), dtype=np.float32)
        if at.any():
            rows[0, :n][at] = self._image
        self._next_offset = delta
        return {"position_ids": self._cast(types, "position_ids", positions),
                IMAGE_EMBEDS: self._cast(types, IMAGE_EMBEDS, rows)}

    def set_window(self, window: int | None) -> None:
        """Attend to the last ``window`` tokens only (<= C) and keep the cache as a ring
        buffer: position p lives in slot p mod C, so generation runs past the C slots, up to
        the RoPE table's ``rope_positions``. Keys keep their own absolute rotation; masks
        come from which position each slot holds. None: the plain static cache."""
        if window is not None:
            window = int(window)
            if not 1 <= window <= self.context_len:
                raise StudioError(f"the window must be 1..{self.context_len} tokens (the KV "
                                  f"cache's slots), not {window}")
        self.ring_window = window

    def _ring(self, window: int | None) -> int | None:
        """A layer's window narrowed to the ring's."""
        if self.ring_window is None:
            return window
        return self.ring_window if window is None else min(window, self.ring_window)

    def _ring_mask(self, pos: int, window: int | None):
        """Decode mask [C + 1] from the slots' positions: slot s is visible when it holds a
        position q with pos - window < q < pos (window: the smaller of the ring's and the
        layer's own)."""
        w = self._ring(window) or self.context_len
        q = self.slot_pos
        visible = (q >= 0) & (q < pos) & (q > pos - int(w))
        mask = np.full((self.context_len + 1,), self.mask_value, dtype=np.float32)
        mask[:-1][visible] = 0.0
        mask[-1] = 0.0
        return mask

    def _fixed(self, feeds: dict, types: dict) -> dict:
        feeds.update((k, v) for k, v in self.fixed_feeds.items() if k in types)
        return feeds

    def _cast(self, types: dict, name: str, value):
        dt = types[name]
        if value.dtype.kind == "f" and dt.kind in "ui":
            # a mask fed to a graph with quantized I/O: its session quantizes it with the
            # input's encoding (each part's own); a bare cast would not
            return value
        return value if value.dtype == dt else value.astype(dt)

    def prefill_feed(self, ids: list[int]) -> dict:
        """Feeds for the prefill graph: ``ids`` right-padded to P and masked."""
        n, P = len(ids), self.prompt_len
        if n == 0:
            raise StudioError("the prompt is empty; give at least one token")
        if n > P:
            raise StudioError(
                f"the prompt has {n} tokens but the prefill graph takes at most P={P}; "
                "shorten the prompt or re-export with a larger prompt length"
            )
        input_ids = np.full((1, P), self.pad_id, dtype=np.int64)
        input_ids[0, :n] = ids
        pos = np.arange(P, dtype=np.int64)[None]
        mask = prefill_mask(n, P, self.mask_value, self._ring(self._full_window))
        t = self._pre_types
        feeds = {
            "input_ids": self._cast(t, "input_ids", input_ids),
            "position_ids": self._cast(t, "position_ids", pos),
            "attention_mask": self._cast(t, "attention_mask", mask[None, None]),
        }
        if self._sliding_window is not None:
            window = prefill_mask(n, P, self.mask_value, self._ring(self._sliding_window))
            feeds[SLIDING_MASK] = self._cast(t, SLIDING_MASK, window[None, None])
        if self.vision is not None:
            feeds.update(self._image_feeds(ids, t))
        return self._fixed(feeds, t)

    def decode_feed(self, token: int, pos: int, copy: bool = False) -> dict:
        """Feeds for one decode step of ``token`` at position ``pos`` over the current cache."""
        C = self.context_len
        if self.ring_window is not None:
            if not 0 <= pos < self.rope_positions:
                raise StudioError(f"position {pos} is past the {self.rope_positions} positions "
                                  "of the RoPE table; re-export with a longer context")

            def masked(window):
                return self._ring_mask(pos, window)
        else:
            if not 0 <= pos < C:
                raise StudioError(f"position {pos} is outside the KV cache of {C} slots")

            def masked(window):
                return decode_mask(pos, C, self.mask_value, window)
        mask = masked(self._full_window)[None, None, None]
        t = self._dec_types
        feeds = {
            "input_ids": self._cast(t, "input_ids", np.array([[token]], dtype=np.int64)),
            "position_ids": self._cast(t, "position_ids",
                                       np.array([[pos + self.rope_offset]], dtype=np.int64)),
            "attention_mask": self._cast(t, "attention_mask", mask),
        }
        if self._sliding_window is not None:
            window = masked(self._sliding_window)[None, None, None]
            feeds[SLIDING_MASK] = self._cast(t, SLIDING_MASK, window)
        for (kn, vn), (k, v) in zip(self._kv_names, self.cache, strict=True):
            feeds[kn] = k.copy() if copy else k
            feeds[vn] = v.copy() if copy else v
        return self._fixed(feeds, t)

    def verify_feed(self, tokens: list[int], pos: int) -> dict:
        """Feeds for the verify graph: ``tokens`` (at most N) at positions ``pos``.., over
        the cache slots ``0..pos-1``; padding rows see only themselves."""
        N, C, n = self.verify_len, self.context_len, len(tokens)
        if not 0 < n <= N:
            raise StudioError(f"the verify graph takes 1..{N} tokens, not {n}")
        if pos + n > C:
            raise StudioError(f"positions {pos}..{pos + n - 1} run past the KV cache of {C} slots")
        ids = np.full((1, N), self.pad_id, dtype=np.int64)
        ids[0, :n] = tokens
        positions = np.minimum(np.arange(pos, pos + N, dtype=np.int64), C - 1)[None]
        positions = positions + self.rope_offset

        def mask(window: int | None):
            m = np.full((N, C + N), self.mask_value, dtype=np.float32)
            for j in range(N):
                if j < n:
                    first = 0 if window is None else max(0, pos + j - int(window) + 1)
                    m[j, first:pos] = 0.0
                    lo = 0 if window is None else max(0, j - int(window) + 1)
                    m[j, C + lo:C + j + 1] = 0.0
                else:
                    m[j, C + j] = 0.0
            return m[None, None]

        t = self._ver_types
        feeds = {
            "input_ids": self._cast(t, "input_ids", ids),
            "position_ids": self._cast(t, "position_ids", positions),
            "attention_mask": self._cast(t, "attention_mask", mask(self._full_window)),
        }
        if self._sliding_window is not None:
            feeds[SLIDING_MASK] = self._cast(t, SLIDING_MASK, mask(self._sliding_window))
        for (kn, vn), (k, v) in zip(self._kv_names, self.cache, strict=True):
            feeds[kn] = k
            feeds[vn] = v
        return self._fixed(feeds, t)

    def verify(self, tokens: list[int], pos: int):
        """One pass of the verify graph over ``tokens`` at positions ``pos``..; writes their KV
        rows into slots ``pos..pos+n-1`` and returns their logits [n, V] (float32). Rows of
        tokens later rejected stay in the cache but are never visible: every mask hides the
        slots at and after the next write position, so rolling back is not advancing."""
        if self.verify_session is None:
            raise StudioError("this model has no verify graph: re-export it (export stage)")
        n = len(tokens)
        if self.ring_window is not None and self.ring_window < self.context_len:
            raise StudioError("the verify graph sees the whole cache: not with a window "
                              "shorter than the context")
        outs = self.verify_session.run(self._outputs, self.verify_feed(tokens, pos))
        for i in range(self.num_layers):
            for j in range(2):
                self.cache[i][j][:, :, pos:pos + n, :] = outs[1 + 2 * i + j][:, :, :n, :]
        self.slot_pos[pos:pos + n] = range(pos, pos + n)
        return np.asarray(outs[0][0, :n], dtype=np.float32)

    def prefill_prompt(self, ids: list[int], progress: Progress | None = None):
        """Prefill a prompt of any length below C: the first P tokens through the prefill
        graph, the rest in chunks of the verify graph (N at a time) or, without one, by
        decode steps. Returns (logits of the last prompt token [V], number of passes)."""
        n = len(ids)
        k = min(n, self.prompt_len)
        vs = self.vision
        if vs is not None and vs.image_token_id in ids[k:]:  # only the prefill takes an image
            end = len(ids) - ids[::-1].index(vs.image_token_id)
            raise StudioError(
                f"the image's tokens end at token {end} of the prompt, but the prefill graph "
                f"takes {k} at once and only it takes an image: put less before the image (a "
                f"chat template's text goes first), or re-export with export.prompt_length "
                f"{end} or more")
        logits = self.prefill(ids[:k])[-1]
        passes = 1
        pos = k
        while pos < n:
            if progress is not None:
                progress.check()
            if self.verify_len and (self.ring_window is None
                                    or self.ring_window >= self.context_len):
                chunk = ids[pos:pos + self.verify_len]
                logits = self.verify(chunk, pos)[-1]
                pos += len(chunk)
            else:
                logits = self.step(ids[pos], pos)
                pos += 1
            passes += 1
        return logits, passes

    def prefill(self, ids: list[int]):
        """Run prefill on ``ids`` (<= P tokens), fill cache slots 0..n-1; logits [n, V] float32."""
        feeds = self.prefill_feed(ids)
        n = len(ids)
        outs = self.prefill_session.run(self._outputs, feeds)
        bad = constant_output_error("prefill", outs[0][0, :n], self.prefill_session, feeds)
        if bad is not None:
            raise bad
        self.reset()
        if self.vision is not None:  # the image was for this prefill; its offset stays
            self._image, self._image_grid = None, None
            self.rope_offset = self._next_offset
        for i in range(self.num_layers):
            for j in range(2):
                row = outs[1 + 2 * i + j]
                self.cache[i][j][:, :, :n, :] = row[:, :, :n, :]
        self.slot_pos[:n] = range(n)
        return np.asarray(outs[0][0, :n], dtype=np.float32)

    def step(self, token: int, pos: int):
        """One decode step; writes the new KV row into slot ``pos``; logits [V] float32."""
        feeds = self.decode_feed(token, pos)
        outs = self.decode_session.run(self._outputs, feeds)
        bad = constant_output_error("decode", outs[0][0, -1], self.decode_session, feeds)
        if bad is not None:
            raise bad
        slot = pos % self.context_len
        for i in range(self.num_layers):
            for j in range(2):
                self.cache[i][j][:, :, slot : slot + 1, :] = outs[1 + 2 * i + j]
        self.slot_pos[slot] = pos
        return np.asarray(outs[0][0, -1], dtype=np.float32)

    # ------------------------------------------------------------------ high level

    def greedy(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        eos_id: int | Iterable[int] | None = None,
        on_step: Callable[[int, int], None] | None = None,
        progress: Progress | None = None,
    ) -> dict:
        """Greedy decoding (see :meth:`generate`)."""
        return self.generate(prompt_ids, max_new_tokens, eos_id=eos_id, on_step=on_step,
                             progress=progress)

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampler: Any = None,
        eos_id: int | Iterable[int] | None = None,
        stop: Callable[[list[int]], bool] | None = None,
        on_step: Callable[[int, int], None] | None = None,
        progress: Progress | None = None,
    ) -> dict:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        A prompt longer than the prefill graph's P tokens is prefilled in chunks
        (:meth:`prefill_prompt`) — it must leave room in the C cache slots. ``sampler``
        (:class:`studio.core.sampling.Sampler`; None: greedy) picks each token. Generation
        stops after ``max_new_tokens``, at an EOS token (kept in ``tokens``, as
        ``transformers`` does), when ``stop(tokens)`` says so (stop sequences), or when the
        cache is full. ``on_step(index, token)`` is called for every new token.

        Returns ``{"tokens", "ttft_s", "prefill_s", "prompt_chunks", "step_s", "stopped"}``:
        ``ttft_s`` is the time from the call to the first token, ``step_s`` one entry per
        later token.
        """
        prompt_ids = checked_prompt(prompt_ids, max_new_tokens, self.context_len)
        n = len(prompt_ids)
        pick = sampler.pick if sampler is not None else (lambda x: int(x.argmax()))
        eos = (
            set() if eos_id is None else ({int(eos_id)} if isinstance(eos_id, int) else set(eos_id))
        )
        tokens: list[int] = []
        step_s: list[float] = []
        out = {"tokens": tokens, "ttft_s": 0.0, "prefill_s": 0.0, "prompt_chunks": 0,
               "step_s": step_s, "stopped": "max_new_tokens"}
        if max_new_tokens == 0:
            return out
        if progress is not None:
            progress.check()
        t0 = time.perf_counter()
        logits, out["prompt_chunks"] = self.prefill_prompt(prompt_ids, progress)
        tok = pick(logits)
        out["ttft_s"] = out["prefill_s"] = time.perf_counter() - t0
        tokens.append(tok)
        if on_step is not None:
            on_step(0, tok)
        pos = n
        last = self.context_len if self.ring_window is None else self.rope_positions
        while True:
            stopped = why_stop(tok, eos, stop, tokens, max_new_tokens, pos, last)
            if stopped is not None:
                break
            if progress is not None:
                progress.check()
                progress.update(
                    len(tokens) / max_new_tokens, f"token {len(tokens)}/{max_new_tokens}"
                )
            t0 = time.perf_counter()
            logits = self.step(tok, pos)
            tok = pick(logits)
            step_s.append(time.perf_counter() - t0)
            pos += 1
            tokens.append(tok)
            if on_step is not None:
                on_step(len(tokens) - 1, tok)
        out["stopped"] = stopped
        if progress is not None:
            progress.update(1.0, f"{len(tokens)} tokens")
        return out

    def teacher_forced_logits(self, ids: list[int], progress: Progress | None = None):
        """Logits [len(ids), V] (float32): prefill on the first min(P, n) ids, then decode
        steps feeding the true tokens. Row i predicts token i + 1."""
        ids = [int(t) for t in ids]
        n = len(ids)
        if n == 0:
            raise StudioError("no tokens to score; give at least one token")
        if n > self.context_len:
            raise StudioError(
                f"{n} tokens do not fit the KV cache of C={self.context_len}; score windows of at most C tokens"
            )
        k = min(self.prompt_len, n)
        if progress is not None:
            progress.check()
        out = np.empty((n, self.vocab_size), dtype=np.float32)
        out[:k] = self.prefill(ids[:k])[:, : self.vocab_size]
        for pos in range(k, n):
            if progress is not None:
                progress.check()
                progress.update((pos - k) / max(1, n - k), f"token {pos}/{n}")
            out[pos] = self.step(ids[pos], pos)[: self.vocab_size]
        if progress is not None:
            progress.update(1.0, f"{n} tokens scored")
        return out


# ---- one generation's rules (shared by every generator that runs StaticKVGenerator.generate,
# the deployed one included) -------------------------------------------------------------------
def checked_prompt(prompt_ids: list[int], max_new_tokens: int, context_len: int) -> list[int]:
    """The prompt as ints; refused empty, past the cache, or with a negative count."""
    prompt_ids = [int(t) for t in prompt_ids]
    n = len(prompt_ids)
    if n == 0:
        raise StudioError("the prompt is empty; give at least one token")
    if n >= context_len:
        raise StudioError(
            f"the prompt has {n} tokens but the KV cache holds {context_len}: shorten "
            "the prompt or re-export with a longer context"
        )
    if max_new_tokens < 0:
        raise StudioError(f"max_new_tokens must be >= 0 (got {max_new_tokens})")
    return prompt_ids


def why_stop(tok: int, eos: set, stop: Callable[[list[int]], bool] | None, tokens: list[int],
             max_new_tokens: int, pos: int, last_position: int) -> str | None:
    """Why generation stops before the next token (None: it goes on)."""
    if tok in eos:
        return "eos"
    if stop is not None and stop(tokens):
        return "stop"
    if len(tokens) >= max_new_tokens:
        return "max_new_tokens"
    if pos >= last_position:
        return "context_full"
    return None
