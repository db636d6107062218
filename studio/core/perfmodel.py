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
  grid search (:func:`calibrate`); the fit ships in ``resources/perf/model.toml``.
"""

from __future__ import annotations

import heapq
import json
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.catalog import Chip, get_chip, load_catalog
from studio.core.errors import StudioError
from studio.core.families import (
    FAMILIES,
    MAX_PARAMS,
    SLIDING,
    UNLISTED,
    config_limit,
    family_of,
    layer_types,
)
from studio.core.resources import resources_dir

MODEL_VERSION = "roofline-1.0"
SOURCE = "estimated"

CONFIGS_DIR = resources_dir() / "configs"
ANCHORS_PATH = resources_dir() / "perf" / "anchors.toml"
FIT_PATH = resources_dir() / "perf" / "model.toml"


# --------------------------------------------------------------------------- schemes


@dataclass(frozen=True)
class Scheme:
    """Bits per stored weight, per activation, and per KV-cache element."""

    name: str
    weight_bits: int
    act_bits: int
    kv_bits: int
    description: str
    float_acts: bool = False

    @property
    def weight_bytes(self) -> float:
        return self.weight_bits / 8

    @property
    def act_bytes(self) -> float:
        return self.act_bits / 8

    @property
    def kv_bytes(self) -> float:
        return self.kv_bits / 8


SCHEMES: dict[str, Scheme] = {
    "W4A16": Scheme("W4A16", 4, 16, 16, "4-bit weights, 16-bit integer activations and KV"),
    "W4": Scheme("W4", 4, 16, 16, "4-bit weights, 16-bit float activations and KV", True),
    "W8A16": Scheme("W8A16", 8, 16, 16, "8-bit weights, 16-bit integer activations and KV"),
    "W8A8": Scheme("W8A8", 8, 8, 8, "8-bit weights, 8-bit activations and KV"),
    "FP16": Scheme("FP16", 16, 16, 16, "16-bit float weights, activations and KV", True),
}


def get_scheme(name: str) -> Scheme:
    key = str(name).strip().upper()
    if key not in SCHEMES:
        raise StudioError(f"unknown scheme {name!r}; known schemes: {', '.join(SCHEMES)}")
    return SCHEMES[key]


# --------------------------------------------------------------------------- architecture

#: the vision-language families whose vision tower the model knows
VISION_FAMILIES = tuple(f.model_type for f in FAMILIES.values() if f.vision)


@dataclass(frozen=True)
class VisionArch:
    """The sizes of a vision-language model's vision tower (Qwen2-VL / Qwen2.5-VL): a ViT over
    ``patch`` x ``patch`` patches (two frames of one image, ``temporal_patch``), ``depth``
    blocks — Qwen2.5-VL's attend within windows of ``window`` patches a side except the
    ``full_blocks`` — and a merger that turns each ``merge`` x ``merge`` patches into one
    token of the language model's width."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    patch: int
    merge: int
    out_hidden: int
    temporal_patch: int = 2
    in_chans: int = 3
    gated_mlp: bool = True
    window: int | None = None  # patches a side of a window-attention block; None: all full
    full_blocks: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, vc: Mapping[str, Any], model_type: str, where: str) -> VisionArch:
        def need(key: str, *alts: str) -> int:
            for k in (key, *alts):
                v = vc.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    if v > config_limit(k):
                        raise StudioError(f"{where}: vision_config '{k}' = {v} must be between "
                                          f"1 and {config_limit(k)}: the config is damaged or "
                                          "not a model's")
                    return v
            raise StudioError(f"{where}: vision_config has no positive '{key}'")

        qwen25 = model_type == "qwen2_5_vl"
        # Qwen2-VL names the ViT's width embed_dim and the language model's hidden_size;
        # Qwen2.5-VL names them hidden_size and out_hidden_size
        depth = need("depth")
        hidden = need("hidden_size") if qwen25 else need("embed_dim")
        out = need("out_hidden_size") if qwen25 else need("hidden_size")
        patch, merge = need("patch_size", "spatial_patch_size"), need("spatial_merge_size")
        # Qwen2-VL's vision MLP is fc1 / fc2 at mlp_ratio x the width; Qwen2.5-VL's is gated
        inter = (need("intermediate_size") if qwen25 or vc.get("intermediate_size")
                 else int(hidden * float(vc.get("mlp_ratio", 4))))
        window_px = vc.get("window_size") if qwen25 else None
        full = tuple(int(i) for i in vc.get("fullatt_block_indexes") or ())
        return cls(depth=depth, hidden=hidden, intermediate=inter,
                   heads=need("num_heads"), patch=patch, merge=merge, out_hidden=out,
                   temporal_patch=int(vc.get("temporal_patch_size") or 2),
                   in_chans=int(vc.get("in_chans") or vc.get("in_channels") or 3),
                   gated_mlp=qwen25,
                   window=int(window_px) // patch if isinstance(window_px, int) else None,
                   full_blocks=full)

    def grid(self, image: int) -> int:
        """Patches a side for a square ``image`` (pixels, a multiple of patch x merge)."""
        unit = self.patch * self.merge
        if image < unit or image % unit:
            raise StudioError(f"the image must be a multiple of {unit} pixels a side (the "
                              f"patch {self.patch} x the merge {self.merge}), not {image}")
        return image // self.patch

    def patches(self, image: int) -> int:
        return self.grid(image) ** 2

    def tokens(self, image: int) -> int:
        """The language model's tokens for one image: the patches merged ``merge`` x ``merge``."""
        return self.patches(image) // (self.merge ** 2)

    @property
    def params(self) -> int:
        h, m = self.hidden, self.merge ** 2
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate
        embed = self.in_chans * self.temporal_patch * self.patch ** 2 * h
        merger = (h * m) * (h * m) + (h * m) * self.out_hidden
        return embed + self.depth * (4 * h * h + mlp) + merger


