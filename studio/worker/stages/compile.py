"""The compile stage: placement checked and context binaries compiled for one target chip."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.catalog import Chip
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.hostmem import HEADROOM, available_memory
from studio.core.partcache import files_digest
from studio.core.progress import Progress, SubProgress
from studio.core.stages.compile import CompileSettings
from studio.engine import deploy, partresume, qnn
from studio.engine.chain import part_dirs
from studio.engine.graphio import IO_ENCODINGS_FILE, quantize_io
from studio.engine.llm_runtime import load_graph_spec
from studio.engine.part_runner import iter_parts
from studio.engine.weightshare import EXECUTED
from studio.engine.weightstore import graph_bytes
from studio.worker.context import StageContext, read_text
from studio.worker.parts import Part, Say
from studio.worker.stages._llm import EMBED_LIMIT, GRAPHS, htp_options

#: the compile stage's staging folder of the deployable graphs (kept across a kill)
STAGING = "genie-staging"


@dataclass
class CompileRun:
    """What the compile stage's steps share: the parts' folders, where each one's binaries
    go in the stage's output, and the placement and binaries gathered so far."""

    ctx: StageContext
    qdir: Path
    spec: dict[str, Any]
    folders: list[Path]
    parts: list[Any]
    placement: dict[str, dict] = field(default_factory=dict)
    compiled: dict[str, dict] = field(default_factory=dict)
    reused: list[int] = field(default_factory=list)

    def where(self, k: int) -> str:
        """A part's folder in the stage's output ("" for one graph)."""
        return "" if self.folders[k] == self.qdir else f"{self.folders[k].name}/"

    def finished(self, k: int, part_key: str | None, got: dict[str, dict]) -> None:
        """Part ``k``'s graphs compiled: gathered, marked (a kill keeps them) and cached."""
        at = self.where(k)
        self.placement.update({at + g: r for g, r in got["placement"].items()})
        self.compiled.update({at + g: c for g, c in got["compiled"].items()})
        if at:  # the part's graphs are compiled: a kill keeps them, other settings too
            mine = [at + x for x in GRAPHS]
            row = {"start": self.parts[k].start, "stop": self.parts[k].stop,
                   "placement": {x: self.placement[x] for x in mine},
                   "compiled": {x: self.compiled[x] for x in mine}}
            partresume.mark(self.ctx.out / at, row, {})
            if part_key is not None:
                self.ctx.parts.put(part_key, self.ctx.out / at, row)


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    s = CompileSettings.of(ctx.config)
    qdir = ctx.input("quantize")
    fp16 = s.fp16
    chip = ctx.chip
    extra = htp_options(s, chip)
    spec = load_graph_spec(qdir)
    settings = deployable(s, extra, spec, qdir, progress)
    job = CompileRun(ctx, qdir, spec, part_dirs(spec, qdir), list(iter_parts(spec)))
    done = keep_interrupted(job, progress)
    io = s.graph_io
    staging = ctx.out / STAGING
    sources, progress = stage_sources(job, settings, io, staging, progress)
    todo = [k for k in range(len(job.folders)) if k not in done]
    n_steps = len(todo) * len(GRAPHS)
    fresh, i = take_compiled_before(job, todo, sources, chip, fp16, extra, io, progress,
                                    n_steps)
    jobs = [(k, key, sources[k], ctx.out / job.where(k)) for k, key in fresh]
    compile_fresh(ctx, jobs, chip, fp16, extra, progress, i, n_steps, job.finished)
    if job.reused:
        progress.log(f"{len(job.reused)} of {len(job.parts)} parts (" + ", ".join(
            str(k + 1) for k in job.reused) + "): the same graphs were compiled for this "
            "target before, taken from then")
    shutil.rmtree(ctx.out / "io-staging", ignore_errors=True)
    rec = None
    if settings is not None:  # the marks stay until then: a kill in it keeps the parts
        rec = deploy.finish(ctx.out, staging, sources,
                            [job.where(k) for k in range(len(job.folders))],
                            spec, chip, settings, progress)
        shutil.rmtree(staging, ignore_errors=True)
    partresume.unmark(ctx.out)
    placement, compiled = write_placement(job, chip, fp16, extra,
                                          Steps(progress, n_steps - 1, n_steps))
    sdk = next(iter(compiled.values())).get("sdk_version", "")
    ctx.fact("compile_seconds", sum(c.get("seconds", 0.0) for c in compiled.values()
                                    if not c.get("reused")), "s")
    if rec is not None:
        return deployed_result(rec, placement, sdk, extra, chip, job.reused, len(job.parts))
    return studio_result(placement, sdk, extra, chip, job.reused, len(job.parts), io,
                         bool(spec.get("vision")))


