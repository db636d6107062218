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
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.layerdiff import PAIRS, TENSOR_MODES
from studio.core.lazyimport import lazy_module
from studio.core.progress import NullProgress, Progress
from studio.engine import qnn
from studio.engine.chain import ChainSession, chain_session
from studio.engine.graphio import encoded
from studio.engine.layerdiff_probes import Probe, find_probes
from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
from studio.engine.onnxio import load_spec
from studio.engine.part_runner import iter_parts
from studio.engine.sensitivity import compare_logits, host_session

onnx = lazy_module("onnx")
external_data_helper = lazy_module("onnx.external_data_helper")
numpy_helper = lazy_module("onnx.numpy_helper")
ort = lazy_module("onnxruntime")

#: the graphs a layer diff runs on
GRAPHS = ("prefill", "decode")


def qdq_tensor_map(qmodel, tensors: list[str]) -> dict[str, dict[str, Any]]:
    """For each FP32 tensor name: the quantized graph's tensor holding the same value as the
    next op reads it (``{"tensor": name, "scale": float | None}``), or no entry when the
    quantized graph has no such tensor."""
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
    locations = {e.value for t in model.graph.initializer
                 if external_data_helper.uses_external_data(t)
                 for e in t.external_data if e.key == "location"}
    for loc in sorted(locations):  # hard links: ONNX Runtime refuses a symlink's target
        link = dst.parent / loc      # as external data outside the model's folder
        if not link.exists():
            link_or_copy((src.parent / loc).resolve(), link)
    onnx.save(model, str(dst))
    return dst


def external_files(graph: Path) -> list[str]:
    """The files beside ``graph`` its initializers' external data live in (names)."""
    model = onnx.load(str(graph), load_external_data=False)
    return sorted({e.value for t in model.graph.initializer
                   if external_data_helper.uses_external_data(t)
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
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(model), sess_options=opts,
                                providers=["CPUExecutionProvider"])


def _max_change(a: list, b: list) -> float:
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b, strict=True))