@dataclass(frozen=True)
class Arch:
    """The sizes of a decoder-only transformer: all the model needs, no weights."""

    name: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    attention_bias: bool = False
    sliding_window: int | None = None
    sliding_layers: int = 0
    max_position: int | None = None
    rope_theta: float | None = None
    vision: VisionArch | None = None  # a vision-language model's vision tower

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params(self) -> int:
        h = self.hidden
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + bias

    @property
    def mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        """Linear weights of one block (norm weights are negligible and left out)."""
        return self.attn_params + self.mlp_params

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The lm_head's weights (shared with the embedding when tied, but read per token)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Stored parameters: a tied embedding / lm_head pair counted once."""
        head = 0 if self.tied_embeddings else self.head_params
        return self.layers * self.layer_params + self.embed_params + head

    def kv_context(self, layer: int, context: int) -> int:
        """KV positions layer ``layer`` attends over at ``context`` (a sliding window caps it)."""
        if self.sliding_window and layer < self.sliding_layers:
            return min(context, self.sliding_window)
        return context

    def kv_bytes_per_token(self, scheme: Scheme) -> float:
        """KV-cache bytes one token of context adds, all layers (K and V)."""
        return 2 * self.layers * self.kv_dim * scheme.kv_bytes

    def kv_cache_bytes(self, scheme: Scheme, context: int) -> float:
        return sum(2 * self.kv_dim * self.kv_context(i, context) * scheme.kv_bytes
                   for i in range(self.layers))

    def weight_bytes(self, scheme: Scheme) -> float:
        return self.params * scheme.weight_bytes

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> Arch:
        """From a Hugging Face ``config.json`` dict. A family of the studio's family table
        (:data:`studio.core.families.FAMILIES`) gives what the config leaves out (tied
        embeddings, attention biases) and which layers slide; another decoder is taken as
        untied, without biases, every layer sliding when the config sets a window."""
        cfg = dict(config)
        if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
            cfg = {**cfg, **cfg["text_config"]}
        where = f"config {name}" if name else "config"

        def need_int(*keys: str) -> int:
            for k in keys:
                v = cfg.get(k)
                if v is not None:
                    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                        raise StudioError(f"{where}: '{k}' must be a positive integer, not {v!r}")
                    if v > config_limit(k):
                        raise StudioError(f"{where}: '{k}' = {v} must be between 1 and "
                                          f"{config_limit(k)}: the config is damaged or not a "
                                          "model's")
                    return v
            raise StudioError(f"{where} has no '{keys[0]}'; give a Hugging Face config.json of "
                              f"a decoder-only transformer ({', '.join(FAMILIES)})")

        hidden = need_int("hidden_size", "n_embd", "d_model")
        layers = need_int("num_hidden_layers", "n_layer", "num_layers")
        heads = need_int("num_attention_heads", "n_head")
        kv_heads = need_int("num_key_value_heads") if cfg.get("num_key_value_heads") else heads
        head_dim = need_int("head_dim") if cfg.get("head_dim") else hidden // heads
        if not cfg.get("head_dim") and hidden % heads:
            raise StudioError(f"{where}: hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads}; add 'head_dim'")
        if heads % kv_heads:
            raise StudioError(f"{where}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
        intermediate = need_int("intermediate_size", "n_inner", "ffn_dim")
        vocab = need_int("vocab_size")
        model_type = str(cfg.get("model_type", "") or "unknown")
        family = family_of(model_type) or UNLISTED
        tied = cfg.get("tie_word_embeddings", family.tied_embeddings)
        if not isinstance(tied, bool):
            raise StudioError(f"{where}: 'tie_word_embeddings' must be true or false")
        window = cfg.get("sliding_window")
        sliding_layers = 0
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            sliding_layers = layer_types(cfg, family, layers).count(SLIDING)
        if sliding_layers == 0:
            window = None
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), Mapping) else {}
        theta = cfg.get("rope_theta", rope.get("rope_theta") if rope else None)
        bias = bool(cfg.get("attention_bias", family.attention_bias))
        vc, top_type = config.get("vision_config"), str(config.get("model_type", ""))
        vision = (VisionArch.from_config(vc, top_type, where)
                  if isinstance(vc, Mapping) and top_type in VISION_FAMILIES else None)
        arch = cls(
            name=name or str(cfg.get("_name_or_path", "") or model_type),
            model_type=model_type, layers=layers, hidden=hidden, heads=heads,
            kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate, vocab=vocab,
            tied_embeddings=tied, attention_bias=bias, sliding_window=window,
            sliding_layers=min(sliding_layers, layers),
            max_position=cfg.get("max_position_embeddings"),
            rope_theta=float(theta) if isinstance(theta, int | float) else None,
            vision=vision,
        )
        total = arch.params + (vision.params if vision else 0)
        if total > MAX_PARAMS:  # sizes each within bounds, together past any model
            raise StudioError(f"{where} describes {total:.3g} parameters; at most "
                              f"{MAX_PARAMS:.0e} are estimated: the config is damaged or not "
                              "a model's")
        return arch


