"""Running the QNN QDQ quantizer on one graph (``onnxruntime.quantization``'s QNN flow:
``qnn_preprocess_model``, ``get_qnn_qdq_config``, ``quantize``): calibration ranges computed
once and read back, weights rounded where the recipe says (:mod:`studio.engine.rounding`),
the activation encodings of a quantized graph, and a graph quantized like another
(:func:`quantize_like`). The recipe and its overrides are :mod:`studio.engine.quant_recipe`;
the LLM's graphs together are :mod:`studio.engine.quantize`."""


from __future__ import annotations

import inspect
import logging
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.lazyimport import ORT_TOOLS, lazy_module
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.core.recipe import (
    DEFAULT_WEIGHT_ROUNDING,
    activation_bits,
    is_float_scheme,
    weight_precision,
)
from studio.engine import qdq_weights, weightstore
from studio.engine.onnxio import private_input, save_onnx_atomic, weight_bytes
from studio.engine.quant_recipe import (
    matmul_precisions,
    normalize_recipe,
    resolve_overrides,
)
from studio.engine.rounding import Source, round_for_recipe, rounded_from_qdq, rounding_targets
from studio.engine.weightstore import WeightStore

onnx = lazy_module("onnx")
external_data_helper = lazy_module("onnx.external_data_helper")
numpy_helper = lazy_module("onnx.numpy_helper")
ort = lazy_module("onnxruntime")
if TYPE_CHECKING:  # a checker reads the module itself
    from onnxruntime import quantization as ortq
else:
    ortq = lazy_module("onnxruntime.quantization")
if TYPE_CHECKING:  # a checker reads the module itself
    from onnxruntime.quantization import calibrate
else:
    calibrate = lazy_module("onnxruntime.quantization.calibrate")
# onnxruntime.tools left bare: its __init__ imports torch, which none of these needs
ortq_qnn = lazy_module("onnxruntime.quantization.execution_providers.qnn", bare=ORT_TOOLS)
fusion_lpnorm = lazy_module("onnxruntime.quantization.execution_providers.qnn.fusion_lpnorm",
                            bare=ORT_TOOLS)
fusion_spacetodepth = lazy_module(
    "onnxruntime.quantization.execution_providers.qnn.fusion_spacetodepth", bare=ORT_TOOLS)
fusions = lazy_module("onnxruntime.quantization.fusions")
onnx_model = lazy_module("onnxruntime.quantization.onnx_model")
quant_utils = lazy_module("onnxruntime.quantization.quant_utils")

# ---------------------------------------------------------------------------- running it


class LogToProgress(logging.Handler):
    """Forwards the quantizer's log warnings into the job log."""

    def __init__(self, progress: Progress):
        super().__init__(level=logging.WARNING)
        self.progress = progress
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
        if "pre-processing" in msg:  # advice for dynamic-shape vision models, not for us
            return
        if msg and msg not in self.seen:
            self.seen.add(msg)
            self.progress.log(f"quantizer: {msg}")


def calibration_reader(feeds: list[dict], progress: Progress):
    class _Reader(ortq.CalibrationDataReader):
        def __init__(self):
            self.i = 0

        def get_next(self):
            progress.check()
            if self.i >= len(feeds):
                return None
            progress.update(self.i / len(feeds), f"calibrating: graph input {self.i + 1}/{len(feeds)} (made from the "
                            "calibration windows)")
            self.i += 1
            return feeds[self.i - 1]

        def rewind(self):
            self.i = 0

    return _Reader()


def preprocess_fuses(src: Path) -> bool:
    """Whether ONNX Runtime's QNN preprocessing would change ``src``: its fusions (GELU from
    Erf, LpNormalization from ReduceL2, SpaceToDepth from Reshape / Transpose), tried on the
    graph's structure. The preprocessing itself first optimizes the whole graph in an ONNX
    Runtime session (weights loaded and prepacked: 7.7 GiB of anonymous memory for an 8 B
    model's 2.8 GiB head part) and writes nothing when no fusion applies — as for every
    decoder the studio exports; a fusion the optimization alone would make possible is not
    seen here (none of the studio's graphs has one)."""
    model = onnx_model.ONNXModel(onnx.load(str(src), load_external_data=False))
    return any([fusion(model).apply() for fusion in (
        fusions.FusionGelu, fusion_lpnorm.FusionLpNormalization,
        fusion_spacetodepth.FusionSpaceToDepth)])


