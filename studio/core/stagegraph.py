"""The stage graph: every pipeline stage declared once.

A declaration says what a stage needs upstream, what it fans out over (nothing, each target
chip, each device) and which project settings it reads. Everything else comes from it:
``plan`` (which jobs, in what order, with which dependencies), the artifact key, preflight's
checks of input files, the frozen :class:`StageConfig` the worker hands the stage (holding
*exactly* what the key hashes), the GUI's stage list and ``--stages``.

A stage cannot read a setting its key does not cover: :meth:`StageConfig.get` refuses an
undeclared key. Adding a stage is one declaration here plus one module in
``studio/worker/stages/`` (``run(ctx, progress)``, named by :attr:`StageDecl.module`).

Keys are reproducible (Bazel / Nix style): a key hashes the stage, its declared settings
(file references by content, never by path), the identity of its fan-out item, the *keys*
of its inputs, and the tool versions including a digest of the stage code. No timing, path
or clock goes into a key; run facts live in the run history.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from studio.core.artifacts import artifact_key
from studio.core.devices import DEVICE_KINDS, Device, device, project_devices
from studio.core.errors import StudioError
from studio.core.fsutil import sha256_file
from studio.core.recipe import DEFAULT_GATES

if TYPE_CHECKING:
    from studio.core.project import Project


@dataclass(frozen=True)
class Need:
    """An upstream stage: its single job, or (``per_chip``) its job for the same chip."""

    stage: str
    per_chip: bool = False


@dataclass(frozen=True)
class StageDecl:
    name: str
    title: str
    needs: tuple[Need, ...] = ()
    fan_out: str = ""  # "" | "target" (each target chip) | "device" (each device)
    settings: tuple[str, ...] = ()  # dotted project keys the stage reads
    needs_all: bool = False  # depends on every other job of the plan (the report)
    cache: bool = True  # False: always run (its content comes from the run history)
    optional: bool = False  # not in a new project's pipeline: asked for by name (--stages)
    # a measurement (timings on a device): cached like the others, but a run asked to
    # remeasure times it again, and later runs reuse the newest measurement
    measures: bool = False
    # for fan_out "device": only devices that run on an NPU (an agent's HTP, not its CPU)
    npu_only: bool = False
    # the model kinds (model.kind) whose pipeline the stage belongs to
    kinds: tuple[str, ...] = ("causal-lm",)
    # what the stage is across model kinds ("quantize" for quantize and graph-quantize, ...):
    # pages, reports and schedulers ask for a role, never for a stage name
    role: str = ""
    # its result holds the accuracy figures the project's gates judge
    gated: bool = False
    # it reads the run history (this run's settings, the comparison with the previous run)
    reads_history: bool = False
    # it takes a model exported in parts (studio.core.parts): the others refuse one
    takes_parts: bool = False
    # it works part by part and keeps the parts it finished across a kill: its work folder
    # is kept per key (studio.core.artifacts), and a re-run does only the rest
    resumes: bool = False
    # what the preflight checks before anything runs when the stage is planned
    # (studio.services.preflight.CHECKS): "draft" (a draft model is set), "overrides" (the
    # override rules name layers of the model), "graph-calibration" (an ONNX graph's
    # calibration samples are given), "prompt-fits" (the prompt fits the context)
    preflight: tuple[str, ...] = ()
    # with "prompt-fits": the setting whose new tokens must fit after the prompt
    new_tokens: str = ""

    @property
    def device_kinds(self) -> tuple[str, ...]:
        """For fan_out "device": the kinds whose devices run it (each kind declares its
        stages, :attr:`studio.core.devices.DeviceKind.stages`)."""
        return tuple(k for k, d in DEVICE_KINDS.items() if self.name in d.stages)

    @property
    def module(self) -> str:
        """The module of the stage's function (``studio.worker.stages.<module>``)."""
        return self.name.replace("-", "_")


