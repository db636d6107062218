"""Layer-wise diff of FP32, the host QDQ emulation and the HTP, tensor by tensor.

The prefill graph is run with chosen intermediate tensors exposed as extra graph outputs, as
Polygraphy and QNN's accuracy debugger do, on the FP32 export, on the quantized (QDQ) graph
in ONNX Runtime on the host CPU and on the quantized graph through the QNN execution provider
(the HTP simulator on x86). Each tensor is compared pairwise: host QDQ vs FP32, HTP vs FP32 and
HTP vs host QDQ.

**Which tensors (probes).** Module paths come from the exported node names
(``/model/layers.0/mlp/up_proj/MatMul`` -> ``model.layers.0.mlp.up_proj``,
:func:`studio.core.recipe.module_of_node`).

- *Boundaries*: the embedding output, the residual stream after each decoder block (the
  output of the block's last node), the final norm and the logits (``lm_head``).
- *Modules* (``tensors = "modules"``, the default, adds them): the output of every leaf
  module (q/k/v/o projections, norms, gate/up/down, the activation) and, inside container
  modules, the nodes that are the attention's own arithmetic or feed a child module:
  the activation x activation MatMuls (``scores`` = Q K^T, ``context`` = softmax x V), the
  ``softmax``, the MLP's gate x up ``product`` and the residual add inside each block.
  Shape-only ops (Reshape, Transpose, ...) and the export's rotary tables are skipped.

**The same tensor in the QDQ graph.** ONNX Runtime's quantizer keeps a float tensor ``X``
as the output of its producer and adds ``QuantizeLinear`` (``X_QuantizeLinear_Output``) and
``DequantizeLinear`` (``X_DequantizeLinear_Output``); a graph output ``X`` becomes the
DequantizeLinear's output and its producer writes ``X_QuantizeLinear_Input``. The probe is
the DequantizeLinear output (what the next op reads), found by structure (the Q node that
reads ``X``, the DQ node that reads that Q node), not by name alone. A tensor the quantizer
left float keeps its name.

- *All* (``tensors = "all"``): every computed float tensor (a deep dive; on the sample
  model 169 tensors, exposed at once).

**On the HTP.** The QDQ graph with the same extra outputs goes through the QNN EP (strict:
every node on the HTP); each extra output is the HTP's quantized tensor, dequantized. Whether
the extra outputs change what the graph computes is measured on every run: the final logits
with the extra outputs are compared with those of the compile stage's context binary (no
extra outputs), and likewise for FP32 and host QDQ (measured on the sample, W8A16, v75, 67
and 169 extra outputs at once: bit-identical logits on every runtime, so there is no need
to expose them in groups). Caveat, measured: the HTP compiler computes a decomposed RMSNorm
(Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul) without rounding its intermediates; exposing an
intermediate gives its value as if rounded (the same as host QDQ's within a few steps), while
the norm's output is ``quantize(rmsnorm(x) * w)`` computed in float (within 1.2e-4 relative).
The tensors of ``"modules"`` are outputs of whole modules, which the HTP does materialize.

**Figures.** Per probe and pair, over all windows' elements: cosine, relative error
``||a - b|| / ||b||`` (``b`` the reference: FP32, or host QDQ for HTP vs host QDQ), max |a-b|;
for HTP vs host QDQ also the fraction of elements that differ by half a quantization step
or more and the largest difference in steps (the tensor's scale). ``gain`` is a probe's
relative error over the largest relative error of the probes it is computed from (its
nearest probed inputs): how much the op amplifies the error it receives. How the rows are
read (first jump, where host QDQ and the HTP part, the worst tensors) is
:mod:`studio.core.layerdiff`'s.

Host QDQ runs with ONNX Runtime's graph optimizations off (see
:func:`studio.engine.sensitivity.host_session`); the final logits of the QDQ graph with the
default optimizations (as :mod:`studio.worker.stages`' validate runs it) are reported next
to them.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.layerdiff import PAIRS, TENSOR_MODES
from studio.core.progress import NullProgress, Progress
from studio.core.recipe import module_of_node
from studio.engine import qnn
from studio.engine.chain import ChainSession, chain_session
from studio.engine.graphio import encoded
from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
from studio.engine.onnxio import load_spec
from studio.engine.part_runner import iter_parts
from studio.engine.sensitivity import compare_logits, host_session

_SHAPE_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                        "Cast", "Shape", "Constant", "ConstantOfShape", "Slice", "Concat",
                        "Gather", "Expand", "Equal", "Where", "Neg"})
_SKIP_MODULES = frozenset({"rope"})  # the export's rotary tables (position only)
_BLOCK = re.compile(r"^(.*?layers\.(\d+))(?:\.|$)")
#: the graphs a layer diff runs on
GRAPHS = ("prefill", "decode")


@dataclass(frozen=True)
class Probe:
    name: str  # model.layers.0 (boundary), model.layers.0.self_attn.scores, lm_head
    tensor: str  # the FP32 graph's tensor
    kind: str  # "boundary" | "module"
    block: int  # -1 before the first decoder block, num_layers after the last
    module: str  # the module path it belongs to
    op: str  # the op that computes it
    inputs: tuple[str, ...] = ()  # nearest probes upstream (names)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        return d


# ---------------------------------------------------------------------------- probes


def _block(module: str) -> tuple[str, int] | None:
    m = _BLOCK.match(module)
    return (m.group(1), int(m.group(2))) if m else None


def find_probes(model, mode: str = "modules") -> list[Probe]:
    """The tensors to compare in an exported FP32 graph (see the module docstring), in graph
    order."""
    floats = _float_tensors(model)
    g = model.graph
    inits = {t.name for t in g.initializer} | {n.output[0] for n in g.node
                                                if n.op_type == "Constant"}
    nodes = [n for n in g.node if n.op_type != "Constant" and n.output]
    computes = {i for i, n in enumerate(nodes) if n.output[0] in floats}
    by_module: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        by_module.setdefault(module_of_node(n.name), []).append(i)
    modules = [m for m in by_module if m and m not in _SKIP_MODULES]
    blocks = {b for m in modules if (b := _block(m))}
    if not blocks:
        raise StudioError("the graph names no decoder blocks (model.layers.N); layerdiff reads "
                          "graphs exported by the studio")
    n_layers = max(i for _, i in blocks) + 1

    def children(m: str) -> list[str]:
        return [c for c in modules if c.startswith(m + ".")]

    def where(m: str) -> int:
        b = _block(m)
        if b:
            return b[1]
        return -1 if "embed" in m else n_layers

    chosen: dict[int, tuple[str, str]] = {}  # node index -> (name, kind)
    for bname, _ in sorted(blocks, key=lambda b: b[1]):  # the last node of each block
        last = max(i for m in modules if m == bname or m.startswith(bname + ".")
                   for i in by_module[m])
        chosen[last] = (bname, "boundary")
    for m in modules:
        idx = by_module[m]
        kids = children(m)
        blk = _block(m)
        if blk and blk[0] == m and not kids:
            continue
        if not kids:  # a leaf module: its output
            last = idx[-1]
            if last in chosen:
                continue
            if last not in computes:
                continue
            boundary = ("embed" in m or (m.endswith("norm") and where(m) == n_layers)
                        or nodes[last].output[0] == "logits")
            if boundary or mode != "blocks":
                chosen[last] = (m, "boundary" if boundary else "module")
            continue
        if mode == "blocks":
            continue
        kid_inputs = {t for k in kids for i in by_module[k] for t in nodes[i].input}
        mm = 0
        for i in idx:
            n = nodes[i]
            if i in chosen or i not in computes or n.op_type in _SHAPE_OPS:
                continue
            if n.op_type == "MatMul" and not any(t in inits for t in n.input):
                role = ("scores", "context")[mm] if mm < 2 else f"matmul_{mm}"
                mm += 1
            elif n.op_type == "Softmax":
                role = "softmax"
            elif n.output[0] in kid_inputs:
                role = {"Mul": "product", "Add": "residual"}.get(n.op_type, n.op_type.lower())
            else:
                continue
            name = f"{m}.{role}"
            k = 1
            while any(v[0] == name for v in chosen.values()):
                name, k = f"{m}.{role}_{k}", k + 1
            chosen[i] = (name, "module")
    if mode == "all":  # every computed tensor but shape bookkeeping
        for i, n in enumerate(nodes):
            m = module_of_node(n.name)
            if (i in chosen or i not in computes or n.op_type in _SHAPE_OPS or not m
                    or m in _SKIP_MODULES):
                continue
            chosen[i] = (f"{m}.{n.name.rsplit('/', 1)[-1]}", "op")
    order = sorted(chosen)
    tensor_of = {nodes[i].output[0]: chosen[i][0] for i in order}
    rank = {name: k for k, name in enumerate(tensor_of.values())}
    # the nearest probes each tensor is computed from (the graph is in topological order)
    near: dict[str, frozenset[str]] = {}
    out = []
    for i, n in enumerate(nodes):
        found: set[str] = set()
        for x in n.input:
            if x in tensor_of:
                found.add(tensor_of[x])
            else:
                found |= near.get(x, frozenset())
        for o in n.output:
            near[o] = frozenset(found)
        if i in chosen:
            name, kind = chosen[i]
            mod = module_of_node(n.name)
            out.append(Probe(name, n.output[0], kind, where(mod), mod, n.op_type,
                             tuple(sorted(found, key=rank.__getitem__))))
    return out


def _float_tensors(model) -> set[str]:
    """The float tensors of a graph (by shape inference on its structure; weights are not
    needed)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is best effort: fall back to the declared ones
        inferred = model
    g = inferred.graph
    want = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    return {v.name for v in (*g.value_info, *g.output)
            if v.type.tensor_type.elem_type in want}