def _takes_calibration_cache() -> bool:
    """Whether this ONNX Runtime's ``quantize_static`` reads a calibration cache (1.32 on)."""
    return ("calibration_cache_path" in inspect.signature(ortq.quantize_static).parameters
            and hasattr(calibrate, "save_tensors_data"))


def mapped_ranges(model_path: Path, config, feeds: list[dict], progress: Progress
                   ) -> Path | None:
    """The min-max ranges ONNX Runtime's quantizer would calibrate, computed without the
    copies of the weights its own calibration holds, saved as its calibration cache (a file
    in ``model_path``'s folder) for ``quantize_static(..., calibration_cache_path=...)``;
    None for the other calibration methods (the quantizer then calibrates itself).

    The quantizer's calibration loads the graph with its weights, writes the augmented graph
    with a copy of them and runs it in a session that prepacks every MatMul weight: about
    three copies beside the one it quantizes (an 8 B model's head part, 2.8 GiB of weights:
    8.8 GiB of anonymous memory). Here the same calibrater (:class:`MinMaxCalibrater`: the
    same tensors, the same ReduceMin / ReduceMax, the same reduction) reads the graph's
    structure only, writes the augmented graph beside the weights file it points into, and
    runs it without prepacking: the weights stay the file's pages."""
    opts = config.extra_options or {}
    if config.calibrate_method != ortq.CalibrationMethod.MinMax or opts.get("CalibStridedMinMax"):
        return None
    if not _takes_calibration_cache():  # an ONNX Runtime before 1.32: it calibrates itself
        return None

    class Mapped(calibrate.MinMaxCalibrater):
        def augment_graph(self):
            augment_min_max(self)

        def create_inference_session(self):
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_session_config_entry("session.disable_prepacking", "1")
            # ONNX Runtime's default order ran the calibration's ReduceMin / ReduceMax nodes
            # (appended to the graph) late, so every activation of the pass stayed alive:
            # Qwen2.5-VL-3B's vision tower at 8 of its 32 blocks peaked at 7.8 GiB here and
            # the whole tower past 23 GiB. The priority-based order frees each tensor once
            # its reductions ran: 2.3 GiB.
            so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            self.infer_session = ort.InferenceSession(
                self.augmented_model_path, sess_options=so, providers=["CPUExecutionProvider"])

    def structure(path: Path):
        # shape inference as the quantizer's loader does it, in the same folder, so the
        # graph's external-data locations stay valid; the weights are not read
        inferred = Path(path).with_name(Path(path).stem + "-inferred.onnx")
        onnx.shape_inference.infer_shapes_path(str(path), str(inferred))
        model = onnx.load(str(inferred), load_external_data=False)
        inferred.unlink()
        return model

    model_path = Path(model_path)
    real = calibrate.load_model_with_shape_infer
    calibrate.load_model_with_shape_infer = structure  # what CalibraterBase loads the graph with
    try:
        calibrator = Mapped(
            model_path, config.op_types_to_quantize,
            str(model_path.with_name(model_path.stem + "-augmented.onnx")),
            symmetric=opts.get("CalibTensorRangeSymmetric", False),
            moving_average=opts.get("CalibMovingAverage", False),
            averaging_constant=opts.get("CalibMovingAverageConstant", 0.01),
            max_intermediate_outputs=opts.get("CalibMaxIntermediateOutputs"),
            use_external_data_format=False)
    finally:
        calibrate.load_model_with_shape_infer = real
    augmented = Path(calibrator.augmented_model_path)
    try:
        calibrator.augment_graph()
        calibrator.create_inference_session()
        calibrator.collect_data(calibration_reader(feeds, progress))
        ranges = calibrator.compute_data()
    finally:
        del calibrator
        augmented.unlink(missing_ok=True)
    cache = model_path.with_name(model_path.stem + "-ranges.json")
    calibrate.save_tensors_data(ranges, cache)
    return cache


