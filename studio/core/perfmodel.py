"""The performance model: a roofline estimate of LLM speed on a Snapdragon HTP.

Pure Python + numpy. Every number it produces is labelled ``estimated`` and carries
:data:`MODEL_VERSION`.

The model
---------
* An op costs ``max(compute, memory)``: compute = 2 x MACs / (peak HTP INT8 ops per core x
  ``compute_fraction``), memory = DRAM bytes / (peak DDR bandwidth x ``bw_fraction``).
  Peak figures come from the chip catalog (``ddr_gbps``, ``htp_tops``, ``htp_cores``); a
  chip whose figures are "unknown" cannot be estimated (one clear line says so).
* The ops of a graph (a DAG) are list-scheduled across the chip's HTP cores
  (:func:`schedule`); DDR is shared by the cores, so a forward pass takes
  ``max(makespan, all DRAM bytes / bandwidth) + overhead_ms``.
* Decode of one token reads every linear weight once (at the scheme's bits per weight),
  the whole KV cache of ``context`` tokens (static-shape caches, as QNN LLM exports use;
  capped by a sliding window where the config has one) and the ``lm_head``. The token
  embedding is a gather of one row and is not counted as traffic.
* Prefill of N prompt tokens is one pass over the same ops with N x the MACs (causal
  attention over the prompt); it is compute-bound for any useful N.
* Three efficiency parameters (``bw_fraction``, ``overhead_ms``, ``compute_fraction``) are
  fitted to published device numbers (``resources/perf/anchors.toml``) by a deterministic
  grid search (:func:`studio.core.perffit.calibrate`); the fit ships in ``resources/perf/model.toml``.
"""

from __future__ import annotations

import heapq
import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.archs import (
    VISION_FAMILIES,
    Arch,
    Scheme,
    VisionArch,
    get_scheme,
)
from studio.core.catalog import Chip, get_chip
from studio.core.errors import StudioError
from studio.core.resources import resources_dir

MODEL_VERSION = "roofline-1.0"
SOURCE = "estimated"

ANCHORS_PATH = resources_dir() / "perf" / "anchors.toml"
FIT_PATH = resources_dir() / "perf" / "model.toml"


# --------------------------------------------------------------------------- chip + fit


@dataclass(frozen=True)
class ChipPerf:
    """The peak figures of one chip the model needs."""

    key: str
    name: str
    ddr_gbps: float
    htp_tops: float
    htp_cores: int

    @classmethod
    def of(cls, chip: Chip) -> ChipPerf:
        missing = chip.perf_unknown()
        if missing:
            raise StudioError(
                f"cannot estimate for {chip.name}: the chip catalog does not know its "
                f"{' and '.join(missing)}; add the figure with its source to "
                "resources/catalog/chips.toml"
            )
        assert chip.ddr_gbps and chip.htp_tops and chip.htp_cores
        # the bytes the NPU can move: its own path where that is narrower than the bus
        gbps = min(chip.ddr_gbps, chip.npu_gbps or chip.ddr_gbps)
        return cls(chip.key, chip.name, gbps, chip.htp_tops, chip.htp_cores)


@dataclass(frozen=True)
class Efficiency:
    """What share of the peaks a real run achieves, and a fixed cost per forward pass."""

    bw_fraction: float = 0.6
    overhead_ms: float = 0.0
    compute_fraction: float = 0.25
    float_decode_fraction: float = 0.005

    def __post_init__(self):
        if not (0 < self.bw_fraction <= 1 and 0 < self.compute_fraction <= 1
                and 0 < self.float_decode_fraction <= 1 and self.overhead_ms >= 0):
            raise StudioError(f"efficiency parameters out of range: {self}")

    def compute_for(self, scheme: Scheme, prefill: bool) -> float:
        """The fraction of peak INT8 ops a pass of ``scheme`` achieves."""
        if not scheme.float_acts:
            return self.compute_fraction
        return self.compute_fraction * FP16_RATE if prefill else self.float_decode_fraction


#: HMX FP16 throughput relative to INT8 (an assumption, not fitted: no prefill anchor uses a
#: float scheme)
FP16_RATE = 0.5


