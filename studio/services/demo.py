"""Demo mode's data, headless: the project and its demo file (``core.demo``), the run the
recorded figures come from, each scene's figures, and the live generation.

Every figure carries its source (measured / simulated / estimated / imported) and where it
comes from; a recorded figure also says which run, on which device, when. A demo never
passes a recording off as live, nor a simulation as a device. Nothing here imports Qt; the
scenes read files and hash nothing, but reading graphs takes seconds: build them off the UI
thread.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from studio.core import demo as demofile
from studio.core import devices, figures
from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.gates import evaluate_gates
from studio.core.jobs import Job, JobStore
from studio.core.progress import Progress
from studio.core.project import Project
from studio.core.stagegraph import STAGES, stage_for_role
from studio.core.units import format_bytes, signed
from studio.engine.waterfall import LABELS, with_estimate
from studio.services import history
from studio.services import profile_view as pv
from studio.services.generate import generate
from studio.services.memory import memory_plan

#: what the live generation on the HTP simulator is, said on stage
SIMULATOR_NOTE = "HTP simulator on this PC — not phone speed"


def when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "date unknown"


def device_name(device_id: str, target: str = "") -> str:
    """A device id as people say it ("host CPU", "HTP simulator (Snapdragon 8 Gen 3)")."""
    try:
        if not device_id:  # a per-target job's: the target's simulator ran it
            return devices.htp_simulator(target).name
        return devices.resolve(device_id, [target] if target else []).name or device_id
    except StudioError:
        return device_id


def recorded_label(job: Job, where: str) -> str:
    """``recorded: run N, DEVICE, DATE`` (a cached job's result was computed by an earlier
    run and reused by this one)."""
    text = f"recorded: run {job.run_id}, {where}, {when(job.finished or job.created)}"
    return text + " (result reused from an earlier run)" if job.cached else text


@dataclass
class Figure:
    """One number on stage, with where it comes from."""

    name: str  # what it is ("decode speed")
    text: str  # the value as shown ("1169 tok/s")
    source: str  # measured | simulated | estimated | imported
    where: str  # the device or chip ("host CPU", "Snapdragon 8 Gen 3")
    recorded: str = ""  # "recorded: run 1, host CPU, 2026-12-03 03:17"; "" for a live figure
    value: float | None = None

    @property
    def badge(self) -> str:
        return f"{self.source} · {self.where}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "source": self.source,
                "where": self.where, "recorded": self.recorded, "value": self.value}


@dataclass
class Scene:
    kind: str  # a key of core.demo.SCENES
    title: str
    figures: list[Figure] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # the scene's table or bars
    recorded: str = ""  # the scene's recording line ("" when nothing is recorded)
    note: str = ""  # a line that qualifies the figures
    empty: str = ""  # what to run when there is nothing to show ("" otherwise)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "title": self.title,
                "figures": [f.to_dict() for f in self.figures], "rows": self.rows,
                "recorded": self.recorded, "note": self.note, "empty": self.empty,
                "extra": self.extra}


@dataclass
class Demo:
    spec: demofile.DemoSpec
    project: Project
    device: str  # the live generation's resolved device id
    target: str  # the chip the waterfall estimate, accuracy and bundle scenes show
    run: history.RunInfo | None  # the run the recorded figures come from
    jobs: JobStore | None
    demo_file: Path | None = None

    @property
    def title(self) -> str:
        return self.spec.title or f"{self.project.name} on {get_chip(self.target).name}"

    @property
    def prompts(self) -> list[str]:
        return list(self.spec.prompts) or [str(self.project.run["prompt"])]

    def close(self) -> None:
        if self.jobs is not None:
            self.jobs.close()
            self.jobs = None

    # ---- the live generation's device -------------------------------------------------------
    @property
    def live_device(self) -> devices.Device:
        return devices.device(self.device, list(self.project.targets))

    @property
    def live_source(self) -> str:
        return self.live_device.source

    @property
    def live_note(self) -> str:
        dev = self.live_device
        if dev.source == "simulated":
            return SIMULATOR_NOTE
        if dev == devices.HOST_CPU:
            return "the FP32 export on this PC's CPU"
        return dev.timing_note


def resolve(path: Path | str) -> tuple[Path, Path | None]:
    """(project file, demo file or None) for ``studio demo FILE``: a project file (its
    ``<stem>.demo.toml`` beside it when there is one) or a demo file (its project)."""
    path = Path(path).expanduser()
    if path.suffix == ".qstudio":
        if not path.is_file():
            raise StudioError(f"no project file {path}: check the path")
        d = demofile.demo_path_for(path)
        return path, (d if d.is_file() else None)
    if path.suffix == ".toml":
        spec = demofile.load(path)
        project = demofile.project_path_for(path, spec)
        if not project.is_file():
            raise StudioError(f"demo file {path.name}: its project {project} does not exist: "
                              "set project = \"NAME.qstudio\" in it")
        return project, path
    raise StudioError(f"{path} is neither a project (.qstudio) nor a demo file "
                      f"(NAME{demofile.SUFFIX}): give one of those")


def open_demo(path: Path | str, project: Project | None = None) -> Demo:
    """The demo of ``path`` (a project or a demo file), checked: the demo file, the device,
    the target and the run. ``project``: the project as the window holds it (unsaved edits
    included); None reads the file. Fast (no graphs read): call it before a window opens."""
    project_path, demo_path = resolve(path)
    spec = demofile.load(demo_path) if demo_path is not None else demofile.default_spec()
    if project is None:
        project = projectfile.load(project_path)
    where = f"demo file {demo_path.name}" if demo_path else "the demo"
    targets = list(project.targets)
    try:
        device = demofile.resolve_device(spec.device, targets)
    except StudioError as exc:
        raise StudioError(f"{where}: {exc.message}") from None
    target = spec.target or (targets[0] if targets else "")
    if not target:
        raise StudioError(f"{project.name} has no target chip: add one to targets")
    if spec.target and spec.target not in targets:
        raise StudioError(f"{where}: target {spec.target} is not a target of {project.name} "
                          f"({', '.join(targets)}): use one of those")
    db = project.folder / "runs.sqlite"
    jobs = JobStore(db) if db.is_file() else None
    try:
        run = pick_run(project, jobs, spec.run, where)
    except StudioError:
        if jobs is not None:
            jobs.close()
        raise
    return Demo(spec, project, device, target, run, jobs, demo_path)


def pick_run(project: Project, jobs: JobStore | None, run: int | None,
             where: str = "the demo") -> history.RunInfo | None:
    """The run the recorded figures come from: ``run``, or the newest with results (None:
    the project has none yet; the scenes say what to run)."""
    if run is None:
        return history.newest_run_with_results(project, jobs) if jobs is not None else None
    info = history.run_info(project, jobs, run) if jobs is not None else None
    if info is None:
        have = [r.id for r in history.runs(project, jobs)] if jobs is not None else []
        listed = ", ".join(map(str, sorted(have)[-8:])) or "none yet"
        raise StudioError(f"{where}: run {run} is not in {project.name}'s history (runs: "
                          f"{listed}): set run = \"latest\" or one of those")
    return info


# ---- the recorded jobs -------------------------------------------------------------------
def role_stage(demo: Demo, role: str) -> str:
    """The stage that plays ``role`` in the demo's project (``core.stagegraph`` roles)."""
    return stage_for_role(role, demo.project.model["kind"]) or role