def qdq_tensor_map(qmodel, tensors: list[str]) -> dict[str, dict[str, Any]]:
    """For each FP32 tensor name: the quantized graph's tensor holding the same value as the
    next op reads it (``{"tensor": name, "scale": float | None}``), or no entry when the
    quantized graph has no such tensor."""
    from onnx import numpy_helper

    g = qmodel.graph
    consumers: dict[str, list[Any]] = {}
    produced: dict[str, Any] = {}
    for n in g.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
        for o in n.output:
            produced[o] = n
    inits = {t.name: t for t in g.initializer}
    outputs = {o.name for o in g.output}

    def scale_of(dq) -> float | None:
        t = inits.get(dq.input[1]) if len(dq.input) > 1 else None
        if t is None:
            return None
        v = numpy_helper.to_array(t)
        return float(v) if np.size(v) == 1 else None

    out: dict[str, dict[str, Any]] = {}
    for name in tensors:
        src = name
        if name in outputs and produced.get(name) is not None \
                and produced[name].op_type == "DequantizeLinear":
            out[name] = {"tensor": name, "scale": scale_of(produced[name])}
            continue
        dq = None
        for q in consumers.get(src, []):
            if q.op_type != "QuantizeLinear":
                continue
            dq = next((d for d in consumers.get(q.output[0], [])
                       if d.op_type == "DequantizeLinear"), None)
            if dq is not None:
                break
        if dq is not None:
            out[name] = {"tensor": dq.output[0], "scale": scale_of(dq)}
        elif name in produced:
            out[name] = {"tensor": name, "scale": None}  # left float by the quantizer
    return out


