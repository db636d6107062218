"""Genie bundles: the studio's quantized decode graph in the form Qualcomm's Genie runtime
loads, the bundle folder a device takes (``genie_config.json``, the context binaries,
``tokenizer.json``, a manifest), and Genie itself (``libGenie.so`` from the installed
``onnxruntime-qnn`` wheel) run on this host's HTP simulator to check a bundle.

Genie's graph conventions (verified here on the simulator): KV inputs ``past_key_{i}_in``
(keys transposed, ``[1, kv_heads, head_dim, CL - AR]``) and ``past_value_{i}_in`` (``[1,
kv_heads, CL - AR, head_dim]``), outputs ``past_{key,value}_{i}_out`` holding only the AR new
rows, int32 ``input_ids`` / ``position_ids``, a uint16 ``attention_mask`` (Genie writes 0 where
a slot is hidden and the quantized "visible" value elsewhere), RoPE inside the graph
(``positional-encoding: absolute``). The studio's decode graph is AR-1 with C cache slots and
a mask over C + 1 positions, so its Genie context size is CL = C + 1.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import Cancelled, StudioError
from studio.core.lazyimport import lazy_module
from studio.core.parts import hidden_name
from studio.engine.checkpoint_check import check_tokenizer
from studio.engine.graphio import set_cache_encodings
from studio.engine.qnn import capture_native_stderr

onnx = lazy_module("onnx")
helper = lazy_module("onnx.helper")
numpy_helper = lazy_module("onnx.numpy_helper")
shape_inference = lazy_module("onnx.shape_inference")
utils = lazy_module("onnx.utils")

# ---- the graph ------------------------------------------------------------------------------
#: the residual stream one part of a model hands the next (``hidden_states_after_{block}``)
HANDOFF = hidden_name(0).removesuffix("0")


def genie_graph(src: Path, dst: Path, spec: dict[str, Any],
                handoff_in: dict[str, tuple[Any, Any]] | None = None,
                kv_encodings: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rewrite a quantized (QDQ) graph over the static KV cache — the AR-1 decode graph or an
    AR-N graph (N new tokens over CL - N slots) — into Genie's I/O conventions at ``dst``. The
    arithmetic inside is untouched: ids become int32 (Gather takes them), the mask input is
    the graph's own uint16 quantized mask (its QuantizeLinear dropped: raw 0 is the mask
    value, raw 65535 is 0 — what Genie writes), keys go in transposed through a quantized
    Transpose, and the new key rows come out as ``[1, kv, head_dim, N]``. Returns the I/O,
    the context size CL and N.

    A part of a model exported in parts (:mod:`studio.core.parts`) takes the residual stream
    ``hidden_states_after_{k}`` instead of the ids or hands it on instead of the logits: it
    passes as its *quantized* uint16 values (the QuantizeLinear on the taking side, the
    DequantizeLinear on the handing side dropped), so Genie copies raw values from part to
    part. ``handoff_in`` gives such an input the (scale, zero point) of the part that hands
    it (both sides then read the same integers alike); the result's ``handoff_out`` gives
    this part's, for the next.

    ``kv_encodings`` (:func:`studio.engine.graphio.cache_encodings`: one encoding per cache
    tensor, the same for every graph of the bundle) makes the KV cache quantized I/O: the
    ``past_*_in`` inputs and ``past_*_out`` rows are uint16 with that encoding, so Genie
    copies the new rows into its cache as they come and the NPU converts no cache at the
    edge (``htp.graph_io = "quantized"``)."""
    model = onnx.load(str(src))
    qkv = kv_encodings is not None
    if qkv:
        if not set_cache_encodings(model, kv_encodings or {}):
            raise StudioError(f"{src.name}: no KV cache edge is a Q/DQ pair: its cache cannot "
                              "be quantized I/O")
    rw = _GenieRewrite(src, model, spec, qkv, dict(handoff_in or {}))
    g = model.graph
    for inp in g.input:
        rw.rewrite_input(inp.name)
    rw.producers = {o: n for n in rw.nodes for o in n.output}
    for out in g.output:
        rw.rewrite_output(out)
    del g.node[:]
    g.node.extend(rw.nodes)
    del g.input[:]
    g.input.extend(rw.inputs)
    del g.output[:]
    g.output.extend(rw.outputs)
    del g.value_info[:]
    onnx.checker.check_model(model)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    if rw.handoff_in:
        raise StudioError(f"{src.name} takes no {', '.join(rw.handoff_in)}: not the next part")
    return {"inputs": [i.name for i in rw.inputs], "outputs": [o.name for o in rw.outputs],
            "context_size": rw.C + rw.S, "ar": rw.S, "handoff_out": rw.handoff_out}