def deployable(s: CompileSettings, extra: dict[str, str], spec: dict[str, Any], qdir: Path,
               progress: Progress) -> Any:
    """The deployable graphs' settings, or None (logged why) where Genie cannot take the
    model and the studio's own prefill and decode graphs are compiled."""
    why_not = deploy.supported(spec, s.fp16, qdir)
    if why_not is not None:
        progress.log(f"the studio's own prefill and decode graphs are compiled ({why_not})")
        return None
    return deploy_settings(s, extra)


def keep_interrupted(job: CompileRun, progress: Progress) -> dict[int, Any]:
    """The parts a killed run compiled, kept in the work folder (a model in parts; the
    deployable graphs it staged too: deploy.stage keeps them if made from the same) and
    gathered into ``job``; a model in one part starts clean."""
    ctx, parts = job.ctx, job.parts
    staged = (STAGING,)
    done = partresume.keep_finished(ctx.out, parts, keep=staged) if len(parts) > 1 else {}
    if len(parts) == 1:
        partresume.clear(ctx.out, keep=staged)
    for kept in done.values():
        job.placement.update(kept["placement"])
        job.compiled.update(kept["compiled"])
    if done:
        progress.log(f"{len(done)} of {len(parts)} parts: compiled by an interrupted run, kept")
    return done


def stage_sources(job: CompileRun, settings: Any, io: str, staging: Path,
                  progress: Progress) -> tuple[list[Path], Progress]:
    """The folders each part's graphs are compiled from, and the progress the compiles
    report to. The binaries that ship (studio.engine.deploy): Genie's AR-N prefill and AR-1
    decode graphs of each part, staged, then compiled like any part's graphs; else (a model
    Genie cannot take) the studio's own graphs, with quantized graph I/O each part's graphs
    with their edge Q/DQ pairs cut in a staging folder (their encodings kept beside)."""
    ctx = job.ctx
    if settings is not None:
        sources = deploy.stage(ctx.input("export"), job.qdir, job.spec, settings, staging,
                               SubProgress(progress, 0.0, 0.3))
        return sources, SubProgress(progress, 0.3, 1.0)  # the compiles: the rest of the bar
    if io == "quantized":
        return quantized_io(job.folders, ctx.out / "io-staging", progress), progress
    return list(job.folders), progress


def take_compiled_before(job: CompileRun, todo: list[int], sources: list[Path], chip: Chip,
                         fp16: bool, extra: dict[str, str], io: str, progress: Progress,
                         n_steps: int) -> tuple[list[tuple[int, str | None]], int]:
    """The parts of ``todo`` to compile, with their part-cache key; a part compiled before
    from the same graphs is taken from the part cache into ``job`` instead. Also the steps
    the taken parts account for."""
    ctx = job.ctx
    i = 0
    fresh: list[tuple[int, str | None]] = []
    for k in todo:
        src, dst = sources[k], ctx.out / job.where(k)
        part_key = None
        if job.where(k) and ctx.parts.root is not None:  # compiled before from these graphs?
            progress.update(i / n_steps, f"looking for {dst.name.replace('_', ' ')} compiled "
                                         "before")
            part_key = ctx.parts.key("compile-part", salt=ctx.part_salt, chip=chip.key,
                                     fp16=fp16, extra=extra, embed_limit=EMBED_LIMIT,
                                     graphs=files_digest(src), io=io)
            row = ctx.parts.get(part_key, dst)
            if row is not None:
                job.placement.update(row["placement"])
                job.compiled.update({g: {**c, "ctx_path": str(dst / Path(c["ctx_path"]).name),
                                         "bin_files": [str(dst / Path(b).name)
                                                       for b in c["bin_files"]], "reused": True}
                                     for g, c in row["compiled"].items()})
                partresume.mark(dst, row, {})
                job.reused.append(k)
                i += len(GRAPHS)
                continue
        fresh.append((k, part_key))
    return fresh, i


