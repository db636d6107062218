"""Layer diff: FP32 vs host QDQ vs the HTP, tensor by tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core.devices import HOST_CPU
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.layerdiff import PAIR_TITLES, summarize
from studio.core.progress import Progress
from studio.core.stages.layerdiff import LayerdiffSettings
from studio.engine import deploy, qnn
from studio.engine.chain import part_dirs
from studio.engine.layerdiff import layer_diff, windows_of
from studio.engine.llm_runtime import load_graph_spec, load_tokenizer
from studio.worker.context import StageContext, device_metric, metric, read_text
from studio.worker.stages._llm import htp_options


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """FP32 vs host QDQ vs the HTP, tensor by tensor, on held-out windows of the prefill or
    the decode graph: where the errors jump and where host QDQ and the HTP part (and, with
    ``layerdiff.fp16_step``, the FP32 graph on the HTP in FP16: the backend unquantized)."""
    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = load_graph_spec(export_dir)
    P = int(spec["prompt_length"])
    chip = ctx.chip
    s = LayerdiffSettings.of(ctx.config)
    graph = s.graph
    W = P + 1 if graph == "decode" else P  # a decode window: P - 1 prefilled, a step, a next
    windows = held_out_windows(s, export_dir, P, W, progress)
    dirs = part_dirs(spec, cdir)
    part = int(s.part)
    if len(dirs) > 1 and not 1 <= part <= len(dirs):
        raise StudioError(f"this model is exported in {len(dirs)} parts: set layerdiff.part "
                          f"to the part to compare (1..{len(dirs)}; studio bisect --part)")
    base = probe_free_base(ctx, s, spec, dirs, part, progress)
    data = layer_diff(export_dir, qdir, windows, mode=s.tensors,
                      htp={"chip": chip, "fp16": s.fp16, "extra_options": htp_options(s, chip),
                           "base": base, "fp16_step": s.fp16_step},
                      work_parent=ctx.out, progress=progress, graph=graph, part=part)
    seconds = data.pop("seconds")  # a run fact: kept out of the artifact
    ctx.fact("layerdiff_seconds", seconds["total"], "s",
             f"{data['probes']} tensors x {len(windows)} windows; HTP "
             f"{seconds.get('htp_probed', 0.0):.1f} s with extra outputs, "
             f"{seconds.get('htp', 0.0):.1f} s without")
    summary = summarize(data)
    data["summary"] = {k: v for k, v in summary.items() if k != "line"}
    atomic_write_json(ctx.out / "layerdiff.json", data)
    progress.log(f"layer diff: {summary['line']}")
    changed = [k for k, v in data["extra_outputs"].items() if not v["logits_identical"]]
    if changed:
        progress.log("warning: the extra outputs changed the final logits of "
                     + ", ".join(changed) + ": their figures are not the plain graph's")
    where = (f"{graph} graph"
             + (f" of part {part}/{len(dirs)} (blocks {data['part']['blocks'][0]}–"
                f"{data['part']['blocks'][1] - 1}; the other parts FP32)" if data["part"] else "")
             + f", {len(windows)} held-out window(s) of {W} tokens, {data['probes']} tensors")
    dev = ctx.device
    return {
        "summary": summary["line"], "target": chip.key, "device": dev.name,
        "device_id": dev.id,
        "source": dev.source, "graph": graph, "tensors": data["tensors"], "part": data["part"],
        "windows": len(windows), "window_tokens": P, "probes": data["probes"],
        "pairs": data["pairs"], "pair_titles": {p: PAIR_TITLES[p] for p in data["pairs"]},
        "curves": summary["curves"], "first_jump": summary["first_jump"],
        "parting": summary.get("parting"),
        "worst": summary["worst"], "apart": summary.get("apart", []), "logits": data["logits"],
        "extra_outputs": data["extra_outputs"], "files": ["layerdiff.json"],
        "metrics": layerdiff_metrics(ctx, data, summary, where),
    }


def held_out_windows(s: LayerdiffSettings, export_dir: Path, P: int, W: int,
                     progress: Progress) -> list:
    """The held-out text's windows of the graph (refused where the text gives none, or where
    the decode graph would need a quantized KV cache fed to every runtime)."""
    text = read_text(s.path(s.heldout_text), "held-out text")
    ids = load_tokenizer(export_dir)(text).input_ids
    want, graph = s.windows, s.graph
    if graph == "decode" and s.kv_cache != "float":
        raise StudioError("the decode graph's layer diff feeds one float KV cache to every "
                          "runtime: set quantization.kv_cache = \"float\" for it")
    windows = windows_of(ids, P, graph, want)
    if not windows:
        raise StudioError(f"the held-out text gives {len(ids)} tokens, fewer than one "
                          f"{graph} window of {W}: use a longer text")
    if len(windows) < want:
        progress.log(f"warning: the held-out text gives {len(windows)} window(s) of {P} "
                     f"tokens, not {want}")
    return windows


def probe_free_base(ctx: StageContext, s: LayerdiffSettings, spec: dict, dirs: list[Path],
                    part: int, progress: Progress) -> Path:
    """The compiled graph the diff compares its probed binary with: the compile stage's own,
    or — where the compile holds the deployable (Genie-form) binaries — the studio's graph
    compiled here without extra outputs."""
    graph, k = s.graph, part - 1 if len(dirs) > 1 else 0
    base = dirs[k] / f"{graph}_ctx.onnx"
    cdir = ctx.input("compile", ctx.config.chip)
    if deploy.read(cdir) is None:
        return base
    src = part_dirs(spec, ctx.input("quantize"))[k] / f"{graph}.onnx"
    progress.update(0.0, f"compiling the {graph} graph without extra outputs")
    return Path(qnn.compile_context(src, ctx.out / "base" / f"{graph}_ctx.onnx", ctx.chip,
                                    fp16=s.fp16, extra_options=htp_options(s, ctx.chip))[
        "ctx_path"])


def layerdiff_metrics(ctx: StageContext, data: dict[str, Any], summary: dict[str, Any],
                      where: str) -> list:
    """The diff's figures: host QDQ's on the host CPU, the HTP's on the device."""
    chip, dev, lg = ctx.chip, ctx.device, data["logits"]

    def host(name: str, value: float, unit: str, detail: str) -> dict[str, Any]:
        return metric(name, value, unit, HOST_CPU.source, HOST_CPU.kind, chip.key, detail)

    def boundary_max(pair: str) -> float:
        return max(summary["curves"][pair]["rel_error"])

    return [
        host("layerdiff_kl_host_qdq", lg["qdq"]["kl_divergence"], "nats",
             f"host QDQ, graph optimizations off, {where}"),
        host("layerdiff_kl_host_qdq_ort_default", lg["qdq_default"]["kl_divergence"],
             "nats", f"host QDQ, ONNX Runtime's default optimizations (as validate), {where}"),
        host("layerdiff_top1_host_qdq", lg["qdq"]["top1_agreement"], "fraction", where),
        host("layerdiff_boundary_rel_error_max_host_qdq", boundary_max("qdq_vs_fp32"),
             "", "largest ||QDQ - FP32|| / ||FP32|| between blocks"),
        device_metric(dev, "layerdiff_kl_htp", lg["htp"]["kl_divergence"], "nats", where),
        device_metric(dev, "layerdiff_top1_htp", lg["htp"]["top1_agreement"], "fraction",
                      where),
        device_metric(dev, "layerdiff_boundary_rel_error_max_htp", boundary_max("htp_vs_fp32"),
                      "", "largest ||HTP - FP32|| / ||FP32|| between blocks"),
        device_metric(dev, "layerdiff_boundary_rel_error_max_htp_vs_host_qdq",
                      boundary_max("htp_vs_qdq"), "",
                      "largest ||HTP - QDQ|| / ||QDQ|| between blocks"),
        device_metric(dev, "layerdiff_extra_outputs_logits_change_htp",
                      data["extra_outputs"]["htp"]["logits_max_abs_change"], "",
                      "max |logits with extra outputs - compiled context's logits|"),
    ]