class _GenieRewrite:
    """:func:`genie_graph`'s rewrite of one graph: its nodes as they are being changed, the
    new inputs and outputs, and the sizes they take (S new tokens, C cache slots)."""

    def __init__(self, src: Path, model, spec: dict[str, Any], qkv: bool,
                 handoff_in: dict[str, tuple[Any, Any]]) -> None:
        g = model.graph
        self.src, self.g, self.qkv, self.handoff_in = src, g, qkv, handoff_in
        self.kv_type = onnx.TensorProto.UINT16 if qkv else onnx.TensorProto.FLOAT
        self.kvh, self.hd = int(spec["num_kv_heads"]), int(spec["head_dim"])
        dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input}
        keys = [n for n in dims if n.startswith("past_key_")]
        if "position_ids" not in dims or not keys:
            raise StudioError(f"{src.name} is not a graph over the KV cache (no position_ids / "
                              "past_key_*): a Genie graph is made from the decode or an AR-N "
                              "graph")
        self.S, self.C = int(dims["position_ids"][1]), int(dims[keys[0]][2])  # new, slots
        self.hidden = int(spec["hidden_size"])
        self.handoff_out: dict[str, tuple[Any, Any]] = {}
        self.inits = {i.name: i for i in g.initializer}
        self.nodes = list(g.node)
        self.producers: dict[str, Any] = {}
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []

    def rename_uses(self, old: str, new: str, skip=None) -> None:
        for n in self.nodes:
            if n is skip:
                continue
            for k, x in enumerate(n.input):
                if x == old:
                    n.input[k] = new

    def quantize_of(self, name: str):
        q = [n for n in self.nodes if n.op_type == "QuantizeLinear" and n.input[0] == name]
        if len(q) != 1:
            raise StudioError(f"{self.src.name}: input {name} is not quantized once (found "
                              f"{len(q)} QuantizeLinear): a Genie graph is made from the "
                              "quantized graph")
        return q[0]

    def rewrite_input(self, name: str) -> None:
        if name in ("input_ids", "position_ids"):
            self.inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.INT32,
                                                             [1, self.S]))
        elif name == "attention_mask":
            self.mask_input(name)
        elif name.startswith(HANDOFF):
            self.handoff_input(name)
        elif name.startswith("past_key_"):
            self.key_input(name)
        elif name.startswith("past_value_"):
            self.value_input(name)
        else:
            raise StudioError(f"{self.src.name}: input {name} has no Genie counterpart (a "
                              "sliding window mask or an extra input): this model cannot be "
                              "bundled yet")

    def mask_input(self, name: str) -> None:
        """The graph's own uint16 quantized mask: its QuantizeLinear dropped."""
        q = self.quantize_of(name)
        zp = numpy_helper.to_array(next(i for i in self.g.initializer if i.name == q.input[2]))
        if zp.dtype != np.uint16 or int(zp) != 65535:
            raise StudioError(f"{self.src.name}: the attention mask is not quantized as uint16 "
                              "with 0 at 65535: Genie's mask cannot feed it")
        self.nodes.remove(q)
        self.rename_uses(q.output[0], name)
        self.inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.UINT16,
                                                         [1, 1, self.S, self.C + self.S]))

    def handoff_input(self, name: str) -> None:
        """The residual stream a part takes, as the handing part's uint16 integers."""
        inits = self.inits
        q = self.quantize_of(name)
        if name in self.handoff_in:  # the handing part's encodings, exactly
            for k, value in zip(q.input[1:3], self.handoff_in.pop(name), strict=True):
                inits[k].CopyFrom(numpy_helper.from_array(np.asarray(value).reshape(
                    numpy_helper.to_array(inits[k]).shape).astype(
                    numpy_helper.to_array(inits[k]).dtype), k))
        if numpy_helper.to_array(inits[q.input[2]]).dtype != np.uint16:
            raise StudioError(f"{self.src.name}: {name} is not quantized as uint16: parts "
                              "cannot hand it on raw (quantize with 16-bit activations)")
        self.nodes.remove(q)
        self.rename_uses(q.output[0], name)
        self.inputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.UINT16,
                                                         [1, self.S, self.hidden]))

    def key_input(self, name: str) -> None:
        """A cache of keys, going in transposed through a quantized Transpose."""
        nodes = self.nodes
        new = f"{name}_in"
        q = self.quantize_of(name)
        dq = next(n for n in nodes if n.op_type == "DequantizeLinear"
                  and n.input[0] == q.output[0])
        if self.qkv:  # the integers go straight into the DequantizeLinear
            nodes.remove(q)
            dq.input[0] = new
        else:
            q.input[0] = new
        t, tq, tdq = f"{new}_T", f"{new}_TQ", f"{new}_TDQ"
        self.rename_uses(dq.output[0], tdq, skip=dq)
        at = nodes.index(dq) + 1
        nodes[at:at] = [
            helper.make_node("Transpose", [dq.output[0]], [t], perm=[0, 1, 3, 2],
                             name=f"{new}_transpose"),
            helper.make_node("QuantizeLinear", [t, q.input[1], q.input[2]], [tq],
                             name=f"{new}_transpose_Q"),
            helper.make_node("DequantizeLinear", [tq, q.input[1], q.input[2]], [tdq],
                             name=f"{new}_transpose_DQ"),
        ]
        self.inputs.append(helper.make_tensor_value_info(new, self.kv_type,
                                                         [1, self.kvh, self.hd, self.C]))

    def value_input(self, name: str) -> None:
        new = f"{name}_in"
        if self.qkv:
            q = self.quantize_of(name)
            self.nodes.remove(q)
            self.rename_uses(q.output[0], new)
        else:
            self.rename_uses(name, new)
        self.inputs.append(helper.make_tensor_value_info(new, self.kv_type,
                                                         [1, self.kvh, self.C, self.hd]))

    def rewrite_output(self, out) -> None:
        name = out.name
        if name.startswith("present_key_"):
            self.key_output(name)
        elif name.startswith("present_value_"):
            self.value_output(name)
        elif name.startswith(HANDOFF):
            self.handoff_output(name)
        else:
            self.outputs.append(out)

    def key_output(self, name: str) -> None:
        """The new key rows, out as ``[1, kv, head_dim, N]``."""
        kvh, hd, S, qkv = self.kvh, self.hd, self.S, self.qkv
        new = name.replace("present_", "past_") + "_out"
        dq = self.producers[name]
        pre = f"{new}_pre"
        dq.output[0] = pre
        self.rename_uses(name, pre)
        if S == 1:  # [1, kv, 1, hd] -> [1, kv, hd, 1] is a reshape
            shape = numpy_helper.from_array(np.array([1, kvh, hd, 1], np.int64),
                                            f"{new}_shape")
            self.g.initializer.append(shape)
            rows = helper.make_node("Reshape", [pre, shape.name], [f"{new}_R"],
                                    name=f"{new}_rows")
        else:
            rows = helper.make_node("Transpose", [pre], [f"{new}_R"], perm=[0, 1, 3, 2],
                                    name=f"{new}_rows")
        self.nodes += [
            rows,
            helper.make_node("QuantizeLinear", [f"{new}_R", dq.input[1], dq.input[2]],
                             [new if qkv else f"{new}_RQ"], name=f"{new}_rows_Q"),
        ]
        if not qkv:
            self.nodes.append(helper.make_node("DequantizeLinear",
                                               [f"{new}_RQ", dq.input[1], dq.input[2]], [new],
                                               name=f"{new}_rows_DQ"))
        self.outputs.append(helper.make_tensor_value_info(new, self.kv_type, [1, kvh, hd, S]))

    def value_output(self, name: str) -> None:
        new = name.replace("present_", "past_") + "_out"
        dq = self.producers[name]
        q = self.producers.get(dq.input[0]) if self.qkv else None
        if self.qkv and q is not None and q.op_type == "QuantizeLinear":
            # the row leaves as the integers its QuantizeLinear gives; the layer's own
            # use of it reads them through the DequantizeLinear
            q.output[0] = new
            dq.input[0] = new
        elif self.qkv:
            raise StudioError(f"{self.src.name}: {name} does not leave through a Q/DQ pair: "
                              "its cache cannot be quantized I/O")
        else:
            dq.output[0] = new
            self.rename_uses(name, new)
        self.outputs.append(helper.make_tensor_value_info(new, self.kv_type,
                                                          [1, self.kvh, self.S, self.hd]))

    def handoff_output(self, name: str) -> None:
        """The residual stream a part hands on, as its uint16 integers (its DequantizeLinear
        dropped); its encoding into ``handoff_out`` for the next part."""
        inits, nodes = self.inits, self.nodes
        dq = self.producers.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            raise StudioError(f"{self.src.name}: {name} does not come out of a "
                              "DequantizeLinear: a part hands on a quantized graph's "
                              "residual stream")
        raw = dq.input[0]
        if numpy_helper.to_array(inits[dq.input[2]]).dtype != np.uint16:
            raise StudioError(f"{self.src.name}: {name} is not quantized as uint16: parts "
                              "cannot hand it on raw (quantize with 16-bit activations)")
        self.handoff_out[name] = (numpy_helper.to_array(inits[dq.input[1]]),
                                  numpy_helper.to_array(inits[dq.input[2]]))
        nodes.remove(dq)
        self.rename_uses(name, raw)  # a use inside the part reads its own quantized copy
        self.producers[raw].output[0] = name
        self.rename_uses(raw, name)
        if any(name in n.input for n in nodes if n.op_type != "DequantizeLinear"):
            raise StudioError(f"{self.src.name}: {name} is read unquantized inside the part")
        self.outputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.UINT16,
                                                          [1, self.S, self.hidden]))