def stage_jobs(demo: Demo, role: str) -> list[Job]:
    """The succeeded jobs of the stage playing ``role`` in the demo's run; for a device or
    target that run did not cover (a partial run), the newest of the project's own runs
    (their recording line names the run they come from)."""
    if demo.jobs is None:
        return []
    stage = role_stage(demo, role)
    mine: list[Job] = []
    if demo.run is not None:
        mine = [j for j in demo.jobs.jobs(run_id=demo.run.id)
                if j.stage == stage and j.state == "succeeded"]
    have = {j.target for j in mine}
    return mine + [j for j in history.latest_jobs(demo.jobs, stage) if j.target not in have]


def stage_job(demo: Demo, role: str, target: str | None = None) -> Job | None:
    """The first of ``stage_jobs`` on ``target`` (a chip key); a stage that also runs on the
    host CPU (whose job names no chip) falls back to its first job."""
    js = stage_jobs(demo, role)
    if target is not None:
        on_host = "host-cpu" in STAGES[role_stage(demo, role)].device_kinds
        js = [j for j in js if target in j.target] or (js if on_host else [])
    return js[0] if js else None


def _store(demo: Demo) -> ArtifactStore:
    return ArtifactStore(demo.project.folder / "artifacts")


def _folder(demo: Demo, job: Job | None) -> Path | None:
    if job is None or not job.artifact_key:
        return None
    art = _store(demo).get(job.artifact_key)
    return art.path if art is not None else None