def write_placement(job: CompileRun, chip: Chip, fp16: bool, extra: dict[str, str],
                    steps: Steps) -> tuple[dict[str, dict], dict[str, dict]]:
    """The placement and binaries in the parts' order, a vision-language model's encoder
    compiled last (float I/O, its own binary); graph.json and placement.json written."""
    ctx, placement, compiled = job.ctx, job.placement, job.compiled
    order = [job.where(k) + g for k in range(len(job.folders)) for g in GRAPHS
             if job.where(k) + g in placement]
    if job.spec.get("vision"):
        got = compile_part(job.qdir, ctx.out, chip, fp16, extra, steps, "", graphs=("vision",))
        placement.update(got["placement"])
        compiled.update(got["compiled"])
        order.append("vision")
    placement = {k: placement[k] for k in order}
    compiled = {k: compiled[k] for k in order}
    shutil.copy2(job.qdir / "graph.json", ctx.out / "graph.json")
    atomic_write_json(ctx.out / "placement.json", placement)
    return placement, compiled


def studio_result(placement: dict[str, dict], sdk: str, extra: dict[str, str], chip: Chip,
                  reused: list[int], parts: int, io: str, vision: bool) -> dict[str, Any]:
    """The compile stage's result for the studio's own graphs."""
    return {
        "summary": f"context binaries for {chip.name} (QNN SDK {sdk}); all nodes on the NPU"
                   + (f"; part{'s' if len(reused) > 1 else ''} "
                      f"{', '.join(str(k + 1) for k in reused)} of {parts} as compiled "
                      "before from the same graphs" if reused else "")
                   + (f"; HTP options {', '.join(f'{k}={v}' for k, v in extra.items())}"
                      if extra else "")
                   + ("; graph I/O quantized (the KV cache, hand-offs and logits as integers)"
                      if io == "quantized" else "")
                   + ("; the vision encoder's binary beside them" if vision else ""),
        "placement": {g: {k: v for k, v in r.items() if k != "cpu_nodes"} for g, r in placement.items()},
        "sdk_version": sdk, "tool": {"qnn_sdk": sdk}, "htp_options": extra, "graph_io": io,
        "metrics": [],
    }


def compile_fresh(ctx: StageContext, jobs: list[tuple[int, Any, Path, Path]], chip: Chip,
                  fp16: bool, extra: dict[str, str], progress: Progress, start: int,
                  total: int, finished) -> None:
    """Compile the parts of ``jobs`` ((index, part key, source, destination)), calling
    ``finished(index, key, result)`` for each: as the stage's sub-work where its executor says
    (``ctx.run_parts``: Ray tasks, or processes of their own when the parts are large), else
    one after the other here."""
    on_ray = ctx.parts_config.on_ray and len(jobs) > 1
    workers = 0 if on_ray else part_processes([src for _, _, src, _ in jobs],
                                              ctx.parts_config.processes)
    if not on_ray and workers < 2:
        for k, key, src, dst in jobs:
            finished(k, key, compile_part(src, dst, chip, fp16, extra,
                                          Steps(progress, start, total),
                                          "" if dst == ctx.out else dst.name))
            start += len(GRAPHS)
        return
    if on_ray:
        progress.log(f"{len(jobs)} parts compiled as Ray tasks ("
                     + ("on this stage's node: its inputs are a copy here"
                        if ctx.parts_config.ray_where == "node"
                        else "on any node that sees the project's store") + ")")
    else:
        progress.log(f"{len(jobs)} parts compiled {workers} at a time, each in a process of "
                     "its own")
    keys = {k: key for k, key, _, _ in jobs}
    for k, got in ctx.run_parts(compile_parts(jobs, chip, fp16, extra), progress,
                                Say("compiling", f"for {chip.name}", start, total,
                                    len(GRAPHS)), workers):
        finished(k, keys[k], got)


def deploy_settings(s: CompileSettings, extra: dict[str, str]):
    """What the deployable graphs are built from (:class:`studio.engine.deploy.DeploySettings`)."""
    return deploy.DeploySettings(
        checkpoint=s.path(s.source), recipe=s.recipe(),
        calibration_text=read_text(s.path(s.calibration_text), "calibration text"),
        prefill_length=int(s.prefill_length), htp_options=extra,
        graph_io=s.graph_io, weight_sharing=s.weight_sharing)


