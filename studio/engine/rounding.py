"""Weight rounding for 4-bit (and 8-bit) per-channel weights: SeqMSE and AdaRound.

Round-to-nearest with MinMax ranges is what ONNX Runtime's quantizer does by itself. The two
methods here choose the integer weights of each quantized MatMul from calibration data, as
Qualcomm's LLM recipes do with AIMET:

- **SeqMSE** (per output channel): a search over candidate clipping ranges ``c = a * max|W|``
  (``a`` on a grid up to 1.0) of each layer's weights; each channel takes the candidate that
  minimises that channel's output error ``||X W_c - X Q_c(W_c)||^2`` on the layer's
  calibration inputs ``X``.
- **GPTQ** (Frantar et al. 2022): the input rows of the weight are quantized one at a time
  (largest ``H_ii`` first), each row's rounding error pushed onto the rows not yet quantized
  through the Cholesky factor of ``H^-1`` (1 % damping), on MinMax's scales (``gptq``) or on
  SeqMSE's (``seqmse_gptq``).
- **AdaRound** (Nagel et al. 2020): the scales stay MinMax's; each weight is rounded up or
  down as learned by minimising the layer's output reconstruction error with the rectified
  sigmoid ``h(V)`` and the annealed regulariser ``sum 1 - |2h - 1|^beta`` (Adam, a few
  hundred iterations per layer, torch on the CPU).

Both reduce the error through the layer's input Gram matrix ``H = X^T X``:
``||X D||^2 = sum_c d_c^T H d_c`` for ``D = W - Q(W)``, so the cost does not grow with the
number of calibration rows.

**Inputs.** The rows ``X`` of each MatMul's input are collected by running ONNX Runtime on
the FP32 graph with those tensors added as outputs. *Sequential* (as AIMET's SeqMSE): the
MatMuls are taken in waves by depth (a MatMul's wave is one more than the deepest quantized
MatMul upstream of it: q/k/v, then o, then gate/up, then down, then the next block), and each
wave's inputs come from the graph whose earlier waves already carry their rounded weights
(weights only: the activations stay float while collecting). Each wave runs the graphs over
the feeds again (4 waves per block + the head: 17 runs of every feed for the 4-block sample);
a model of many blocks would want each block's inputs cached instead (not done yet). A part
of a model in parts is rounded on its own inputs (the previous part's FP32 outputs).

**Applying it exactly.** The result is handed to the quantizer as per-channel
``TensorQuantOverrides`` with explicit ``scale`` / ``zero_point`` (symmetric, zero point 0)
and the FP32 weights replaced by their dequantized values ``q * s``; ORT then stores exactly
the integers chosen here (``round(q * s / s) = q``).

Grid: what ORT's MinMax gives a symmetric per-channel weight: ``s = 2 c / (qmax - qmin)`` with
ORT's range for the type (int4: -8..7, int8 symmetric: -127..127).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.progress import NullProgress, Progress
from studio.engine.onnxio import private_input
from studio.engine.quant_recipe import resolve_overrides
from studio.engine.threads import HOST_THREADS

onnx = lazy_module("onnx")
external_data_helper = lazy_module("onnx.external_data_helper")
numpy_helper = lazy_module("onnx.numpy_helper")
ort = lazy_module("onnxruntime")
ortq = lazy_module("onnxruntime.quantization")
quant_utils = lazy_module("onnxruntime.quantization.quant_utils")
torch = lazy_module("torch")

# SeqMSE: candidate clipping ranges a * max|W| per channel, a in [LOW, 1.0]
SEQMSE_CANDIDATES = 20
SEQMSE_LOW = 0.3
# AdaRound (Nagel et al. 2020; AIMET's defaults but the iteration count)
ADAROUND_ITERATIONS = 500
ADAROUND_LR = 1e-2
ADAROUND_REG = 0.1
ADAROUND_BETA = (20.0, 2.0)
ADAROUND_WARMUP = 0.2
_GAMMA, _ZETA = -0.1, 1.1
# GPTQ: damping of H's diagonal, as a fraction of its mean
GPTQ_DAMP = 0.01
SEED = 0


@dataclass(frozen=True)
class Target:
    """A MatMul weight [in, out] quantized symmetric per output channel (axis 1)."""

    weight: str
    node: str
    input: str
    quant_type: Any  # onnxruntime.quantization.QuantType
    qmin: int
    qmax: int


@dataclass
class Rounded:
    """What the rounding chose for one weight: integers [in, out] and a scale per channel."""

    ints: Any  # np.ndarray int32 [in, out]
    scales: Any  # np.ndarray float32 [out]
    quant_type: Any
    stats: dict[str, Any] = field(default_factory=dict)

    def dequantized(self):
        return (self.ints.astype(np.float32) * self.scales[None, :]).astype(np.float32)

    def overrides(self) -> list[dict[str, Any]]:
        """ORT's per-channel TensorQuantOverrides for this weight (explicit scales)."""
        out: list[dict[str, Any]] = []
        for c, s in enumerate(self.scales):
            d: dict[str, Any] = {"scale": np.float32(s), "zero_point": 0}
            if c == 0:
                d.update(quant_type=self.quant_type, axis=1)
            out.append(d)
        return out