def augment_min_max(calibrater) -> None:
    """``MinMaxCalibrater.augment_graph`` in one pass over the graph: the same ReduceMin and
    ReduceMax nodes (each with its Reshape to one dimension) at the same places, the same
    graph outputs in the same order, the same axes for per-channel ranges, and the augmented
    graph saved where the calibrater says. ONNX Runtime's own looks up each tensor's first
    reader and the graph's value infos again for every tensor (quadratic in the graph's size:
    1.9 % of the whole test suite's sampled time went to it, more on a large model's graphs).

    Where ONNX Runtime puts a tensor's nodes: in front of the first node that reads it (after
    those of earlier tensors with the same reader), the ReduceMax pair before the ReduceMin
    pair; a tensor no node reads gets them at the end."""
    model = calibrater.model
    graph = model.graph
    tensors, _ = calibrater.select_tensors_to_calibrate(model)
    shape_name = str(uuid.uuid4())
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64),
                                                          shape_name))
    types = {vi.name: vi for vi in graph.value_info}
    types.update({vi.name: vi for vi in graph.output})
    types.update({vi.name: vi for vi in graph.input})
    first_reader: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            first_reader.setdefault(name, i)
    versions = {op: next((o.version for o in model.opset_import if onnx.defs.has(op, o.domain)),
                         0) for op in ("ReduceMin", "ReduceMax")}
    before: dict[int, list] = {}
    for tensor in tensors:
        if tensor not in types:
            raise StudioError(f"no type for tensor {tensor!r} of the graph to calibrate: run "
                              "shape inference on it first")
        vi = types[tensor]
        pairs = {}
        for op in ("ReduceMin", "ReduceMax"):
            out = f"{tensor}_{op}"
            reduce = onnx.helper.make_node(op, [tensor], [out + "_Reshape"], keepdims=1, name=out)
            if calibrater.per_channel:
                axes = [0, *range(2, len(vi.type.tensor_type.shape.dim))]
                if not versions[op]:
                    raise StudioError(f"the graph imports no opset with {op}: export it again")
                if versions[op] < 18:
                    reduce.attribute.append(onnx.helper.make_attribute("axes", axes))
                else:
                    axes_name = str(uuid.uuid4())
                    graph.initializer.append(numpy_helper.from_array(
                        np.array(axes, dtype=np.int64), axes_name))
                    reduce.input.append(axes_name)
            reshape = onnx.helper.make_node("Reshape", [out + "_Reshape", shape_name], [out],
                                            name=out + "_Reshape")
            pairs[op] = [reduce, reshape]
            graph.output.append(onnx.helper.make_tensor_value_info(
                out, vi.type.tensor_type.elem_type, [None]))
        before.setdefault(first_reader.get(tensor, len(graph.node)), []).extend(
            pairs["ReduceMax"] + pairs["ReduceMin"])
    nodes: list[Any] = []
    for i, node in enumerate(graph.node):
        nodes.extend(before.get(i, ()))
        nodes.append(node)
    nodes.extend(before.get(len(graph.node), ()))
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, calibrater.augmented_model_path,
              save_as_external_data=calibrater.use_external_data_format)


def static_quantize(model_path: Path, out: Path, config, ranges: Path | None = None) -> None:
    """ONNX Runtime's ``quantize_static`` with a ``get_qnn_qdq_config`` config, reading the
    activation ranges from ``ranges`` (its calibration cache: :func:`mapped_ranges`; when
    the file does not exist yet it calibrates and writes it) or, without one, calibrating
    itself."""
    ortq.quantize_static(
        str(model_path), str(out), config.calibration_data_reader,
        calibrate_method=config.calibrate_method, quant_format=config.quant_format,
        activation_type=config.activation_type, weight_type=config.weight_type,
        op_types_to_quantize=config.op_types_to_quantize,
        nodes_to_quantize=config.nodes_to_quantize,
        nodes_to_exclude=config.nodes_to_exclude, per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        use_external_data_format=config.use_external_data_format,
        calibration_providers=config.calibration_providers,
        extra_options=config.extra_options,
        **({"calibration_cache_path": str(ranges)} if ranges else {}))


