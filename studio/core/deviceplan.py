"""The device memory plan: what the NPU maps at once for a model on one target, against the
chip's limits.

Pure Python: no torch, no ONNX, no Qt. The plan is computed from the checkpoint's layout
(:class:`studio.core.parts.Layout`, parameters per block) and a few sizes of its config
(:class:`Dims`), before any work; a compiled binary's file size, where one exists, replaces
the weights it estimates (``measured``).

What "fits" means here (the model, and why)
-------------------------------------------
Two limits, both from the chip catalog (``resources/catalog/chips.toml``, each with its
source or "unknown"):

* **The address-space limit** (``npu_va_mib``, about 3.8 GiB on v73-v81): the Hexagon NPU
  is a 32-bit processor and maps about 3.8 GiB in one address space (the project's HTP facts
  note; ai-hub-models issue 100: "the address space limitation of the Hexagon" is why
  Llama-2-7B ships as 8 binaries; llama.cpp's Hexagon notes: "around 3.5GB" per session).
  The plan judges it **per part**: what one part maps while it runs — its context
  binaries' weights, their graphs' activation / spill-fill memory, its I/O buffers and the
  KV cache of its own blocks — must fit. Why per part and not the whole model: AI Hub ships
  Llama-3-8B at W4A16 (about 4 GiB of weights before any cache) for v75 in 5 parts, which
  one 3.8 GiB space for everything could not hold, and the note's own reading is that
  "parts are a device constraint": splitting is what makes a model fit. Genie does load
  every binary of ``ctx-bins`` at once; the whole model's total is reported beside the
  limit (it is what the phone's memory holds), but not judged against it. If the backend
  turns out to map every part into one space, the total is the figure to judge instead —
  the plan carries both.
* **The context-binary limit** (``npu_context_mib``, estimated 1 GiB): one context binary —
  its weights and its graphs' activation memory — must stay under it. A guess from AI Hub's
  splits (Llama-2-7B at W4A16 in 4 parts x 2 graphs = 8 binaries of ~0.85 GB; Llama-3.1-8B
  in 5 parts), below the host compiler's 2 GiB per-graph allocation limit.

A plan **fits** when every part and every binary is under its limit; a limit the catalog
does not know is not judged (``fits`` is None when neither is known). More parts lower both
the largest part and the largest binary (the total grows a little: a region of activations
per graph). :func:`what_fits` names the smallest part count that fits at the plan's scheme,
else the first narrower scheme (and its part count) that does.

Weight sharing: with it, a part's prefill and decode graphs live in one context binary
holding the weights once; without it (what the bundle builds today: the x86 simulator
cannot load a weight-shared binary), each graph's binary holds its own copy — twice the
weights in the process.

The figures
-----------
* weights: each binary's parameters at the scheme's weight width (per-layer overrides and
  quantization scales not counted), the first part's embedding table at its own width (a
  Gather's data: the activations' width, or 8 bits with ``quantization.embedding = "INT8"``;
  :func:`studio.core.recipe.table_bits`) — ``estimated``; a compiled binary's file size where one
  is given — ``measured``.
* KV cache: K and V of every block at the context length, at the element width the graphs
  take it (float32 with float graph I/O, uint16 with quantized graph I/O, uint8 with the
  8-bit cache) — ``estimated`` (arithmetic on the shapes; Genie keeps one cache for both
  graphs).
* activations + spill-fill: per graph, the largest live set of one block at its AR tokens
  with buffer reuse — the attention scores and their softmax (heads x AR x C), or the MLP's
  gate, up and product (3 x AR x intermediate), whichever is larger, plus four AR x hidden
  tensors — at the activation width, backed by DDR in full (VTCM holds tiles of it); a
  region per graph, no spill-fill buffer shared between contexts — ``estimated``.
* I/O tensors: per graph, token ids and positions (int32), the attention mask (uint16,
  AR x C), the hand-offs between parts (uint16, AR x hidden), the new KV rows and, in the
  last part, the logits (float32, or uint16 with quantized graph I/O) — ``estimated``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from studio.core.catalog import Chip
from studio.core.errors import StudioError
from studio.core.parts import AUTO_WEIGHT_BITS, Layout, Part, compiled_bytes, part_bytes, split
from studio.core.recipe import activation_bits, table_bits, weight_bits
from studio.core.units import format_bytes

#: a row's source: the metrics' vocabulary (studio.core.metrics.SOURCES) where a figure has
#: one, "unknown" where there is none
ROW_SOURCES = ("measured", "estimated", "unknown")
#: the KV cache's element type as the graphs take it, and its bytes
KV_DTYPES = {"float32": 4, "uint16": 2, "uint8": 1}
#: the schemes a plan may suggest instead, widest weights first (W8A8 before W8A16: the
#: narrower activations and cache)
SUGGESTED_SCHEMES = ("W8A8", "W8A16", "W4A16")


def kv_dtype(graph_io: str, kv_cache: str) -> str:
    """The KV cache's element type as the compiled graphs take it, from the settings
    ``htp.graph_io`` and ``quantization.kv_cache``."""
    if kv_cache == "int8":
        return "uint8"
    return "uint16" if graph_io == "quantized" else "float32"


def scheme_bits(scheme: str) -> tuple[int, int]:
    """(weight bits, activation bits) of a scheme (:mod:`studio.core.recipe` owns them)."""
    return weight_bits(scheme), activation_bits(scheme)


@dataclass(frozen=True)
class Dims:
    """The sizes of a decoder the plan needs beyond its layout."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model: Any) -> Dims:
        """From a :class:`studio.core.modelinfo.ModelInfo` or a
        :class:`studio.core.archs.Arch` (the same facts under two spellings)."""
        if hasattr(model, "hidden_size"):
            return cls(model.hidden_size, model.num_heads, model.num_kv_heads, model.head_dim,
                       model.intermediate_size, model.vocab_size)
        return cls(model.hidden, model.heads, model.kv_heads, model.head_dim, model.intermediate,
                   model.vocab)