# ---------------------------------------------------------------------------- graphs


def graph_with_outputs(src: Path, names: list[str], dst: Path) -> Path:
    """``src`` with ``names`` added as float graph outputs, written to ``dst``. Weights kept in
    external data files stay where they are (linked beside ``dst``)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        model = onnx.load(str(src), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise StudioError(f"{src} is not a readable ONNX model ({str(exc).splitlines()[0]}): "
                          "re-run the stage that wrote it") from None
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in have:
            model.graph.output.append(
                onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None))
            have.add(n)
    locations = {e.value for t in model.graph.initializer if uses_external_data(t)
                 for e in t.external_data if e.key == "location"}
    for loc in sorted(locations):  # hard links: ONNX Runtime refuses a symlink's target
        link = dst.parent / loc      # as external data outside the model's folder
        if not link.exists():
            link_or_copy((src.parent / loc).resolve(), link)
    onnx.save(model, str(dst))
    return dst


def external_files(graph: Path) -> list[str]:
    """The files beside ``graph`` its initializers' external data live in (names)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(graph), load_external_data=False)
    return sorted({e.value for t in model.graph.initializer if uses_external_data(t)
                   for e in t.external_data if e.key == "location"})


class Replay:
    """A session whose runs were made elsewhere (a device, through its agent): ``run`` gives
    the outputs of the next feed, in the order the feeds were run."""

    def __init__(self, arrays: Mapping[tuple[int, str], Any]) -> None:
        self.arrays = arrays
        self.i = 0

    def run(self, names: list[str], _feed: Any) -> list[Any]:
        out = [self.arrays[(self.i, n)] for n in names]
        self.i += 1
        return out


