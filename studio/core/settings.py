"""The project file's settings: its sections, assembled from the stages' declarations.

Each ``[section]`` of a ``.qstudio`` file is a class below. Its keys are declared where the
stage that reads them declares its settings (``studio/core/stages/<stage>.py``, with
:func:`studio.core.keys.setting`: the key, its type (the annotation), its default, a
one-line doc and its allowed range or choices); a section takes them by reference, in the
order the file writes them, and declares here only the keys no stage reads (the plan's and
the retired ones). A key a stage declares that the section does not name follows the named
ones. Everything else comes from these declarations: the keys the file may hold, the
defaults a file leaves out, the checks at load (one line naming the key and the limit), and
the keys a sweep may vary.

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
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from studio.core.catalog import load_catalog
from studio.core.devices import (
    check_kinds,
    default_devices,
    device,
    device_names,
    shorthand_kind,
)
from studio.core.errors import StudioError
from studio.core.keys import (  # noqa: F401  (read from here by the pages and commands)
    MAX_CONTEXT,
    MAX_DIM,
    MAX_TOKENS,
    Key,
    Spec,
    check_type,
    check_value,
    declare_keys,
    setting,
    short_repr,
)
from studio.core.recipe import (
    ACTIVATION_GRANULARITIES,
    DEFAULT_GATES,
    QUANTIZED_SCHEMES,
    check_recipe,
    is_float_scheme,
)
from studio.core.stagegraph import (
    DECLARATIONS,
    DEFAULT_STAGES,
    PLAN_KEYS,
    REFS,
    STAGE_KEYS,
    STAGE_NAMES,
    StageDecl,
    kind_stages,
)
from studio.core.stages import ablation, graph_import, graph_quantize, graph_run
from studio.core.stages import autoprecision as autoprecision_stage
from studio.core.stages import bundle as bundle_stage
from studio.core.stages import compile as compile_stage
from studio.core.stages import draft as draft_stage
from studio.core.stages import export as export_stage
from studio.core.stages import layerdiff as layerdiff_stage
from studio.core.stages import profile as profile_stage
from studio.core.stages import quantize as quantize_stage
from studio.core.stages import report as report_stage
from studio.core.stages import run as run_stage
from studio.core.stages import sensitivity as sensitivity_stage
from studio.core.stages import validate as validate_stage
from studio.core.stages import waterfall as waterfall_stage
from studio.core.stages.bundle import DLC_AUTO_BYTES  # noqa: F401  (read from here)
from studio.core.stages.run import CHAT_TEMPLATES, PERFORMANCE_MODES  # noqa: F401

#: pipeline.executor: where work runs (studio.services.executors)
EXECUTORS = ("local", "ray")


# ---- a section --------------------------------------------------------------------------------
class Section(dict[str, Any]):
    """One ``[section]`` of the project file: its typed settings, declared on the subclass
    with :func:`setting` and read by attribute, held as the items of a dict, so that the
    section is also a mapping of its keys (and JSON / TOML as it is). A key no declaration
    has cannot be set; a deleted key takes its default again. Subclasses set ``name``;
    :meth:`rules` holds the rules between their own keys."""

    name: ClassVar[str] = ""
    _keys: ClassVar[dict[str, Key]] = {}

    def read_key(self, key: Key) -> Any:
        return dict.__getitem__(self, key.name)

    def write_key(self, key: Key, value: Any) -> None:
        dict.__setitem__(self, key.name, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The section's keys: those it names (by reference to a stage's declaration, or
        declared here), then the stages' keys of the section it does not name."""
        super().__init_subclass__(**kwargs)
        named = declare_keys(cls)
        for attr, key in named.items():
            if attr != key.name or key.section != cls.name:
                raise ValueError(f"[{cls.name}] names {key.key} as {attr}: a section holds its "
                                 "own keys, each by its own name")
        rest = {k.name: k for k in STAGE_KEYS.values()
                if k.section == cls.name and k.name not in named}
        for attr, key in rest.items():
            setattr(cls, attr, key)
        cls._keys = {**named, **rest}

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
# Each key is declared (type, default, range, doc) by the stage that owns it, in its module
# under studio/core/stages; a section takes those keys by reference, in the order the file
# writes them, and declares here only the keys no stage reads (the plan's, the retired
# ones). A key a stage declares that its section does not name here follows the named ones
# (Section.__init_subclass__): adding a setting to a stage touches no line of this file.
def _chips() -> tuple[str, ...]:
    return ("", *load_catalog())