# What a project deploys: a causal LM from a checkpoint, a sentence encoder from its PyTorch
# weights, or any ONNX graph. Each kind has its own declared stages (the report is shared).
MODEL_KINDS: tuple[str, ...] = ("causal-lm", "encoder", "onnx-graph")
GRAPH_KINDS: tuple[str, ...] = ("encoder", "onnx-graph")
MODEL_KIND_HELP = {
    "causal-lm": "a language model from a Hugging Face checkpoint: export, quantize, compile, "
                 "validate (perplexity, logits), generate",
    "encoder": "a sentence encoder from its PyTorch weights: embeddings checked against FP32 "
               "and on a small retrieval set",
    "onnx-graph": "any ONNX network with static (or fixed) input shapes and .npz calibration "
                  "samples",
}


_GATES = tuple(f"gates.{k}" for k in DEFAULT_GATES)
#: the [htp] settings a compile bakes into its context binaries: every stage that compiles
#: a graph for the HTP declares them (compile, and the stages that compile their own graphs)
HTP_COMPILE_SETTINGS = ("htp.optimization_level", "htp.vtcm_mb", "htp.fp16_relaxation",
                        "htp.graph_io")
#: the [htp] settings the sessions that run compiled binaries take (the run and profile
#: stages: their timings depend on them, the binaries do not)
HTP_RUN_SETTINGS = ("htp.performance_mode",)