def load_fit(path: str | Path | None = None) -> tuple[Efficiency, dict[str, Any]]:
    """The shipped calibration: its parameters and its whole table."""
    p = Path(path) if path is not None else FIT_PATH
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudioError(f"performance-model fit {p} not found; run studio estimate "
                          "--calibration --write-fit") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"performance-model fit {p} is not valid TOML ({e})") from None
    if data.get("model_version") != MODEL_VERSION:
        raise StudioError(f"performance-model fit {p} is for model {data.get('model_version')!r}, "
                          f"not {MODEL_VERSION}; run studio estimate --calibration --write-fit")
    try:
        eff = Efficiency(float(data["bw_fraction"]), float(data["overhead_ms"]),
                         float(data["compute_fraction"]), float(data["float_decode_fraction"]))
    except (KeyError, TypeError, ValueError):
        raise StudioError(f"performance-model fit {p} lacks its parameters; run studio "
                          "estimate --calibration --write-fit") from None
    return eff, data


# --------------------------------------------------------------------------- op graphs


@dataclass
class OpGraph:
    """Columnar ops of one forward pass: names, types, layer (-1: none), MACs, DRAM bytes,
    and the dependency edges ``(producer, consumer)`` as row indices."""

    names: list[str]
    op_types: list[str]
    layer: np.ndarray
    macs: np.ndarray
    dram_bytes: np.ndarray
    edges: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))

    def __post_init__(self):
        n = len(self.names)
        self.layer = np.asarray(self.layer, np.int64).reshape(n)
        self.macs = np.asarray(self.macs, np.float64).reshape(n)
        self.dram_bytes = np.asarray(self.dram_bytes, np.float64).reshape(n)
        self.edges = np.asarray(self.edges, np.int64).reshape(-1, 2)
        if len(self.op_types) != n:
            raise ValueError("op_types and names differ in length")

    def __len__(self) -> int:
        return len(self.names)


def roofline(macs, dram_bytes, chip: ChipPerf, eff: Efficiency,
             compute_fraction: float | None = None) -> dict[str, np.ndarray]:
    """Per-op roofline on one HTP core: times (s), the bound, arithmetic intensity (ops/B).

    ``compute_fraction`` overrides ``eff.compute_fraction`` (see :meth:`Efficiency.compute_for`).
    """
    macs = np.asarray(macs, np.float64)
    b = np.asarray(dram_bytes, np.float64)
    cf = eff.compute_fraction if compute_fraction is None else compute_fraction
    ops_per_s = chip.htp_tops * 1e12 * cf / chip.htp_cores
    bytes_per_s = chip.ddr_gbps * 1e9 * eff.bw_fraction
    compute = 2 * macs / ops_per_s
    memory = b / bytes_per_s
    time = np.maximum(compute, memory)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(b > 0, 2 * macs / np.where(b > 0, b, 1), np.inf)
    bound = np.where(compute >= memory, "compute", "memory")
    bound = np.where((compute == 0) & (memory == 0), "none", bound)
    return {"time_s": time, "compute_s": compute, "memory_s": memory, "bound": bound,
            "intensity": intensity, "ridge": np.float64(ops_per_s / bytes_per_s),
            "peak_ops_per_s": np.float64(ops_per_s), "bytes_per_s": np.float64(bytes_per_s)}


@dataclass
class Schedule:
    start: np.ndarray
    core: np.ndarray
    finish: np.ndarray

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if len(self.finish) else 0.0


def schedule(durations: Sequence[float] | np.ndarray, edges, cores: int) -> Schedule:
    """List-schedule a DAG of ops onto ``cores`` identical cores.

    Ops are taken in topological order (lowest index first among the ready ones); each goes
    to the core where it can start earliest (the lowest core index on ties) and starts when
    that core is free and all its predecessors have finished. Deterministic.
    """
    d = np.asarray(durations, np.float64)
    n = len(d)
    if cores < 1:
        raise ValueError("cores must be >= 1")
    e = np.asarray(edges, np.int64).reshape(-1, 2)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    indeg = np.zeros(n, np.int64)
    for a, b in e.tolist():
        if a == b:
            raise ValueError(f"op {a} depends on itself")
        preds[b].append(a)
        succs[a].append(b)
        indeg[b] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    start = np.zeros(n)
    finish = np.zeros(n)
    core = np.full(n, -1, np.int64)
    free = [0.0] * cores
    done = 0
    while ready:
        i = heapq.heappop(ready)
        t_ready = max((finish[p] for p in preds[i]), default=0.0)
        best = min(range(cores), key=lambda c: (max(free[c], t_ready), c))
        start[i] = max(free[best], t_ready)
        finish[i] = start[i] + d[i]
        free[best] = finish[i]
        core[i] = best
        done += 1
        for s in succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, s)
    if done != n:
        raise ValueError("the op graph has a cycle")
    return Schedule(start, core, finish)