class Model(Section):
    name: ClassVar[str] = "model"
    source = export_stage.Source.source
    draft = draft_stage.Draft.draft
    draft_embedding = bundle_stage.BundleSettings.draft_embedding
    kind = graph_import.Kind.kind
    chat_template = run_stage.Prompt.chat_template

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
    prompt_length = export_stage.Shapes.prompt_length
    context_length = export_stage.Shapes.context_length
    parts = export_stage.ExportSettings.parts
    max_part_mb = export_stage.ExportSettings.max_part_mb
    image_size = export_stage.ExportSettings.image_size

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
    scheme = quantize_stage.Scheme.scheme
    weight_granularity = quantize_stage.Weights.weight_granularity
    activation_granularity: str = setting("quantization.activation_granularity", "per_tensor",
                                          "one activation scale per tensor (static, what the "
                                          "HTP runs) or per token (dynamic: refused, the HTP "
                                          "cannot run it)", choices=ACTIVATION_GRANULARITIES)
    weight_rounding = quantize_stage.Recipe.weight_rounding
    rounding_samples = quantize_stage.Recipe.rounding_samples
    calibration_text = quantize_stage.Calibration.calibration_text
    calibration_samples = quantize_stage.Calibration.calibration_samples
    vision_scheme = quantize_stage.QuantizeSettings.vision_scheme
    vision_overrides = quantize_stage.QuantizeSettings.vision_overrides
    calibration_images = quantize_stage.QuantizeSettings.calibration_images
    calibration_method = quantize_stage.Recipe.calibration_method
    block_size = quantize_stage.Weights.block_size
    kv_cache = quantize_stage.KvCache.kv_cache
    overrides = quantize_stage.Recipe.overrides
    embedding = quantize_stage.Recipe.embedding
    placement = graph_quantize.Placement.placement

    def rules(self) -> None:
        check_recipe(self)


class Validation(Section):
    name: ClassVar[str] = "validation"
    heldout_text = validate_stage.Heldout.heldout_text
    heldout_tokens = validate_stage.HeldoutTokens.heldout_tokens
    greedy_tokens = validate_stage.Greedy.greedy_tokens
    heldout_images = validate_stage.ValidateSettings.heldout_images
    device_tokens = validate_stage.ValidateSettings.device_tokens


class Gates(Section):
    name: ClassVar[str] = "gates"
    min_logits_cosine = report_stage.Gates.min_logits_cosine
    max_perplexity_increase = report_stage.Gates.max_perplexity_increase
    min_top1_agreement = report_stage.Gates.min_top1_agreement
    min_output_cosine = report_stage.Gates.min_output_cosine
    min_ranking_top1 = report_stage.Gates.min_ranking_top1


class Run(Section):
    name: ClassVar[str] = "run"
    prompt = run_stage.Prompt.prompt
    max_new_tokens = run_stage.RunSettings.max_new_tokens
    devices: list[str] = setting("run.devices", default_devices(), "the devices run and "
                                 "profile fan out over: " + ", ".join(device_names()))
    image = run_stage.RunSettings.image
    speculative_overlap: bool = setting("run.speculative_overlap", False, "speculative "
                                        "decoding with a draft model: the draft drafts the "
                                        "next window on the CPU while the target verifies "
                                        "(studio generate --overlap, the Playground)")

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
    stages: list[str] = setting("pipeline.stages", None, "the stages a run asks for (default: "
                                "the model kind's stages but the optional ones)",
                                factory=_default_stages)
    executor: str = setting("pipeline.executor", "local", "where stage jobs and a stage's parts "
                            "run: local (this machine's worker processes) or ray (a Ray "
                            "cluster, pip install 'qstudio[ray]'); studio sweep --executor "
                            "overrides it", choices=EXECUTORS)
    part_processes: int = setting("pipeline.part_processes", 0, "a stage's parts (the compile of "
                                  "a model exported in parts) run at once on this machine, each "
                                  "in a process of its own (0: as many as the cores and the free "
                                  "memory allow)", min=0, max=256)

    def rules(self) -> None:
        if not self.stages:
            raise StudioError("pipeline.stages is empty: name the stages to run, e.g. "
                              + ", ".join(f'"{s}"' for s in STAGE_NAMES))