DECLARATIONS: tuple[StageDecl, ...] = (
    StageDecl("export", "Export", (),
              settings=("model.source", "export.prompt_length", "export.context_length",
                        "export.parts", "export.max_part_mb", "export.image_size",
                        # export.parts = "auto" asks the targets' NPUs (KEY_IDENTITIES)
                        "targets"),
              role="export",
              takes_parts=True, resumes=True),
    StageDecl("quantize", "Quantize", (Need("export"),),
              settings=("quantization.scheme", "quantization.weight_granularity",
                        "quantization.calibration_text", "quantization.calibration_samples",
                        "quantization.calibration_method", "quantization.block_size",
                        "quantization.weight_rounding", "quantization.rounding_samples",
                        "quantization.kv_cache", "quantization.overrides",
                        "quantization.embedding",
                        "quantization.calibration_images", "quantization.vision_scheme",
                        "quantization.vision_overrides"), role="quantize",
              takes_parts=True, resumes=True, preflight=("overrides",)),
    # the deployable binaries (studio.engine.deploy): Genie's AR-N prefill graph is exported
    # from the checkpoint and quantized here, with the recipe's calibration
    StageDecl("compile", "Compile", (Need("export"), Need("quantize")), fan_out="target",
              settings=("model.source", "quantization.scheme",
                        "quantization.weight_granularity", "quantization.calibration_text",
                        "quantization.calibration_samples", "quantization.calibration_method",
                        "quantization.overrides", "quantization.embedding",
                        "quantization.block_size",
                        "quantization.weight_rounding", "quantization.rounding_samples",
                        "bundle.prefill_length", "bundle.weight_sharing",
                        *HTP_COMPILE_SETTINGS), role="compile",
              takes_parts=True, resumes=True),
    StageDecl("validate", "Validate", (Need("export"), Need("quantize"),
                                       Need("compile", per_chip=True)), fan_out="target",
              settings=("quantization.scheme", "validation.heldout_text",
                        "validation.heldout_tokens", "validation.greedy_tokens",
                        "validation.device_tokens", "run.prompt", "validation.heldout_images",
                        "model.chat_template"),
              role="validate", gated=True,
              takes_parts=True, preflight=("prompt-fits",), new_tokens="validation.greedy_tokens"),
    StageDecl("run", "Run", (Need("export"), Need("compile", per_chip=True)), fan_out="device",
              measures=True,
              settings=("quantization.scheme", "run.prompt", "run.max_new_tokens",
                        "run.image", "model.chat_template", *HTP_RUN_SETTINGS), role="run",
              takes_parts=True, preflight=("prompt-fits",), new_tokens="run.max_new_tokens"),
    StageDecl("profile", "Profile", (Need("quantize"), Need("compile", per_chip=True)),
              fan_out="device", measures=True,
              npu_only=True, settings=("quantization.scheme", "profile.repeats",
                                       "quantization.weight_granularity",
                                       "quantization.block_size", *HTP_COMPILE_SETTINGS,
                                       *HTP_RUN_SETTINGS),
              role="profile",
              takes_parts=True),
    StageDecl("sensitivity", "Sensitivity", (Need("export"),), optional=True,
              settings=("quantization.scheme", "quantization.weight_granularity",
                        "quantization.calibration_text", "quantization.calibration_samples",
                        "validation.heldout_text", "sensitivity.heldout_tokens",
                        "sensitivity.high", "sensitivity.low", "sensitivity.confirm_on_htp",
                        "sensitivity.confirm_top"), role="sensitivity"),
    StageDecl("autoprecision", "Auto precision", (Need("export"), Need("sensitivity")),
              optional=True,
              settings=("autoprecision.metric", "autoprecision.max_perplexity_change",
                        "autoprecision.min_logits_cosine", "autoprecision.min_top1_agreement",
                        "autoprecision.on_htp"),
              role="autoprecision"),
    StageDecl("layerdiff", "Layer diff", (Need("export"), Need("quantize"),
                                          Need("compile", per_chip=True)),
              fan_out="target", optional=True,
              settings=("quantization.scheme", "quantization.weight_granularity",
                        "quantization.block_size", "validation.heldout_text",
                        "quantization.kv_cache", "layerdiff.windows", "layerdiff.tensors",
                        "layerdiff.graph", "layerdiff.fp16_step", "layerdiff.part",
                        *HTP_COMPILE_SETTINGS),
              role="layerdiff", takes_parts=True),
    StageDecl("draft", "Draft model", (), optional=True,
              settings=("model.draft", "export.prompt_length", "export.context_length"),
              role="draft", preflight=("draft",)),
    StageDecl("ablation", "Pruning ablation", (), optional=True,
              settings=("model.source", "validation.heldout_text", "validation.heldout_tokens",
                        "export.context_length", "pruning.drop_blocks"), role="ablation"),
    StageDecl("waterfall", "Optimization waterfall", (Need("export"), Need("ablation")),
              optional=True,
              settings=("quantization.scheme", "quantization.weight_granularity",
                        "quantization.calibration_text", "quantization.calibration_samples",
                        "validation.heldout_text", "validation.heldout_tokens", "model.source",
                        "waterfall.window", "waterfall.k", "waterfall.new_tokens"),
              role="waterfall"),
    StageDecl("bundle", "Genie bundle", (Need("export"), Need("quantize"),
                                         Need("compile", per_chip=True)),
              fan_out="target", optional=True,
              settings=("model.source", "quantization.scheme",
                        "quantization.weight_granularity", "quantization.calibration_text",
                        "quantization.calibration_samples", "quantization.calibration_method",
                        "quantization.overrides", "quantization.embedding",
                        "quantization.block_size",
                        "quantization.weight_rounding", "quantization.rounding_samples",
                        "validation.heldout_text", "bundle.new_tokens", "bundle.prompts",
                        "bundle.parts", "bundle.prefill_length",
                        "bundle.score_tokens", "bundle.dlc", "run.prompt",
                        "validation.greedy_tokens", "model.chat_template", "model.draft",
                        "model.draft_embedding", "bundle.draft",
                        # the device memory plan's KV width (the refusal before any work)
                        "quantization.kv_cache", "bundle.weight_sharing",
                        *HTP_COMPILE_SETTINGS),
              role="bundle", takes_parts=True,
              # its result holds validate's figures of the binaries it ships (with
              # bundle.score_tokens): the gates judge them too
              gated=True),
    # encoders and ONNX graphs: the graph with static shapes (an encoder exported from its
    # PyTorch weights), its rewrites and quantization, the placement on each chip, the check
    # against FP32 per output, the latency per inference on each device
    StageDecl("import", "Import", (), kinds=GRAPH_KINDS,
              settings=("model.kind", "model.source", "graph.shapes", "graph.seq_len"),
              role="export"),
    StageDecl("graph-quantize", "Quantize", (Need("import"),), kinds=GRAPH_KINDS,
              settings=("model.kind", "quantization.scheme", "quantization.weight_granularity",
                        "quantization.calibration_text", "quantization.calibration_samples",
                        "quantization.calibration_method", "quantization.overrides",
                        "quantization.weight_rounding",
                        "quantization.placement", "graph.calibration", "graph.validation"),
              role="quantize", preflight=("graph-calibration",)),
    StageDecl("graph-compile", "Compile", (Need("graph-quantize"),), fan_out="target",
              kinds=GRAPH_KINDS, settings=("quantization.scheme", "quantization.placement",
                                           *HTP_COMPILE_SETTINGS),
              role="compile"),
    StageDecl("graph-validate", "Validate", (Need("import"), Need("graph-quantize"),
                                             Need("graph-compile", per_chip=True)),
              fan_out="target", kinds=GRAPH_KINDS,
              settings=("model.kind", "quantization.scheme", "quantization.placement"),
              role="validate", gated=True),
    StageDecl("graph-run", "Run", (Need("import"), Need("graph-quantize"),
                                   Need("graph-compile", per_chip=True)),
              fan_out="device", measures=True,
              kinds=GRAPH_KINDS,
              settings=("quantization.scheme", "quantization.placement", "graph.repeats"),
              role="run"),
    StageDecl("graph-profile", "Profile", (Need("import"), Need("graph-quantize"),
                                           Need("graph-compile", per_chip=True)),
              fan_out="device", measures=True, npu_only=True,
              kinds=GRAPH_KINDS,
              settings=("quantization.scheme", "quantization.placement", "profile.repeats"),
              role="profile"),
    StageDecl("report", "Report", (), needs_all=True, cache=False, settings=("name", *_GATES),
              takes_parts=True,
              kinds=MODEL_KINDS, role="report", reads_history=True),
)
STAGES: dict[str, StageDecl] = {d.name: d for d in DECLARATIONS}
STAGE_NAMES: tuple[str, ...] = tuple(STAGES)


