"""Per-layer precision sensitivity and automatic mixed precision, measured on the host CPU.

**What a variant is.** A variant is the base recipe (the project's scheme and weight
granularity, no overrides) plus one override rule in the recipe's vocabulary
(``{"model.layers.1.mlp.down_proj": "INT16"}``), quantized by the same QNN QDQ tools as the
quantize stage and scored against FP32.

**What keeps it affordable.**

- Only the *prefill* graph is quantized and scored: teacher-forced scoring runs over windows
  of ``P`` tokens of the held-out text, each window one prefill call (row ``i`` predicts
  token ``i + 1``). The decode graph holds the same layers and weights.
- Calibration runs once: the float graph is preprocessed and brought to opset 21 once (the
  quantizer does the same for 16-bit types; 4-bit weights need it too), the activation
  ranges are computed once from the calibration feeds and every later quantize reads them
  back (ONNX Runtime's calibration cache).
- Weights are quantized once. A variant that changes activations goes through the real
  quantizer with per-tensor weights (fast), then gets the base's per-channel weight tensors
  back; a variant that only changes weights (``INT4``) is the base model with those
  weights' tensors taken from one real quantize where every layer is ``INT4``. Per-channel
  weight quantization depends on the weight alone.
- Variants that change activations in parts of the graph no other one touches share one
  quantizer run: the QNN config says up front which tensors each variant changes (its
  resolved tensor overrides) and so which nodes it touches; variants whose tensors and nodes
  do not meet are quantized together, and each one's part of the result (the
  quantize-dequantize nodes made for its tensors, their scales, and the nodes that read
  them) is put on the base graph. A group whose joint plan is not the sum of its members',
  or whose result has a change that belongs to no member or to two, is quantized variant by
  variant. On the sample model the 29 layers' INT16 variants take 4 quantizer runs.
- Every shortcut gives the graph the quantizer gives for the variant alone: the tests
  compare them node by node and tensor by tensor.
- Host QDQ models are scored with ONNX Runtime's graph optimizations off: the CPU
  optimizer fuses DequantizeLinear + MatMul into ``MatMulNBits``, which re-quantizes
  activations and moves the figures.

Every figure here is ``measured`` on ``host-cpu`` (the host QDQ emulation, not the HTP).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import ORT_TOOLS, lazy_module
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.core.recipe import (
    PRECISION_BITS,
    PRECISIONS,
    SCHEME_PRECISIONS,
    activation_precision,
    effective_precisions,
    is_float_precision,
    is_float_scheme,
    is_weight_only,
    module_of_node,
    weight_precision,
)
from studio.engine import qnn
from studio.engine.calibration import build_calibration_feeds, calibration_windows
from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
from studio.engine.onnxio import load_spec, private_input
from studio.engine.qdq import (
    LogToProgress,
    calibration_reader,
    mapped_ranges,
    preprocess_fuses,
    static_quantize,
)
from studio.engine.quant_recipe import (
    GraphFacts,
    matmul_weights,
    normalize_recipe,
    resolve_overrides,
)
from studio.engine.splicing import (
    SHARED_SCALE_OPS,
    apply_part,
    canonical,
    node_key,
    split_variants,
)

onnx = lazy_module("onnx")
ort = lazy_module("onnxruntime")
ortq = lazy_module("onnxruntime.quantization")
# onnxruntime.tools left bare: its __init__ imports torch, which none of these needs
ortq_qnn = lazy_module("onnxruntime.quantization.execution_providers.qnn", bare=ORT_TOOLS)
quantize = lazy_module("onnxruntime.quantization.quantize")

SOURCE, DEVICE = "measured", "host-cpu"
#: the precision a layer is raised to when ``high`` is "auto": one step above the scheme (over
#: 4-bit weights: the layer's weights to 8 bits, as published W4A16 models keep a few layers)
AUTO_HIGH = {"W8A8": "INT16", "W8A16": "FP16", "W4A16": "INT8"}
METRICS = ("perplexity", "logits_cosine", "top1_agreement", "kl_divergence")
_BLOCK = re.compile(r"^(.*?layers\.\d+)\.")
_BLOCK_NAME = re.compile(r"^.*layers\.\d+$")


# ---------------------------------------------------------------------------- choices


def resolve_choices(scheme: str, high: str, low: str) -> tuple[str, str]:
    """The precisions a layer is raised and lowered to; StudioError when they change nothing."""
    if scheme not in SCHEME_PRECISIONS or is_float_scheme(scheme):
        raise StudioError(
            f"sensitivity analysis needs a quantized scheme (W8A8 or W8A16), not {scheme!r}: "
            "set quantization.scheme"
        )
    if high == "auto" and scheme not in AUTO_HIGH:
        raise StudioError(
            f"sensitivity.high = auto has no step above {scheme} (auto raises "
            + ", ".join(f"{s} to {p}" for s, p in AUTO_HIGH.items())
            + "): name the precision, e.g. sensitivity.high = \"FP16\""
        )
    high = AUTO_HIGH[scheme] if high == "auto" else high
    if high not in PRECISIONS:
        raise StudioError(
            f"sensitivity.high = {high!r} is not one of auto, {', '.join(PRECISIONS)}"
        )
    if low and low not in PRECISIONS:
        raise StudioError(
            f"sensitivity.low = {low!r} is not one of {', '.join(PRECISIONS)} (or \"\" for none)"
        )
    act = activation_precision(scheme)
    for what, prec in (("high", high), ("low", low)):
        if prec and prec == act:
            raise StudioError(
                f"sensitivity.{what} = {prec} is what {scheme} already gives every layer's "
                f"activations: choose another precision (auto raises {scheme} to "
                f"{AUTO_HIGH[scheme]})"
            )
    if high == "INT4" or (high == "INT8" and act == "INT16"
                          and weight_precision(scheme) != "INT4"):
        raise StudioError(
            f"sensitivity.high = {high} lowers the layer over {scheme}: set it as sensitivity.low"
        )
    if low == "INT4" and weight_precision(scheme) == "INT4":
        low = ""  # the scheme's weights are 4-bit already: nothing to lower them to
    if is_float_precision(low) or low == "INT16":
        raise StudioError(
            f"sensitivity.low = {low} raises the layer: use INT4 (4-bit weights), INT8 over "
            "W8A16, or \"\" for none"
        )
    return high, low


def weights_only(scheme: str, precision: str) -> bool:
    """Whether raising a layer to ``precision`` over ``scheme`` raises its weights alone: 4-bit
    weights to 8 bits under the scheme's 16-bit activations."""
    return weight_precision(scheme) == "INT4" and precision == "INT8"