def _quantize_streamed(model_path: Path, out: Path, config, ranges: Path | None,
                       progress: Progress) -> None:
    """:func:`static_quantize`, the graph's large weights quantized a slice at a time beside
    it (:mod:`studio.engine.qdq_weights`: the same graph, without the quantizer's whole-weight
    copies). Needs the ranges computed already (the stand-ins cannot be calibrated on); a
    graph the streamed path does not reproduce is quantized the usual way."""
    opts = config.extra_options or {}
    if ranges is None:
        static_quantize(model_path, out, config, ranges)
        return
    stood, originals = qdq_weights.stand_in(model_path, opts.get("TensorQuantOverrides", {}),
                                            opts.get("BlockSize", 0))
    if not originals:
        static_quantize(model_path, out, config, ranges)
        return
    try:
        static_quantize(stood, out, config, ranges)
        progress.log(f"{len(originals)} large weights quantized a slice at a time")
        qdq_weights.put_weights(out, originals)
    except qdq_weights.NotStreamable as exc:
        progress.log(f"{exc}: quantizing the whole graph at once")
        static_quantize(model_path, out, config, ranges)
    finally:
        stood.unlink(missing_ok=True)


#: what ORT's quantizer appends to the name of a graph output's float tensor
_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


def activation_encodings(qdq_path: Path) -> dict[str, list[dict[str, Any]]]:
    """The activation scales of a QDQ graph as ``TensorQuantOverrides`` (tensor -> [{scale,
    zero_point, quant_type}]): every non-initializer tensor a QuantizeLinear reads."""
    model = onnx.load(str(qdq_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, list[dict[str, Any]]] = {}
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in inits or len(n.input) < 3:
            continue
        if n.input[1] not in inits or n.input[2] not in inits:
            continue
        scale = numpy_helper.to_array(inits[n.input[1]])
        zp = numpy_helper.to_array(inits[n.input[2]])
        if scale.size != 1:
            continue
        quant = ortq.QuantType
        qt = {np.dtype("uint16"): quant.QUInt16, np.dtype("uint8"): quant.QUInt8,
              np.dtype("int16"): quant.QInt16, np.dtype("int8"): quant.QInt8}.get(zp.dtype)
        if qt is None:
            continue
        enc = [{"scale": scale.reshape(()).astype(np.float32), "zero_point": zp.reshape(()),
                "quant_type": qt}]
        out[n.input[0]] = enc
        if n.input[0].endswith(_OUTPUT_SUFFIX):  # a graph output, renamed by the quantizer
            out[n.input[0][:-len(_OUTPUT_SUFFIX)]] = enc
    return out


def run_quantizer(
    src: Path, dst: Path, recipe: dict, feeds: list[dict], progress: Progress,
    shared: dict[str, list[dict[str, Any]]] | None = None,
    rounded: dict[str, Any] | None = None,
    store: WeightStore | None = None,
) -> dict[str, Any]:
    """Quantize one graph. ``rounded``: weight -> :class:`studio.engine.rounding.Rounded`,
    the integer weights and per-channel scales chosen for the weights the recipe quantizes per
    channel (:func:`studio.engine.rounding.rounding_targets`); the quantizer stores exactly
    those. ``store``: the shared weight file of ``dst``'s folder, where a graph past
    :data:`studio.engine.weightstore.SHARE_ABOVE` bytes keeps its weights (the prefill and
    decode graphs of a part then hold one copy)."""
    work = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.stem}-quant."))
    handler = LogToProgress(progress)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        model_path, external = _preprocessed(src, work)
        model = onnx.load(str(model_path), load_external_data=False)
        resolved = resolve_overrides(model, recipe)
        progress.check()
        applied: set[str] = set()
        if rounded:
            model_path, applied = _apply_rounding(model, model_path, work, external,
                                                  resolved["init_overrides"], rounded)
        by_channel = (_channels_where_blocks_do_not_fit(
            model, model_path, recipe["block_size"], resolved["init_overrides"])
            if recipe["weight_granularity"] == "per_block" else {})
        for w, why in by_channel.items():
            progress.log(f"{w}: 4-bit per channel, not in blocks: {why}")
        config = _qnn_config(model, recipe, feeds, resolved, shared, progress)
        if external and config.extra_options.get("UseQDQContribOps"):
            # 16-bit types need opset 21, and ORT's own upgrade serializes the whole model
            # (past 2 GB it cannot): upgrade the weight-free graph here; the quantizer then
            # sees opset 21 and does the rest as for a small graph.
            model_path = _upgrade_opset(model_path, work, 21)
        del model
        qmodel, mm = _quantized(src, model_path, work / dst.name, config, feeds, progress)
        _save_quantized(qmodel, dst, store)
        overrides = config.extra_options.get("TensorQuantOverrides", {})
        return {
            "file": dst.name,
            "opset": next(o.version for o in qmodel.opset_import if o.domain in ("", "ai.onnx")),
            "calibration_feeds": len(feeds),
            "matmul_precisions": mm,
            "per_channel_weights": resolved["per_channel_weights"],
            "nodes_excluded": resolved["nodes_to_exclude"],
            "patterns": resolved["patterns"],
            "layers": resolved["layers"],
            "tensors_overridden": {
                name: (jsonable(v[0]) | {"scale": f"per channel ({len(v)}), chosen by "
                                                   f"{recipe.get('weight_rounding')}"}
                       if name in applied else jsonable(v))
                for name, v in sorted(overrides.items())},
            **({"weights_rounded": len(applied)} if rounded else {}),
            **({"per_channel_not_blocks": by_channel} if by_channel else {}),
            "qdq_nodes": sum(
                n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qmodel.graph.node
            ),
        }
    finally:
        root.removeHandler(handler)
        shutil.rmtree(work, ignore_errors=True)