def kind_stages(kind: str) -> tuple[str, ...]:
    """Every stage of a ``kind`` project (model.kind), in declaration order."""
    return tuple(d.name for d in DECLARATIONS if kind in d.kinds)


def default_stages(kind: str) -> tuple[str, ...]:
    """What a new ``kind`` project's pipeline runs: its stages but the optional ones."""
    return tuple(d.name for d in DECLARATIONS if kind in d.kinds and not d.optional)


DEFAULT_STAGES: tuple[str, ...] = default_stages("causal-lm")


def stage_for_role(role: str, kind: str) -> str:
    """The stage that plays ``role`` in a ``kind`` project ("" when the kind has none):
    ``stage_for_role("quantize", "onnx-graph") == "graph-quantize"``."""
    return next((d.name for d in DECLARATIONS if d.role == role and kind in d.kinds), "")


def stages_with_role(role: str) -> tuple[str, ...]:
    """Every stage that plays ``role``, whatever the model kind."""
    return tuple(d.name for d in DECLARATIONS if d.role == role)

# Settings that name an input file: hashed by content, checked by preflight by kind.
REFS: dict[str, str] = {
    "model.source": "checkpoint",
    "model.draft": "checkpoint",
    "quantization.calibration_text": "text",
    "validation.heldout_text": "text",
    "quantization.calibration_images": "images",
    "validation.heldout_images": "images",
    "run.image": "images",
    "graph.calibration": "samples",
    "graph.validation": "samples",
}
# Keys that shape the plan (which jobs exist) rather than what a job computes.
PLAN_KEYS: dict[str, str] = {
    "targets": "the chips compile, validate and the simulator devices fan out over",
    "run.devices": "the devices run and profile fan out over",
    "pipeline.stages": "which stages a run asks for",
}
# Keys of the project file that no stage reads yet, with why.
UNREAD_KEYS: dict[str, str] = {
    "schema_version": "the file format's version",
    "sweeps": "recipe sweeps: variants of the project, each planned like a run of its own",
    "quantization.activation_granularity": "per_tensor, the only value the HTP runs (per_token "
                                           "is refused when the project is read)",
    "run.speculative_overlap": "how studio generate and the Playground decode speculatively "
                               "(no stage decodes speculatively)",
    "pipeline.executor": "where the jobs run (this machine or a Ray cluster), not what they "
                         "compute",
    "pipeline.part_processes": "how many of a stage's parts run at once, not what they "
                               "compute",
    "bundle.max_context_mb": "retired: the bundle ships the compile stage's binaries, split as "
                             "export.parts says (kept so older project files load)",
}