@dataclass
class GraphEstimate:
    """Per-op estimate of one forward pass, and its total."""

    graph: OpGraph
    roof: dict[str, np.ndarray]
    sched: Schedule
    bandwidth_floor_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.sched.makespan, self.bandwidth_floor_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """What dominates the pass: 'memory', 'compute' or 'overhead'."""
        t = self.roof["time_s"]
        mem = float(t[self.roof["bound"] == "memory"].sum())
        comp = float(t[self.roof["bound"] == "compute"].sum())
        if self.overhead_s > max(mem, comp):
            return "overhead"
        return "memory" if mem >= comp else "compute"


def estimate_ops(graph: OpGraph, chip: ChipPerf, eff: Efficiency,
                 compute_fraction: float | None = None) -> GraphEstimate:
    roof = roofline(graph.macs, graph.dram_bytes, chip, eff, compute_fraction)
    sched = schedule(roof["time_s"], graph.edges, chip.htp_cores)
    floor = float(graph.dram_bytes.sum()) / float(roof["bytes_per_s"])
    return GraphEstimate(graph, roof, sched, floor, eff.overhead_ms / 1000)


class _Chain:
    """An :class:`OpGraph` built op by op, each op depending on the one before."""

    def __init__(self, scheme: Scheme) -> None:
        self.wb, self.ab = scheme.weight_bytes, scheme.act_bytes
        self.names: list[str] = []
        self.types: list[str] = []
        self.layer: list[int] = []
        self.macs: list[float] = []
        self.dram: list[float] = []

    def add(self, name: str, op: str, li: int, m: float, b: float) -> None:
        self.names.append(name)
        self.types.append(op)
        self.layer.append(li)
        self.macs.append(m)
        self.dram.append(b)

    def linear(self, name: str, li: int, rows: int, k: int, m_out: int) -> None:
        """A weight MatMul of ``rows`` x ``k`` by ``k`` x ``m_out``: its weights read once,
        its activations in and out."""
        self.add(name, "MatMul", li, rows * k * m_out,
                 k * m_out * self.wb + rows * (k + m_out) * self.ab)

    def graph(self) -> OpGraph:
        n = len(self.names)
        edges = np.array([(i, i + 1) for i in range(n - 1)], np.int64).reshape(-1, 2)
        return OpGraph(self.names, self.types, np.array(self.layer), np.array(self.macs),
                       np.array(self.dram), edges)


#: the edge conversions of a graph with float I/O, in :func:`transformer_ops`
FLOAT_IO_OP = "/graph_io/float_edges"
FLOAT_BYTES = 4


def transformer_ops(arch: Arch, scheme: Scheme, tokens: int, context: int,
                    prefill: bool = False, float_io: bool = False) -> OpGraph:
    """The ops of one forward pass over ``tokens`` new tokens with ``context`` KV positions.

    Decode: ``tokens`` = 1, attention over the static cache of ``context`` positions.
    Prefill: ``prefill=True``, causal attention over the prompt itself (``context`` caps it).
    Per layer: qkv -> attention -> o_proj -> gate/up -> down, then the lm_head.

    The published graphs the model is fitted to take and give quantized tensors. With
    ``float_io`` (a QDQ graph as the quantizer writes it, ``htp.graph_io = "float"``) the
    pass also converts at its edges: the float32 KV cache read and written back quantized
    before the first layer, the new rows and the logits dequantized to float32 after the
    last — memory-bound element-wise work (:data:`FLOAT_IO_OP`).
    """
    h, n = arch.hidden, tokens
    kb, ab = scheme.kv_bytes, scheme.act_bytes
    chain = _Chain(scheme)
    add = chain.add

    def linear(name: str, li: int, k: int, m_out: int) -> None:
        chain.linear(name, li, n, k, m_out)

    qkv = arch.q_dim + 2 * arch.kv_dim
    if float_io:
        cache = 0.0 if prefill else sum(2 * arch.kv_dim * arch.kv_context(i, context)
                                        for i in range(arch.layers))
        add(FLOAT_IO_OP, "QuantizeLinear", -1, 0.0, cache * (FLOAT_BYTES + kb))
    for i in range(arch.layers):
        p = f"/model/layers.{i}"
        linear(f"{p}/self_attn/qkv_proj", i, h, qkv)
        ctx = arch.kv_context(i, context)
        if prefill:
            span = min(n, ctx)
            att_macs = 2 * arch.q_dim * n * (span + 1) / 2  # causal: QK^T and AV
            kv_read = 0.0
        else:
            att_macs = 2 * arch.q_dim * n * ctx
            kv_read = 2 * arch.kv_dim * ctx * kb
        kv_write = 2 * arch.kv_dim * n * kb
        act = n * (qkv + arch.q_dim) * ab
        add(f"{p}/self_attn/attention", "Attention", i, att_macs, kv_read + kv_write + act)
        linear(f"{p}/self_attn/o_proj", i, arch.q_dim, h)
        linear(f"{p}/mlp/gate_up_proj", i, h, 2 * arch.intermediate)
        linear(f"{p}/mlp/down_proj", i, arch.intermediate, h)
    linear("/lm_head", -1, h, arch.vocab)
    if float_io:  # the new rows and the logits back to float32
        rows = 2 * arch.kv_dim * n * arch.layers
        add(FLOAT_IO_OP + " (out)", "DequantizeLinear", -1, 0.0,
            rows * (kb + FLOAT_BYTES) + n * arch.vocab * (ab + FLOAT_BYTES))
    return chain.graph()