class Pruning(Section):
    name: ClassVar[str] = "pruning"
    drop_blocks = ablation.AblationSettings.drop_blocks


class Waterfall(Section):
    name: ClassVar[str] = "waterfall"
    window = waterfall_stage.WaterfallSettings.window
    k = waterfall_stage.WaterfallSettings.k
    new_tokens = waterfall_stage.WaterfallSettings.new_tokens


class Bundle(Section):
    name: ClassVar[str] = "bundle"
    new_tokens = bundle_stage.BundleSettings.new_tokens
    prompts = bundle_stage.BundleSettings.prompts
    parts = bundle_stage.BundleSettings.parts
    max_context_mb: int = setting("bundle.max_context_mb", 1536, "no longer read: the bundle "
                                  "ships the compile stage's binaries, split as export.parts "
                                  "says (kept so older project files load)", min=16,
                                  cap=1 << 20)
    prefill_length = compile_stage.Prefill.prefill_length
    weight_sharing = compile_stage.Prefill.weight_sharing
    dlc = bundle_stage.BundleSettings.dlc
    score_tokens = bundle_stage.BundleSettings.score_tokens
    draft = bundle_stage.BundleSettings.draft_in_bundle


class Sensitivity(Section):
    name: ClassVar[str] = "sensitivity"
    heldout_tokens = sensitivity_stage.SensitivitySettings.heldout_tokens
    high = sensitivity_stage.SensitivitySettings.high
    low = sensitivity_stage.SensitivitySettings.low
    confirm_on_htp = sensitivity_stage.SensitivitySettings.confirm_on_htp
    confirm_top = sensitivity_stage.SensitivitySettings.confirm_top

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
    metric = autoprecision_stage.AutoprecisionSettings.metric
    max_perplexity_change = autoprecision_stage.AutoprecisionSettings.max_perplexity_change
    min_logits_cosine = autoprecision_stage.AutoprecisionSettings.min_logits_cosine
    min_top1_agreement = autoprecision_stage.AutoprecisionSettings.min_top1_agreement
    on_htp = autoprecision_stage.AutoprecisionSettings.on_htp

    def rules(self) -> None:
        _check_chip_or_none("autoprecision.on_htp", self.on_htp, "the host QDQ model")


class Layerdiff(Section):
    name: ClassVar[str] = "layerdiff"
    windows = layerdiff_stage.LayerdiffSettings.windows
    tensors = layerdiff_stage.LayerdiffSettings.tensors
    graph = layerdiff_stage.LayerdiffSettings.graph
    fp16_step = layerdiff_stage.LayerdiffSettings.fp16_step
    part = layerdiff_stage.LayerdiffSettings.part


class Htp(Section):
    """The HTP toolchain's options the QNN EP in this wheel exposes: compile-side (baked into
    the context binaries, so in the compile stage's key) and run-side (the sessions that run
    them). The seed's other knobs — multi-core scheduling, L2 (system-level) cache
    reservation — have no EP option here: :data:`NOT_EXPOSED` says what they would need."""

    name: ClassVar[str] = "htp"
    optimization_level = compile_stage.HtpCompile.optimization_level
    vtcm_mb = compile_stage.HtpCompile.vtcm_mb
    fp16_relaxation = compile_stage.HtpCompile.fp16_relaxation
    graph_io = compile_stage.HtpCompile.graph_io
    performance_mode = run_stage.HtpRun.performance_mode


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
    repeats = profile_stage.Repeats.repeats


class Graph(Section):
    name: ClassVar[str] = "graph"
    shapes = graph_import.ImportSettings.shapes
    seq_len = graph_import.ImportSettings.seq_len
    calibration = graph_quantize.GraphQuantizeSettings.calibration
    validation = graph_quantize.GraphQuantizeSettings.validation
    repeats = graph_run.GraphRunSettings.repeats

    def rules(self) -> None:
        for name, dims in self.shapes.items():
            if not (dims and len(dims) <= 8 and all(0 < d <= MAX_DIM for d in dims)):
                raise StudioError(f"graph.shapes.{name} must be a list of at most 8 positive "
                                  f"integers up to {MAX_DIM}, e.g. [1, 3, 32, 32], not "
                                  f"{short_repr(dims)}")


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


# every key a stage declares lands in a section of the file (a misspelt section fails here,
# at import), and the tables name declared keys
check_settings_declared(DECLARATIONS, REFS, PLAN_KEYS)
