"""The project file's settings: one typed declaration per section.

Each ``[section]`` of a ``.qstudio`` file is a class below with one declaration per key:
its type (the annotation), its default, a one-line doc and its allowed range or choices
(:func:`setting`). Everything else comes from these declarations: the keys the file may hold,
the defaults a file leaves out, the checks at load (one line naming the key and the limit),
the keys a stage may declare (:mod:`studio.core.stagegraph`'s declarations, checked here at
import) and the keys a sweep may vary.

Settings are read by attribute (``project.quantization.scheme``, typed for mypy). A section
is also a dict of its keys (``project.quantization["scheme"]``, ``dict(project.gates)``,
``.items()``, JSON and TOML as it is), so code that names a key by a string (commands,
sweeps, stage configs) reads and sets it the same way; setting a key (or an attribute) no
declaration has is refused, and a section always holds every key.

A section checks its own ranges and the rules between its own keys (:meth:`Section.check`);
the rules between sections are :func:`check_across`. Pure: no I/O, no heavy imports.
"""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from studio.core.devices import (
    check_kinds,
    default_devices,
    device,
    device_names,
    shorthand_kind,
)
from studio.core.drafttable import DRAFT_TABLE_MODES
from studio.core.errors import StudioError
from studio.core.layerdiff import MAX_WINDOWS, TENSOR_MODES
from studio.core.parts import DEFAULT_MAX_PART_BYTES, MAX_PARTS
from studio.core.recipe import (
    ACTIVATION_GRANULARITIES,
    BLOCK_SIZES,
    CALIBRATION_METHODS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_CALIBRATION_SAMPLES,
    DEFAULT_GATES,
    DEFAULT_GRANULARITY,
    DEFAULT_ROUNDING_SAMPLES,
    DEFAULT_SCHEME,
    DEFAULT_WEIGHT_ROUNDING,
    EMBEDDING_PRECISIONS,
    GATE_HELP,
    GRANULARITIES,
    KV_CACHE_KINDS,
    PLACEMENTS,
    PRECISIONS,
    QUANTIZED_SCHEMES,
    SCHEMES,
    WEIGHT_ROUNDINGS,
    check_recipe,
    is_float_scheme,
)
from studio.core.stagegraph import (
    DECLARATIONS,
    DEFAULT_STAGES,
    MODEL_KINDS,
    PLAN_KEYS,
    REFS,
    STAGE_NAMES,
    StageDecl,
    kind_stages,
)

#: bundle.dlc = auto writes the DLC files up to this many bytes of quantized graph weights
DLC_AUTO_BYTES = 2 << 30
#: pipeline.executor: where work runs (studio.services.executors)
EXECUTORS = ("local", "ray")
#: model.chat_template: the checkpoint's template, or the prompt as written
CHAT_TEMPLATES = ("checkpoint", "none")
#: the longest context (and so prompt, generation, window) an export takes
MAX_CONTEXT = 4096
#: a sanity cap for counts of held-out / calibration tokens and samples
MAX_TOKENS = 1_000_000
#: the largest dimension of a static input shape (graph.shapes)
MAX_DIM = 1 << 20