def vision_ops(v: VisionArch, scheme: Scheme, image: int) -> OpGraph:
    """The ops of one pass of the vision tower over a square ``image`` (pixels a side): the
    patch embedding, ``depth`` blocks (window attention over ``window`` x ``window`` patches,
    full attention in ``full_blocks`` or everywhere without windows), the merger."""
    n, h = v.patches(image), v.hidden
    ab = scheme.act_bytes
    chain = _Chain(scheme)
    add, linear = chain.add, chain.linear

    linear("/visual/patch_embed", -1, n, v.in_chans * v.temporal_patch * v.patch ** 2, h)
    for i in range(v.depth):
        p = f"/visual/blocks.{i}"
        linear(f"{p}/attn/qkv", i, n, h, 3 * h)
        span = n if v.window is None or i in v.full_blocks else min(n, v.window ** 2)
        add(f"{p}/attn/attention", "Attention", i, 2 * h * n * span, 4 * n * h * ab)
        linear(f"{p}/attn/proj", i, n, h, h)
        if v.gated_mlp:
            linear(f"{p}/mlp/gate_up_proj", i, n, h, 2 * v.intermediate)
        else:
            linear(f"{p}/mlp/fc1", i, n, h, v.intermediate)
        linear(f"{p}/mlp/{'down_proj' if v.gated_mlp else 'fc2'}", i, n, v.intermediate, h)
    m, t = v.merge ** 2, v.tokens(image)
    linear("/visual/merger/mlp.0", -1, t, h * m, h * m)
    linear("/visual/merger/mlp.2", -1, t, h * m, v.out_hidden)
    return chain.graph()


#: the scheme a vision tower is estimated at (deployed VL encoders keep 8-bit weights)
VISION_SCHEME = "W8A16"


# --------------------------------------------------------------------------- estimate


