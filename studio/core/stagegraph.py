"""The stage graph: every pipeline stage declared once.

A declaration (:class:`StageDecl`, in the stage's own module ``studio/core/stages/<stage>.py``
beside its settings class) says what a stage needs upstream, what it fans out over
(nothing, each target chip, each device) and which project settings it reads (its
settings class's keys). Everything else comes from it:
``plan`` (which jobs, in what order, with which dependencies), the artifact key, preflight's
checks of input files, the frozen :class:`StageConfig` the worker hands the stage (holding
*exactly* what the key hashes), the GUI's stage list and ``--stages``.

A stage cannot read a setting its key does not cover: :meth:`StageConfig.get` refuses an
undeclared key. Adding a stage is one declaration module in ``studio/core/stages/`` (listed
in :data:`DECLARATIONS`) plus one module in ``studio/worker/stages/`` (``run(ctx,
progress)``, named by :attr:`StageDecl.module`).

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
from typing import Any, Protocol

from studio.core.artifacts import artifact_key
from studio.core.catalog import get_chip
from studio.core.deviceplan import device_limits_identity
from studio.core.devices import DEVICE_KINDS, Device, device, project_devices
from studio.core.errors import StudioError
from studio.core.fsutil import sha256_file, stat_key
from studio.core.keys import Key
from studio.core.stagedecl import (  # noqa: F401  (the declarations' names, read from here)
    GRAPH_KINDS,
    MODEL_KIND_HELP,
    MODEL_KINDS,
    Need,
    StageDecl,
)
from studio.core.stages import (
    ablation,
    autoprecision,
    bundle,
    compile,
    draft,
    export,
    graph_compile,
    graph_import,
    graph_profile,
    graph_quantize,
    graph_run,
    graph_validate,
    layerdiff,
    profile,
    quantize,
    report,
    run,
    sensitivity,
    validate,
    waterfall,
)


class Project(Protocol):
    """What the plan reads of a project (:class:`studio.core.project.Project` is one): its
    targets, its sections (typed by :mod:`studio.core.settings`, which builds on this module)
    and its input files. A protocol, so that the plan does not import the project that
    imports it."""

    @property
    def targets(self) -> list[str]: ...
    @property
    def model(self) -> Any: ...
    @property
    def export(self) -> Any: ...
    @property
    def pipeline(self) -> Any: ...
    @property
    def run(self) -> Any: ...
    def input_path(self, ref: str) -> Path: ...


#: every stage, in pipeline order: each declared in its module, beside its settings class
DECLARATIONS: tuple[StageDecl, ...] = (
    export.DECL, quantize.DECL, compile.DECL, validate.DECL, run.DECL, profile.DECL,
    sensitivity.DECL, autoprecision.DECL, layerdiff.DECL, draft.DECL, ablation.DECL,
    waterfall.DECL, bundle.DECL,
    graph_import.DECL, graph_quantize.DECL, graph_compile.DECL, graph_validate.DECL,
    graph_run.DECL, graph_profile.DECL,
    report.DECL,
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



def stage_keys(declarations: tuple[StageDecl, ...]) -> dict[str, Key]:
    """Every key the stages read (dotted key -> its declaration), in declaration order."""
    return {k.key: k for d in declarations for k in d.settings_class.keys()}


#: every key a stage reads, by its dotted name
STAGE_KEYS: dict[str, Key] = stage_keys(DECLARATIONS)
# Settings that name an input file: hashed by content, checked by preflight by kind (each
# declares it: ``setting(..., ref=KIND)``)
REFS: dict[str, str] = {name: k.ref for name, k in STAGE_KEYS.items() if k.ref}
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
    sig = stat_key(path)
    digest = _DIGESTS.get(sig)
    if digest is None:
        digest = _DIGESTS[sig] = sha256_file(path)
    return digest


def _item_identity(decl: StageDecl, item: str) -> dict[str, Any]:
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
                "its settings class (studio/core/stages) so that its artifact key covers it"
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