def graph_io(path: Path) -> dict[str, list[str]]:
    """A graph's input and output names."""
    g = onnx.load(str(path), load_external_data=False).graph
    return {"inputs": [i.name for i in g.input], "outputs": [o.name for o in g.output]}


# ---- the config -----------------------------------------------------------------------------
def genie_config(spec: dict[str, Any], ctx_bins: list[str], chip=None,
                 tokenizer: str = "tokenizer.json") -> dict[str, Any]:
    """A ``basic`` dialog with greedy sampling over the bundle's context binaries (paths
    relative to the bundle folder, as on the device)."""
    eos = spec.get("eos_token_id")
    backend: dict[str, Any] = {"version": 1, "use-mmap": False, "spill-fill-bufsize": 0,
                               "mmap-budget": 0, "poll": False, "cpu-mask": "0xe0",
                               "kv-dim": int(spec["head_dim"]), "allow-async-init": False}
    return {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": int(spec["context_length"]) + 1,
                    "n-vocab": int(spec["vocab_size"]), "bos-token": -1,
                    "eos-token": int(eos) if eos is not None else -1},
        "sampler": {"version": 1, "seed": 42, "temp": 1.0, "top-k": 1, "top-p": 1.0,
                    "greedy": True},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {"version": 1, "n-threads": 1,
                   "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": backend},
                   "model": {"version": 1, "type": "binary",
                             "binary": {"version": 1, "ctx-bins": list(ctx_bins)},
                             "positional-encoding": {"type": "absolute"}}},
    }}