@dataclass
class Estimate:
    """Prefill and decode speed of an architecture on a chip, labelled ``estimated``."""

    arch: Arch
    chip: ChipPerf
    scheme: Scheme
    context: int
    prompt_tokens: int
    eff: Efficiency
    decode: GraphEstimate
    prefill: GraphEstimate
    #: a vision-language model with an image: the vision tower's pass and the image's pixels
    #: a side (the prefill then takes the image's tokens beside the prompt's)
    encoder: GraphEstimate | None = None
    image: int | None = None

    @property
    def image_tokens(self) -> int:
        v = self.arch.vision
        return v.tokens(self.image) if v is not None and self.image else 0

    @property
    def ttft_s(self) -> float:
        """Time to the first token: the vision tower (with an image), then the prefill."""
        return (self.encoder.total_s if self.encoder is not None else 0.0) + self.prefill.total_s

    @property
    def decode_tokens_per_s(self) -> float:
        return 1.0 / self.decode.total_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.image_tokens) / self.prefill.total_s

    def layer_traffic(self) -> dict[int, float]:
        """DRAM bytes per decoded token by layer (-1: outside the layers, the lm_head)."""
        g = self.decode.graph
        out: dict[int, float] = {}
        for li, b in zip(g.layer.tolist(), g.dram_bytes.tolist(), strict=True):
            out[li] = out.get(li, 0.0) + b
        return out

    def to_dict(self) -> dict[str, Any]:
        d = self.decode
        return {
            "source": SOURCE,
            "model_version": MODEL_VERSION,
            "model": self.arch.name,
            "chip": self.chip.key,
            "chip_name": self.chip.name,
            "scheme": self.scheme.name,
            "context": self.context,
            "prompt_tokens": self.prompt_tokens,
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 3),
            "decode_ms_per_token": round(d.total_s * 1000, 4),
            "time_to_first_token_ms": round(self.ttft_s * 1000, 3),
            "bound": d.bound,
            "prefill_bound": self.prefill.bound,
            "params": self.arch.params,
            "weight_bytes": int(round(self.arch.weight_bytes(self.scheme))),
            "kv_bytes_per_token": int(round(self.arch.kv_bytes_per_token(self.scheme))),
            "kv_cache_bytes": int(round(self.arch.kv_cache_bytes(self.scheme, self.context))),
            "decode_dram_bytes_per_token": int(round(float(d.graph.dram_bytes.sum()))),
            "decode_macs_per_token": int(round(float(d.graph.macs.sum()))),
            "chip_figures": {"ddr_gbps": self.chip.ddr_gbps, "htp_tops": self.chip.htp_tops,
                             "htp_cores": self.chip.htp_cores},
            "efficiency": asdict(self.eff),
            **({"vision": self.vision_dict()} if self.encoder is not None else {}),
        }

    def vision_dict(self) -> dict[str, Any]:
        """The vision tower's part of the estimate: its pass, and the TTFT split."""
        v, e = self.arch.vision, self.encoder
        assert v is not None and e is not None and self.image
        return {"image_px": self.image, "patches": v.patches(self.image),
                "image_tokens": self.image_tokens, "scheme": VISION_SCHEME,
                "params": v.params, "encoder_ms": round(e.total_s * 1000, 3),
                "encoder_bound": e.bound,
                "prefill_ms": round(self.prefill.total_s * 1000, 3),
                "encoder_macs": int(round(float(e.graph.macs.sum())))}


def estimate(arch: Arch, chip: Chip | ChipPerf | str, scheme: Scheme | str, context: int,
             prompt_tokens: int | None = None, eff: Efficiency | None = None,
             float_io: bool = False, image: int | None = None) -> Estimate:
    """Decode and prefill estimate for ``arch`` on ``chip`` (uses the shipped fit by default);
    ``float_io``: graphs that convert their edges (:func:`transformer_ops`); ``image``: a
    vision-language model's square image (pixels a side) — its vision tower runs first (at
    :data:`VISION_SCHEME`) and the prefill takes its tokens beside the prompt's."""
    if isinstance(chip, str):
        chip = get_chip(chip)
    perf = chip if isinstance(chip, ChipPerf) else ChipPerf.of(chip)
    sch = scheme if isinstance(scheme, Scheme) else get_scheme(scheme)
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise StudioError(f"context must be a positive number of tokens, not {context!r}")
    prompt = min(context, 1024) if prompt_tokens is None else prompt_tokens
    if isinstance(prompt, bool) or not isinstance(prompt, int) or not 1 <= prompt <= context:
        raise StudioError(f"prompt tokens must be between 1 and the context ({context}), "
                          f"not {prompt!r}")
    if eff is None:
        eff = load_fit()[0]
    encoder, extra = None, 0
    if image is not None:
        if arch.vision is None:
            raise StudioError(f"{arch.name} has no vision tower: an image needs a "
                              f"vision-language config ({', '.join(VISION_FAMILIES)})")
        vs = get_scheme(VISION_SCHEME)
        encoder = estimate_ops(vision_ops(arch.vision, vs, int(image)), perf, eff,
                               eff.compute_for(vs, prefill=True))
        extra = arch.vision.tokens(int(image))
        if prompt + extra > context:
            raise StudioError(f"the image's {extra} tokens and {prompt} prompt tokens do not fit "
                              f"the context of {context}: a smaller image or a longer context")
    dec = estimate_ops(transformer_ops(arch, sch, 1, context, float_io=float_io), perf, eff,
                       eff.compute_for(sch, prefill=False))
    pre = estimate_ops(transformer_ops(arch, sch, prompt + extra, context, prefill=True,
                                       float_io=float_io), perf, eff,
                       eff.compute_for(sch, prefill=True))
    return Estimate(arch, perf, sch, context, prompt, eff, dec, pre, encoder,
                    int(image) if image is not None else None)


# --------------------------------------------------------------------------- LLM tuning


def with_kv_bits(scheme: Scheme, bits: int) -> Scheme:
    """``scheme`` with a KV cache of ``bits`` per element (INT8 KV: 8)."""
    return replace(scheme, name=f"{scheme.name}+KV{bits}", kv_bits=int(bits))