def _preprocessed(src: Path, work: Path) -> tuple[Path, bool]:
    """The graph the quantizer reads: QNN's preprocessing (its fusions) where it fuses
    something, else ``src`` as a private input in ``work``; and whether its weights are
    external data."""
    pre = work / "preprocessed.onnx"
    # A graph past the 2 GB protobuf limit (its weights in external data) must be written
    # back the same way; the graph is read without its weights (the overrides and the
    # config only need its structure, and an in-memory model past 2 GB cannot be
    # serialized for shape inference or ByteSize).
    external = _uses_external_data(src)
    ext = ({"save_as_external_data": True, "all_tensors_to_one_file": True,
            "external_data_location": pre.name + ".data"} if external else {})
    model_path = (pre if preprocess_fuses(src) and ortq_qnn.qnn_preprocess_model(
        str(src), str(pre), **ext) else private_input(src, work))
    return model_path, external


def _qnn_config(model, recipe: dict, feeds: list[dict], resolved: dict[str, Any],
                shared: dict[str, list[dict[str, Any]]] | None, progress: Progress):
    """ONNX Runtime's QNN QDQ configuration of the recipe: the activation type, the
    resolved overrides and exclusions, another graph's shared encodings, LPBQ blocks."""
    act = (ortq.QuantType.QUInt16 if activation_bits(recipe["scheme"]) == 16
           else ortq.QuantType.QUInt8)
    config = ortq_qnn.get_qnn_qdq_config(
        model,
        calibration_reader(feeds, progress),
        calibrate_method=ortq.CalibrationMethod[recipe["calibration_method"]],
        activation_type=act,
        weight_type=ortq.QuantType.QUInt8,
        per_channel=False,
        init_overrides=resolved["init_overrides"] or None,
        nodes_to_exclude=resolved["nodes_to_exclude"] or None,
    )
    if shared:
        # activations another graph already quantized keep that graph's scales (the
        # verify graph reuses the decode graph's, so both compute the same logits)
        tqo = config.extra_options.setdefault("TensorQuantOverrides", {})
        for name, enc in shared.items():
            if name not in tqo:
                tqo[name] = enc
    if recipe["weight_granularity"] == "per_block":
        # block-wise weights as an opset-21 DequantizeLinear with block_size (LPBQ)
        config.extra_options["BlockSize"] = recipe["block_size"]
        config.extra_options["UseQDQContribOps"] = False
    return config