def local_config(bundle: Path, name: str = "genie_config.json") -> dict[str, Any]:
    """The bundle's own ``genie_config.json`` (or the config ``name``: a dialog with two
    engines, ``spd``, too) with its file paths made absolute (Genie resolves relative paths
    from the current folder)."""
    path = Path(bundle) / name
    try:
        cfg = json.loads(path.read_text())
        dialog = cfg["dialog"]
        tok = dialog["tokenizer"]
        engines = dialog["engine"] if isinstance(dialog["engine"], list) else [dialog["engine"]]
        binaries = [e["model"]["binary"] for e in engines]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StudioError(f"{path} is not a Genie dialog config ({exc}): build the bundle "
                          "again") from None
    tok["path"] = str((Path(bundle) / tok["path"]).resolve())
    if not Path(tok["path"]).is_file():
        raise StudioError(f"the bundle has no {Path(tok['path']).name} (genie_config.json names "
                          "it): copy the model's tokenizer.json into the bundle")
    # Genie loads a broken tokenizer without a word and fails later: check it here

    check_tokenizer(Path(tok["path"]).parent, int(dialog["context"]["n-vocab"]))
    for binary in binaries:
        bins = []
        for b in binary["ctx-bins"]:
            p = (Path(bundle) / b).resolve()
            if not p.is_file():
                raise StudioError(f"the bundle has no context binary {b} ({name} lists it): "
                                  "build the bundle again")
            bins.append(str(p))
        binary["ctx-bins"] = bins
    return cfg