def deployed_result(rec: dict[str, Any], placement: dict[str, dict], sdk: str,
                    extra: dict[str, str], chip: Chip, reused: list[int], parts: int
                    ) -> dict[str, Any]:
    """The compile stage's result for the deployable binaries."""
    n = len(rec["graphs"])
    shared = rec.get("shared") or []
    return {
        "summary": f"{n} deployable context binaries for {chip.name} (QNN SDK {sdk}): "
                   + (f"the AR-{rec['prefill_ar']} prefill and " if rec["prefill_ar"] else "")
                   + "the AR-1 decode graph in Genie's form"
                   + (f", {rec['parts']} parts each" if rec["parts"] > 1 else "")
                   + f", {rec['binary_bytes'] / 2**20:.1f} MiB; all nodes on the NPU"
                   + (f"; HTP options {', '.join(f'{k}={v}' for k, v in extra.items())}"
                      if extra else "")
                   + ("; graph I/O quantized (the KV cache and hand-offs as integers)"
                      if rec["graph_io"] == "quantized" else "")
                   + (f"; weight-shared for the device: {len(shared)} binar"
                      + ("y" if len(shared) == 1 else "ies")
                      + f", {sum(r['bytes'] for r in shared) / 2**20:.1f} MiB, equal by "
                      "structure to the ones the simulator ran" if shared else "")
                   + (f"; part{'s' if len(reused) > 1 else ''} "
                      f"{', '.join(str(k + 1) for k in reused)} of {parts} as compiled "
                      "before from the same graphs" if reused else ""),
        "placement": {g: {k: v for k, v in r.items() if k != "cpu_nodes"}
                      for g, r in placement.items()},
        "sdk_version": sdk, "tool": {"qnn_sdk": sdk}, "htp_options": extra,
        "graph_io": rec["graph_io"], "deploy": {k: rec[k] for k in (
            "context_size", "prefill_ar", "parts", "binary_bytes", "weights_bytes")},
        "weight_sharing": shared or None,
        # every binary with how it was checked: what the report and the Deploy page show
        "binaries": [{"file": r["file"], "bytes": r["bytes"], "part": r["part"],
                      "kind": r["kind"], "checked": EXECUTED} for r in rec["graphs"]]
        + [{"file": r["file"], "bytes": r["bytes"], "part": r["part"],
            "kind": "prefill + decode, weights shared", "checked": r["executed"]}
           for r in shared],
        "metrics": [],
    }


def quantized_io(folders: list[Path], staging: Path, progress: Progress) -> list[Path]:
    """Each part's graphs (or the one graph set) with quantized I/O under ``staging``, the
    residual stream each part takes encoded as the part before hands it; the folders to
    compile from."""
    shutil.rmtree(staging, ignore_errors=True)
    out, handoff = [], None
    for k, src in enumerate(folders):
        progress.check()
        progress.update(0.0, f"quantized graph I/O: cutting the edge Q/DQ pairs of "
                             f"{'part ' + str(k + 1) if len(folders) > 1 else 'the graphs'}")
        dst = staging / (src.name if len(folders) > 1 else "")
        handoff = quantize_io(src, dst, GRAPHS, handoff)["handoff_out"]
        out.append(dst)
    return out


class Steps:
    """The progress of one part's graphs inside the stage's: step ``n`` of ``total``."""

    def __init__(self, progress: Progress, start: int, total: int) -> None:
        self.progress, self.n, self.total = progress, start, total

    def update(self, half: float, message: str) -> None:
        self.progress.update((self.n + half) / self.total, message)

    def check(self) -> None:
        self.progress.check()