def rounding_targets(model, init_overrides: dict[str, list[dict]]) -> dict[str, Target]:
    """The MatMul weights the quantizer will store symmetric per channel (axis 1), with
    their integer type: the layers a rounding method works on. Weights that per-layer
    overrides keep at 16 bits, per tensor or in float are not among them."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, Target] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = node.input[1]
        ov = init_overrides.get(w)
        if len(inits[w].dims) != 2 or not ov:
            continue
        first = ov[0]
        qt = first.get("quant_type")
        if first.get("axis") != 1 or not first.get("symmetric") or qt not in (
                ortq.QuantType.QInt4, ortq.QuantType.QInt8):
            continue
        qmin, qmax = quant_utils.get_qmin_qmax_for_qType(qt.tensor_type, symmetric=True)
        out[w] = Target(w, node.name, node.input[0], qt, int(qmin), int(qmax))
    return out


# ---------------------------------------------------------------------------- the algorithms


def _scales(absmax, t: Target):
    s = 2.0 * np.asarray(absmax, np.float64) / (t.qmax - t.qmin)
    # as ORT: a channel of zeros (a scale below float32's smallest normal) gets scale 1
    return np.where(s < np.finfo(np.float32).tiny, 1.0, s).astype(np.float32)


def _quant(w, scales, t: Target):
    """Round to nearest on the grid of ``scales`` (as ORT does: half to even, then clip)."""
    q = np.rint(w.astype(np.float32) / scales[None, :])
    return np.clip(q, t.qmin, t.qmax).astype(np.int32)


def channel_errors(h, w, ints, scales):
    """Each output channel's error ``d_c^T H d_c`` for ``d = W - q * s`` (float64)."""
    d = w.astype(np.float64) - ints.astype(np.float64) * scales.astype(np.float64)[None, :]
    return np.einsum("ic,ic->c", h @ d, d)


def nearest(w, t: Target) -> tuple[Any, Any]:
    """MinMax + round to nearest: what the quantizer does by itself."""
    s = _scales(np.abs(w).max(axis=0), t)
    return _quant(w, s, t), s


def seqmse(h, w, t: Target, candidates: int = SEQMSE_CANDIDATES, low: float = SEQMSE_LOW):
    """Per channel, the clipping range (of ``candidates`` between ``low`` and 1.0 times the
    channel's max |w|) whose nearest rounding gives the smallest output error on ``H``.
    Returns (ints, scales, the chosen fraction per channel)."""
    absmax = np.abs(w).max(axis=0).astype(np.float64)
    alphas = np.linspace(low, 1.0, candidates)
    best_s = _scales(absmax, t)  # 1.0 first: a tie keeps the wider range
    best_q = _quant(w, best_s, t)
    best_err = channel_errors(h, w, best_q, best_s)
    best_a = np.ones(w.shape[1])
    for a in alphas[-2::-1]:
        s = _scales(a * absmax, t)
        q = _quant(w, s, t)
        err = channel_errors(h, w, q, s)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_q = np.where(better[None, :], q, best_q)
        best_s = np.where(better, s, best_s)
        best_a = np.where(better, a, best_a)
    return best_q, best_s.astype(np.float32), best_a