def _run_hint(demo: Demo, role: str) -> str:
    return f"run studio --batch {demo.project.path.name if demo.project.path else 'FILE'} " \
           f"--stages {role_stage(demo, role)}"


# ---- the scenes --------------------------------------------------------------------------
def build_scene(demo: Demo, kind: str) -> Scene:
    """One scene's data (StudioError inside a scene becomes its empty state)."""
    builders: dict[str, Callable[[Demo], Scene]] = {
        "generate": generate_scene, "waterfall": waterfall_scene,
        "accuracy": accuracy_scene, "profile": profile_scene, "memory": memory_scene,
        "bundle": bundle_scene,
    }
    if kind not in builders:
        raise StudioError(f"unknown scene {kind!r}; the scenes are "
                          f"{', '.join(demofile.SCENES)}")
    try:
        return builders[kind](demo)
    except StudioError as exc:
        return Scene(kind, demofile.SCENES[kind], empty=exc.message)


def build_scenes(demo: Demo) -> list[Scene]:
    return [build_scene(demo, k) for k in demo.spec.scenes]


def generate_scene(demo: Demo) -> Scene:
    """The live generation's setup (device, its source, the prompts) and the speeds the
    demo's run recorded on each device, as recordings."""
    dev = demo.live_device
    scene = Scene("generate", demofile.SCENES["generate"], note=demo.live_note,
                  extra={"device": dev.id, "device_name": dev.name, "source": dev.source,
                         "prompts": demo.prompts, "max_new_tokens": demo.spec.max_new_tokens})
    for job in stage_jobs(demo, "run"):
        res = job.result or {}
        dev_id = str(res.get("device_id") or job.target or "cpu")
        where = device_name(dev_id)
        ms = {m.name: m for m in demo.jobs.metrics(job_id=job.id)} if demo.jobs else {}
        rec = recorded_label(job, where)
        tps, pre = ms.get("decode_tokens_per_s"), ms.get("prefill_ms")
        if tps is not None:
            scene.figures.append(Figure(figures.title(tps.name),
                                        figures.fmt(tps.name, tps.value), tps.source,
                                        where, rec, tps.value))
        if pre is not None:
            scene.figures.append(Figure(figures.title(pre.name),
                                        figures.fmt(pre.name, pre.value), pre.source, where,
                                        rec, pre.value))
    return scene


def waterfall_scene(demo: Demo) -> Scene:
    """The waterfall's steps: decode speed measured on the host CPU and estimated for the
    target chip by the performance model, and the perplexity each step costs."""
    job = stage_job(demo, "waterfall")
    folder = _folder(demo, job)
    if job is None or folder is None or not (folder / "waterfall.json").is_file():
        raise StudioError("no optimization waterfall recorded yet: "
                          + _run_hint(demo, "waterfall"))
    data = with_estimate(json.loads((folder / "waterfall.json").read_text()), demo.target)
    rec = recorded_label(job, "host CPU")
    note = data.get("estimate_note", "")
    note += ("; the host CPU computes the quantized steps' QDQ graphs in float, so they are "
             "slower there: their speed-up belongs to the NPU")
    scene = Scene("waterfall", demofile.SCENES["waterfall"], recorded=rec, note=note,
                  extra={"chip": data["chip"], "chip_name": data["chip_name"]})
    for r in data["steps"]:
        est = r.get("estimated_tokens_per_s")
        scene.rows.append({
            "step": r["step"], "label": LABELS.get(r["step"], r["step"]),
            "measured": Figure("host CPU", f"{r['tokens_per_s']:,.1f} tok/s",
                               str(r.get("source", "measured")), "host CPU", rec,
                               float(r["tokens_per_s"])),
            "estimated": Figure(data["chip_name"], f"{est:,.1f} tok/s", "estimated",
                                data["chip_name"], "", float(est)) if est else None,
            "perplexity": Figure("perplexity", f"{r['ppl']:.2f} ({signed(r['ppl_change'], '.1%', '−')})",
                                 str(r.get("source", "measured")), "host CPU", rec,
                                 float(r["ppl"])),
        })
    first, last = scene.rows[0], scene.rows[-1]
    if first["estimated"] and last["estimated"]:
        scene.figures.append(Figure(
            f"{first['label']} → {last['label']} on {data['chip_name']}",
            f"{first['estimated'].value:,.0f} → {last['estimated'].value:,.0f} tok/s",
            "estimated", data["chip_name"], "", last["estimated"].value))
    return scene