def check_device_stages(declarations: tuple[StageDecl, ...]) -> None:
    """Every stage a device kind says it runs is one that fans out over devices: a misspelt
    stage fails at import. Raises ValueError naming the kind and the stage."""
    device_stages = {d.name for d in declarations if d.fan_out == "device"}
    for k, decl in DEVICE_KINDS.items():
        for s in decl.stages:
            if s not in device_stages:
                raise ValueError(f"the device kind {k} runs the stage {s!r}, which is not a "
                                 f"stage over devices ({', '.join(sorted(device_stages))})")


check_device_stages(DECLARATIONS)


def declared_by(key: str) -> list[str]:
    """The stages that read the project key ``key``."""
    return [d.name for d in DECLARATIONS if key in d.settings]


def check_stage_names(stages: list[str], kind: str = "") -> None:
    names = kind_stages(kind) if kind else STAGE_NAMES
    if not stages:
        raise StudioError("no stages given: name at least one of " + ", ".join(names))
    for s in stages:
        if s not in STAGES:
            raise StudioError(f"unknown stage {s!r}; known stages: {', '.join(names)}")
        if s not in names:
            raise StudioError(f"the {s} stage is for {' and '.join(STAGES[s].kinds)} projects, "
                              f"and this project's model.kind is {kind}: its stages are "
                              f"{', '.join(names)}")


def project_value(project: Project, key: str) -> Any:
    section, _, leaf = key.partition(".")
    if not leaf:
        return getattr(project, section)
    return getattr(getattr(project, section), leaf)


# ---- the plan ------------------------------------------------------------------------------
@dataclass
class PlannedJob:
    stage: str
    target: str = ""  # the fan-out item: a chip key, a device id, or ""
    deps: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.target}]" if self.target else self.stage

    @property
    def decl(self) -> StageDecl:
        return STAGES[self.stage]

    @property
    def chip(self) -> str:
        """The chip this job is for ("" when none)."""
        if self.decl.fan_out == "target":
            return self.target
        if self.decl.fan_out == "device":
            return device(self.target).chip
        return ""


def job_needs(decl: StageDecl, item: str, kind: str) -> tuple[Need, ...]:
    """What a job needs upstream: its stage's declared needs and, for a stage that fans out
    over devices, what its device runs beside the export (:attr:`Device.runs`: the quantized
    graphs for a kind that says so; a chip's compiled context is declared by the stage)."""
    needs = decl.needs
    if decl.fan_out != "device" or not item:
        return needs
    runs = device(item).runs
    stage = stage_for_role(runs, kind) if runs != "export" else ""
    if stage and all(n.stage != stage for n in needs):
        needs += (Need(stage, per_chip=STAGES[stage].fan_out == "target"),)
    return needs


def _universe(project: Project, chips: list[str]) -> list[PlannedJob]:
    """Every job the project could run, in declaration order, with dependencies."""
    devices = project_devices(project.run.devices, chips)
    jobs: list[PlannedJob] = []
    index: dict[tuple[str, str], int] = {}
    kind = project.model.kind
    for d in DECLARATIONS:
        if d.needs_all or kind not in d.kinds:
            continue
        if d.fan_out == "target":
            items = list(chips)
        elif d.fan_out == "device":
            items = [dev.id for dev in devices if dev.kind in d.device_kinds
                     and (dev.on_npu or not d.npu_only)]
        else:
            items = [""]
        for item in items:
            job = PlannedJob(d.name, item)
            for need in job_needs(d, item, kind):
                if need.per_chip:
                    dep = index.get((need.stage, job.chip)) if job.chip else None
                else:
                    dep = index.get((need.stage, ""))
                if dep is not None:
                    job.deps.append(dep)
            index[(d.name, item)] = len(jobs)
            jobs.append(job)
    return jobs