def pass_seconds(arch: Arch, chip: Chip | ChipPerf | str, scheme: Scheme, context: int,
                 tokens: int = 1, eff: Efficiency | None = None,
                 float_io: bool = False) -> float:
    """Estimated seconds of one target pass over ``tokens`` new tokens with ``context`` KV
    positions (1: a decode step; k + 1: a speculative verify pass); ``float_io``: a graph
    that converts its edges (:func:`transformer_ops`)."""
    if isinstance(chip, str):
        chip = get_chip(chip)
    perf = chip if isinstance(chip, ChipPerf) else ChipPerf.of(chip)
    if eff is None:
        eff = load_fit()[0]
    g = transformer_ops(arch, scheme, int(tokens), int(context), float_io=float_io)
    return estimate_ops(g, perf, eff, eff.compute_for(scheme, prefill=False)).total_s


def speculative_estimate(arch: Arch, chip: Chip | ChipPerf | str, scheme: Scheme,
                         context: int, tokens_per_pass: float, k: int,
                         draft: Arch | None = None, eff: Efficiency | None = None
                         ) -> dict[str, Any]:
    """Estimated decode speed with speculative decoding on ``chip``: ``tokens_per_pass``
    (measured acceptance) tokens per verify pass of k + 1 tokens, plus, with a ``draft``
    model on the same NPU, its k decode steps per pass (prompt lookup drafts for free).
    Labelled ``estimated``."""
    plain = pass_seconds(arch, chip, scheme, context, 1, eff)
    verify = pass_seconds(arch, chip, scheme, context, k + 1, eff)
    drafting = k * pass_seconds(draft, chip, scheme, context, 1, eff) if draft else 0.0
    per_token = (verify + drafting) / max(tokens_per_pass, 1e-9)
    return {
        "source": "estimated", "plain_tokens_per_s": 1.0 / plain,
        "speculative_tokens_per_s": 1.0 / per_token, "speedup": plain / per_token,
        "verify_pass_ms": verify * 1e3, "decode_step_ms": plain * 1e3,
        "draft_ms_per_pass": drafting * 1e3, "tokens_per_target_pass": tokens_per_pass, "k": k,
    }


def waterfall_estimate(arch: Arch, chip: Chip | ChipPerf | str, context: int, window: int,
                       scheme: str, tokens_per_pass: float | None, k: int,
                       dropped_blocks: int = 0, pruned_tokens_per_pass: float | None = None,
                       eff: Efficiency | None = None) -> list[dict[str, Any]]:
    """Estimated decode tok/s on ``chip`` for the waterfall's steps, each on top of the last:
    FP16 (the HTP's float) -> W8A16 with float graph I/O (the quantizer's graphs) -> quantized
    graph I/O -> ``scheme`` (4-bit) -> INT8 KV -> a W-slot cache -> speculative
    (``tokens_per_pass`` at k) -> ``dropped_blocks`` fewer blocks."""
    low = get_scheme(scheme)
    kv8 = with_kv_bits(low, 8)
    steps: list[tuple[str, float]] = [
        ("fp32", 1.0 / pass_seconds(arch, chip, get_scheme("FP16"), context, 1, eff)),
        ("w8a16", 1.0 / pass_seconds(arch, chip, get_scheme("W8A16"), context, 1, eff,
                                     float_io=True)),
        ("quantized_io", 1.0 / pass_seconds(arch, chip, get_scheme("W8A16"), context, 1, eff)),
        ("w4a16", 1.0 / pass_seconds(arch, chip, low, context, 1, eff)),
        ("int8_kv", 1.0 / pass_seconds(arch, chip, kv8, context, 1, eff)),
        ("window", 1.0 / pass_seconds(arch, chip, kv8, window, 1, eff)),
    ]
    if tokens_per_pass:
        steps.append(("speculative", speculative_estimate(
            arch, chip, kv8, window, tokens_per_pass, k, eff=eff)["speculative_tokens_per_s"]))
    if dropped_blocks:
        pruned = replace(arch, layers=arch.layers - int(dropped_blocks))
        tau = pruned_tokens_per_pass or tokens_per_pass
        rate = (speculative_estimate(pruned, chip, kv8, window, tau, k, eff=eff)
                ["speculative_tokens_per_s"] if tau
                else 1.0 / pass_seconds(pruned, chip, kv8, window, 1, eff))
        steps.append(("pruned", rate))
    return [{"step": s, "tokens_per_s": r, "source": "estimated"} for s, r in steps]