# ---- the runtime ----------------------------------------------------------------------------
def library_path() -> Path:
    try:  # optional: no onnxruntime-qnn wheel exists for macOS
        import onnxruntime_qnn
    except ImportError:
        raise StudioError("onnxruntime-qnn is not installed: Genie comes with it") from None
    p = Path(onnxruntime_qnn.__file__).parent / "libGenie.so"
    if not p.is_file():
        raise StudioError(f"this onnxruntime-qnn has no libGenie.so ({p.parent})")
    return p


def _genie_message(text: str) -> str:
    """What Genie printed, without its start-up chatter, on one line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()
             and "LIBNATIVE" not in ln and "affinity" not in ln and "[INFO]" not in ln]
    return " ".join(lines)[:400] or "no message"


#: GenieDialog_signal's action that ends the running query (GENIE_DIALOG_ACTION_ABORT)
_ABORT = 1
#: GENIE_STATUS_WARNING_CONTEXT_EXCEEDED: the query filled the context and stopped there (a
#: warning, not a failure: measured, a long prompt with 90 new tokens in a 128-token context)
_CONTEXT_EXCEEDED = 4


class GenieDialog:
    """A Genie dialog created from a bundle's config (``config``: the file's name), on this
    host's HTP simulator. ``profile``: Genie's own profiler is bound to it, and each query's
    result carries its event (:meth:`query`'s ``profile``)."""

    def __init__(self, bundle: Path, config: str = "genie_config.json",
                 profile: bool = False) -> None:
        self.bundle = Path(bundle)
        cfg = local_config(self.bundle, config)
        self.lib = ctypes.CDLL(str(library_path()))
        self._cfg, self._dlg = ctypes.c_void_p(), ctypes.c_void_p()
        self._prof = ctypes.c_void_p()
        t0 = time.perf_counter()
        st2 = -1
        with capture_native_stderr() as cap:  # Genie prints its reasons on fd 2
            st = self.lib.GenieDialogConfig_createFromJson(json.dumps(cfg).encode(),
                                                          ctypes.byref(self._cfg))
            if st == 0 and profile and (
                    self.lib.GenieProfile_create(None, ctypes.byref(self._prof)) != 0
                    or self.lib.GenieDialogConfig_bindProfiler(self._cfg, self._prof) != 0):
                self._free_profile()
            if st == 0:
                st2 = self.lib.GenieDialog_create(self._cfg, ctypes.byref(self._dlg))
        if st != 0:
            raise StudioError(f"Genie refused the bundle's {config} (status {st}): "
                              f"{_genie_message(cap.text)}")
        if st2 != 0:
            self.lib.GenieDialogConfig_free(self._cfg)
            self._cfg = ctypes.c_void_p()
            self._free_profile()
            raise StudioError(f"Genie could not create the dialog (status {st2}): "
                              f"{_genie_message(cap.text)}")
        self.load_s = time.perf_counter() - t0

    def query(self, prompt: str, max_new_tokens: int,
              on_text: Callable[[str], None] | None = None,
              stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Greedy text after ``prompt`` (Genie tokenizes it itself); timings are wall clock on
        the simulator. ``stop()`` is asked after each piece of text: when it says so, Genie is
        told to abort and :class:`Cancelled` is raised once the query has returned."""
        self.lib.GenieDialog_reset(self._dlg)
        self.lib.GenieDialog_setMaxNumTokens(self._dlg, ctypes.c_uint32(int(max_new_tokens)))
        pieces: list[str] = []
        stamps: list[float] = []
        aborted: list[bool] = []
        callback_t = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)

        def cb(text, _code, _user) -> None:
            if text:
                piece = text.decode("utf-8", "replace")
                pieces.append(piece)
                stamps.append(time.perf_counter())
                if on_text is not None:
                    on_text(piece)
            if stop is not None and not aborted and stop():
                aborted.append(True)
                self.lib.GenieDialog_signal(self._dlg, ctypes.c_int(_ABORT))

        keep = callback_t(cb)
        t0 = time.perf_counter()
        with capture_native_stderr() as cap:
            st = self.lib.GenieDialog_query(self._dlg, prompt.encode(), 0, keep, None)
        wall = time.perf_counter() - t0
        if aborted:
            raise Cancelled("Genie's query was stopped")
        if st == _CONTEXT_EXCEEDED:  # a warning: the text so far, stopped at the context's end
            stopped = "context"
        elif st != 0:
            raise StudioError(f"Genie's query failed (status {st}): {_genie_message(cap.text)}")
        else:
            stopped = "max_new_tokens" if len(pieces) >= max_new_tokens else "eos"
        return {"text": "".join(pieces), "wall_s": wall, "stopped": stopped,
                "first_text_s": (stamps[0] - t0) if stamps else None, "pieces": len(pieces),
                "profile": self._last_query() if self._prof else None}

    def _last_query(self) -> dict[str, Any] | None:
        """Genie's profile event of the last query (its figures: ``num-generated-tokens``,
        ``token-acceptance-rate`` of a speculative dialog, ...), as ``{name: value}``."""
        held: list[Any] = []
        alloc_t = ctypes.CFUNCTYPE(None, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p))

        def alloc(size, out) -> None:
            buf = ctypes.create_string_buffer(int(size))
            held.append(buf)
            out[0] = ctypes.cast(buf, ctypes.c_char_p)

        keep = alloc_t(alloc)
        data = ctypes.c_char_p()
        if self.lib.GenieProfile_getJsonData(self._prof, keep, ctypes.byref(data)) != 0 or not held:
            return None
        try:
            doc = json.loads(held[-1].value.decode("utf-8", "replace"))
            events = [e for c in doc.get("components", []) for e in c.get("events", [])
                      if e.get("type") == "GenieDialog_query"]
        except (ValueError, AttributeError):
            return None
        if not events:
            return None
        return {k: (v["value"] if isinstance(v, dict) and "value" in v else v)
                for k, v in events[-1].items()}

    def _free_profile(self) -> None:
        if self._prof:
            self.lib.GenieProfile_free(self._prof)
            self._prof = ctypes.c_void_p()

    def close(self) -> None:
        if self._dlg:
            self.lib.GenieDialog_free(self._dlg)
            self._dlg = ctypes.c_void_p()
        if self._cfg:
            self.lib.GenieDialogConfig_free(self._cfg)
            self._cfg = ctypes.c_void_p()
        self._free_profile()

    def __enter__(self) -> GenieDialog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- the studio's runtime over the bundle's graphs -------------------------------------------
def pass_feeds(tokens: list[int], pos: int, ar: int, cl: int, pad: int) -> dict[str, Any]:
    """The ids, positions and uint16 mask of one pass of an AR-``ar`` Genie graph over a
    context of ``cl``: ``tokens`` (at most ``ar``, the rest padding that sees only itself) at
    positions ``pos``.., each seeing the cache slots before ``pos`` and the new rows up to
    its own — as Genie feeds them."""
    n, slots = len(tokens), cl - ar
    visible = 65535  # the uint16 mask: raw 65535 is "attend", raw 0 the mask value
    ids = np.full((1, ar), pad, np.int32)
    ids[0, :n] = tokens
    positions = np.minimum(np.arange(pos, pos + ar), cl - 1).astype(np.int32)[None]
    mask = np.zeros((1, 1, ar, cl), np.uint16)
    for r in range(ar):
        if r < n:
            mask[0, 0, r, :pos] = visible
            mask[0, 0, r, slots:slots + r + 1] = visible
        else:
            mask[0, 0, r, slots + r] = visible
    return {"input_ids": ids, "position_ids": positions, "attention_mask": mask}


def prompt_schedule(n_ids: int, ar: int, cl: int) -> list[tuple[int, int, int]]:
    """How Genie runs a prompt of ``n_ids`` tokens from position 0 with an AR-``ar`` prefill
    graph: (first token, tokens, graph AR) per pass — AR-N passes where the context allows
    (the last chunk padded), AR-1 passes for the rest."""
    pos, out = 0, []
    while pos < n_ids:
        n = ar if ar > 1 and pos + ar <= cl - 1 and pos <= cl - ar else 1
        take = min(n, n_ids - pos)
        out.append((pos, take, n))
        pos += take
    return out


class BundleRunner:
    """The studio's own runtime over a bundle's Genie-form graphs (the compiled contexts Genie
    loads), with its own KV cache: a prompt goes through the AR-N graph in chunks of N
    (the last chunk padded; padding rows see only themselves), or one token per pass where
    there is none or the cache is too full for it, then greedy AR-1 steps. This is what the
    bundle computes when run as intended — the reference Genie's output is checked against.

    ``graphs`` maps AR (tokens per pass) to the sessions of that graph's parts, in order;
    parts hand each other their outputs by name."""

    def __init__(self, graphs: dict[int, list[Any]], spec: dict[str, Any], context_size: int,
                 kv_encodings: dict[str, dict[str, Any]] | None = None):
        if 1 not in graphs:
            raise StudioError("a bundle needs its AR-1 decode graph")
        self.graphs, self.cl = graphs, int(context_size)
        self.layers, self.eos = int(spec["num_layers"]), spec.get("eos_token_id")
        self.pad = int(spec.get("pad_token_id") or 0)
        kvh, hd = int(spec["num_kv_heads"]), int(spec["head_dim"])
        # the cache as the graphs take it: float, or uint16 with quantized KV I/O (the rows
        # come out with the encoding the inputs take: copied as they are)
        types = {i.name: i.type for s in graphs[1] for i in s.get_inputs()}
        dtype = np.uint16 if types.get("past_key_0_in") == "tensor(uint16)" else np.float32
        self.keys = np.zeros((self.layers, 1, kvh, hd, self.cl - 1), dtype)
        self.values = np.zeros((self.layers, 1, kvh, self.cl - 1, hd), dtype)
        # an empty slot holds 0.0, as Genie keeps it: with a quantized cache, each tensor's
        # zero point (raw 0 is far from 0.0). Masked slots still move the HTP's fixed-point
        # softmax a little: a cache of raw zeros parted from Genie's text at a near tie
        # (logits 0.006 apart), one of zero points gives its text on every prompt
        self.zero = {k: int(e["zero_point"]) for k, e in (kv_encodings or {}).items()
                     if dtype == np.uint16}
        self.passes = {ar: 0 for ar in graphs}
        self.prompt_passes = 0
        self.reset()

    def reset(self) -> None:
        for i in range(self.layers):
            self.keys[i] = self.zero.get(f"key_{i}", 0)
            self.values[i] = self.zero.get(f"value_{i}", 0)

    def _pass(self, tokens: list[int], pos: int, ar: int, rows: bool = False):
        """``tokens`` (at most ``ar``) at positions ``pos``..; returns the last real row's
        logits (``rows``: every real row's, [n, V]) and stores the new KV rows in slots
        ``pos``.."""
        n, slots = len(tokens), self.cl - ar
        values = pass_feeds(tokens, pos, ar, self.cl, self.pad)
        for i in range(self.layers):
            values[f"past_key_{i}_in"] = self.keys[i][..., :slots]
            values[f"past_value_{i}_in"] = self.values[i][:, :, :slots]
        for sess in self.graphs[ar]:
            names = [o.name for o in sess.get_outputs()]
            feeds = {i.name: values[i.name] for i in sess.get_inputs()}
            values.update(zip(names, sess.run(names, feeds), strict=True))
        for i in range(self.layers):
            self.keys[i][..., pos:pos + n] = values[f"past_key_{i}_out"][..., :n]
            self.values[i][:, :, pos:pos + n] = values[f"past_value_{i}_out"][:, :, :n]
        self.passes[ar] += 1
        logits = np.asarray(values["logits"]).reshape(ar, -1)
        return logits[:n] if rows else logits[n - 1]

    def teacher_forced(self, ids: list[int]):
        """Logits [len(ids), V] (float32) of the bundle's graphs over ``ids`` as Genie runs
        a prompt: AR-N passes where the context allows, AR-1 passes for the rest. Row i
        predicts token i + 1 — what the shipped binaries compute, scored like validate."""
        if len(ids) > self.cl - 1:
            raise StudioError(f"{len(ids)} tokens do not fit the bundle's context of "
                              f"{self.cl - 1}")
        self.reset()
        return np.concatenate(self._prompt(ids, rows=True)).astype(np.float32)

    def _prompt(self, ids: list[int], rows: bool) -> list[Any]:
        """``ids`` from position 0 through the graphs as Genie runs a prompt: AR-N passes
        where the context allows (the last chunk padded), AR-1 passes for the rest. Returns
        each pass's logits (``rows``: every real row's, else the last row's)."""
        return [self._pass(ids[pos:pos + take], pos, n, rows=rows)
                for pos, take, n in prompt_schedule(len(ids), max(self.graphs), self.cl)]

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy tokens after ``ids``; stops after an EOS token or at the context's end, like
        Genie. ``runner_up`` then holds each new token's second best and its logit gap."""
        self.reset()
        passes = self._prompt(ids, rows=False)
        self.prompt_passes = len(passes)
        pos, logits = len(ids), (passes[-1] if passes else None)
        out: list[int] = []
        self.runner_up: list[tuple[int, float]] = []  # per new token: 2nd best, its gap
        while logits is not None and len(out) < max_new_tokens:
            tok = int(logits.argmax())
            second = np.argsort(logits)[-2]
            self.runner_up.append((int(second), float(logits[tok] - logits[second])))
            out.append(tok)
            if tok == self.eos or pos >= self.cl - 1 or len(out) == max_new_tokens:
                break
            logits = self._pass([tok], pos, 1)
            pos += 1
        return out


# ---- splitting ------------------------------------------------------------------------------
def split_graph(src: Path, folder: Path, spec: dict[str, Any], parts: int) -> list[Path]:
    """Split the Genie graph ``src`` (AR-1 decode or AR-N) into ``parts`` graphs of consecutive transformer
    blocks (the first also embeds, the last also norms and projects to logits), for context
    binaries that each stay within a budget. A part hands the next the residual stream after
    its last block as the *quantized* uint16 tensor ``hidden_states_after_{k}`` (the same
    QuantizeLinear / DequantizeLinear parameters on both sides, so Genie copies raw values);
    every part takes the ids, positions and mask it needs and the KV cache of its blocks."""
    L = int(spec["num_layers"])
    if not 2 <= parts <= L:
        raise StudioError(f"a {L}-block model splits into 2..{L} parts, not {parts}")
    model = onnx.load(str(src))
    g = model.graph
    ar = next(d.dim_value for i in g.input if i.name == "input_ids"
              for d in i.type.tensor_type.shape.dim[1:2])
    bounds = [round(L * (i + 1) / parts) - 1 for i in range(parts - 1)]  # last block of a part
    handoff = {}
    for last in bounds:
        add = [n for n in g.node if n.op_type == "Add" and n.name.startswith(
            f"/model/layers.{last}/") and n.name.count("/") == 3]  # the block's own residuals
        if not add:
            raise StudioError(f"{src.name}: block {last} has no residual Add to split after")
        res = add[-1].output[0]
        q = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == res]
        if len(q) != 1:
            raise StudioError(f"{src.name}: the residual stream after block {last} is not "
                              "quantized once: cannot hand it to the next part")
        name = hidden_name(last)
        for n in g.node:
            for k, x in enumerate(n.input):
                if x == q[0].output[0]:
                    n.input[k] = name
        q[0].output[0] = name
        handoff[last] = name
    model = shape_inference.infer_shapes(model)
    known = {v.name for v in model.graph.value_info}
    for name in handoff.values():  # shape inference may stop short of the hand-off tensors
        if name not in known:
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.UINT16, [1, ar, int(spec["hidden_size"])]))
    ex = utils.Extractor(model)
    graph_inputs = [i.name for i in model.graph.input]
    folder.mkdir(parents=True, exist_ok=True)
    out, first = [], 0
    for p in range(parts):
        last = bounds[p] if p < len(bounds) else L - 1
        blocks = range(first, last + 1)
        kv_in = [n for n in graph_inputs if any(n in (f"past_key_{b}_in", f"past_value_{b}_in")
                                                 for b in blocks)]
        ins = (["input_ids"] if p == 0 else [handoff[bounds[p - 1]]]) + [
            "position_ids", "attention_mask", *kv_in]
        kv_out = [f"past_{kind}_{b}_out" for b in blocks for kind in ("key", "value")]
        outs = ([handoff[last]] if p < parts - 1 else ["logits"]) + kv_out
        part = ex.extract_model(ins, outs)
        path = folder / f"{src.stem}_part{p + 1}_of_{parts}.onnx"
        onnx.save(part, str(path))
        out.append(path)
        first = last + 1
    return out