def plan(project: Project, stages: list[str] | None = None, targets: list[str] | None = None,
         retry: tuple[str, str] | None = None) -> list[PlannedJob]:
    """The jobs for the requested stages plus every job they need upstream.

    With ``retry=(stage, item)``: that job, every job of the project's stages downstream of
    it, and what they need upstream (which the cache serves).
    """
    wanted = list(project.pipeline.stages if stages is None else stages)
    check_stage_names(wanted, project.model.kind)
    chips = list(targets or project.targets)
    for i, t in enumerate(chips):
        if t not in project.targets:
            raise StudioError(
                f"target {t!r} is not one of the project's targets ({', '.join(project.targets)})"
            )
        if t in chips[:i]:  # its jobs would be planned (and computed) twice
            raise StudioError(f"target {t} is given twice: name each target once")
    universe = _universe(project, chips)
    if retry is not None and STAGES[retry[0]].fan_out == "device" and retry[1]:
        retry = (retry[0], device(retry[1]).id)  # "htp-sim/CHIP" of older histories
    if retry is not None:
        roots = {i for i, j in enumerate(universe) if (j.stage, j.target) == retry}
        if not roots and not STAGES[retry[0]].needs_all:
            raise StudioError(f"{retry[0]}[{retry[1]}] is not a job of this project's plan")
        changed = True
        while changed:  # everything downstream of the retried job
            changed = False
            for i, j in enumerate(universe):
                if i not in roots and j.stage in wanted and roots.intersection(j.deps):
                    roots.add(i)
                    changed = True
        report_wanted = any(STAGES[s].needs_all for s in wanted) or STAGES[retry[0]].needs_all
    else:
        roots = {i for i, j in enumerate(universe) if j.stage in wanted}
        report_wanted = any(STAGES[s].needs_all for s in wanted)
    selected = set(roots)
    todo = list(roots)
    while todo:
        for dep in universe[todo.pop()].deps:
            if dep not in selected:
                selected.add(dep)
                todo.append(dep)
    order = sorted(selected)
    remap = {old: new for new, old in enumerate(order)}
    out = [PlannedJob(universe[i].stage, universe[i].target,
                      [remap[d] for d in universe[i].deps]) for i in order]
    if report_wanted:
        for d in DECLARATIONS:
            if d.needs_all:
                out.append(PlannedJob(d.name, "", list(range(len(out)))))
    return out


# ---- what a job reads, and its key --------------------------------------------------------------
def ref_identity(project: Project, ref: str) -> dict[str, Any]:
    """A file reference's identity: its content only (two copies of a checkpoint, wherever
    they are and however the project names them, give one key)."""
    path = project.input_path(ref)
    if path.is_dir():
        files = {str(p.relative_to(path)): _file_digest(p)
                 for p in sorted(path.rglob("*")) if p.is_file()}
        return {"files": files}
    return {"sha256": _file_digest(path)}


# input files hashed by this process, by (path, inode, size, mtime): a sweep plans the same
# checkpoint for every point, and a file rewritten in place gets a new mtime
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def _file_digest(path: Path) -> str:
    st = path.stat()
    sig = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    digest = _DIGESTS.get(sig)
    if digest is None:
        digest = _DIGESTS[sig] = sha256_file(path)
    return digest