def adaround(h, w, scales, t: Target, iterations: int = ADAROUND_ITERATIONS,
             lr: float = ADAROUND_LR, reg: float = ADAROUND_REG, seed: int = SEED,
             check=None):
    """AdaRound on the grid of ``scales``: learned up/down rounding of each weight that
    minimises the output error ``trace(D^T H D)`` (normalised by nearest rounding's), with the
    rectified sigmoid and the annealed regulariser. Returns the integers (hard rounding)."""
    torch.manual_seed(seed)
    # ||X D||^2 through a factor of H (rank <= the calibration rows): X_eff^T X_eff = H
    lam, u = np.linalg.eigh(np.asarray(h, np.float64))
    keep = lam > max(float(lam.max()), 0.0) * 1e-9
    xe = torch.from_numpy((np.sqrt(lam[keep])[:, None] * u[:, keep].T).astype(np.float32))
    wt = torch.from_numpy(np.array(w, np.float32))
    st = torch.from_numpy(np.asarray(scales, np.float32))[None, :]
    x = wt / st
    floor = torch.floor(x)
    rest = (x - floor).clamp(0.01, 0.99)
    # h(V) starts at the fractional part: rounding starts at the float weight
    v = (-torch.log((_ZETA - _GAMMA) / (rest - _GAMMA) - 1.0)).requires_grad_(True)
    opt = torch.optim.Adam([v], lr=lr)
    q0 = torch.from_numpy(_quant(w, scales, t).astype(np.float32))
    d0 = wt - q0 * st
    norm = float((xe @ d0).pow(2).sum()) or 1.0
    warm = int(iterations * ADAROUND_WARMUP)
    b0, b1 = ADAROUND_BETA
    lo, hi = float(t.qmin), float(t.qmax)
    for it in range(iterations):
        if check is not None and it % 50 == 0:
            check()
        hv = torch.clamp(torch.sigmoid(v) * (_ZETA - _GAMMA) + _GAMMA, 0.0, 1.0)
        soft = torch.clamp(floor + hv, lo, hi) * st
        d = wt - soft
        loss = (xe @ d).pow(2).sum() / norm
        if it >= warm:
            frac = (it - warm) / max(1, iterations - warm)
            beta = b1 + 0.5 * (b0 - b1) * (1 + np.cos(np.pi * frac))
            loss = loss + reg * (1 - (2 * hv - 1).abs().pow(beta)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        up = (v >= -np.log((_ZETA - _GAMMA) / (0.5 - _GAMMA) - 1.0)).float()
        q = torch.clamp(floor + up, lo, hi)
    return q.numpy().astype(np.int32)


def gptq(h, w, scales, t: Target, damp: float = GPTQ_DAMP, check=None):
    """GPTQ on the grid of ``scales``: rows of ``w`` [in, out] quantized in order of
    decreasing ``H_ii``, each row's error ``(w_i - q_i s) / U_ii`` taken off the later rows
    through the upper Cholesky factor ``U`` of ``H^-1``. Returns the integers."""
    n = h.shape[0]
    hd = np.array(h, np.float64)
    hd[np.diag_indices(n)] += damp * float(np.mean(np.diag(hd))) + 1e-12
    perm = np.argsort(-np.diag(hd), kind="stable")
    hd = hd[perm][:, perm]
    u = np.linalg.cholesky(np.linalg.inv(hd)).T
    rest = np.array(w, np.float64)[perm]
    s = np.asarray(scales, np.float64)
    q = np.empty(rest.shape, np.int32)
    for i in range(n):
        if check is not None and i % 256 == 0:
            check()
        qi = np.clip(np.rint(rest[i] / s), t.qmin, t.qmax)
        q[i] = qi
        err = (rest[i] - qi * s) / u[i, i]
        rest[i + 1:] -= np.outer(u[i, i + 1:], err)
    out = np.empty_like(q)
    out[perm] = q
    return out


def round_layer(h, w, t: Target, method: str, check=None) -> Rounded:
    """One layer's weights rounded by ``method``, never worse than nearest rounding on ``H``
    (a method that does not beat it falls back to it)."""
    q_n, s_n = nearest(w, t)
    e_n = float(channel_errors(h, w, q_n, s_n).sum())
    stats: dict[str, Any] = {"nearest_error": e_n}
    if method == "seqmse":
        q, s, a = seqmse(h, w, t)
        stats["clipped_channels"] = int((a < 1.0).sum())
        stats["mean_range"] = float(a.mean())
    elif method == "adaround":
        s = s_n
        q = adaround(h, w, s, t, check=check)
        stats["changed_weights"] = int((q != q_n).sum())
    elif method in ("gptq", "seqmse_gptq"):
        s = s_n
        if method == "seqmse_gptq":
            _, s, a = seqmse(h, w, t)
            stats["clipped_channels"] = int((a < 1.0).sum())
            stats["mean_range"] = float(a.mean())
        q = gptq(h, w, s, t, check=check)
        stats["changed_weights"] = int((q != _quant(w, s, t)).sum())
    else:
        raise StudioError(f"unknown weight rounding {method!r}")
    e = float(channel_errors(h, w, q, s).sum())
    if e > e_n:
        q, s, e = q_n, s_n, e_n
        stats["fell_back_to_nearest"] = True
    stats["error"] = e
    stats["error_ratio"] = e / e_n if e_n > 0 else 1.0
    return Rounded(q, s.astype(np.float32), t.quant_type, stats)


# ---------------------------------------------------------------------------- collecting inputs


@dataclass
class Source:
    """A graph and its calibration feeds; ``rows[i]``: the real rows of feed ``i`` (a padded
    prefill feed's first rows), None for all."""

    path: Path
    feeds: list[dict]
    rows: list[int | None]


def prefill_rows(feed: dict) -> int | None:
    """The real rows of a padded prefill feed (the last real row sees them all)."""
    mask = feed.get("attention_mask")
    if mask is None or mask.ndim < 3 or mask.shape[-2] <= 1:
        return None
    return int((mask.reshape(-1, mask.shape[-2], mask.shape[-1])[0, -1] == 0).sum())


def waves(model, targets: dict[str, Target]) -> list[list[str]]:
    """The targets in waves by depth: a MatMul's wave is one more than the deepest target
    MatMul upstream of it."""
    producer = {o: n for n in model.graph.node for o in n.output}
    by_node = {t.node: t.weight for t in targets.values()}
    depth: dict[str, int] = {}  # tensor -> depth of the deepest target upstream (+1)

    def tensor_depth(name: str) -> int:
        stack = [name]
        while stack:
            cur = stack[-1]
            if cur in depth:
                stack.pop()
                continue
            node = producer.get(cur)
            if node is None:
                depth[cur] = 0
                stack.pop()
                continue
            todo = [i for i in node.input if i and i not in depth]
            if todo:
                stack.extend(todo)
                continue
            d = max((depth[i] for i in node.input if i), default=0)
            if node.name in by_node:
                d += 1
            for o in node.output:
                depth[o] = d
            stack.pop()
        return depth[name]

    level: dict[int, list[str]] = {}
    for t in targets.values():
        level.setdefault(tensor_depth(t.input), []).append(t.weight)
    return [sorted(level[k]) for k in sorted(level)]


def _session(path: Path, outputs: list[str], replaced: dict[str, Any], work: Path):
    """A CPU session on ``path`` with ``outputs`` added as graph outputs and the weights of
    ``replaced`` in place of the file's (external data stays where it is: the graph is
    written beside links to its files)."""
    model = onnx.load(str(path), load_external_data=False)
    have = {o.name for o in model.graph.output}
    for name in outputs:
        if name not in have:
            model.graph.output.append(
                onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    local = private_input(Path(path), work)
    local.unlink()
    onnx.save_model(model, str(local))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = HOST_THREADS
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    keep = []
    for name, arr in replaced.items():
        val = ort.OrtValue.ortvalue_from_numpy(arr)
        keep.append(val)
        opts.add_initializer(name, val)
    sess = ort.InferenceSession(str(local), sess_options=opts,
                                providers=["CPUExecutionProvider"])
    sess._studio_keep = keep  # the initializers must outlive the session
    return sess


def _gram(sources: list[Source], tensors: list[str], replaced: dict[str, Any], work: Path,
          progress: Progress) -> tuple[dict[str, Any], int]:
    """``X^T X`` (float64) of each tensor over every source's feeds' real rows."""
    grams: dict[str, Any] = {}
    rows = 0
    for i, src in enumerate(sources):
        sess = _session(src.path, tensors, replaced, work / f"g{i}")
        for feed, limit in zip(src.feeds, src.rows, strict=True):
            progress.check()
            outs = sess.run(tensors, feed)
            for j, (name, x) in enumerate(zip(tensors, outs, strict=True)):
                x = np.asarray(x, np.float64)
                x = x.reshape(-1, x.shape[-1])[:limit]
                g = x.T @ x
                grams[name] = grams[name] + g if name in grams else g
                if j == 0:
                    rows += x.shape[0]
        del sess
    return grams, rows


def round_model(sources: list[Source], targets: dict[str, Target], weights: dict[str, Any],
                method: str, work: Path, progress: Progress = NullProgress(),
                sequential: bool = True) -> tuple[dict[str, Rounded], dict[str, Any]]:
    """Round the ``targets`` (weights given as FP32 arrays [in, out]) by ``method`` from the
    inputs their MatMuls see on ``sources`` (graphs sharing these weights, e.g. the prefill
    and decode graphs). Returns the rounding per weight and what was done (for quant.json;
    no timings). ``sequential``: later waves see the rounded weights of earlier ones."""
    t0 = time.perf_counter()
    model = onnx.load(str(sources[0].path), load_external_data=False)
    order = waves(model, targets) if sequential else [sorted(targets)]
    del model
    done: dict[str, Rounded] = {}
    replaced: dict[str, Any] = {}
    total, rows = len(targets), 0
    for k, wave in enumerate(order):
        tensors = sorted({targets[w].input for w in wave})
        progress.update(len(done) / max(1, total),
                        f"{method}: collecting inputs of {len(wave)} layer(s), wave "
                        f"{k + 1}/{len(order)}")
        grams, rows = _gram(sources, tensors, replaced, work / f"wave{k}", progress)
        for w in wave:
            progress.check()
            t = targets[w]
            progress.update(len(done) / max(1, total),
                            f"{method}: layer {len(done) + 1}/{total} {t.node}")
            r = round_layer(grams[t.input], weights[w], t, method, check=progress.check)
            done[w] = r
            replaced[w] = r.dequantized()
        del grams
    ratios = [r.stats["error_ratio"] for r in done.values()]
    summary = {
        "method": method,
        "layers": len(done),
        "sequential": sequential,
        "calibration_rows": rows,
        "mean_error_ratio": sum(ratios) / len(ratios) if ratios else 1.0,
        "by_layer": {w: {k: (round(v, 6) if isinstance(v, float) else v)
                         for k, v in r.stats.items()} for w, r in sorted(done.items())},
    }
    progress.log(f"{method}: {len(done)} layers rounded in {time.perf_counter() - t0:.1f} s, "
                 f"output error {summary['mean_error_ratio']:.3f} of nearest rounding's "
                 "(mean over layers, calibration inputs)")
    return done, summary


def round_for_recipe(sources: list[Source], recipe: dict, work: Path,
                     progress: Progress = NullProgress()
                     ) -> tuple[dict[str, Rounded], dict[str, Any], float]:
    """The recipe's ``weight_rounding`` applied to the weights it quantizes per channel in
    the graphs of ``sources`` (which share their weights: the first one's are read).
    Returns the rounding per weight, what was done (for quant.json) and the seconds it took
    (a run fact, kept out of the artifact)."""
    t0 = time.perf_counter()
    method = recipe["weight_rounding"]
    # the graph without its weights (a graph past 2 GB cannot go through shape inference,
    # which serializes it), then the weights rounded, one at a time
    src = Path(sources[0].path)
    model = onnx.load(str(src), load_external_data=False)
    targets = rounding_targets(model, resolve_overrides(model, recipe)["init_overrides"])
    weights = {}
    for t in model.graph.initializer:
        if t.name in targets:
            if external_data_helper.uses_external_data(t):
                external_data_helper.load_external_data_for_tensor(t, str(src.parent))
            weights[t.name] = numpy_helper.to_array(t)
    del model
    if not targets:
        progress.log(f"{method}: no weight is quantized per channel; nothing to round")
        return {}, {"method": method, "layers": 0}, time.perf_counter() - t0
    work.mkdir(parents=True, exist_ok=True)
    done, summary = round_model(sources, targets, weights, method, work, progress)
    return done, summary, time.perf_counter() - t0


def rounded_from_qdq(qdq_path: Path) -> dict[str, Rounded]:
    """The per-channel integer weights (axis 1, zero point 0) a quantized graph stores for
    its MatMuls, as roundings to apply to another graph with the same weights (an AR-N graph
    beside the decode graph), keyed by the FP32 weight's name."""
    types = {onnx.TensorProto.INT4: ortq.QuantType.QInt4,
             onnx.TensorProto.INT8: ortq.QuantType.QInt8}
    model = onnx.load(str(qdq_path))
    inits = {t.name: t for t in model.graph.initializer}
    weight_of = {n.input[1]: n for n in model.graph.node if n.op_type == "MatMul"}
    out: dict[str, Rounded] = {}
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or n.output[0] not in weight_of:
            continue
        q, s = inits.get(n.input[0]), inits.get(n.input[1])
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if q is None or s is None or q.data_type not in types or len(q.dims) != 2 or axis != 1:
            continue
        zp = numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 and \
            n.input[2] in inits else np.zeros(1)
        scales = numpy_helper.to_array(s).astype(np.float32)
        if np.any(zp != 0) or scales.shape != (q.dims[1],):
            continue
        name = q.name[:-len("_quantized")] if q.name.endswith("_quantized") else q.name
        out[name] = Rounded(numpy_helper.to_array(q).astype(np.int32), scales,
                            types[q.data_type], {})
    return out