def load_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """A HF config dict from a ``config.json``, a checkpoint folder, or a bundled name."""
    p = Path(path)
    if not p.exists() and (CONFIGS_DIR / f"{path}.json").is_file():
        p = CONFIGS_DIR / f"{path}.json"
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise StudioError(f"{p.parent} has no config.json; give a checkpoint folder or a "
                              "config.json")
    if not p.is_file():
        bundled = ", ".join(sorted(f.stem for f in CONFIGS_DIR.glob("*.json")))
        raise StudioError(f"config {path} not found; give a config.json, a checkpoint folder, "
                          f"or a bundled name ({bundled})")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"{p} is not valid JSON ({e}); give a Hugging Face config.json") from None
    if not isinstance(cfg, dict):
        raise StudioError(f"{p} is not a JSON object; give a Hugging Face config.json")
    name = p.parent.name if p.name == "config.json" else p.stem
    return cfg, name


def load_arch(path: str | Path) -> Arch:
    cfg, name = load_config(path)
    return Arch.from_config(cfg, name)


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


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Anchor:
    model: str
    config: str
    scheme: str
    chip: str
    context: int
    decode_tokens_per_s: float
    source: str
    prefill_tokens_per_s: float | None = None
    prompt_tokens: int | None = None


def load_anchors(path: str | Path | None = None) -> list[Anchor]:
    return _load_rows(Path(path) if path is not None else ANCHORS_PATH, "anchor", "anchor",
                      Anchor)