# ---- declaring a setting ----------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What a setting allows besides its type. ``min`` / ``above`` / ``max`` are its range
    (``above``: strictly more than); ``cap`` is a limit of the machine, named only when a value
    passes it; ``choices`` a closed set (or a function giving it, for sets that live
    elsewhere); ``hint`` what the value means, appended to the error."""

    doc: str
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None
    min: float | None = None
    above: float | None = None
    max: float | None = None
    cap: float | None = None
    required: bool = False
    hint: str = ""

    def allowed(self) -> tuple[Any, ...] | None:
        return self.choices() if callable(self.choices) else self.choices


class Key:
    """A declared setting on its section's class: reads and writes the section's item."""

    def __init__(self, default: Any, spec: Spec,
                 factory: Callable[[], Any] | None = None) -> None:
        self._default, self._factory, self.spec = default, factory, spec
        self.name = ""
        self.type: Any = None  # the annotation, resolved by the section

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def default(self) -> Any:
        """The value where the file leaves the key out (a fresh copy)."""
        return self._factory() if self._factory else copy.deepcopy(self._default)

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        return dict.__getitem__(obj, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        dict.__setitem__(obj, self.name, value)


def setting(default: Any, doc: str, *, factory: Callable[[], Any] | None = None,
            **limits: Any) -> Any:
    """A section's setting: its default (or a ``factory`` making it), a one-line doc and its
    limits (see :class:`Spec`). Its type is the annotation it is assigned to."""
    return Key(default, Spec(doc, **limits), factory)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is float:
        return "int or float"
    return getattr(origin, "__name__", str(origin))


def check_type(where: str, value: Any, hint: Any) -> None:
    """A one-line error unless ``value`` is of the declared type (elements included)."""
    origin = typing.get_origin(hint) or hint
    if origin in (typing.Union, types.UnionType):  # e.g. int | str: one of the arms
        for arm in typing.get_args(hint):
            try:
                check_type(where, value, arm)
                return
            except StudioError:
                continue
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {type(value).__name__} "
                          f"{_short(value)}")
    want: tuple[type, ...] = (int, float) if hint is float else (origin,)
    if isinstance(value, bool) and bool not in want:
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {value!r}")
    if not isinstance(value, want):
        raise StudioError(f"{where} must be a {_type_name(hint)}, not {type(value).__name__} "
                          f"{_short(value)}")
    args, held = typing.get_args(hint), typing.cast(Any, value)
    if origin is list and args:
        for i, item in enumerate(held):
            check_type(f"{where}[{i}]", item, args[0])
    elif origin is dict and args:
        for key, item in held.items():
            check_type(f"{where}[{key!r}]", item, args[1])


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range_text(spec: Spec) -> str:
    if spec.above is not None:
        low = f"above {_num(spec.above)}"
        return low + (f" and at most {_num(spec.max)}" if spec.max is not None else "")
    if spec.min is not None and spec.max is not None:
        return f"between {_num(spec.min)} and {_num(spec.max)}"
    if spec.max is not None:
        return f"at most {_num(spec.max)}"
    return "0 or more" if spec.min == 0 else f"at least {_num(spec.min or 0)}"


def check_value(where: str, value: Any, spec: Spec) -> None:
    """A one-line error unless ``value`` (of the declared type) is within ``spec``."""
    hint = f" {spec.hint}" if spec.hint else ""
    if isinstance(value, float) and not math.isfinite(value):
        raise StudioError(f"{where} must be a finite number, not {value}")
    allowed = spec.allowed()
    if allowed is not None and value not in allowed:
        shown = ", ".join(str(c) for c in allowed if c != "")
        raise StudioError(f"{where} = {_short(value)} is not one of {shown}{hint}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low_ok = ((spec.min is None or value >= spec.min)
                  and (spec.above is None or value > spec.above))
        if not low_ok or (spec.max is not None and value > spec.max):
            raise StudioError(f"{where} must be {_range_text(spec)}, not {value}{hint}")
        if spec.cap is not None and value > spec.cap:
            raise StudioError(f"{where} = {value} is more than this studio takes (at most "
                              f"{_num(spec.cap)}){hint}")


# ---- a section --------------------------------------------------------------------------------
class Section(dict[str, Any]):
    """One ``[section]`` of the project file: its typed settings, declared on the subclass
    with :func:`setting` and read by attribute, held as the items of a dict, so that the
    section is also a mapping of its keys (and JSON / TOML as it is). A key no declaration
    has cannot be set; a deleted key takes its default again. Subclasses set ``name``;
    :meth:`rules` holds the rules between their own keys."""

    name: ClassVar[str] = ""
    _keys: ClassVar[dict[str, Key]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hints = typing.get_type_hints(cls)
        cls._keys = {n: v for n, v in vars(cls).items() if isinstance(v, Key)}
        for key in cls._keys.values():
            key.type = hints[key.name]

    def __init__(self, values: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        super().__init__()
        for name, key in self._keys.items():
            dict.__setitem__(self, name, key.default())
        self.update(values or {}, **more)

    # ---- the declaration
    @classmethod
    def specs(cls) -> dict[str, tuple[Spec, Any]]:
        """key -> (its spec, its type), in declaration order."""
        return {name: (key.spec, key.type) for name, key in cls._keys.items()}

    @classmethod
    def default(cls, key: str) -> Any:
        """The value of ``key`` where the file leaves it out (a fresh copy)."""
        return cls._keys[key].default()

    @classmethod
    def from_table(cls, raw: Any) -> Section:
        """The section from a TOML table: unknown keys, missing required keys and values of
        the wrong type are refused in one line; left-out keys take their defaults."""
        if not isinstance(raw, dict):
            raise StudioError(f"[{cls.name}] must be a table")
        bad = set(raw) - set(cls._keys)
        if bad:
            raise StudioError(cls.unknown(sorted(bad, key=str)[0]))
        out = cls()
        for name, key in cls._keys.items():
            if name in raw:
                check_type(f"{cls.name}.{name}", raw[name], key.type)
                dict.__setitem__(out, name, copy.deepcopy(raw[name]))
            elif key.spec.required:
                raise StudioError(f"[{cls.name}] needs the key {name!r}")
        return out

    @classmethod
    def unknown(cls, key: Any) -> str:
        """The one-line error for a key this section does not declare."""
        return (f"unknown key {key!r} in [{cls.name}] (allowed: "
                f"{', '.join(sorted(cls._keys))})")

    def check(self) -> None:
        """One-line errors for values of the wrong type or out of their declared range, then
        :meth:`rules`."""
        for name, key in self._keys.items():
            value = self[name]
            check_type(f"{self.name}.{name}", value, key.type)
            check_value(f"{self.name}.{name}", value, key.spec)
        self.rules()

    def rules(self) -> None:
        """The rules between this section's own keys (none by default)."""

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of the section's keys, nothing shared with the section."""
        return copy.deepcopy(dict(self))

    # ---- only declared keys, always all of them
    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._keys:
            raise StudioError(self.unknown(key))
        dict.__setitem__(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._keys:
            raise AttributeError(f"[{self.name}] has no setting {name!r} (settings: "
                                 f"{', '.join(self._keys)})")
        dict.__setitem__(self, name, value)

    def __delitem__(self, key: str) -> None:
        """A deleted key is a key the file leaves out: it takes its default again."""
        if key not in self._keys:
            raise KeyError(key)
        if self._keys[key].spec.required:
            raise StudioError(f"[{self.name}] needs the key {key!r}")
        dict.__setitem__(self, key, self.default(key))

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Section:  # type: ignore[override,misc]
        self.update(other)
        return self

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self._keys:
            raise StudioError(self.unknown(key))
        return self[key]

    _NO_DEFAULT: ClassVar[object] = object()

    def pop(self, key: str, default: Any = _NO_DEFAULT) -> Any:  # type: ignore[override]
        if key not in self._keys:
            if default is Section._NO_DEFAULT:
                raise KeyError(key)
            return default
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        raise TypeError(f"[{self.name}] keeps every key: set or delete (reset) one by name")

    def clear(self) -> None:
        for name in self._keys:
            dict.__setitem__(self, name, self.default(name))

    def copy(self) -> dict[str, Any]:  # type: ignore[override]
        """A plain (shallow) dict of the section's keys, as ``dict.copy`` gives."""
        return dict(self)

    def __reduce__(self) -> Any:  # copy, deepcopy and pickle: the class and its items
        return (type(self), (dict(self),))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__reduce__()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


# ---- the sections, in the order of the file ---------------------------------------------------
def _chips() -> tuple[str, ...]:
    from studio.core.catalog import load_catalog

    return ("", *load_catalog())


class Model(Section):
    name: ClassVar[str] = "model"
    source: str = setting("", "the checkpoint folder, the .onnx file or sample:NAME",
                          required=True)
    draft: str = setting("", "a draft checkpoint for speculative decoding (\"\": none)")
    draft_embedding: str = setting(
        "auto", "the draft's token table: the target's where vocabulary, width and values "
                "match (auto), the target's whenever vocabulary and width match (target: the "
                "draft was distilled on it), or its own (own)", choices=DRAFT_TABLE_MODES)
    kind: str = setting("causal-lm", "causal-lm (a checkpoint), encoder (a sentence "
                        "encoder's PyTorch weights) or onnx-graph (any ONNX file); each kind "
                        "runs its own declared stages", choices=MODEL_KINDS)
    chat_template: str = setting("checkpoint", "how a prompt reaches a causal LM: through "
                                 "the checkpoint's chat template (checkpoint: its "
                                 "chat_template.jinja or tokenizer_config.json's "
                                 "chat_template, one user message with the assistant's turn "
                                 "opened; as written where it has none) or as written (none)",
                                 choices=CHAT_TEMPLATES)

    def rules(self) -> None:
        if not self.source:
            raise StudioError("model.source is required: a checkpoint folder or "
                              "sample:tiny-coder")
        onnx = self.source.lower().endswith(".onnx")
        if self.kind == "onnx-graph" and not onnx:
            raise StudioError(f"model.source {self.source!r} is not an .onnx file, which an "
                              "onnx-graph project needs (model.kind)")
        if self.kind != "onnx-graph" and onnx:
            raise StudioError(f"model.source {self.source!r} is an ONNX file: set model.kind = "
                              "\"onnx-graph\" (or leave model.kind out)")


class Export(Section):
    name: ClassVar[str] = "export"
    prompt_length: int = setting(32, "P: the tokens the prefill graph takes per pass",
                                 min=1, max=MAX_CONTEXT)
    context_length: int = setting(128, "C: the tokens the KV cache holds",
                                  min=2, max=MAX_CONTEXT)
    parts: int | str = setting(1, "runs of consecutive blocks exported, quantized and "
                               "compiled one at a time: N, or auto (the fewest whose "
                               "8-bit weights each fit export.max_part_mb)", min=1,
                               max=MAX_PARTS)
    max_part_mb: int = setting(DEFAULT_MAX_PART_BYTES // 1_000_000, "the budget of one "
                               "part's compiled weights, in MB (one HTP graph must stay under "
                               "about 2 GB)", min=1, max=2048)
    image_size: int = setting(448, "a vision-language model's image side in pixels (square; "
                              "a multiple of patch x merge, 28 for Qwen2-VL): the vision "
                              "encoder's fixed input. Text models ignore it", min=28, max=1792)

    def rules(self) -> None:
        if isinstance(self.parts, str) and self.parts != "auto":
            raise StudioError(f"export.parts = {self.parts!r}: give a number of parts or "
                              "\"auto\"")
        if self.context_length <= self.prompt_length:
            raise StudioError(
                f"export.context_length ({self.context_length}) must be larger than "
                f"export.prompt_length ({self.prompt_length})"
            )


class Quantization(Section):
    name: ClassVar[str] = "quantization"
    scheme: str = setting(DEFAULT_SCHEME, "the weight and activation precisions of every layer",
                          choices=SCHEMES)
    weight_granularity: str = setting(DEFAULT_GRANULARITY, "one weight scale per tensor, per "
                                      "output channel, or per block (LPBQ)",
                                      choices=GRANULARITIES)
    activation_granularity: str = setting("per_tensor", "one activation scale per tensor "
                                          "(static, what the HTP runs) or per token (dynamic: "
                                          "refused, the HTP cannot run it)",
                                          choices=ACTIVATION_GRANULARITIES)
    weight_rounding: str = setting(DEFAULT_WEIGHT_ROUNDING, "how per-channel integer weights "
                                   "are chosen: nearest (MinMax), or from calibration inputs: "
                                   "seqmse (clipping search), adaround (learned rounding), gptq "
                                   "(error feedback), seqmse_gptq (both); float schemes ignore "
                                   "it", choices=WEIGHT_ROUNDINGS)
    rounding_samples: int = setting(DEFAULT_ROUNDING_SAMPLES, "calibration windows the weight "
                                    "rounding fits each layer on (seqmse, adaround)", min=1,
                                    cap=MAX_TOKENS)
    calibration_text: str = setting("sample:calibration", "the text the activation ranges are "
                                    "calibrated on")
    calibration_samples: int = setting(DEFAULT_CALIBRATION_SAMPLES, "calibration windows (or "
                                       "samples)", min=1, cap=MAX_TOKENS)
    vision_scheme: str = setting("", "a vision-language model's vision encoder: its own "
                                 "scheme (\"\": the recipe's scheme)", choices=("", *SCHEMES))
    vision_overrides: dict[str, str] = setting({}, "a vision-language model's vision encoder: "
                                               "per-layer precisions on its layers "
                                               "(visual.blocks.N.attn.qkv, visual.merger.mlp.0, "
                                               "...), the last matching pattern wins")
    calibration_images: str = setting("", "a vision-language model: a folder of images the "
                                      "vision encoder and the image prompts are calibrated on "
                                      "(\"\": images generated here); text models ignore it")
    calibration_method: str = setting(DEFAULT_CALIBRATION_METHOD, "how a range is taken from "
                                      "the calibration statistics",
                                      choices=CALIBRATION_METHODS)
    block_size: int = setting(DEFAULT_BLOCK_SIZE, "input channels per block (per_block "
                              "weights)", choices=BLOCK_SIZES)
    kv_cache: str = setting("float", "the KV cache as graph I/O: float, or int8 with per-head "
                            "scales", choices=KV_CACHE_KINDS)
    overrides: dict[str, str] = setting({}, "per-layer precisions: pattern -> precision, the "
                                        "last matching pattern wins")
    embedding: str = setting("auto", "the token embedding table's precision: auto (the "
                             "activations' width, as the quantizer stores a Gather table: "
                             "16-bit under W4A16 / W8A16) or INT8 (half the bytes: what lets "
                             "an 8 B model's first part fit one context binary)",
                             choices=EMBEDDING_PRECISIONS)
    placement: str = setting("strict", "graphs: nodes the HTP refuses fail the run, go to the "
                             "CPU, or are rewritten", choices=PLACEMENTS)

    def rules(self) -> None:
        check_recipe(self)


class Validation(Section):
    name: ClassVar[str] = "validation"
    heldout_text: str = setting("sample:heldout", "the text perplexity and agreement are "
                                "measured on")
    heldout_tokens: int = setting(256, "held-out tokens scored", min=16, cap=MAX_TOKENS)
    greedy_tokens: int = setting(16, "tokens generated greedily to compare with FP32", min=1)
    heldout_images: str = setting("", "a vision-language model: a folder of held-out images "
                                  "the encoder and the answers after them are checked on (\"\": "
                                  "images generated here, not the calibration ones)")
    device_tokens: int = setting(0, "held-out tokens the device scores (the first ones); 0: "
                                 "all of them for a model in one part, the first 64 for a "
                                 "model in parts, whose host figures are scored part by part",
                                 min=0, cap=MAX_TOKENS)


class Gates(Section):
    name: ClassVar[str] = "gates"
    min_logits_cosine: float = setting(DEFAULT_GATES["min_logits_cosine"],
                                       GATE_HELP["min_logits_cosine"], min=0, max=1)
    max_perplexity_increase: float = setting(DEFAULT_GATES["max_perplexity_increase"],
                                             GATE_HELP["max_perplexity_increase"], min=0)
    min_top1_agreement: float = setting(DEFAULT_GATES["min_top1_agreement"],
                                        GATE_HELP["min_top1_agreement"], min=0, max=1)
    min_output_cosine: float = setting(DEFAULT_GATES["min_output_cosine"],
                                       GATE_HELP["min_output_cosine"], min=0, max=1)
    min_ranking_top1: float = setting(DEFAULT_GATES["min_ranking_top1"],
                                      GATE_HELP["min_ranking_top1"], min=0, max=1)


class Run(Section):
    name: ClassVar[str] = "run"
    prompt: str = setting("def __init__(self", "the text generation starts from")
    max_new_tokens: int = setting(16, "tokens generated per run", min=1)
    devices: list[str] = setting(default_devices(), "the devices run and profile fan out "
                                 "over: " + ", ".join(device_names()))
    image: str = setting("", "a vision-language model: the image the prompt is about (\"\": "
                         "the prompt alone)")
    speculative_overlap: bool = setting(False, "speculative decoding with a draft model: the "
                                        "draft drafts the next window on the CPU while the "
                                        "target verifies (studio generate --overlap, the "
                                        "Playground)")

    def rules(self) -> None:
        if not self.prompt.strip():
            raise StudioError("run.prompt is empty: give the text generation starts from")
        if not self.devices:
            raise StudioError("run.devices is empty: name a device to run on, e.g. "
                              + ", ".join(f'"{k}"' for k in default_devices()))
        check_kinds(self.devices)
        seen: set[str] = set()
        for name in self.devices:  # one device named twice would run every job twice
            try:  # an id as the plan reads it (agent:lab is agent:lab@cpu)
                key = name if shorthand_kind(name) else device(name).id
            except StudioError:  # an adb phone the project's only target completes
                key = name
            if key in seen:
                raise StudioError(f"run.devices names {name!r} twice: name each device once")
            seen.add(key)


def _default_stages() -> list[str]:
    return list(DEFAULT_STAGES)


class Pipeline(Section):
    name: ClassVar[str] = "pipeline"
    stages: list[str] = setting(None, "the stages a run asks for (default: the model kind's "
                                "stages but the optional ones)", factory=_default_stages)
    executor: str = setting("local", "where stage jobs and a stage's parts run: local (this "
                            "machine's worker processes) or ray (a Ray cluster, pip install "
                            "'qstudio[ray]'); studio sweep --executor overrides it",
                            choices=EXECUTORS)
    part_processes: int = setting(0, "a stage's parts (the compile of a model exported in "
                                  "parts) run at once on this machine, each in a process of "
                                  "its own (0: as many as the cores and the free memory allow)",
                                  min=0, max=256)

    def rules(self) -> None:
        if not self.stages:
            raise StudioError("pipeline.stages is empty: name the stages to run, e.g. "
                              + ", ".join(f'"{s}"' for s in STAGE_NAMES))


class Pruning(Section):
    name: ClassVar[str] = "pruning"
    drop_blocks: int = setting(1, "pruning by ablation: the blocks whose removal costs the "
                               "least perplexity are dropped", min=1, cap=1024,
                               hint="(the blocks the pruned checkpoint leaves out)")


class Waterfall(Section):
    name: ClassVar[str] = "waterfall"
    window: int = setting(0, "the attention window of the windowed step", min=0,
                          cap=MAX_CONTEXT, hint="(0: half the context)")
    k: int = setting(4, "the speculative step's draft tokens per pass", min=1, max=16)
    new_tokens: int = setting(48, "tokens generated per timing", min=2, cap=MAX_CONTEXT)


class Bundle(Section):
    name: ClassVar[str] = "bundle"
    new_tokens: int = setting(96, "the Genie check: tokens generated per prompt (fewer when "
                              "the context is shorter)", min=1, cap=MAX_CONTEXT)
    prompts: int = setting(3, "the Genie check: held-out prompts whose greedy text Genie must "
                           "match", min=1, max=8)
    parts: int = setting(0, "the parts of the bundle: the compile stage's (export.parts); "
                         "another count is refused", min=0, cap=1024,
                         hint="(0: the compile stage's parts)")
    max_context_mb: int = setting(1536, "no longer read: the bundle ships the compile stage's "
                                  "binaries, split as export.parts says (kept so older project "
                                  "files load)", min=16,
                                  cap=1 << 20)
    prefill_length: int = setting(0, "tokens per pass of the AR-N prefill graph", min=0,
                                  cap=MAX_CONTEXT,
                                  hint="(0: the export's prompt length, 1: no prefill graph)")
    weight_sharing: str = setting(
        "auto", "one context binary per part whose prefill and decode graphs share their "
                "weights (compiled beside the separate binaries the simulator runs, checked "
                "against them by structure; the simulator cannot load it: a device executes "
                "it)", choices=("auto", "on", "off"),
        hint="(auto: on where there is a prefill graph to share with)")
    dlc: str = setting(
        "auto", "the DLC files of the quantized graphs beside the binaries, for Qualcomm's own "
                "on-device tools (Genie does not read them; each holds a graph's weights "
                "again)", choices=("auto", "on", "off"),
        hint=f"(auto: where the quantized graphs hold at most {DLC_AUTO_BYTES >> 30} GiB of "
             "weights; at 8 B they would double the bundle)")
    score_tokens: int = setting(64, "held-out tokens scored against FP32 on the bundle's own "
                                "binaries (the figures of what ships)", min=0, cap=MAX_TOKENS,
                                hint="(0: none)")
    draft: str = setting("auto", "the draft model (model.draft) in the bundle, for the app's CPU "
                         "(its ONNX graphs, the token table it reads, how to run it beside the "
                         "target), checked against plain greedy decoding over the bundle's "
                         "binaries: auto (with a draft model) or off", choices=("auto", "off"))


class Sensitivity(Section):
    name: ClassVar[str] = "sensitivity"
    heldout_tokens: int = setting(128, "held-out tokens scored per variant", min=16,
                                  cap=MAX_TOKENS)
    high: str = setting("auto", "the precision a layer is raised to (auto: INT16 over W8A8, "
                        "FP16 over W8A16)", choices=("auto", *PRECISIONS))
    low: str = setting("INT4", "the precision a layer is lowered to", choices=("", *PRECISIONS),
                       hint="(or \"\" to skip lowering)")
    confirm_on_htp: str = setting("", "a chip whose HTP simulator scores the top entries of "
                                  "the raise ranking again (\"\": host figures only)")
    confirm_top: int = setting(3, "the entries of the raise ranking confirmed on the HTP",
                               min=1, max=64,
                               hint="(entries of the ranking scored again on the HTP simulator)")

    def rules(self) -> None:
        _check_chip_or_none("sensitivity.confirm_on_htp", self.confirm_on_htp,
                            "host figures only")


def _check_chip_or_none(key: str, value: str, empty: str) -> None:
    """A setting naming a catalog chip, or "" for ``empty``: one line when it names neither."""
    chips = _chips() if value else ("",)
    if value not in chips:
        raise StudioError(f"{key} = {value!r} is not a known chip "
                          f"({', '.join(c for c in chips if c)}; \"\" for {empty})")


class Autoprecision(Section):
    name: ClassVar[str] = "autoprecision"
    metric: str = setting("perplexity", "the target: perplexity within max_perplexity_change "
                          "of FP32, the mean logits cosine at least min_logits_cosine, or the "
                          "top-1 agreement at least min_top1_agreement",
                          choices=("perplexity", "cosine", "top1"))
    max_perplexity_change: float = setting(0.02, "the perplexity change allowed, either way",
                                           min=0, hint="(0.02 = 2 %)")
    min_logits_cosine: float = setting(0.999, "the mean logits cosine vs FP32 required",
                                       above=0, max=1)
    min_top1_agreement: float = setting(0.95, "the teacher-forced top-1 agreement with FP32 "
                                        "required", above=0, max=1)
    on_htp: str = setting("", "a chip whose HTP simulator measures each step (\"\": the host "
                          "QDQ model, faster, but its rounding is not the HTP's)")

    def rules(self) -> None:
        _check_chip_or_none("autoprecision.on_htp", self.on_htp, "the host QDQ model")


class Layerdiff(Section):
    name: ClassVar[str] = "layerdiff"
    windows: int = setting(2, "held-out windows of P tokens compared", min=1, max=MAX_WINDOWS)
    tensors: str = setting("modules", "which tensors: blocks (the residual stream between "
                           "blocks), modules (and every module's output), all",
                           choices=TENSOR_MODES)
    graph: str = setting("prefill", "which graph: prefill, or decode (one step over an FP32 "
                         "cache)", choices=("prefill", "decode"))
    fp16_step: bool = setting(False, "also run the FP32 graph on the HTP in FP16, without "
                              "quantization (a bisection's first step; chips with FP16)")
    part: int = setting(0, "for a model exported in parts: the part compared (1..parts), "
                        "fed what the FP32 parts before it hand on, its hand-off run on to the "
                        "logits by the FP32 parts after it", min=0, cap=1024,
                        hint="(0: a model exported whole)")


#: the run-time performance modes the QNN HTP backend takes (the EP's htp_performance_mode,
#: qnn-net-run's --perf_profile); "" leaves the backend's default
PERFORMANCE_MODES = ("", "burst", "sustained_high_performance", "high_performance", "balanced",
                     "low_balanced", "power_saver", "low_power_saver", "high_power_saver",
                     "extreme_power_saver")


class Htp(Section):
    """The HTP toolchain's options the QNN EP in this wheel exposes: compile-side (baked into
    the context binaries, so in the compile stage's key) and run-side (the sessions that run
    them). The seed's other knobs — multi-core scheduling, L2 (system-level) cache
    reservation — have no EP option here: :data:`NOT_EXPOSED` says what they would need."""

    name: ClassVar[str] = "htp"
    optimization_level: int = setting(
        0, "the compiler's graph finalization optimization (the EP's "
           "htp_graph_finalization_optimization_mode): 1 prepares fastest, 3 optimizes most",
        min=0, max=3, hint="(0: the backend's default)")
    vtcm_mb: int = setting(0, "VTCM the compiled graphs may use, in MB", min=0, max=64,
                           hint="(0: the chip's whole VTCM, from the catalog)")
    fp16_relaxation: bool = setting(
        False, "float ops left in a quantized graph run in FP16 instead of FP32 (the EP's "
               "enable_htp_fp16_precision; always on for the FP16 scheme)")
    graph_io: str = setting(
        "quantized", "the compiled graphs' inputs and outputs: float (the NPU quantizes the KV "
                 "cache, the mask and the hand-offs and dequantizes the new rows and logits "
                 "at every pass) or quantized (it takes and gives the integers it computes "
                 "with; the host keeps the cache as they are and reads the logits)",
        choices=("float", "quantized"))
    performance_mode: str = setting(
        "", "run time: the HTP's clock and power vote while the run and profile stages run "
            "the binaries (the EP's htp_performance_mode; qnn-net-run's --perf_profile on a "
            "phone; an agent applies it on its device). The simulator's timings do not follow "
            "it", choices=PERFORMANCE_MODES, hint="(empty: the backend's default)")


#: the performance seed's HTP knobs the QNN EP in this wheel does not expose, and what
#: setting them would need
NOT_EXPOSED = {
    "multi-core scheduling": "the QNN SDK's multi-core HTP graph options on a chip with "
                             "several HTP cores (automotive SA8295P / SA8775P); the ONNX "
                             "Runtime QNN EP offers no option for it",
    "L2 (system-level) cache reservation": "the QNN HTP backend's system-level cache "
                                           "allocator on a device; no EP option, and the "
                                           "simulator models no cache",
    "weight layout / DMA merging": "chosen by the HTP compiler itself (the optimization level "
                                   "above moves it); no separate EP option",
    "graph I/O quantization offload": "the EP's offload_graph_io_quantization is accepted "
                                      "but leaves the compiled context unchanged here "
                                      "(measured: identical binaries, on or off); "
                                      "htp.graph_io = quantized cuts the edge conversions "
                                      "instead",
    "spill-fill buffer sharing": "the EP's enable_htp_spill_fill_buffer is accepted; it shares "
                                 "one buffer between contexts loaded together, which the "
                                 "simulator does not show (identical binaries)",
}


class Profile(Section):
    name: ClassVar[str] = "profile"
    repeats: int = setting(5, "times one decode step is profiled (the median and spread are "
                           "kept)", min=1, max=50,
                           hint="(each repeat profiles one decode step on the simulator; 5 "
                                "gives a median and a spread)")


class Graph(Section):
    name: ClassVar[str] = "graph"
    shapes: dict[str, list[int]] = setting({}, "static input shapes: name -> dims, for inputs "
                                           "with symbolic dims")
    seq_len: int = setting(128, "the encoder's sequence length", min=2, max=512)
    calibration: str = setting("", "calibration samples (.npz / .npy; \"\" for an encoder: "
                               "its text through the tokenizer)")
    validation: str = setting("", "validation samples (\"\": the last calibration samples)")
    repeats: int = setting(5, "timed inferences the run stage takes", min=1, max=1000)

    def rules(self) -> None:
        for name, dims in self.shapes.items():
            if not (dims and len(dims) <= 8 and all(0 < d <= MAX_DIM for d in dims)):
                raise StudioError(f"graph.shapes.{name} must be a list of at most 8 positive "
                                  f"integers up to {MAX_DIM}, e.g. [1, 3, 32, 32], not "
                                  f"{_short(dims)}")


# ---- all sections -------------------------------------------------------------------------
S = TypeVar("S", bound=Section)


class SectionField(Generic[S]):
    """A section on :class:`Settings`: read it as its declaration's type; assign it any
    mapping of its keys (``project.gates = {...}`` makes a Gates of it)."""

    def __init__(self, cls: type[S]) -> None:
        self.cls = cls
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @typing.overload
    def __get__(self, obj: None, owner: Any = None) -> SectionField[S]: ...

    @typing.overload
    def __get__(self, obj: object, owner: Any = None) -> S: ...

    def __get__(self, obj: object | None, owner: Any = None) -> SectionField[S] | S:
        if obj is None:
            return self
        got = obj.__dict__.get(self.attr)
        if got is None:
            got = obj.__dict__[self.attr] = self.cls()
        return typing.cast(S, got)

    def __set__(self, obj: object, value: Mapping[str, Any]) -> None:
        obj.__dict__[self.attr] = value if isinstance(value, self.cls) else self.cls(value)


class Settings:
    """Every section of a project file, in the order the file writes them."""

    model = SectionField(Model)
    export = SectionField(Export)
    quantization = SectionField(Quantization)
    validation = SectionField(Validation)
    gates = SectionField(Gates)
    run = SectionField(Run)
    pipeline = SectionField(Pipeline)
    pruning = SectionField(Pruning)
    waterfall = SectionField(Waterfall)
    bundle = SectionField(Bundle)
    sensitivity = SectionField(Sensitivity)
    autoprecision = SectionField(Autoprecision)
    layerdiff = SectionField(Layerdiff)
    htp = SectionField(Htp)
    profile = SectionField(Profile)
    graph = SectionField(Graph)

    def sections(self) -> Iterator[Section]:
        for name in SECTIONS:
            yield getattr(self, name)


#: section name -> its declaration, in file order
SECTIONS: dict[str, type[Section]] = {
    name: f.cls for name, f in vars(Settings).items() if isinstance(f, SectionField)
}
#: section name -> its keys
SECTION_KEYS: dict[str, tuple[str, ...]] = {n: tuple(c.specs()) for n, c in SECTIONS.items()}
#: the settings outside the sections a stage may read
TOP_SETTINGS: tuple[str, ...] = ("name", "targets")


def _check_declarations() -> None:
    for name, cls in SECTIONS.items():
        if cls.name != name:
            raise ValueError(f"the [{name}] section's declaration {cls.__name__} says {cls.name}")
        clash = set(cls.specs()) & {*dir(Section), "_keys", "_NO_DEFAULT"}
        if clash:
            raise ValueError(f"[{name}] declares {sorted(clash)[0]!r}, a name the mapping "
                             "protocol of a section uses: rename the setting")
    if set(SECTION_KEYS["gates"]) != set(DEFAULT_GATES):
        raise ValueError("the [gates] declaration and recipe.DEFAULT_GATES name other gates")


_check_declarations()


def setting_keys() -> frozenset[str]:
    """Every setting a stage may declare: ``section.key`` and the top-level ones."""
    return frozenset({*TOP_SETTINGS, *(f"{s}.{k}" for s, ks in SECTION_KEYS.items() for k in ks)})


def spec_of(key: str) -> Spec:
    """The declaration of ``section.key``."""
    section, _, leaf = key.partition(".")
    return SECTIONS[section].specs()[leaf][0]


def check_across(s: Settings) -> None:
    """The rules between sections (each section has checked its own keys)."""
    C = s.export.context_length
    for key, value in (("run.max_new_tokens", s.run.max_new_tokens),
                       ("validation.greedy_tokens", s.validation.greedy_tokens)):
        if value > C - 1:
            raise StudioError(
                f"{key} = {value} is more than the exported context allows (at most "
                f"{C - 1} after a one-token prompt, export.context_length = {C}): lower it "
                "or raise export.context_length"
            )
    kind = s.model.kind
    for st in s.pipeline.stages:
        if st not in STAGE_NAMES:
            raise StudioError(f"pipeline.stages: unknown stage {st!r}; known: "
                              f"{', '.join(STAGE_NAMES)}")
        if st not in kind_stages(kind):
            raise StudioError(
                f"pipeline.stages: {st!r} is not a stage of a {kind} project (model.kind); its "
                f"stages: {', '.join(kind_stages(kind))}")
    if kind != "causal-lm" and is_float_scheme(s.quantization.scheme):
        raise StudioError(f"quantization.scheme {s.quantization.scheme} is for causal LMs here; "
                          f"quantize the graph ({' or '.join(QUANTIZED_SCHEMES[:2])})")


def check(s: Settings) -> None:
    """Every section's own checks, in file order, then :func:`check_across`."""
    for section in s.sections():
        section.check()
    check_across(s)


def check_settings_declared(declarations: tuple[StageDecl, ...], *tables: Mapping[str, str]
                            ) -> None:
    """Every setting a stage declares (and every key of ``tables``) is one that
    :mod:`studio.core.settings` declares: a misspelt key fails at import, not when the stage
    runs. Raises ValueError naming the stage and the key."""
    known = setting_keys()

    def why(key: str) -> str:
        section, _, leaf = key.partition(".")
        if section in SECTION_KEYS:
            return f"[{section}] has {', '.join(SECTION_KEYS[section])}"
        return f"sections: {', '.join(SECTION_KEYS)}"

    for d in declarations:
        for key in d.settings:
            if key not in known:
                raise ValueError(f"the {d.name} stage declares the setting {key!r}, which "
                                 f"studio/core/settings.py does not declare ({why(key)})")
    for table in tables:
        for key in table:
            if key not in known:
                raise ValueError(f"{key!r} is not a setting studio/core/settings.py declares "
                                 f"({why(key)})")


# the stages declare their settings by name: a misspelt one fails here, at import
check_settings_declared(DECLARATIONS, REFS, PLAN_KEYS)