def accuracy_scene(demo: Demo) -> Scene:
    """FP32 against the deployed model: perplexity, logits cosine, top-1 and greedy
    agreement, each with its source, and the project's gates."""
    job = stage_job(demo, "validate", demo.target)
    if job is None or not job.result:
        raise StudioError("no validation recorded yet: " + _run_hint(demo, "validate"))
    r = job.result
    ms = {m.name: m for m in demo.jobs.metrics(job_id=job.id)} if demo.jobs else {}
    scene = Scene("accuracy", demofile.SCENES["accuracy"])
    deployed_where = device_name(str(r.get("device_id") or "htp-sim"), job.target)

    def fig(name: str, metric: str, fmt: Callable[[float], str], where: str | None = None
            ) -> Figure | None:
        m = ms.get(metric)
        if m is None:
            return None
        w = where or device_name(m.device, m.target)
        return Figure(name, fmt(m.value), m.source, w, recorded_label(job, w), m.value)

    # the catalogue's titles and way of writing each figure, as on every page
    pairs = [("perplexity_fp32", "host CPU"), ("perplexity_quantized", deployed_where),
             ("logits_cosine_mean", deployed_where), ("top1_agreement", deployed_where),
             ("greedy_agreement", deployed_where)]
    for metric, where in pairs:
        f = fig(figures.title(metric), metric, partial(figures.fmt, metric), where)
        if f is not None:
            scene.figures.append(f)
    fp, q = ms.get("perplexity_fp32"), ms.get("perplexity_quantized")
    if fp is not None and q is not None and fp.value:
        scene.extra["perplexity_change"] = q.value / fp.value - 1.0
    scene.recorded = recorded_label(job, deployed_where)
    scene.rows = [{**g, "label": g["gate"].replace("_", " ")}
                  for g in evaluate_gates(dict(demo.project.gates), r)]
    scene.extra["target"] = job.target
    scene.note = (f"deployed = {demo.project.quantization['scheme']} on the {deployed_where}: "
                  "its numerics are the HTP's kernels" if "simulator" in deployed_where
                  else f"deployed = {demo.project.quantization['scheme']} on {deployed_where}")
    return scene


def profile_scene(demo: Demo, top: int = 7) -> Scene:
    """The op breakdown of one decode step: the share of each op type (largest first) and of
    each block of the seed's table."""
    job = stage_job(demo, "profile", demo.target)
    if job is None:
        raise StudioError("no profile recorded yet: " + _run_hint(demo, "profile"))
    data = pv.load(SimpleNamespace(store=_store(demo), jobs=demo.jobs), job)
    where = device_name(job.target)
    rec = recorded_label(job, where)
    rows = pv.breakdown(data, "op_type")
    shown = rows[:top]
    rest = rows[top:]
    out = [{"name": r.name, "share": r.share, "count": r.count} for r in shown]
    if rest:
        out.append({"name": f"{len(rest)} other op types", "share": sum(r.share for r in rest),
                    "count": sum(r.count for r in rest)})
    blocks = [{"name": r.name, "share": r.share, "count": r.count}
              for r in pv.breakdown(data, "block") if r.share > 0]
    scene = Scene("profile", demofile.SCENES["profile"], rows=out, recorded=rec,
                  extra={"blocks": blocks, "unit": data.unit, "source": data.source,
                         "ops": len(data.profile.ops)})
    scene.figures.append(Figure(figures.title("profiled_ops"),
                                figures.fmt("profiled_ops", len(data.profile.ops)),
                                data.source, where, rec, float(len(data.profile.ops))))
    scene.note = ("shares of the simulator's cycle counts: where the step's work goes, not the "
                  "phone's time" if data.source == "simulated" else
                  f"shares of the profiled {data.unit}")
    return scene