def layout_of_arch(arch: Any) -> Layout:
    """The layout of a :class:`studio.core.archs.Arch` (a config without weights): its
    linear weights and two norms per block, the embedding, the final norm, the head."""
    block = arch.layer_params + 2 * arch.hidden
    return Layout(blocks=(block,) * arch.layers, embedding=arch.embed_params, norm=arch.hidden,
                  head=0 if arch.tied_embeddings else arch.head_params,
                  tied=bool(arch.tied_embeddings))


@dataclass(frozen=True)
class Row:
    """One thing the NPU maps, for one part (and one context binary of it, where it is
    held in one)."""

    what: str
    bytes: int | None
    source: str
    detail: str
    kind: str  # "weights" | "kv" | "activations" | "io"
    part: str = ""  # the part it belongs to ("" for the whole model)
    binary: str = ""  # the context binary it belongs to ("" when none: the cache, the I/O)

    def __post_init__(self) -> None:
        if self.source not in ROW_SOURCES:
            raise ValueError(f"row source must be one of {ROW_SOURCES}, not {self.source!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "bytes": self.bytes, "source": self.source,
                "detail": self.detail, "kind": self.kind, "part": self.part,
                "binary": self.binary}


@dataclass(frozen=True)
class Inputs:
    """What a plan is computed for (besides the model and the chip)."""

    scheme: str
    parts: int
    context_length: int
    prefill_length: int  # AR-N of the prefill graph; 1: no prefill graph
    kv: str = "float32"  # KV_DTYPES
    weight_sharing: bool = False
    graph_io: str = "float"  # "quantized": uint16 logits
    embedding: str = "auto"  # quantization.embedding: the token table's precision