def _load(path: Path, what: str):
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
    _check_modes(mode, graph)
    export_dir, quant_dir = Path(export_dir), Path(quant_dir)
    spec = load_spec(export_dir)
    _check_windows(spec, windows, graph)
    parts = list(iter_parts(spec))
    me = _the_part(parts, part)
    sub = me.name if me is not None else ""
    out_name = me.hidden_out if me is not None and me.hidden_out else "logits"
    fsrc, qsrc = export_dir / sub / f"{graph}.onnx", quant_dir / sub / f"{graph}.onnx"
    t_start = time.perf_counter()
    progress.update(0.0, "choosing the tensors to compare")
    probes = _Probes.find(fsrc, qsrc, mode, out_name)
    work = Path(tempfile.mkdtemp(prefix=".layerdiff.", dir=work_parent))
    try:
        fx = graph_with_outputs(fsrc, probes.ftensors, work / "fp32.onnx")
        (work / "q").mkdir()
        qx = graph_with_outputs(qsrc, probes.qtensors, work / "q" / "prefill.onnx")
        progress.update(0.03, "opening the sessions")
        feeds, scored = _window_feeds(spec, export_dir, graph, windows, threads)
        chain = _PartChain.of(feeds, parts, me, export_dir, graph, fsrc, out_name, threads)
        # runtimes with the extra outputs, and without them (the same logits, measured)
        probed, plain = _host_runtimes(fx, qx, fsrc, qsrc, threads)
        seconds: dict[str, float] = {}
        remote = dict(htp or {})
        if remote.get("runner") is not None:
            _htp_elsewhere(remote, probes, fx, qx, qsrc, chain.feeds, probed, plain, seconds,
                           progress)
        elif htp is not None:
            _htp_here(htp, probes, fx, qx, probed, plain, seconds, progress)
        pairs = [(n, a, b) for n, a, b in PAIRS if a in probed and b in probed]
        acc, logits, base = _run_windows(probes, pairs, chain, probed, plain, seconds,
                                         progress)
        progress.update(0.96, "figures")
        rows = _rows(probes.probes, pairs, acc)
        final = _final_logits(base, logits, scored)
        seconds["total"] = time.perf_counter() - t_start
        return {
            "graph": graph, "tensors": mode, "windows": len(windows),
            "window_tokens": int(spec["prompt_length"]),
            "part": None if me is None else {"index": me.index + 1, "of": len(parts),
                                             "name": me.name, "blocks": [me.start, me.stop],
                                             "output": out_name},
            "num_layers": int(spec["num_layers"]), "probes": len(probes.probes),
            "missing_in_qdq": probes.missing, "pairs": [n for n, _, _ in pairs],
            "rows": rows, "logits": final,
            # the extra outputs must not change what the graph computes: measured, every run
            "extra_outputs": _extra_outputs(probed, logits, base),
            "seconds": {k: round(v, 3) for k, v in seconds.items()},
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_modes(mode: str, graph: str) -> None:
    if mode not in TENSOR_MODES:
        raise StudioError(f"layerdiff.tensors = {mode!r}: use one of {', '.join(TENSOR_MODES)}")
    if graph not in GRAPHS:
        raise StudioError(f"layerdiff.graph = {graph!r}: use one of {', '.join(GRAPHS)}")


def _check_windows(spec: dict[str, Any], windows: list[list[int]], graph: str) -> None:
    P = int(spec["prompt_length"])
    width = P + 1 if graph == "decode" else P
    if not windows or any(len(w) != width for w in windows):
        raise StudioError(f"the layer diff of the {graph} graph scores windows of exactly "
                          + (f"P={P}" if graph == "prefill" else f"P + 1 = {width}")
                          + " tokens")


def _the_part(parts: list, part: int):
    """The part compared (``part``, 1-based), None for a model exported whole."""
    if len(parts) > 1 and not 1 <= part <= len(parts):
        raise StudioError(f"this model is exported in {len(parts)} parts: name the part to "
                          f"compare (layerdiff.part, studio bisect --part 1..{len(parts)})")
    if len(parts) == 1 and part > 1:
        raise StudioError(f"layerdiff.part = {part}, but this model is exported whole: use 0")
    return parts[part - 1] if len(parts) > 1 else None


@dataclass
class _Probes:
    """The tensors compared: the probes the quantized graph computes too, each one's tensor
    in the FP32 graph and in the QDQ graph (``qmap``: with its scale), and those it lacks."""

    probes: list[Probe]
    qmap: dict[str, dict[str, Any]]
    missing: list[str]
    out_name: str  # the graph's output: the logits, or a part's hand-off

    @classmethod
    def find(cls, fsrc: Path, qsrc: Path, mode: str, out_name: str) -> _Probes:
        probes = find_probes(_load(fsrc, "the export"), mode)
        qmap = qdq_tensor_map(_load(qsrc, "quantize"), [p.tensor for p in probes] + [out_name])
        missing = [p.name for p in probes if p.tensor not in qmap]
        probes = [p for p in probes if p.tensor in qmap]
        if out_name not in qmap or not probes:
            raise StudioError(f"{qsrc} does not compute the FP32 graph's tensors (no "
                              f"{out_name}): it is not the quantized export of this model; "
                              "re-run quantize")
        return cls(probes, qmap, missing, out_name)

    @property
    def ftensors(self) -> list[str]:
        return [p.tensor for p in self.probes]

    @property
    def qtensors(self) -> list[str]:
        return [self.qmap[p.tensor]["tensor"] for p in self.probes]


def _window_feeds(spec: dict[str, Any], export_dir: Path, graph: str,
                  windows: list[list[int]], threads: int) -> tuple[list[dict], list[list[int]]]:
    """The whole model's feeds of the graph compared, one per window (the decode graph's
    over an FP32 cache of the window's first P - 1 tokens), and the tokens each scores."""
    P = int(spec["prompt_length"])
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
    return feeds, scored


@dataclass
class _PartChain:
    """The compared graph's feeds (a part's: what the FP32 parts before it hand on), the
    whole model's, and the FP32 parts after it that carry a runtime's hand-off on to the
    logits (None for the last part or a model in one)."""

    feeds: list[dict]
    whole_feeds: list[dict]
    after: Any
    out_name: str

    @classmethod
    def of(cls, feeds: list[dict], parts: list, me, export_dir: Path, graph: str,
           fsrc: Path, out_name: str, threads: int) -> _PartChain:
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
        return cls(feeds, whole_feeds, after, out_name)

    def to_logits(self, out, wi: int):
        """The logits a runtime's output of the part gives: itself for the last part (or
        a model in one), else the FP32 parts after it run on that hand-off."""
        if self.after is None:
            return out
        return self.after.run(["logits"], {**self.whole_feeds[wi], self.out_name: out})[0]


def _host_runtimes(fx: Path, qx: Path, fsrc: Path, qsrc: Path, threads: int
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """FP32, host QDQ and host QDQ with ONNX Runtime's default optimizations: with the extra
    outputs (``probed``) and without them (``plain``)."""
    probed: dict[str, Any] = {"fp32": host_session(fx, threads),
                              "qdq": host_session(qx, threads),
                              "qdq_default": _default_session(qx, threads)}
    plain: dict[str, Any] = {"fp32": host_session(fsrc, threads),
                             "qdq": host_session(qsrc, threads),
                             "qdq_default": _default_session(qsrc, threads)}
    return probed, plain


def _htp_elsewhere(remote: dict[str, Any], probes: _Probes, fx: Path, qx: Path, qsrc: Path,
                   feeds: list[dict], probed: dict[str, Any], plain: dict[str, Any],
                   seconds: dict[str, float], progress: Progress) -> None:
    """The HTP's runs through ``remote["runner"]`` (a device through its agent), each graph
    once over every feed, replayed as sessions into ``probed`` and ``plain``."""
    runner, out_name = remote["runner"], probes.out_name
    chip, fp16 = remote["chip"], bool(remote.get("fp16"))
    where = remote.get("where", "the device")
    progress.update(0.05, f"running the graph with {len(probes.probes)} extra outputs on "
                          f"{where}")
    t0 = time.perf_counter()
    probed["htp"] = Replay(runner(qx, [out_name, *probes.qtensors], feeds, fp16))
    plain["htp"] = Replay(runner(qsrc, [out_name], feeds, fp16))
    if remote.get("fp16_step") and chip.fp16:
        progress.update(0.08, f"running the FP32 graph in FP16 on {where}")
        probed["htp_fp16"] = Replay(runner(fx, [out_name, *probes.ftensors], feeds, True))
    seconds["htp_remote"] = time.perf_counter() - t0


def _htp_here(htp: Mapping[str, Any], probes: _Probes, fx: Path, qx: Path,
              probed: dict[str, Any], plain: dict[str, Any], seconds: dict[str, float],
              progress: Progress) -> None:
    """The HTP sessions on this host (the QNN EP, the simulator on x86) into ``probed`` and
    ``plain``: the QDQ graph with the extra outputs, the compile stage's binary without them,
    and with ``fp16_step`` the FP32 graph in FP16."""
    chip, fp16 = htp["chip"], bool(htp.get("fp16"))
    extra = dict(htp.get("extra_options") or {})
    progress.update(0.05, f"preparing the graph with {len(probes.probes)} extra outputs for "
                          f"the HTP of {chip.name}")
    t0 = time.perf_counter()
    probed["htp"] = qnn.make_session(qx, chip, strict=True, fp16=fp16, extra_options=extra)
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


def _run_windows(probes: _Probes, pairs: list[tuple[str, str, str]], chain: _PartChain,
                 probed: dict[str, Any], plain: dict[str, Any], seconds: dict[str, float],
                 progress: Progress) -> tuple[dict, dict[str, list], dict[str, list]]:
    """Every runtime over every window: the figures of each probe and pair accumulated,
    and each runtime's logits with the extra outputs (``logits``) and without (``base``)."""
    out_name, ftensors, qtensors = probes.out_name, probes.ftensors, probes.qtensors
    feeds = chain.feeds
    acc = {(p.name, n): _Acc() for p in probes.probes for n, _, _ in pairs}
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
                store[k].append(np.asarray(chain.to_logits(vals[0], wi)[0], dtype=np.float32))
                if suffix:
                    got[k] = vals[1:]
                done += 1
        for i, p in enumerate(probes.probes):
            scale = probes.qmap[p.tensor]["scale"]
            for n, a, b in pairs:
                acc[(p.name, n)].add(got[a][i], got[b][i],
                                     scale if n == "htp_vs_qdq" else None)
        del got
    return acc, logits, base


def _rows(probes: list[Probe], pairs: list[tuple[str, str, str]], acc: dict
          ) -> list[dict[str, Any]]:
    """A row per probe: its figures per pair, and each one's gain over its inputs'."""
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
    return rows


def _final_logits(base: dict[str, list], logits: dict[str, list], scored: list[list[int]]
                  ) -> dict[str, Any]:
    """Each runtime's final logits against FP32's (the HTP's against host QDQ's too)."""
    ref = base["fp32"]
    final = {k: compare_logits(ref, v, scored) for k, v in base.items()}
    if "htp" in base:
        final["htp"]["top1_agreement_with_qdq"] = compare_logits(
            base["qdq"], base["htp"], scored)["top1_agreement"]
    if "htp_fp16" in logits:  # probed only: its plain run would be the same graph
        final["htp_fp16"] = compare_logits(ref, logits["htp_fp16"], scored)
    return final


def _extra_outputs(probed: dict[str, Any], logits: dict[str, list], base: dict[str, list]
                   ) -> dict[str, dict[str, Any]]:
    """Whether the extra outputs left each runtime's logits unchanged, and by how much."""
    return {k: {"logits_identical": _max_change(logits[k], base[k]) == 0.0,
                "logits_max_abs_change": _max_change(logits[k], base[k])}
            for k in probed if k in base}