def rule_for(name: str, precision: str, scheme: str) -> str:
    """The override pattern that gives layer (or block) ``name`` ``precision`` over
    ``scheme``: the name itself, or its weights' pattern when the change is to the weights
    alone (``model.layers.3.mlp.down_proj.weight``; a block: ``model.layers.3.*.weight``)."""
    if not weights_only(scheme, precision):
        return name
    return f"{name}.*.weight" if _BLOCK_NAME.match(name) else f"{name}.weight"


def raise_ranking(sens: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """The weighted layers and key activations of a sensitivity result (``sensitivity.json``)
    in one ranking, by what raising each alone gained (the KL drop; ties in the stage's own
    order), and those gains (a result from before key activations were ranked has none)."""
    units = list(sens["layers"]) + list(sens.get("points", []))
    gains = {e["name"]: -e["raise"]["delta"]["kl_divergence"] for e in units}
    order = {name: i for i, name in enumerate(
        sens["ranking"]["raise"] + sens["ranking"].get("raise_points", []))}
    return sorted(gains, key=lambda n: (-gains[n], order.get(n, len(order)))), gains


def _check_calibration_cache() -> None:
    """Variants read the activation ranges back from ONNX Runtime's calibration cache."""
    if "calibration_cache_path" not in inspect.signature(quantize.quantize_static).parameters:
        raise StudioError(
            f"onnxruntime {ort.__version__} cannot reuse calibration ranges; the "
            "sensitivity analysis needs onnxruntime 1.32 or later: upgrade it"
        )


def block_of(layer: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.3``; "" for a layer outside a block."""
    m = _BLOCK.match(layer)
    return m.group(1) if m else ""


# ---------------------------------------------------------------------------- scoring


def heldout_windows(ids: list[int], length: int) -> list[list[int]]:
    """Consecutive windows of ``length`` tokens (the last may be shorter, never below 2)."""
    wins = [ids[i : i + length] for i in range(0, len(ids), length)]
    wins = [w for w in wins if len(w) >= 2]
    if not wins:
        raise StudioError("the held-out slice has fewer than 2 tokens: use a longer text")
    return wins


def host_session(model, threads: int = 1):
    """An ONNX Runtime CPU session for a host QDQ model, graph optimizations off: the CPU
    optimizer would fuse DequantizeLinear + MatMul into MatMulNBits and re-quantize the
    activations. ``model`` is a path or a ModelProto. One thread by default: a QDQ graph is
    a thousand small nodes, and on the sample model one thread ran it twice as fast as two,
    with the same logits bit for bit."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(src, sess_options=opts, providers=["CPUExecutionProvider"])


def compare_logits(ref: list, got: list, windows: list[list[int]]) -> dict[str, float]:
    """Teacher-forced figures of ``got`` against the FP32 ``ref`` (lists of [n, V] logits)."""
    nll = cnt = 0.0
    cos, top1, kl = [], [], []
    for r, g, w in zip(ref, got, windows, strict=True):
        a, b = r.astype(np.float64), g.astype(np.float64)
        lb = b - b.max(-1, keepdims=True)
        lb = lb - np.log(np.exp(lb).sum(-1, keepdims=True))
        la = a - a.max(-1, keepdims=True)
        la = la - np.log(np.exp(la).sum(-1, keepdims=True))
        n = len(w)
        nll -= float(lb[np.arange(n - 1), w[1:]].sum())
        cnt += n - 1
        cos.append((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
                                      + 1e-12))
        top1.append(a.argmax(-1) == b.argmax(-1))
        kl.append((np.exp(la) * (la - lb)).sum(-1))
    return {
        "perplexity": math.exp(nll / cnt),
        "logits_cosine": float(np.concatenate(cos).mean()),
        "top1_agreement": float(np.concatenate(top1).mean()),
        "kl_divergence": float(np.concatenate(kl).mean()),
    }


def greedy_against_fp32(fp32_logits, prompt: list[int], got: list[int]) -> dict[str, Any]:
    """A runtime's greedy tokens ``got`` after ``prompt`` judged by FP32: ``fp32_logits`` are
    FP32's teacher-forced logits over ``prompt + got``; each new token against FP32's choice
    given the runtime's own text (``agreement``), and the share before the first difference
    (``prefix``: one near-tie flip early on shifts everything after it)."""
    choice = [int(fp32_logits[len(prompt) - 1 + i].argmax()) for i in range(len(got))]
    same = [a == b for a, b in zip(choice, got, strict=True)]
    first = next((i for i, x in enumerate(same) if not x), len(same))
    return {"agreement": sum(same) / max(1, len(same)), "prefix": first / max(1, len(same)),
            "first_difference": first, "fp32_choice": choice}


def perplexity(logits: list, windows: list[list[int]]) -> float:
    return compare_logits(logits, logits, windows)["perplexity"]


# ---------------------------------------------------------------------------- the bench


class _CheckOnly:
    """Passes cancellation through, keeps the calibration reader's fractions to itself."""

    def __init__(self, parent: Progress):
        self.parent = parent

    def update(self, fraction: float, message: str = "") -> None:
        pass

    def log(self, message: str) -> None:
        pass

    def check(self) -> None:
        self.parent.check()


@dataclass
class _WeightQ:
    """One weight as the quantizer wrote it: its three tensors and its DequantizeLinear."""

    tensors: dict[str, Any]  # initializer name -> TensorProto
    dq_attrs: list[Any]


class VariantBench:
    """The base recipe's prefill graph, calibrated and quantized once, and the FP32 logits of
    the held-out windows; :meth:`evaluate` quantizes and scores one variant,
    :meth:`evaluate_many` many (sharing quantizer runs where they can).

    Give either the calibration text and its tokenizer (the ranges are computed once, then
    :attr:`ranges` holds them) or ``ranges`` from an earlier bench on the same export and
    recipe. Use it as a context manager: it works in a temporary folder under
    ``work_parent``.
    """

    def __init__(self, graphs_dir: Path, recipe: dict, heldout_ids: list[int],
                 work_parent: Path, *, calibration_text: str = "",
                 tokenizer_dir: Path | None = None, ranges: Path | None = None,
                 progress: Progress = NullProgress(), threads: int = 1):
        self.graphs_dir = Path(graphs_dir)
        self.spec = load_spec(self.graphs_dir)
        if self.spec.get("dtype", "float32") != "float32" or "quantization" in self.spec:
            raise StudioError(
                f"{graphs_dir} holds quantized graphs; analyse the FP32 export instead"
            )
        base = normalize_recipe({**recipe, "overrides": {}})
        if is_float_scheme(base["scheme"]):
            resolve_choices(base["scheme"], "auto", "")  # raises the one-line error
        if ranges is None and (not calibration_text or tokenizer_dir is None):
            raise StudioError("give a calibration text and its tokenizer, or calibration ranges")
        _check_calibration_cache()
        self.recipe = base
        self.calibration_text = calibration_text
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
        self.given_ranges = Path(ranges) if ranges else None
        self.windows = heldout_windows(list(heldout_ids), int(self.spec["prompt_length"]))
        self.progress = progress
        self.threads = threads
        self.work = Path(tempfile.mkdtemp(dir=work_parent, prefix=".sensitivity."))
        self.ranges = self.work / "calibration.json"
        self.quantized = 0  # runs of the quantizer
        self.patched = 0  # 4-bit variants: the base with weights quantized earlier
        self.spliced = 0  # variants cut out of a group's quantizer run
        self._plans: dict[str, tuple[dict[str, str], frozenset[str]]] = {}
        self._configs: dict[str, tuple[dict, Any]] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> VariantBench:
        try:
            self.prepare()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)

    # -- preparation ------------------------------------------------------------------------
    def prepare(self) -> None:
        """Float model, calibration ranges, FP32 reference, base model, 4-bit weights."""
        src = self.graphs_dir / "prefill.onnx"
        if not src.is_file():
            raise StudioError(f"{self.graphs_dir} has no prefill.onnx; re-run the export")
        self._prepare_float(src)
        self._prepare_feeds()
        self._prepare_reference(src)
        self._prepare_layers()
        self._prepare_base()
        self._index_nodes()

    def _prepare_float(self, src: Path) -> None:
        """The float prefill graph as the quantizer reads it (QNN's preprocessing, opset 21)."""
        self.progress.update(0.0, "preparing the float prefill graph")
        pre = self.work / "preprocessed.onnx"
        fused = preprocess_fuses(src) and ortq_qnn.qnn_preprocess_model(str(src), str(pre))
        model_path = pre if fused else private_input(src, self.work)
        model = onnx.load(str(model_path))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        if opset < 21:  # what the quantizer does for 16-bit types; 4-bit weights need it too
            model = onnx.version_converter.convert_version(model, 21)
        self.float_path = self.work / "float.onnx"
        onnx.save(model, str(self.float_path))
        self.model = model
        self.facts = GraphFacts.of(model)  # read by every variant's recipe, computed once

    def _prepare_feeds(self) -> None:
        """The calibration ranges given, or the calibration feeds to find them from."""
        p = self.progress
        P, C = int(self.spec["prompt_length"]), int(self.spec["context_length"])
        p.check()
        self.feeds: list[dict] = []  # only read when the ranges are not known yet
        if self.given_ranges is not None:
            if not self.given_ranges.is_file():
                raise StudioError(
                    f"calibration ranges {self.given_ranges} are missing: re-run the sensitivity "
                    "stage"
                )
            shutil.copy2(self.given_ranges, self.ranges)
        else:
            p.update(0.02, "calibration feeds")
            assert self.tokenizer_dir is not None
            wins = calibration_windows(self.calibration_text, self.tokenizer_dir, length=C,
                                       count=self.recipe["samples"], min_length=min(C, P + 1))
            self.feeds, _ = build_calibration_feeds(
                self.graphs_dir, self.spec, wins, SubProgress(p, 0.02, 0.1), decode_per_window=0
            )

    def _prepare_reference(self, src: Path) -> None:
        """The FP32 logits of the held-out windows, and their perplexity."""
        p = self.progress
        p.check()
        p.update(0.1, "FP32 logits of the held-out windows")
        fp32 = make_cpu_session(src, threads=self.threads)
        gen = StaticKVGenerator(fp32, make_cpu_session(self.graphs_dir / "decode.onnx",
                                                       threads=1), self.spec)
        self._feeds = [gen.prefill_feed(w) for w in self.windows]  # as validate pads them
        self.reference = self._logits(fp32)
        self.fp32 = {"perplexity": perplexity(self.reference, self.windows)}

    def _prepare_layers(self) -> None:
        """The weighted layers, the key activations without weights, the blocks."""
        applied = resolve_overrides(self.model, self.recipe, self.facts)["layers"]
        self.layers = [r["layer"] for r in applied if r["weight"]]  # the weighted layers
        # key activations without weights (attention scores, softmax output, residual)
        self.points = [r["layer"] for r in applied if not r["weight"]]
        self.weight_of = self._weights_by_layer()
        self.blocks = sorted({b for b in map(block_of, self.layers) if b},
                             key=lambda b: int(b.rsplit(".", 1)[1]))

    def _prepare_base(self) -> None:
        """The calibration ranges (the quantize stage's, to the same bits) and the base
        model quantized with the recipe, its 8-bit weights and plan."""
        p = self.progress
        p.check()
        p.update(0.15, f"calibrating and quantizing the base ({self.recipe['scheme']})")
        if not self.ranges.is_file():  # the quantize stage's calibration, to the same bits
            cache = mapped_ranges(self.float_path, self._config(self.recipe)[1], self.feeds,
                                   _CheckOnly(p))
            if cache is not None:
                os.replace(cache, self.ranges)
        self.base_path = self._real(self.recipe, self.work / "base.onnx")
        self._base = onnx.load(str(self.base_path))
        self._int8 = self._harvest(self._base)
        self._int4: dict[str, _WeightQ] | None = None
        self._w8: dict[str, _WeightQ] | None = None
        self._base_plan = self._plan(self.recipe)

    def _index_nodes(self) -> None:
        """Each node's tensors, the nodes that make or read each tensor, and the outputs
        that share an input's scale."""
        self._node_io: dict[str, tuple[str, ...]] = {}
        self._touching: dict[str, set[str]] = {}  # tensor -> nodes that make or read it
        self._passes_scale: dict[str, list[str]] = {}  # input -> outputs sharing its scale
        for node in self.model.graph.node:
            key = node_key(node)
            self._node_io[node.name] = (*node.input, *node.output)
            for t in (*node.input, *node.output):
                self._touching.setdefault(t, set()).add(key)
            if node.op_type in SHARED_SCALE_OPS and node.input:
                self._passes_scale.setdefault(node.input[0], []).extend(node.output)

    def _weights_by_layer(self) -> dict[str, tuple[str, int, int]]:
        """layer -> (weight initializer, element count, output features)."""
        inits = {t.name: t for t in self.model.graph.initializer}
        out = {}
        for w, node in matmul_weights(self.model).items():
            dims = list(inits[w].dims)
            out[module_of_node(node)] = (w, int(dims[0]) * int(dims[1]), int(dims[1]))
        return out

    # -- quantizing -------------------------------------------------------------------------
    def _recipe(self, overrides: dict[str, str]) -> dict:
        return normalize_recipe({**self.recipe, "overrides": dict(overrides), "given": {}})

    def _config(self, recipe: dict):
        """The quantizer's configuration for a recipe: the recipe's tensor overrides as the
        quantize stage resolves them, completed by the QNN config (converts, shared scales)."""
        key = canonical([recipe["weight_granularity"], recipe["overrides"]])
        if key not in self._configs:
            resolved = resolve_overrides(self.model, recipe, self.facts)
            act = ortq.QuantType.QUInt16 if recipe["scheme"] == "W8A16" else ortq.QuantType.QUInt8
            self._configs[key] = resolved, ortq_qnn.get_qnn_qdq_config(
                self.model, calibration_reader(self.feeds, _CheckOnly(self.progress)),
                activation_type=act, weight_type=ortq.QuantType.QUInt8, per_channel=False,
                init_overrides=resolved["init_overrides"] or None,
                nodes_to_exclude=resolved["nodes_to_exclude"] or None,
            )
        return self._configs[key]

    def _plan(self, recipe: dict) -> tuple[dict[str, str], frozenset[str]]:
        """What the quantizer will do, in comparable form: tensor -> its resolved override,
        and the nodes left float."""
        key = canonical(recipe["overrides"])
        if key not in self._plans:
            resolved, config = self._config(recipe)
            tqo = config.extra_options.get("TensorQuantOverrides", {})
            self._plans[key] = ({t: canonical(v) for t, v in tqo.items()},
                                frozenset(resolved["nodes_to_exclude"]))
        return self._plans[key]

    def _real(self, recipe: dict, out: Path) -> Path:
        """The real quantizer on the prepared float graph, reading the cached ranges."""
        self.progress.check()
        _, config = self._config(recipe)
        handler = LogToProgress(NullProgress())
        root = logging.getLogger()
        root.addHandler(handler)
        level = root.level
        root.setLevel(logging.ERROR)  # keeps the quantizer's advice off stderr
        try:
            static_quantize(self.float_path, out, config, self.ranges)
        except ValueError as exc:
            raise StudioError(f"quantizing a variant failed: {str(exc).splitlines()[0]}") from None
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
        self.quantized += 1
        return out

    @staticmethod
    def _harvest(model) -> dict[str, _WeightQ]:
        """Each quantized MatMul weight of a QDQ model: its tensors and DequantizeLinear."""
        inits = {t.name: t for t in model.graph.initializer}
        out = {}
        for node in model.graph.node:
            if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
                continue
            if not node.input[0].endswith("_quantized"):
                continue
            name = node.input[0].removesuffix("_quantized")
            out[name] = _WeightQ({i: inits[i] for i in node.input if i in inits},
                                 list(node.attribute))
        return out

    @staticmethod
    def _patch(model, weights: dict[str, _WeightQ]) -> None:
        """Replace weights' quantized tensors (and their DequantizeLinear's attributes)."""
        index = {t.name: i for i, t in enumerate(model.graph.initializer)}
        for node in model.graph.node:
            if node.op_type != "DequantizeLinear" or not node.input[0].endswith("_quantized"):
                continue
            wq = weights.get(node.input[0].removesuffix("_quantized"))
            if wq is None:
                continue
            for name, tensor in wq.tensors.items():
                model.graph.initializer[index[name]].CopyFrom(tensor)
            del node.attribute[:]
            node.attribute.extend(wq.dq_attrs)

    def _weights_only(self, recipe: dict) -> bool:
        """Whether a variant changes weights alone (4-bit weights, or 8-bit ones over a
        4-bit scheme): the base graph with those weights patched in, no quantizer run."""
        rules = recipe["overrides"].items()
        return bool(rules) and (all(p == "INT4" for _, p in rules) or all(
            weights_only(self.recipe["scheme"], p) and is_weight_only(k) for k, p in rules))

    def _int8_weights(self) -> dict[str, _WeightQ]:
        """Every weight at 8 bits per channel under the base's activations (over a 4-bit
        scheme: what raising a layer's weights gives them)."""
        if self._w8 is None:
            recipe = self._recipe({f"{layer}.weight": "INT8" for layer in self.layers})
            path = self._real(recipe, self.work / "all-int8.onnx")
            self._w8 = self._harvest(onnx.load(str(path)))
            path.unlink()
        return self._w8

    def _int4_weights(self) -> dict[str, _WeightQ]:
        if self._int4 is None:
            recipe = self._recipe({layer: "INT4" for layer in self.layers})
            path = self._real(recipe, self.work / "all-int4.onnx")
            self._int4 = self._harvest(onnx.load(str(path)))
            path.unlink()
        return self._int4

    def _base_copy(self):
        model = onnx.ModelProto()
        model.CopyFrom(self._base)
        return model

    def _quantized(self, recipe: dict):
        """The real quantizer for a recipe that changes activations. Weights are quantized per
        tensor there (fast) and get the base's per-channel tensors back."""
        fast = {**recipe, "weight_granularity": "per_tensor"}
        model = onnx.load(str(self._real(fast, self.work / "variant.onnx")))
        if self.recipe["weight_granularity"] == "per_channel":
            back = {}
            for name, wq in self._harvest(model).items():
                zp = next((t for n, t in wq.tensors.items() if n.endswith("_zero_point")), None)
                if zp is not None and zp.data_type == onnx.TensorProto.UINT8 and name in self._int8:
                    back[name] = self._int8[name]
            self._patch(model, back)
        return model

    def variant_model(self, overrides: dict[str, str]):
        """The quantized prefill ModelProto of the base recipe plus ``overrides``."""
        recipe = self._recipe(overrides)
        if not recipe["overrides"]:
            return self._base_copy()
        if self._weights_only(recipe) and all(p == "INT4" for p in recipe["overrides"].values()):
            # 4-bit weights change only those weights' tensors: the base graph with them
            int4 = self._int4_weights()
            model = self._base_copy()
            self._patch(model, {w: int4[w] for w in self._covered_weights(recipe)})
            self.patched += 1
            return model
        if self._weights_only(recipe):
            # 8-bit weights over a 4-bit scheme: the base graph with those weights as the
            # same recipe at 8-bit weights quantizes them (a weight's scales are its own)
            int8 = self._int8_weights()
            model = self._base_copy()
            self._patch(model, {w: int8[w] for w in self._covered_weights(recipe, "QInt8")})
            self.patched += 1
            return model
        return self._quantized(recipe)  # 4-bit weights among them are quantized there

    def variant_models(self, variants: list[dict[str, str]]):
        """:meth:`variant_model` for many variants, yielded in order. Variants that change
        activations in parts of the graph no other variant of a group touches go through the
        quantizer together, once per group; each one's part of the result (the quantize-dequantize
        nodes of the tensors it changes, and the nodes that read them) is put on the base graph.
        A group whose result cannot be split that way is quantized variant by variant."""
        recipes = [self._recipe(v) for v in variants]
        todo = [i for i, r in enumerate(recipes) if r["overrides"] and not self._weights_only(r)]
        parts: dict[int, Any] = {}
        for group in self._groups([(i, recipes[i]) for i in todo]):
            if len(group) > 1:
                parts.update(self._split_group(group) or {})
        for i, v in enumerate(variants):
            if i in parts:
                model = self._base_copy()
                apply_part(model, parts.pop(i))
                self.spliced += 1
                yield model
            else:
                yield self.variant_model(v)

    def _groups(self, items: list[tuple[int, dict]]) -> list[list[tuple[int, dict, set, set]]]:
        """First-fit packing of variants whose changed tensors and the nodes around them do
        not meet."""
        base_tqo, base_excl = self._base_plan
        groups: list[list[tuple[int, dict, set, set]]] = []
        used: list[tuple[set, set]] = []
        for i, recipe in items:
            tqo, excl = self._plan(recipe)
            tensors = {t for t in tqo.keys() | base_tqo.keys() if tqo.get(t) != base_tqo.get(t)}
            for name in excl ^ base_excl:
                tensors.update(self._node_io.get(name, ()))
            todo = list(tensors)
            while todo:  # outputs that take their scale from a changed input change too
                for out in self._passes_scale.get(todo.pop(), ()):
                    if out not in tensors:
                        tensors.add(out)
                        todo.append(out)
            nodes = set(excl ^ base_excl)
            for t in tensors:
                nodes.update(self._touching.get(t, ()))
            for g, (gt, gn) in zip(groups, used, strict=True):
                if not (tensors & gt) and not (nodes & gn):
                    g.append((i, recipe, tensors, nodes))
                    gt |= tensors
                    gn |= nodes
                    break
            else:
                groups.append([(i, recipe, tensors, nodes)])
                used.append((set(tensors), set(nodes)))
        return groups

    def _split_group(self, group) -> dict[int, Any] | None:
        """Quantize a group's variants together and split the result by variant; None when
        the quantizer's plan or result for the group is not the sum of its variants'."""
        overrides: dict[str, str] = {}
        for _, recipe, _, _ in group:
            overrides.update(recipe["given"])
        joint = normalize_recipe({**self.recipe, "overrides": overrides, "given": {}})
        base_tqo, base_excl = self._base_plan
        tqo, excl = self._plan(joint)
        want = dict(base_tqo)
        want_excl = set(base_excl)
        for _, recipe, tensors, _ in group:
            mine, mine_excl = self._plan(recipe)
            for t in tensors:
                if t in mine:
                    want[t] = mine[t]
                else:
                    want.pop(t, None)
            want_excl |= mine_excl - base_excl
        if tqo != want or excl != want_excl:
            return None
        owners = {t: i for i, _, tensors, _ in group for t in tensors}
        return split_variants(self._base, self._quantized(joint), owners)

    def quantizer_model(self, overrides: dict[str, str]):
        """The variant as the quantizer alone gives it, weights included (the slow way that
        :meth:`variant_model` and :meth:`variant_models` must match)."""
        return onnx.load(str(self._real(self._recipe(overrides),
                                        self.work / "by-the-quantizer.onnx")))

    def _covered_weights(self, recipe: dict, quant_type: str = "QInt4") -> set[str]:
        """The weights a recipe quantizes to ``quant_type`` (4-bit by default)."""
        weights = {w for w, _, _ in self.weight_of.values()}
        res, _ = self._config(recipe)
        return {name for name, ov in res["init_overrides"].items()
                if name in weights and getattr(ov[0].get("quant_type"), "name", "") == quant_type}

    # -- scoring ----------------------------------------------------------------------------
    def _logits(self, session) -> list:
        out = []
        for w, feed in zip(self.windows, self._feeds, strict=True):
            lg = session.run(["logits"], feed)[0]
            out.append(np.asarray(lg[0, : len(w)], dtype=np.float32))
        return out

    def score(self, model) -> dict[str, float]:
        """Teacher-forced figures of a quantized prefill graph (a path or a ModelProto) on the
        held-out windows against FP32."""
        self.progress.check()
        logits = self._logits(host_session(model, self.threads))
        return compare_logits(self.reference, logits, self.windows)

    def _score(self, model, overrides: dict[str, str]) -> dict[str, Any]:
        return {**self.score(model), **self.footprint(overrides)}

    def evaluate(self, overrides: dict[str, str]) -> dict[str, Any]:
        """Quantize the variant and score it: perplexity, logits cosine, top-1, KL vs FP32,
        and its weight and activation bytes under the recipe's override rule."""
        return self._score(self.variant_model(overrides), overrides)

    def evaluate_many(self, variants: list[dict[str, str]], progress: Progress = NullProgress()
                      ) -> list[dict[str, Any]]:
        """:meth:`evaluate` for many variants (quantized in groups where they do not meet)."""
        out = []
        for i, model in enumerate(self.variant_models(variants)):
            progress.update(i / max(1, len(variants)),
                            ", ".join(f"{k}={v}" for k, v in variants[i].items()))
            out.append(self._score(model, variants[i]))
        return out

    def score_on_htp(self, overrides: dict[str, str], chip) -> dict[str, float]:
        """The variant's figures on the QNN HTP *simulator* of ``chip`` (every node on the
        HTP, as the compile stage requires): the same windows, the same FP32 reference."""
        self.progress.check()
        path = self.work / "htp-variant.onnx"
        onnx.save(self.variant_model(overrides), str(path))
        session = qnn.make_session(path, chip, strict=True, threads=self.threads)
        try:
            return compare_logits(self.reference, self._logits(session), self.windows)
        finally:
            del session
            path.unlink(missing_ok=True)

    def footprint(self, overrides: dict[str, str]) -> dict[str, int]:
        """Weight bytes of the weighted layers, and bytes of their outputs per token, as the
        recipe's override rule (``effective_precisions``) gives each layer."""
        q = {"scheme": self.recipe["scheme"],
             "weight_granularity": self.recipe["weight_granularity"], "overrides": overrides}
        wb = ab = 0
        for lp in effective_precisions(self.layers, q, set(self.weight_of)):
            _, numel, out_features = self.weight_of[lp.layer]
            wb += numel * PRECISION_BITS[lp.weight] // 8
            ab += out_features * PRECISION_BITS[lp.activation] // 8
        return {"weight_bytes": wb, "activation_bytes_per_token": ab}