def windows_of(ids: list[int], P: int, graph: str, want: int) -> list[list[int]]:
    """Up to ``want`` held-out windows for the ``graph``'s diff: P tokens each for prefill,
    P + 1 for decode (P - 1 prefilled, a step, the token it predicts)."""
    W = P + 1 if graph == "decode" else P
    return [ids[i * P:i * P + W] for i in range(min(want, (len(ids) - W) // P + 1))
            if len(ids) >= W]


# ---------------------------------------------------------------------------- figures


@dataclass
class _Acc:
    """Running sums for one probe and one pair (the windows' elements together)."""

    dot: float = 0.0
    aa: float = 0.0
    bb: float = 0.0
    dd: float = 0.0
    max_abs: float = 0.0
    differ: int = 0
    count: int = 0
    max_steps: float | None = None

    def add(self, a, b, scale: float | None) -> None:
        x = np.asarray(a, dtype=np.float64).ravel()
        y = np.asarray(b, dtype=np.float64).ravel()
        if x.shape != y.shape:
            raise StudioError(f"tensor shapes differ ({x.shape} vs {y.shape}); the graphs do not "
                              "match: re-run quantize")
        d = x - y
        self.dot += float(x @ y)
        self.aa += float(x @ x)
        self.bb += float(y @ y)
        self.dd += float(d @ d)
        m = float(np.abs(d).max()) if d.size else 0.0
        self.max_abs = max(self.max_abs, m)
        # elements that differ by half a quantization step or more (all, without a scale)
        self.differ += int(np.count_nonzero(np.abs(d) >= 0.5 * scale if scale else d))
        self.count += int(d.size)
        if scale:
            s = m / scale
            self.max_steps = s if self.max_steps is None else max(self.max_steps, s)

    def figures(self, steps: bool) -> dict[str, float | None]:
        cos = self.dot / math.sqrt(self.aa * self.bb) if self.aa > 0 and self.bb > 0 else (
            1.0 if self.dd == 0 else 0.0)
        rel = math.sqrt(self.dd) / math.sqrt(self.bb) if self.bb > 0 else (
            0.0 if self.dd == 0 else math.inf)
        out: dict[str, float | None] = {"cosine": cos, "rel_error": rel,
                                        "max_abs": self.max_abs}
        if steps:
            out["differ"] = self.differ / self.count if self.count else 0.0
            out["max_steps"] = self.max_steps
        return out


# ---------------------------------------------------------------------------- the run


def _default_session(model: Path, threads: int):
    """A CPU session with ONNX Runtime's default graph optimizations, as validate runs the
    host QDQ graph (:func:`studio.engine.llm_runtime.make_cpu_session`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(model), sess_options=opts,
                                providers=["CPUExecutionProvider"])


def _max_change(a: list, b: list) -> float:
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b, strict=True))


def _load(path: Path, what: str):
    import onnx

    if not path.is_file():
        raise StudioError(f"{path} is missing: re-run {what}")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise StudioError(f"{path} is not a readable ONNX model ({first}): re-run {what}") \
            from None


def layer_diff(export_dir: Path, quant_dir: Path, windows: list[list[int]], *,
               mode: str = "modules", htp: Mapping[str, Any] | None = None,
               work_parent: Path | None = None, progress: Progress = NullProgress(),
               threads: int = 1, graph: str = "prefill", part: int = 0) -> dict[str, Any]:
    """Run the diff on ``windows`` of the prefill graph (each exactly P tokens) or of the
    decode graph (each P + 1 tokens: FP32 prefills the first P - 1, every runtime's decode
    graph then takes token P - 1 over that one cache and predicts token P, so the decode
    graph's own error is measured) and return the rows and the final-logits figures
    (JSON-able; ``seconds`` holds run timings).

    ``htp``: ``{"chip": Chip, "fp16": bool, "extra_options": {...}, "base": Path,
    "fp16_step": bool, "runner": callable}`` runs the HTP too (``base``: the compile stage's
    context model of the graph, for the unchanged-logits check; ``fp16_step``: also the FP32
    graph on the HTP in FP16 — the seed's step 1, the backend without quantization;
    ``runner(graph, names, feeds, fp16) -> {(feed index, name): array}``: the HTP runs
    elsewhere, a device through its agent, each graph once over every feed — the plain
    graph is then the quantized graph itself, prepared there); None compares FP32 and host
    QDQ only.

    ``part`` (1-based; a model exported in parts must name one): that part's graphs are
    compared, fed what the FP32 parts before it hand on, and every runtime's hand-off goes
    on through the FP32 parts after it to the logits — so the final figures are that part's
    own error at the output (``base`` is then that part's context model).
    """
    if mode not in TENSOR_MODES:
        raise StudioError(f"layerdiff.tensors = {mode!r}: use one of {', '.join(TENSOR_MODES)}")
    if graph not in GRAPHS:
        raise StudioError(f"layerdiff.graph = {graph!r}: use one of {', '.join(GRAPHS)}")
    export_dir, quant_dir = Path(export_dir), Path(quant_dir)
    spec = load_spec(export_dir)
    P = int(spec["prompt_length"])
    width = P + 1 if graph == "decode" else P
    if not windows or any(len(w) != width for w in windows):
        raise StudioError(f"the layer diff of the {graph} graph scores windows of exactly "
                          + (f"P={P}" if graph == "prefill" else f"P + 1 = {width}")
                          + " tokens")
    parts = list(iter_parts(spec))
    if len(parts) > 1 and not 1 <= part <= len(parts):
        raise StudioError(f"this model is exported in {len(parts)} parts: name the part to "
                          f"compare (layerdiff.part, studio bisect --part 1..{len(parts)})")
    if len(parts) == 1 and part > 1:
        raise StudioError(f"layerdiff.part = {part}, but this model is exported whole: use 0")
    me = parts[part - 1] if len(parts) > 1 else None
    sub = me.name if me is not None else ""
    out_name = me.hidden_out if me is not None and me.hidden_out else "logits"
    fsrc, qsrc = export_dir / sub / f"{graph}.onnx", quant_dir / sub / f"{graph}.onnx"
    t_start = time.perf_counter()
    progress.update(0.0, "choosing the tensors to compare")
    probes = find_probes(_load(fsrc, "the export"), mode)
    qmap = qdq_tensor_map(_load(qsrc, "quantize"), [p.tensor for p in probes] + [out_name])
    missing = [p.name for p in probes if p.tensor not in qmap]
    probes = [p for p in probes if p.tensor in qmap]
    if out_name not in qmap or not probes:
        raise StudioError(f"{qsrc} does not compute the FP32 graph's tensors (no {out_name}): "
                          "it is not the quantized export of this model; re-run quantize")
    ftensors = [p.tensor for p in probes]
    qtensors = [qmap[p.tensor]["tensor"] for p in probes]

    work = Path(tempfile.mkdtemp(prefix=".layerdiff.", dir=work_parent))
    try:
        fx = graph_with_outputs(fsrc, ftensors, work / "fp32.onnx")
        (work / "q").mkdir()
        qx = graph_with_outputs(qsrc, qtensors, work / "q" / "prefill.onnx")
        progress.update(0.03, "opening the sessions")
        gen = StaticKVGenerator(
            chain_session(spec, export_dir, "prefill", lambda f: make_cpu_session(f, threads)),
            chain_session(spec, export_dir, "decode", lambda f: make_cpu_session(f, 1)), spec)
        if graph == "prefill":
            feeds = [gen.prefill_feed(w) for w in windows]  # as validate and sensitivity pad
        else:  # one FP32 cache per window, then the step every runtime takes from it
            feeds = []
            for w in windows:
                gen.prefill(w[:P - 1])
                feeds.append(gen.decode_feed(w[P - 1], P - 1, copy=True))
        scored = windows if graph == "prefill" else [w[P - 1:] for w in windows]
        del gen
        whole_feeds, after = feeds, None
        if me is not None:  # the part's inputs: what the FP32 parts before it hand on
            def chain(ps):
                return ChainSession([make_cpu_session(export_dir / q.name / f"{graph}.onnx",
                                                      threads) for q in ps])

            earlier = parts[:me.index]
            if earlier:
                first = chain(earlier)
                whole_feeds = [{**f, me.hidden_in: first.run([me.hidden_in], f)[0]}
                               for f in feeds]
                del first
            names = [i.name for i in make_cpu_session(fsrc, 1).get_inputs()]
            feeds = [{n: f[n] for n in names} for f in whole_feeds]
            if parts[me.index + 1:]:
                after = chain(parts[me.index + 1:])  # the hand-off on to the logits, in FP32

        def to_logits(out, wi: int):
            """The logits a runtime's output of the part gives: itself for the last part (or
            a model in one), else the FP32 parts after it run on that hand-off."""
            if after is None:
                return out
            return after.run(["logits"], {**whole_feeds[wi], out_name: out})[0]
        # runtimes with the extra outputs, and without them (the same logits, measured)
        probed: dict[str, Any] = {"fp32": host_session(fx, threads),
                                  "qdq": host_session(qx, threads),
                                  "qdq_default": _default_session(qx, threads)}
        plain: dict[str, Any] = {"fp32": host_session(fsrc, threads),
                                 "qdq": host_session(qsrc, threads),
                                 "qdq_default": _default_session(qsrc, threads)}
        seconds: dict[str, float] = {}
        remote = dict(htp or {})
        runner = remote.get("runner")
        if runner is not None:
            chip, fp16 = remote["chip"], bool(remote.get("fp16"))
            where = remote.get("where", "the device")
            progress.update(0.05, f"running the graph with {len(probes)} extra outputs on "
                                  f"{where}")
            t0 = time.perf_counter()
            probed["htp"] = Replay(runner(qx, [out_name, *qtensors], feeds, fp16))
            plain["htp"] = Replay(runner(qsrc, [out_name], feeds, fp16))
            if remote.get("fp16_step") and chip.fp16:
                progress.update(0.08, f"running the FP32 graph in FP16 on {where}")
                probed["htp_fp16"] = Replay(runner(fx, [out_name, *ftensors], feeds, True))
            seconds["htp_remote"] = time.perf_counter() - t0
        elif htp is not None:
            chip, fp16 = htp["chip"], bool(htp.get("fp16"))
            extra = dict(htp.get("extra_options") or {})
            progress.update(0.05, f"preparing the graph with {len(probes)} extra outputs for "
                                  f"the HTP of {chip.name}")
            t0 = time.perf_counter()
            probed["htp"] = qnn.make_session(qx, chip, strict=True, fp16=fp16,
                                             extra_options=extra)
            seconds["htp_prepare"] = time.perf_counter() - t0

            base_ctx = Path(htp["base"])  # the compile's binary (with its graph I/O)
            plain["htp"] = encoded(qnn.make_session(base_ctx, chip, strict=True, fp16=fp16,
                                                    extra_options=extra), base_ctx.parent,
                                   base_ctx.stem.removesuffix("_ctx"), all_float=True)
            if htp.get("fp16_step"):
                if not chip.fp16:
                    raise StudioError(f"the HTP of {chip.name} runs no FP16: the FP32 graph "
                                      "cannot run there unquantized (step 1 of a bisection)")
                progress.update(0.07, f"preparing the FP32 graph in FP16 on the HTP of "
                                      f"{chip.name} (no quantization)")
                t0 = time.perf_counter()
                probed["htp_fp16"] = qnn.make_session(fx, chip, strict=True, fp16=True,
                                                      extra_options=extra)
                seconds["htp_fp16_prepare"] = time.perf_counter() - t0
        pairs = [(n, a, b) for n, a, b in PAIRS if a in probed and b in probed]
        acc = {(p.name, n): _Acc() for p in probes for n, _, _ in pairs}
        logits: dict[str, list] = {k: [] for k in probed}
        base: dict[str, list] = {k: [] for k in plain}
        steps = len(feeds) * (len(probed) + len(plain))
        done = 0
        for wi, feed in enumerate(feeds):
            got: dict[str, list] = {}
            for runs, store, suffix in ((probed, logits, "_probed"), (plain, base, "")):
                for k, sess in runs.items():
                    progress.check()
                    progress.update(0.1 + 0.85 * done / steps, f"window {wi + 1}/{len(feeds)}: "
                                    f"{k}{' with extra outputs' if suffix else ''}")
                    want = ((ftensors if k in ("fp32", "htp_fp16") else qtensors)
                            if suffix else [])
                    t0 = time.perf_counter()
                    vals = sess.run([out_name, *want], feed)
                    seconds[k + suffix] = seconds.get(k + suffix, 0.0) + time.perf_counter() - t0
                    store[k].append(np.asarray(to_logits(vals[0], wi)[0], dtype=np.float32))
                    if suffix:
                        got[k] = vals[1:]
                    done += 1
            for i, p in enumerate(probes):
                scale = qmap[p.tensor]["scale"]
                for n, a, b in pairs:
                    acc[(p.name, n)].add(got[a][i], got[b][i],
                                         scale if n == "htp_vs_qdq" else None)
            del got
        progress.update(0.96, "figures")
        rows = []
        for p in probes:
            row: dict[str, Any] = p.to_dict()
            for n, _, _ in pairs:
                row[n] = acc[(p.name, n)].figures(steps=n == "htp_vs_qdq")
            rows.append(row)
        rel = {(r["name"], n): r[n]["rel_error"] for r in rows for n, _, _ in pairs}
        for r in rows:  # how much each op amplifies the error it receives
            for n, _, _ in pairs:
                before = max((rel[(i, n)] for i in r["inputs"]), default=0.0)
                r[n]["gain"] = r[n]["rel_error"] / before if before > 0 else None
        ref = base["fp32"]
        final = {k: compare_logits(ref, v, scored) for k, v in base.items()}
        if "htp" in base:
            final["htp"]["top1_agreement_with_qdq"] = compare_logits(
                base["qdq"], base["htp"], scored)["top1_agreement"]
        if "htp_fp16" in logits:  # probed only: its plain run would be the same graph
            final["htp_fp16"] = compare_logits(ref, logits["htp_fp16"], scored)
        seconds["total"] = time.perf_counter() - t_start
        return {
            "graph": graph, "tensors": mode, "windows": len(windows), "window_tokens": P,
            "part": None if me is None else {"index": me.index + 1, "of": len(parts),
                                             "name": me.name, "blocks": [me.start, me.stop],
                                             "output": out_name},
            "num_layers": int(spec["num_layers"]), "probes": len(probes),
            "missing_in_qdq": missing, "pairs": [n for n, _, _ in pairs],
            "rows": rows, "logits": final,
            # the extra outputs must not change what the graph computes: measured, every run
            "extra_outputs": {k: {"logits_identical": _max_change(logits[k], base[k]) == 0.0,
                                  "logits_max_abs_change": _max_change(logits[k], base[k])}
                              for k in probed if k in base},
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