def _item_identity(decl: StageDecl, item: str) -> dict[str, Any]:
    from studio.core.catalog import get_chip

    def chip_id(key: str) -> dict[str, Any]:
        c = get_chip(key)
        return {"key": c.key, "htp_arch": c.htp_arch, "soc_model": c.soc_model,
                "vtcm_mb": c.vtcm_mb, "fp16": c.fp16}

    if decl.fan_out == "target":
        return {"chip": chip_id(item)}
    if decl.fan_out == "device":
        dev = device(item)
        return {"device": {"kind": dev.kind, "id": dev.id},
                **({"chip": chip_id(dev.chip)} if dev.chip else {})}
    return {}


@dataclass(frozen=True)
class StageConfig:
    """What one job may read: its declared settings, the files they name, its inputs.

    Built by :func:`stage_config`; its ``hashed`` part is exactly what the key covers.
    """

    stage: str
    item: str
    settings: Mapping[str, Any]
    paths: Mapping[str, str]  # ref setting -> resolved file or folder (not hashed)
    hashed: Mapping[str, Any]  # settings with references replaced by content identities

    def get(self, key: str) -> Any:
        if key not in self.settings:
            raise StudioError(
                f"the {self.stage} stage read {key!r}, which it does not declare: declare it in "
                "studio/core/stagegraph.py so that its artifact key covers it"
            )
        return self.settings[key]

    def path(self, key: str) -> Path:
        self.get(key)
        return Path(self.paths[key])

    @property
    def device(self) -> Device | None:
        return device(self.item) if STAGES[self.stage].fan_out == "device" else None

    @property
    def chip(self) -> str:
        return PlannedJob(self.stage, self.item).chip

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "item": self.item, "settings": dict(self.settings),
                "paths": dict(self.paths), "hashed": dict(self.hashed)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StageConfig:
        return cls(d["stage"], d["item"], MappingProxyType(dict(d["settings"])),
                   MappingProxyType(dict(d["paths"])), MappingProxyType(dict(d["hashed"])))


def _targets_identity(project: Project, targets: list[str]) -> Any:
    """What a stage that reads ``targets`` takes of them (the export, for
    ``export.parts = "auto"``): the chips' NPU context-binary limits, so that a new target
    with the same limits keeps the export's key; nothing when the part count is given."""
    from studio.core.catalog import get_chip
    from studio.core.deviceplan import device_limits_identity

    if project.export.parts != "auto":
        return None
    return {"npu_context_bytes": device_limits_identity(get_chip(t) for t in targets)}


#: settings hashed by what the stages that declare them read of them, not by their value
KEY_IDENTITIES: dict[str, Callable[[Project, Any], Any]] = {"targets": _targets_identity}


def stage_config(project: Project, job: PlannedJob) -> StageConfig:
    decl = STAGES[job.stage]
    settings = {k: project_value(project, k) for k in decl.settings}
    paths: dict[str, str] = {}
    hashed: dict[str, Any] = {}
    for k, v in settings.items():
        if k in REFS and v:  # an empty reference (an optional file) names nothing
            paths[k] = str(project.input_path(v))
            hashed[k] = ref_identity(project, v)
        elif k in KEY_IDENTITIES:
            hashed[k] = KEY_IDENTITIES[k](project, v)
        else:
            hashed[k] = v
    hashed["@item"] = _item_identity(decl, job.target)
    return StageConfig(job.stage, job.target, MappingProxyType(settings),
                       MappingProxyType(paths), MappingProxyType(hashed))


def job_key(config: StageConfig, input_keys: Mapping[str, str],
            versions: Mapping[str, str]) -> str:
    """The artifact key: stage, hashed settings, item, the keys of the inputs, versions."""
    return artifact_key(config.stage, dict(config.hashed), dict(sorted(input_keys.items())),
                        dict(versions))


def plan_keys(project: Project, jobs: list[PlannedJob], versions: Mapping[str, str],
              config: Callable[[Project, PlannedJob], StageConfig] = stage_config
              ) -> list[str]:
    """The artifact key of every job of a plan (in order), computed without running it."""
    keys: list[str] = []
    for job in jobs:
        cfg = config(project, job)
        keys.append(job_key(cfg, {jobs[d].label: keys[d] for d in job.deps}, versions))
    return keys