def _quantized(src: Path, model_path: Path, out: Path, config, feeds: list[dict],
               progress: Progress):
    """The quantizer run into ``out``, the result checked and loaded; with its MatMuls'
    precisions (refused where a MatMul got 16-bit weights under 16-bit activations)."""
    # Not CalibMaxIntermediateOutputs: in ORT 1.32 MinMaxCalibrater drops the collected
    # batches when it reaches that count without computing their ranges. MinMax keeps
    # only ReduceMin/ReduceMax outputs per feed, so memory stays small anyway.
    try:
        _quantize_streamed(model_path, out, config,
                           mapped_ranges(model_path, config, feeds, progress), progress)
    except ValueError as exc:
        raise StudioError(
            f"quantization of {src.name} failed: {str(exc).splitlines()[0]}"
        ) from None
    progress.check()
    onnx.checker.check_model(str(out))  # by path: works past the 2 GB protobuf limit
    qmodel = onnx.load(str(out))
    mm = matmul_precisions(qmodel)
    bad = [k for k in mm if k.startswith("16x16w")]
    if bad:
        raise StudioError(
            f"{mm[bad[0]]} MatMul(s) of {src.name} ended up with 16-bit weights under 16-bit "
            "activations, which the HTP does not run; keep those weights INT8"
        )
    return qmodel, mm


def _save_quantized(qmodel, dst: Path, store: WeightStore | None) -> None:
    """The quantized graph at ``dst``, its weights in the folder's shared store where it is
    past :data:`studio.engine.weightstore.SHARE_ABOVE` bytes."""
    if store is not None and weight_bytes(qmodel) > weightstore.SHARE_ABOVE:
        weightstore.save_shared(qmodel, dst, store)
    else:
        save_onnx_atomic(qmodel, dst)


#: why a weight whose input dimension is not a whole number of blocks is not block-quantized
BLOCKS_DO_NOT_FIT = ("its input dimension {k} is not a multiple of the block size {b}: the HTP "
                     "computes such a MatMul wrong (one MatMul measured on the simulator: "
                     "output cosine to the host QDQ graph -0.19 at 688 / 32, 0.9999 at 256 / 32)")