def compile_part(src: Path, dst: Path, chip: Chip, fp16: bool, extra: dict[str, str],
                 steps: Any = None, part_name: str = "",
                 graphs: tuple[str, ...] = GRAPHS) -> dict[str, dict]:
    """Check the placement of a part's graphs (or the one graph set) in ``src`` and compile
    their context binaries into ``dst``: {"placement": {graph: report}, "compiled": {graph:
    info}}. A node the NPU refuses fails it in one line."""
    out: dict[str, dict] = {"placement": {}, "compiled": {}}
    # the deployable graphs of a model without a prefill graph (bundle.prefill_length = 1)
    graphs = tuple(g for g in graphs if (src / f"{g}.onnx").is_file())
    for g in graphs:
        label = f"{g} ({part_name.replace('_', ' ')})" if part_name else g
        dst.mkdir(parents=True, exist_ok=True)
        if steps is not None:
            steps.check()
            steps.update(0.0, f"checking placement of {label} on {chip.name} as its "
                              "context binary compiles")
        # a context binary is embedded in its ONNX model unless the model would come near
        # protobuf's 2 GB limit (real 1-8 B LLMs): then it is written beside it (_qnn.bin)
        size = graph_bytes(src / f"{g}.onnx")
        rep, comp = qnn.compile_placed(src / f"{g}.onnx", dst / f"{g}_ctx.onnx", chip,
                                       fp16=fp16, embed=size < EMBED_LIMIT,
                                       extra_options=extra)
        out["placement"][g] = rep
        if comp is None or not rep["all_on_npu"]:
            names = ", ".join(f"{n['name']} ({n['op_type']})" for n in rep["cpu_nodes"][:5])
            raise StudioError(
                f"{len(rep['cpu_nodes'])} node(s) of the {label} graph cannot run on the NPU "
                f"of {chip.name}: {names}; change their precision or the recipe"
            )
        out["compiled"][g] = comp
        if steps is not None:
            steps.n += 1

    if (src / IO_ENCODINGS_FILE).is_file():  # quantized I/O: the host reads its encodings
        shutil.copy2(src / IO_ENCODINGS_FILE, dst / IO_ENCODINGS_FILE)
    return out


#: parts whose graphs hold at least this many bytes are compiled in processes of their own,
#: two or more at a time: one process compiles one graph at a time (the QNN backend runs
#: two compiles of one process one after the other, measured on two 8 B parts), and a
#: process's start (about 3 s) is small beside such a part's compile (20-90 s)
PARALLEL_ABOVE = 256 << 20

#: one compile process's peak ~ this + PROCESS_PER_BYTE x its largest graph's bytes: the
#: Llama-3.1-8B shape's parts, W8A16 decode graphs of 0.75 and 1.27 GB, peaked at 3.06 and
#: 5.2 GiB compiled alone (benchmarks/README.md)
PROCESS_BASE = 512 << 20
PROCESS_PER_BYTE = 4.2


def part_processes(sources: list[Path], asked: int = 0) -> int:
    """How many parts to compile at once: 1 for fewer than two parts or small ones; else as
    many as the cores, the parts and the free memory allow (each process's peak predicted
    from its largest graph). ``asked`` (``pipeline.part_processes``, when not 0) sets the
    count (tests, a host the prediction does not fit)."""
    if len(sources) < 2:
        return 1
    if asked:
        return max(1, min(len(sources), asked))
    largest = max(graph_bytes(src / f"{g}.onnx") for src in sources for g in GRAPHS)
    if largest < PARALLEL_ABOVE:
        return 1
    per = max(part_memory(src) for src in sources)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    fit = int(max(0, available_memory() - HEADROOM) // per)
    return max(1, min(len(sources), cores or 1, fit))


def _compile_job(src: str, dst: str, chip: Chip, fp16: bool, extra: dict[str, str],
                 part_name: str) -> dict[str, dict]:
    return compile_part(Path(src), Path(dst), chip, fp16, extra, None, part_name)


def compile_parts(jobs: list[tuple[int, Any, Path, Path]], chip: Chip, fp16: bool,
                  extra: dict[str, str]) -> list[Part]:
    """The parts of ``jobs`` ((index, key, source folder, destination)) as the stage's
    sub-work: each named by its folder in the stage's output (its staged graphs' folder
    carries the suffix that orders its graph names), with its predicted peak."""
    return [Part(k, dst.name.replace("_", " "), _compile_job,
                 (str(src), str(dst), chip, fp16, extra, dst.name), part_memory(src))
            for k, _, src, dst in jobs]


def part_memory(src: Path) -> int:
    """A part's compile's predicted peak, bytes (its largest graph's line above)."""
    largest = max(graph_bytes(src / f"{g}.onnx") for g in GRAPHS)
    return int(PROCESS_BASE + PROCESS_PER_BYTE * largest)