def _load_rows(p: Path, table: str, what: str, row_type: Any) -> list[Any]:
    """The ``[[table]]`` rows of the TOML file ``p`` as ``row_type`` records, each with its
    source; a missing, malformed or unsourced file is one line naming it."""
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudioError(f"{what} table {p} not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StudioError(f"{what} table {p} is not valid TOML ({e}); fix the file") from None
    rows = data.get(table)
    if not isinstance(rows, list) or not rows:
        raise StudioError(f"{what} table {p} has no [[{table}]] rows; fix the file")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(row_type(**row))
        except TypeError as e:
            raise StudioError(f"{what} table {p}: row {i + 1} is malformed ({e})") from None
        if not out[-1].source:
            raise StudioError(f"{what} table {p}: row {i + 1} has no source")
    return out


HELDOUT_PATH = resources_dir() / "perf" / "heldout.toml"


@dataclass(frozen=True)
class Published:
    """One published decode speed held out from the fit (``resources/perf/heldout.toml``)."""

    model: str
    config: str  # "" where the architecture's sizes are not public
    scheme: str
    chip: str  # a catalog key, or the device as published
    context: int
    decode_tokens_per_s: float
    runtime: str
    dates: str
    doubt: str
    source: str


def load_heldout(path: str | Path | None = None) -> list[Published]:
    return _load_rows(Path(path) if path is not None else HELDOUT_PATH, "published",
                      "held-out", Published)


def heldout_report(rows: Sequence[Published] | None = None,
                   eff: Efficiency | None = None) -> dict[str, Any]:
    """The model against the published speeds it was not fitted to: each row's estimate and
    error (estimated / published - 1), the rows it cannot estimate (a chip the catalog lacks,
    sizes not public) with the reason, and the median absolute errors overall, per chip, per
    runtime and per model size — without the doubtful rows, and with them."""
    rows = list(rows) if rows is not None else load_heldout()
    if eff is None:
        eff = load_fit()[0]
    catalog = load_catalog()
    done: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for r in rows:
        try:
            if not r.config:
                raise StudioError("the architecture's sizes are not public")
            if r.chip not in catalog:
                raise StudioError("the chip catalog has no such chip")
            arch = load_arch(r.config)
            est = estimate(arch, catalog[r.chip], r.scheme, int(r.context), eff=eff)
        except StudioError as e:
            skipped.append({**asdict(r), "reason": e.message})
            continue
        done.append({**asdict(r), "params_b": round(arch.params / 1e9, 2),
                     "estimated_decode_tokens_per_s": round(est.decode_tokens_per_s, 3),
                     "error": round(est.decode_tokens_per_s / r.decode_tokens_per_s - 1, 4)})

    def summary(sel: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [d["error"] for d in sel]
        return {"rows": len(errs),
                "mdape": round(100 * float(np.median(np.abs(errs))), 2) if errs else None,
                "median_error": round(100 * float(np.median(errs)), 2) if errs else None}

    clean = [d for d in done if not d["doubt"]]

    def by(key) -> dict[str, Any]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for d in clean:
            groups.setdefault(key(d), []).append(d)
        return {k: summary(v) for k, v in sorted(groups.items())}

    def size(d: dict[str, Any]) -> str:
        b = d["params_b"]
        return "< 2 B" if b < 2 else "2-5 B" if b < 5 else ">= 5 B"

    return {"source": SOURCE, "model_version": MODEL_VERSION, "rows": done, "skipped": skipped,
            "clean": summary(clean), "all": summary(done), "by_chip": by(lambda d: d["chip"]),
            "by_runtime": by(lambda d: d["runtime"]), "by_size": by(size)}


BW_GRID = np.round(np.arange(0.30, 1.0000001, 0.01), 2)
OVERHEAD_GRID = np.round(np.arange(0.0, 30.0000001, 0.2), 1)
FLOAT_GRID = np.round(np.geomspace(0.0005, 0.05, 81), 6)
COMPUTE_GRID = np.round(np.arange(0.010, 1.0000001, 0.005), 3)
_START = Efficiency(0.8, 0.0, 0.25, 0.005)


def _ape(pred: float, pub: float) -> float:
    return abs(pred - pub) / pub * 100


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return float(np.median(xs)) if xs else None


@dataclass
class _Prepared:
    anchor: Anchor
    arch: Arch
    perf: ChipPerf
    scheme: Scheme

    def decode_times(self, cf: float) -> np.ndarray:
        """Decode seconds per token (no overhead) on the grids: (bw,) or (bw, float fraction).

        The decode graph is a chain, so its schedule is the sum of its ops on any number of
        cores; this is :func:`estimate_ops` vectorised over the grids.
        """
        g = transformer_ops(self.arch, self.scheme, 1, self.anchor.context)
        assert np.array_equal(g.edges[:, 1] - g.edges[:, 0], np.ones(len(g) - 1))
        c1 = 2 * g.macs / (self.perf.htp_tops * 1e12 / self.perf.htp_cores)
        m1 = g.dram_bytes / (self.perf.ddr_gbps * 1e9)
        mem = m1[:, None] / BW_GRID[None, :]  # (ops, bw)
        if not self.scheme.float_acts:
            return np.maximum(c1[:, None] / cf, mem).sum(axis=0)
        comp = c1[:, None] / FLOAT_GRID[None, :]  # (ops, ff)
        return np.maximum(comp[:, None, :], mem[:, :, None]).sum(axis=0)


def _fit_decode(times: list[np.ndarray], published: np.ndarray, rows: Iterable[int],
                default_ff: float) -> tuple[float, float, float]:
    """(bw_fraction, overhead_ms, float_decode_fraction) minimising the mean |log error|."""
    rows = list(rows)
    oh = OVERHEAD_GRID[None, :, None] / 1000
    err = np.zeros((len(BW_GRID), len(OVERHEAD_GRID), len(FLOAT_GRID)))
    any_float = False
    for i in rows:
        t = times[i]
        if t.ndim == 1:
            t = t[:, None, None]
        else:
            any_float = True
            t = t[:, None, :]
        err += np.abs(np.log(published[i] * (t + oh)))
    if not any_float:  # the float fraction is free: keep the default
        err = err[:, :, :1]
    b, o, f = np.unravel_index(int(np.argmin(err)), err.shape)
    ff = float(FLOAT_GRID[f]) if any_float else default_ff
    return float(BW_GRID[b]), float(OVERHEAD_GRID[o]), ff


def _predict(times: np.ndarray, bw: float, oh: float, ff: float) -> float:
    b = int(np.argmin(np.abs(BW_GRID - bw)))
    t = times[b] if times.ndim == 1 else times[b, int(np.argmin(np.abs(FLOAT_GRID - ff)))]
    return 1.0 / (float(t) + oh / 1000)


def calibrate(anchors: Sequence[Anchor] | None = None,
              catalog_path: str | Path | None = None) -> dict[str, Any]:
    """Fit the efficiency parameters to the anchors; median and leave-one-out errors.

    A deterministic grid search, minimising the mean |log(estimated / published)|:
    ``compute_fraction`` on the prefill anchors; then ``bw_fraction``, ``overhead_ms`` and
    ``float_decode_fraction`` jointly on the decode anchors; then both once more. The
    leave-one-out figure refits the decode parameters without each anchor and predicts it.
    """
    anchors = list(anchors) if anchors is not None else load_anchors()
    catalog = load_catalog(catalog_path)
    prepared: list[_Prepared] = []
    skipped: list[dict[str, Any]] = []
    for a in anchors:
        try:
            chip = catalog.get(a.chip) or get_chip(a.chip, catalog_path)
            prepared.append(_Prepared(a, load_arch(a.config), ChipPerf.of(chip),
                                      get_scheme(a.scheme)))
        except StudioError as e:
            skipped.append({**asdict(a), "reason": e.message})
    if len(prepared) < 3:
        raise StudioError("fewer than 3 anchors can be estimated; cannot calibrate")
    published = np.array([p.anchor.decode_tokens_per_s for p in prepared])
    pre_rows = [i for i, p in enumerate(prepared) if p.anchor.prefill_tokens_per_s]

    def prompt_of(p: _Prepared) -> int:
        return p.anchor.prompt_tokens or min(p.anchor.context, 1024)

    def fit_compute(eff: Efficiency) -> float:
        if not pre_rows:
            return eff.compute_fraction
        errs = np.zeros(len(COMPUTE_GRID))
        for i in pre_rows:
            p = prepared[i]
            published_prefill = float(p.anchor.prefill_tokens_per_s or 0.0)
            g = transformer_ops(p.arch, p.scheme, prompt_of(p), p.anchor.context, prefill=True)
            for j, cf in enumerate(COMPUTE_GRID):
                e = Efficiency(eff.bw_fraction, eff.overhead_ms, float(cf),
                               eff.float_decode_fraction)
                t = estimate_ops(g, p.perf, e, e.compute_for(p.scheme, prefill=True)).total_s
                errs[j] += abs(math.log(prompt_of(p) / t / published_prefill))
        return float(COMPUTE_GRID[int(np.argmin(errs))])

    every = range(len(prepared))
    eff = _START
    for _ in range(2):
        cf = fit_compute(eff)
        times = [p.decode_times(cf) for p in prepared]
        bw, oh, ff = _fit_decode(times, published, every, _START.float_decode_fraction)
        eff = Efficiency(bw, oh, cf, ff)

    rows = []
    for i, p in enumerate(prepared):
        pred = _predict(times[i], eff.bw_fraction, eff.overhead_ms, eff.float_decode_fraction)
        loo = _predict(times[i], *_fit_decode(times, published, (k for k in every if k != i),
                                              _START.float_decode_fraction))
        row: dict[str, Any] = {
            **asdict(p.anchor),
            "estimated_decode_tokens_per_s": round(pred, 3),
            "ape": round(_ape(pred, p.anchor.decode_tokens_per_s), 2),
            "loo_estimated_decode_tokens_per_s": round(loo, 3),
            "loo_ape": round(_ape(loo, p.anchor.decode_tokens_per_s), 2),
        }
        est = estimate(p.arch, p.perf, p.scheme, p.anchor.context, prompt_of(p), eff)
        row["bound"] = est.decode.bound
        if p.anchor.prefill_tokens_per_s:
            row["estimated_prefill_tokens_per_s"] = round(est.prefill_tokens_per_s, 3)
            row["prefill_ape"] = round(_ape(est.prefill_tokens_per_s,
                                            p.anchor.prefill_tokens_per_s), 2)
        rows.append(row)
    prefill_apes = [r["prefill_ape"] for r in rows if "prefill_ape" in r]
    return {
        "source": SOURCE,
        "model_version": MODEL_VERSION,
        "params": asdict(eff),
        "anchors_used": len(prepared),
        "decode_mdape": round(_median(r["ape"] for r in rows) or 0.0, 2),
        "decode_loo_mdape": round(_median(r["loo_ape"] for r in rows) or 0.0, 2),
        "prefill_mdape": round(m, 2) if (m := _median(prefill_apes)) is not None else None,
        "prefill_anchors": len(prefill_apes),
        "rows": rows,
        "skipped": skipped,
    }


def fit_toml(cal: Mapping[str, Any]) -> str:
    """The shipped fit file's text for a :func:`calibrate` result."""
    p = cal["params"]
    lines = [
        "# Fitted efficiency parameters of the performance model (studio/core/perfmodel.py).",
        "# Written by `studio estimate --calibration --write-fit` from studio/resources/perf/anchors.toml;",
        "# tests/core/test_perfmodel.py recomputes the fit and checks it equals this file.",
        "",
        f'model_version = "{cal["model_version"]}"',
        f"bw_fraction = {p['bw_fraction']!r}",
        f"overhead_ms = {p['overhead_ms']!r}",
        f"compute_fraction = {p['compute_fraction']!r}",
        f"float_decode_fraction = {p['float_decode_fraction']!r}",
        f"anchors_used = {cal['anchors_used']}",
        f"decode_mdape = {cal['decode_mdape']!r}",
        f"decode_loo_mdape = {cal['decode_loo_mdape']!r}",
    ]
    if cal.get("prefill_mdape") is not None:
        lines.append(f"prefill_mdape = {cal['prefill_mdape']!r}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- LLM tuning


def with_kv_bits(scheme: Scheme, bits: int) -> Scheme:
    """``scheme`` with a KV cache of ``bits`` per element (INT8 KV: 8)."""
    from dataclasses import replace

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
    from dataclasses import replace

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