def _channels_where_blocks_do_not_fit(model, model_path: Path, block: int,
                                      init_overrides: dict[str, list[dict]]) -> dict[str, str]:
    """The block-wise 4-bit weights whose input dimension is not a whole number of blocks,
    given explicit per-channel scales instead (the quantizer's block size applies to every
    weight it computes scales for; one with its scales given keeps them): weight -> why."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, str] = {}
    for w, rules in init_overrides.items():
        rule = rules[0] if rules else {}
        t = inits.get(w)
        if (t is None or len(t.dims) != 2 or rule.get("axis") != 0 or "scale" in rule
                or t.dims[0] % block == 0):
            continue
        values = numpy_helper.to_array(t, base_dir=str(Path(model_path).parent))
        qtype = rule["quant_type"]
        qmin, qmax = quant_utils.get_qmin_qmax_for_qType(qtype.tensor_type, symmetric=True)
        lo, hi = values.min(axis=0), values.max(axis=0)
        per: list[dict] = []
        for n in range(values.shape[1]):  # as the quantizer's own symmetric per channel
            _, sc = quant_utils.compute_scale_zp(lo[n:n + 1], hi[n:n + 1], qmin, qmax, symmetric=True)
            per.append({"scale": np.float32(np.asarray(sc).reshape(())), "zero_point": 0})
        per[0].update(quant_type=qtype, axis=1)
        init_overrides[w] = per
        out[w] = BLOCKS_DO_NOT_FIT.format(k=t.dims[0], b=block)
    return out


def _apply_rounding(model, model_path: Path, work: Path, external: bool,
                    init_overrides: dict[str, list[dict]], rounded: dict[str, Any]
                    ) -> tuple[Path, set[str]]:
    """Put the rounding's choices where the quantizer reproduces them: each rounded weight's
    FP32 values replaced by its dequantized integers and its per-channel override given the
    explicit scales (``round(q * s / s) = q``). Only weights this graph quantizes per channel
    with the same integer type (per-layer overrides win). Returns the graph to quantize and
    the weights applied."""
    targets = rounding_targets(model, init_overrides)
    apply = {w: r for w, r in rounded.items()
             if w in targets and targets[w].quant_type == r.quant_type}
    if not apply:
        return model_path, set()
    full = onnx.load(str(model_path))
    for init in full.graph.initializer:
        if init.name in apply:
            init.CopyFrom(numpy_helper.from_array(apply[init.name].dequantized(), init.name))
    for w, r in apply.items():
        init_overrides[w] = r.overrides()
    out = work / "rounded.onnx"
    if external:
        onnx.save_model(full, str(out), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=out.name + ".data")
    else:
        onnx.save_model(full, str(out))
    return out, set(apply)


def quantize_graph(src: Path, dst: Path, recipe: dict, feeds: list[dict],
                   progress: Progress = NullProgress()) -> dict[str, Any]:
    """Quantize any FP32 ONNX graph with static shapes (a CNN, an encoder, ...) into the QDQ
    graph ``dst`` for the HTP: the recipe's scheme, granularity and overrides, calibrated on
    ``feeds`` (at least one). Returns what was quantized."""
    if not feeds:
        raise StudioError("quantization needs calibration samples: give at least one")
    recipe = normalize_recipe(recipe)
    if is_float_scheme(recipe["scheme"]):
        raise StudioError(f"{recipe['scheme']} is not a quantization: run the float graph with "
                          "fp16 instead")
    rounded = None
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        work = Path(tempfile.mkdtemp(dir=Path(dst).parent, prefix=f".{Path(dst).stem}-round."))
        try:
            rounded, summary, _ = round_for_recipe(
                [Source(Path(src), feeds, [None] * len(feeds))], recipe, work,
                SubProgress(progress, 0.0, 0.5))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        progress = SubProgress(progress, 0.5, 1.0)
    info = run_quantizer(Path(src), Path(dst), recipe, feeds, progress, rounded=rounded)
    info.pop("layers", None)
    if rounded is not None:
        info["rounding"] = summary
    return info


def quantize_like(src: Path, dst: Path, like: Path, recipe: dict, feeds: list[dict],
                  progress: Progress = NullProgress()) -> dict[str, Any]:
    """Quantize the FP32 graph ``src`` into ``dst`` with the recipe, its activations taking the
    scales of the quantized graph ``like`` wherever the tensor names match (an AR-N graph
    next to the decode graph: both then compute the same rows alike); ``feeds`` calibrate
    whatever ``like`` lacks; with a weight rounding other than nearest, the weights take the
    integers and scales ``like`` stores. Returns what was quantized and how many tensors were
    shared."""
    shared = activation_encodings(Path(like))
    recipe = normalize_recipe(recipe)
    rounded = None
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        # the same integer weights as ``like`` (chosen there from its calibration inputs)

        rounded = rounded_from_qdq(Path(like))
    info = run_quantizer(Path(src), Path(dst), recipe, feeds, progress,
                           shared=shared, rounded=rounded)
    info.pop("layers", None)
    info["shared_activations"] = sum(1 for t in info["tensors_overridden"] if t in shared)
    return info


def _uses_external_data(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(external_data_helper.uses_external_data(t) for t in model.graph.initializer)


def _upgrade_opset(path: Path, work: Path, opset: int) -> Path:
    """``path`` (weights in external data) converted to ``opset`` without loading its
    weights: the converted graph is written into ``work`` beside links to its data files
    (:mod:`studio.engine.onnxlinks` lets onnx read linked external data; a copy of GBs was
    what this did before)."""
    model = onnx.load(str(path), load_external_data=False)
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= opset:
        return path
    converted = onnx.version_converter.convert_version(model, opset)
    locations = {
        e.value
        for t in converted.graph.initializer if external_data_helper.uses_external_data(t)
        for e in t.external_data if e.key == "location"
    }
    for loc in sorted(locations):
        src, dst = path.parent / loc, work / loc
        if not dst.exists():
            link_or_copy(src.resolve(), dst)
    out = work / f"opset{opset}.onnx"
    onnx.save_model(converted, str(out))
    return out


def weight_type_name(recipe: dict) -> str:
    """How a (normalized) recipe stores its weights, in words."""
    return {
        ("INT8", "per_tensor"): "QUInt8",
        ("INT8", "per_channel"): "QInt8 per channel (symmetric)",
        ("INT4", "per_channel"): "QInt4 per channel (symmetric)",
        ("INT4", "per_block"): f"QInt4 block-wise, {recipe['block_size']} per block "
                               "(LPBQ, symmetric)",
    }.get((weight_precision(recipe["scheme"]), recipe["weight_granularity"]),
          recipe["weight_granularity"])


def jsonable(value):
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return getattr(value, "name", str(value))