@dataclass(frozen=True)
class DevicePlan:
    chip: str
    chip_name: str
    inputs: Inputs
    rows: tuple[Row, ...]
    va_bytes: int | None
    va_source: str
    context_bytes: int | None
    context_source: str
    suggestion: str = ""  # what would fit, when this does not ("" when it fits or none does)
    suggestion_settings: str = ""  # the settings that say it ('export.parts = 4, ...')
    blocks: tuple[tuple[int, int], ...] = field(default=())  # (first, last) block per part

    @property
    def total(self) -> int:
        """Everything the model maps, all parts together (rows of unknown size count 0)."""
        return sum(r.bytes or 0 for r in self.rows)

    def _sums(self, attr: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            key = getattr(r, attr)
            if key:
                out[key] = out.get(key, 0) + (r.bytes or 0)
        return out

    def binaries(self) -> dict[str, int]:
        """Each context binary's mapping: its weights and its graphs' activation memory."""
        return self._sums("binary")

    def part_mappings(self) -> dict[str, int]:
        """What each part maps while it runs: its binaries, its blocks' KV cache, its I/O."""
        return self._sums("part")

    @property
    def largest_binary(self) -> tuple[str, int]:
        return max(self.binaries().items(), key=lambda kv: kv[1], default=("", 0))

    @property
    def largest_part(self) -> tuple[str, int]:
        return max(self.part_mappings().items(), key=lambda kv: kv[1], default=("", 0))

    @property
    def fits_address_space(self) -> bool | None:
        return None if self.va_bytes is None else self.largest_part[1] <= self.va_bytes

    @property
    def fits_context(self) -> bool | None:
        return None if self.context_bytes is None else self.largest_binary[1] <= self.context_bytes

    @property
    def fits(self) -> bool | None:
        """True when every known limit is met, False when one is not, None when the
        catalog knows neither limit for this chip."""
        judged = [f for f in (self.fits_address_space, self.fits_context) if f is not None]
        return all(judged) if judged else None

    def over(self) -> list[str]:
        """What is over a limit, one phrase each."""
        out = []
        if self.fits_address_space is False:
            name, size = self.largest_part
            out.append(f"its largest part ({name}) maps {format_bytes(size)}, over the NPU's "
                       f"{format_bytes(self.va_bytes or 0)} address space")
        if self.fits_context is False:
            name, size = self.largest_binary
            out.append(f"its largest context binary ({name}) maps {format_bytes(size)}, over "
                       f"{format_bytes(self.context_bytes or 0)} (estimated)")
        return out

    def summary(self) -> str:
        """One line: the largest part and binary against the limits, and the verdict."""
        i = self.inputs
        head = (f"{self.chip_name}: {i.scheme} in {i.parts} part{'s' if i.parts != 1 else ''}"
                f"{', weights shared' if i.weight_sharing else ''}, context {i.context_length}"
                f" ({i.kv} KV): {format_bytes(self.total)} in all ("
                + ("the binaries measured, the rest estimated"
                   if any(r.source == "measured" for r in self.rows) else "estimated") + ")")
        part, binary = self.largest_part[1], self.largest_binary[1]
        head += (f"; the largest part maps {format_bytes(part)}"
                 + (f" of {format_bytes(self.va_bytes)}" if self.va_bytes else
                    " (the NPU's address space is unknown for this chip)")
                 + f", the largest binary {format_bytes(binary)}"
                 + (f" of {format_bytes(self.context_bytes)}" if self.context_bytes else
                    " (the binary limit is unknown)"))
        if self.fits is None:
            return head + "; cannot judge"
        if self.fits:
            return head + "; fits"
        return head + "; does not fit" + (f": {self.suggestion} would fit" if self.suggestion
                                          else ": no part count or scheme fits")

    def to_dict(self) -> dict[str, Any]:
        i = self.inputs
        name, size = self.largest_binary
        pname, psize = self.largest_part
        return {"chip": self.chip, "chip_name": self.chip_name, "scheme": i.scheme,
                "parts": i.parts, "blocks": [list(b) for b in self.blocks],
                "context_length": i.context_length, "prefill_length": i.prefill_length,
                "kv_dtype": i.kv, "weight_sharing": i.weight_sharing,
                "rows": [r.to_dict() for r in self.rows], "total_bytes": self.total,
                "largest_binary": {"name": name, "bytes": size},
                "largest_part": {"name": pname, "bytes": psize},
                "npu_va_bytes": self.va_bytes, "npu_va_source": self.va_source,
                "npu_context_bytes": self.context_bytes,
                "npu_context_source": self.context_source,
                "fits": self.fits, "suggestion": self.suggestion, "summary": self.summary()}


# ---- the arithmetic ----------------------------------------------------------------------------
def _graphs(i: Inputs) -> list[tuple[str, int]]:
    """(kind, AR tokens) of the graphs of each part: the AR-N prefill graph (when N > 1) and
    the AR-1 decode graph."""
    return ([("prefill", i.prefill_length)] if i.prefill_length > 1 else []) + [("decode", 1)]


def activation_bytes(dims: Dims, ar: int, context: int, act_bytes: float) -> int:
    """The activation + spill-fill estimate of one graph at ``ar`` tokens (see the module's
    notes): the larger of the attention and MLP live sets, plus four hidden-state tensors."""
    attn = 2 * dims.heads * ar * context
    mlp = 3 * ar * dims.intermediate
    return int((max(attn, mlp) + 4 * ar * dims.hidden) * act_bytes)


def io_bytes(dims: Dims, part: Part, ar: int, context: int, kv_bytes: int,
             logits_bytes: int) -> int:
    """The I/O buffers of one graph of ``part`` at ``ar`` tokens (the KV inputs are the
    cache, counted once)."""
    n = 2 * ar * 4 + ar * context * 2  # ids, positions (int32), mask (uint16)
    n += (0 if part.embeds else ar * dims.hidden * 2) + (0 if part.heads else ar * dims.hidden * 2)
    n += 2 * (part.stop - part.start) * dims.kv_heads * dims.head_dim * ar * kv_bytes
    if part.heads:
        n += ar * dims.vocab * logits_bytes
    return n


def _build(layout: Layout, dims: Dims, chip: Chip, i: Inputs,
           measured: Mapping[str, int] | None = None) -> DevicePlan:
    w_bits, a_bits = scheme_bits(i.scheme)
    act = a_bits / 8
    kvb = KV_DTYPES[i.kv]
    C = i.context_length
    parts = split(layout, i.parts)
    graphs = _graphs(i)
    rows: list[Row] = []
    for p in parts:
        binaries = ([(p.name, graphs)] if i.weight_sharing or len(graphs) == 1 else
                    [(f"{p.name}/{kind}", [(kind, ar)]) for kind, ar in graphs])
        blocks = f"blocks {p.start}–{p.stop - 1}"
        for name, held in binaries:
            size = (measured or {}).get(name)
            if size is not None:
                rows.append(Row(f"{name} weights", int(size), "measured",
                                f"{blocks}: the compiled binary's file size", "weights",
                                p.name, name))
            else:
                t_bits = table_bits(i.scheme, i.embedding)
                table = (f", the {layout.embedding / 1e6:,.1f} M-entry embedding table at "
                         f"{t_bits} bits" if p.embeds and t_bits != w_bits else "")
                rest = p.parameters - (layout.embedding if table else 0)
                rows.append(Row(f"{name} weights", part_bytes(layout, p, w_bits, t_bits),
                                "estimated", f"{blocks}: {rest / 1e6:,.1f} M parameters "
                                f"at {w_bits} bits{table}", "weights", p.name, name))
            for kind, ar in held:
                rows.append(Row(f"{name} activations ({kind})",
                                activation_bytes(dims, ar, C, act), "estimated",
                                f"AR-{ar} at {a_bits}-bit activations: one block's largest live "
                                "set, a region per graph", "activations", p.name, name))
        n = p.stop - p.start
        rows.append(Row(f"{p.name} KV cache", 2 * n * dims.kv_heads * dims.head_dim * C * kvb,
                        "estimated", f"K and V of {n} blocks x {dims.kv_heads} KV heads x "
                        f"{dims.head_dim} x {C} positions, {i.kv}", "kv", p.name))
        rows.append(Row(f"{p.name} I/O tensors",
                        sum(io_bytes(dims, p, ar, C, kvb, 2 if i.graph_io == "quantized" else 4)
                            for _, ar in graphs), "estimated",
                        "ids, positions, mask, hand-offs, new KV rows"
                        f"{', logits' if p.heads else ''} of {len(graphs)} "
                        f"graph{'s' if len(graphs) != 1 else ''}", "io", p.name))
    return DevicePlan(chip.key, chip.name, i, tuple(rows), chip.npu_va_bytes, chip.npu_va_source,
                      chip.npu_context_bytes, chip.npu_context_source,
                      blocks=tuple((p.start, p.stop - 1) for p in parts))


def smallest_fitting(layout: Layout, dims: Dims, chip: Chip, i: Inputs) -> int | None:
    """The smallest part count at which the plan fits (None: none does, or the catalog
    knows neither limit). Each part count is planned: more parts lower the largest binary
    but raise the total (a region of activations per graph)."""
    for n in range(1, layout.num_layers + 1):
        fits = _build(layout, dims, chip, replace(i, parts=n)).fits
        if fits is None:
            return None
        if fits:
            return n
    return None


def fitting_change(layout: Layout, dims: Dims, chip: Chip, i: Inputs) -> tuple[str, str]:
    """What would fit, in words and as the settings to change: the part count at the plan's
    scheme ("4 parts"), else with the embedding table at 8 bits where the activations' width
    stores it wider, else the first narrower scheme (with the 8-bit table if it needs it),
    each with its part count; ("", "") when nothing does."""
    w_bits, a_bits = scheme_bits(i.scheme)
    narrower = [s for s in SUGGESTED_SCHEMES if s != i.scheme and (
        scheme_bits(s)[0] < w_bits or (scheme_bits(s)[0] == w_bits and scheme_bits(s)[1] < a_bits))]
    for scheme in [i.scheme, *narrower]:
        tables = [i.embedding] + (["INT8"] if i.embedding == "auto" and table_bits(scheme) > 8
                             else [])
        for table in tables:
            n = smallest_fitting(layout, dims, chip, replace(i, scheme=scheme, embedding=table))
            if n is None:
                continue
            words = [] if scheme == i.scheme else [scheme]
            sets = [] if scheme == i.scheme else [f'quantization.scheme = "{scheme}"']
            if table != i.embedding:
                words.append("the embedding table at 8 bits")
                sets.append('quantization.embedding = "INT8"')
            count = f"{n} part{'s' if n != 1 else ''}"
            sets.append(f"export.parts = {n}")
            return (f"{' with '.join(words)} in {count}" if words else count), ", ".join(sets)
    return "", ""


def what_fits(layout: Layout, dims: Dims, chip: Chip, i: Inputs) -> str:
    """What would fit, in words: "4 parts", "the embedding table at 8 bits in 6 parts",
    "W4A16 in 4 parts" (:func:`fitting_change`); "" when nothing does."""
    return fitting_change(layout, dims, chip, i)[0]


def device_plan(layout: Layout, dims: Dims, chip: Chip, inputs: Inputs,
                measured: Mapping[str, int] | None = None) -> DevicePlan:
    """The plan of ``layout`` on ``chip`` for ``inputs``; when it does not fit, with what
    would (``suggestion``). ``measured``: context binary name -> its file size."""
    if inputs.kv not in KV_DTYPES:
        raise StudioError(f"KV cache type {inputs.kv!r} is not one of {', '.join(KV_DTYPES)}")
    plan = _build(layout, dims, chip, inputs, measured)
    if plan.fits is False:
        words, sets = fitting_change(layout, dims, chip, inputs)
        plan = replace(plan, suggestion=words, suggestion_settings=sets)
    return plan


def check_bundle_fits(plan: DevicePlan) -> None:
    """Refuse a bundle that cannot fit its target, in one line naming what would."""
    if plan.fits is not False:
        return
    i = plan.inputs
    fix = (f"{plan.suggestion} would fit (set {plan.suggestion_settings})"
           if plan.suggestion else
           "no part count or scheme fits: lower export.context_length, set "
           "quantization.kv_cache = \"int8\" or take a smaller model")
    raise StudioError(f"this bundle does not fit {plan.chip_name}'s NPU ({i.scheme} in "
                      f"{i.parts} part{'s' if i.parts != 1 else ''}): " + "; ".join(plan.over())
                      + f"; {fix}")


# ---- the bundle's inputs -----------------------------------------------------------------------
def sharing(mode: str, prefill_ar: int) -> bool:
    """Whether the bundle ships weight-shared binaries (``bundle.weight_sharing``; auto: where
    a prefill graph shares the decode graph's weights, as the compile stage decides)."""
    return mode == "on" or (mode == "auto" and int(prefill_ar) > 1)


def bundle_inputs(layout: Layout, *, scheme: str, exported_parts: int, prompt_length: int,
                  context_length: int, prefill_length: int, graph_io: str, kv_cache: str,
                  weight_sharing: str = "auto", embedding: str = "auto") -> Inputs:
    """The inputs of the plan of the bundle a project ships, from its settings: the
    export's parts (the compile stage's binaries are the bundle's: it splits nothing), the
    AR-N prefill graph at ``bundle.prefill_length`` (0: the prompt length), the KV cache's
    width and whether the binaries are weight-shared."""
    return Inputs(scheme=scheme, parts=max(1, int(exported_parts)),
                  context_length=int(context_length),
                  prefill_length=int(prefill_length) or int(prompt_length),
                  kv=kv_dtype(graph_io, kv_cache),
                  weight_sharing=sharing(weight_sharing, int(prefill_length) or
                                         int(prompt_length)),
                  graph_io=graph_io, embedding=embedding)


# ---- the export's part count -------------------------------------------------------------------
def device_part_count(layout: Layout, dims: Dims, chips: Iterable[Chip], prompt_length: int,
                      context_length: int) -> int | None:
    """The fewest parts whose every context binary fits each chip's context-binary limit, at
    the export's weight width (:data:`studio.core.parts.AUTO_WEIGHT_BITS`, 16-bit
    activations, prefill at the export's prompt length); None when no chip knows its limit
    or no count meets it. Both graphs' activations count, as a weight-shared binary holds
    them (a little over what separate binaries need). The address-space limit is left to the
    plan itself (it depends on the scheme and the cache, which the export does not know)."""
    limits = [c.npu_context_bytes for c in chips if c.npu_context_bytes is not None]
    if not limits:
        return None
    limit = min(limits)
    act = 2
    acts = sum(activation_bytes(dims, ar, context_length, act)
               for ar in ({prompt_length, 1} if prompt_length > 1 else {1}))

    def worst(parts: Sequence[Part]) -> int:
        return max(compiled_bytes(p.parameters, AUTO_WEIGHT_BITS) for p in parts) + acts

    for n in range(1, layout.num_layers + 1):
        if worst(split(layout, n)) <= limit:
            return n
    return None


def device_limits_identity(chips: Iterable[Chip]) -> list[int]:
    """What :func:`device_part_count` reads of the chips: their context-binary limits (the
    export's key hashes these, not the chip names)."""
    return sorted({c.npu_context_bytes for c in chips if c.npu_context_bytes is not None})