def memory_scene(demo: Demo) -> Scene:
    """What the deployed decode graph needs in memory: weights (deployed vs FP32), the KV
    cache, activations with naive allocation and with buffer reuse (from the graph's shapes:
    estimated)."""
    job = stage_job(demo, "quantize")
    folder = _folder(demo, job)
    if job is None or folder is None or not (folder / "decode.onnx").is_file():
        raise StudioError("no quantized graphs recorded yet: " + _run_hint(demo, "quantize"))
    mem = memory_plan(folder / "decode.onnx")
    p = mem["plan"]
    src = str(mem.get("source", "estimated"))
    scheme = demo.project.quantization["scheme"]
    where = f"the {scheme} decode graph"
    rec = (f"from run {job.run_id}'s {scheme} graphs, {when(job.finished or job.created)}"
           + (" (reused from an earlier run)" if job.cached else ""))
    # named as the Profiler's Memory tab names them: the graph's stored bytes, not the
    # Overview's checkpoint formula (each parameter once)
    bars = [("graph weights, FP32", mem["weight_bytes_fp32"]),
            (f"graph weights, {scheme}", mem["weight_bytes"]),
            ("KV cache, graph I/O", mem["kv_cache_bytes"]),
            ("activations, naive", p["naive_bytes"]),
            ("activations, buffer reuse", p["arena_bytes"])]
    scene = Scene("memory", demofile.SCENES["memory"], recorded=rec,
                  rows=[{"name": n, "bytes": int(b), "text": format_bytes(int(b)),
                         "source": src} for n, b in bars],
                  note="computed from the graph's shapes and dtypes (no device involved)")
    w32, wq = mem["weight_bytes_fp32"], mem["weight_bytes"]
    if w32:
        scene.figures.append(Figure("graph weights vs FP32", f"{wq / w32:.0%}", src, where, rec,
                                    wq / w32))
    scene.figures.append(Figure("activations saved by buffer reuse",
                                f"{p['reuse_saving']:.0%}", src, where, rec,
                                float(p["reuse_saving"])))
    return scene


def bundle_scene(demo: Demo) -> Scene:
    """The deployment bundle (when one is built) and the target chips: what each is, whether
    the run compiled for it and with which SDK."""
    scene = Scene("bundle", demofile.SCENES["bundle"])
    compiled = {j.target: j for j in stage_jobs(demo, "compile")}
    for key in demo.project.targets:
        chip = get_chip(key)
        cj = compiled.get(chip.key)
        res = (cj.result or {}) if cj else {}
        placement = res.get("placement") or {}
        on_npu = all(g.get("all_on_npu") for g in placement.values()) if placement else None
        scene.rows.append({
            "chip": chip.key, "name": chip.name, "label": chip.label,
            "htp": f"HTP v{chip.htp_arch}", "vtcm": f"{format_bytes(chip.vtcm_mb * 2**20)} VTCM",
            "ddr": (f"{chip.ddr_type} {chip.ddr_gbps:g} GB/s" if chip.ddr_gbps else ""),
            "compiled": cj is not None, "sdk": res.get("sdk_version", ""),
            "on_npu": on_npu,
            "recorded": recorded_label(cj, "host CPU (QNN compiler)") if cj else "",
            "catalog": "chip catalog", "catalog_source": chip.source,
        })
    job = stage_job(demo, "bundle", demo.target)
    folder = _folder(demo, job)
    if job is not None and job.result:
        r = job.result
        files = []
        bdir = folder / "bundle" if folder is not None else None
        if bdir is not None and bdir.is_dir():
            files = [{"name": str(f.relative_to(bdir)), "bytes": f.stat().st_size}
                     for f in sorted(bdir.rglob("*")) if f.is_file()]
        where = device_name(f"htp-sim:{job.target}")
        scene.recorded = recorded_label(job, where)
        scene.extra["bundle"] = {"target": job.target, "files": files,
                                 "total_bytes": sum(f["bytes"] for f in files),
                                 "summary": str(r.get("summary", "")),
                                 "stored": bdir is not None}
        names = {k: (figures.title(k), partial(figures.fmt, k))
                 for k in ("genie_tokens_per_s", "genie_identical_prompts")}
        for m in (demo.jobs.metrics(job_id=job.id) if demo.jobs else []):
            if m.name in names:
                label, fmt = names[m.name]
                w = device_name(m.device, m.target)
                scene.figures.append(Figure(label, fmt(m.value), m.source, w,
                                            recorded_label(job, w), m.value))
    else:
        scene.note = ("no deployment bundle built yet: build it on the Deploy page or with "
                      f"studio bundle {demo.project.path.name if demo.project.path else 'FILE'}")
    return scene


# ---- the live generation -----------------------------------------------------------------
def live_generate(demo: Demo, prompt: str, on_text: Callable[[str], None] | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
    """Generate after ``prompt`` on the demo's device (greedy); the result's figures carry
    the device's source label (``generate.generate``)."""
    return generate(demo.project, prompt, demo.device, demo.spec.max_new_tokens,
                    on_text=on_text, progress=progress)
