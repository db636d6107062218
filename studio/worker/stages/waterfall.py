"""The optimization waterfall measured on the host CPU."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.devices import HOST_CPU
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.core.recipe import weight_bits
from studio.core.stages.waterfall import WaterfallSettings
from studio.engine import waterfall as wf
from studio.engine.graphio import quantize_io
from studio.engine.kvquant import calibrate_kv_scales, write_int8_kv_graphs
from studio.engine.llm_export import export_llm
from studio.engine.llm_runtime import cpu_generator, load_graph_spec, load_tokenizer
from studio.engine.quantize import quantize_llm
from studio.worker.context import StageContext, host_metric, read_text
from studio.worker.stages._llm import GRAPHS


@dataclass
class WaterfallRun:
    """What the waterfall's steps share: the inputs and settings read once, and the rows
    measured so far."""

    ctx: StageContext
    progress: Progress
    settings: WaterfallSettings
    export_dir: Path
    spec: dict[str, Any]
    tok: Any
    calib: str
    samples: Any
    score_ids: list[int]
    prompt: list[int]
    new_tokens: int
    window: int
    k: int
    low_gran: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    fp32_tokens: list[int] | None = None

    def add(self, step: str, gen, window: int | None, speed: dict[str, Any], note: str = "",
            ppl: float | None = None) -> None:
        """A step's row: its decode rate, its perplexity and its change from the first's."""
        rows = self.rows
        if ppl is None:
            ppl = wf.perplexity(gen, self.score_ids, window)
        base = rows[0]["ppl"] if rows else ppl
        if self.fp32_tokens is None:
            self.fp32_tokens = speed["tokens"]
        rows.append({"step": step, "label": wf.LABELS[step], "tokens_per_s": speed["tokens_per_s"],
                     "source": HOST_CPU.source, "device": HOST_CPU.kind, "ppl": ppl,
                     "ppl_change": ppl / base - 1.0,
                     "same_greedy_tokens_as_fp32": wf.same_prefix(self.fp32_tokens or [],
                                                                  speed["tokens"]),
                     "greedy_tokens": len(speed["tokens"]),
                     "note": note, **({"speculative": speed["speculative"]}
                                      if "speculative" in speed else {})})
        self.progress.log(f"waterfall {wf.LABELS[step]}: {speed['tokens_per_s']:.1f} tok/s "
                          f"(host CPU), ppl {ppl:.2f}")

    def rate(self, gen, window: int | None = None) -> dict[str, Any]:
        """The decode rate of ``gen`` on the prompt (attention to ``window`` tokens)."""
        if window is None:
            return wf.decode_rate(gen, self.prompt, self.new_tokens)
        return wf.decode_rate(gen, self.prompt, self.new_tokens, window=window)

    def quantized(self, src: Path, name: str, scheme: str, gran: str, a: float,
                  b: float) -> Path:
        """``src``'s graphs quantized to ``scheme`` into ``name`` (progress ``a``..``b``)."""
        progress = self.progress
        progress.update(a, f"quantizing {name} ({scheme}{', with a verify graph' if weight_bits(scheme) == 4 else ''})")
        out = self.ctx.out / name
        quantize_llm(src, out, {"scheme": scheme, "weight_granularity": gran,
                                "samples": self.samples}, self.calib,
                     self.export_dir / "tokenizer", SubProgress(progress, a, b),
                     with_verify=weight_bits(scheme) == 4)
        return out

    def kv8(self, src: Path, fp_gen, name: str) -> Path:
        """``src``'s graphs with an INT8 KV cache (scales calibrated on ``fp_gen``)."""
        out = self.ctx.out / name
        scales = calibrate_kv_scales(fp_gen, self.tok(self.calib).input_ids)
        write_int8_kv_graphs(src, out, scales, per_head=False)
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".onnx" and not (out / f.name).exists():
                shutil.copy2(f, out / f.name)
        return out


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The optimization waterfall measured on the host CPU: each step's graphs built here
    (W8A16, W4A16 with a verify graph, INT8 KV, the pruned checkpoint's), its decode rate and
    its held-out perplexity; and what the performance model needs to estimate the steps for
    a chip (the measured tokens per speculative pass)."""
    export_dir, abl_dir = ctx.input("export"), ctx.input("ablation")
    w = prepare(ctx, export_dir, progress)
    made, sp = measure_steps(w)
    ablation = json.loads((abl_dir / "ablation.json").read_text())
    pruned, psp = measure_pruned(w, abl_dir, ablation)
    for d in made + pruned:  # keep the figures, not the graphs (large)
        shutil.rmtree(d, ignore_errors=True)
    s = w.settings
    cfg = json.loads((s.path(s.source) / "config.json").read_text())
    rows, W = w.rows, w.window
    result = {
        "steps": rows, "context": int(w.spec["context_length"]), "window": W, "k": w.k,
        "prompt_tokens": len(w.prompt),
        "new_tokens": w.new_tokens, "scheme": "W4A16", "weight_granularity": w.low_gran,
        "dropped_blocks": ablation["dropped"], "config": cfg,
        "tokens_per_pass": sp["speculative"]["tokens_per_target_pass"],
        "pruned_tokens_per_pass": psp["speculative"]["tokens_per_target_pass"],
    }
    atomic_write_json(ctx.out / "waterfall.json", result)
    first, last = rows[0], rows[-1]
    return {
        "summary": (f"{len(rows)} steps on the host CPU: {first['tokens_per_s']:.0f} -> "
                    f"{last['tokens_per_s']:.0f} tok/s, ppl {first['ppl']:.2f} -> "
                    f"{last['ppl']:.2f} (measured); speculative {sp['speculative']['tokens_per_target_pass']:.2f} "
                    "tokens per pass"),
        "waterfall": result,
        "metrics": [host_metric("waterfall_final_tokens_per_s", last["tokens_per_s"], "tok/s")],
    }


def prepare(ctx: StageContext, export_dir: Path, progress: Progress) -> WaterfallRun:
    """The inputs and settings the steps share: the window checked against the context,
    the held-out text cut into the tokens scored and the prompt."""
    spec = load_graph_spec(export_dir)
    tok = load_tokenizer(export_dir)
    C = int(spec["context_length"])
    s = WaterfallSettings.of(ctx.config)
    W = int(s.window or C // 2)
    if not 1 <= W <= C:
        raise StudioError(f"waterfall.window is {W}: give 1..{C} (the context), or 0 for C/2")
    calib = read_text(s.path(s.calibration_text), "calibration text")
    held = tok(read_text(s.path(s.heldout_text), "held-out text")).input_ids
    prompt = held[-(C // 2):] if len(held) > C // 2 else held[: max(1, len(held) // 2)]
    return WaterfallRun(
        ctx=ctx, progress=progress, settings=s, export_dir=export_dir, spec=spec, tok=tok, calib=calib,
        samples=s.calibration_samples, score_ids=held[: s.heldout_tokens], prompt=prompt,
        new_tokens=max(2, min(int(s.new_tokens), C - len(prompt) - 1)), window=W, k=int(s.k),
        low_gran=s.weight_granularity if weight_bits(s.scheme) == 4 else "per_channel")


def measure_steps(w: WaterfallRun) -> tuple[list[Path], dict[str, Any]]:
    """The steps on the exported model: FP32, W8A16, quantized I/O, W4A16, INT8 KV, the
    window and speculative decoding; the folders of the graphs built and the speculative
    rate."""
    progress, spec, export_dir, W = w.progress, w.spec, w.export_dir, w.window
    C = int(spec["context_length"])
    progress.update(0.01, "FP32 on the host CPU")
    fp = cpu_generator(export_dir, spec)
    w.add("fp32", fp, None, w.rate(fp), "the chip's estimate is FP16 (the HTP runs no FP32)")
    d8 = w.quantized(export_dir, "w8a16", "W8A16", "per_channel", 0.05, 0.2)
    g8 = cpu_generator(d8, spec)
    w.add("w8a16", g8, None, w.rate(g8),
          "QDQ graphs run in float on the host CPU: slower here, faster on the NPU")
    progress.update(0.2, "quantized graph I/O (the W8A16 graphs' edge Q/DQ pairs cut)")
    dio = w.ctx.out / "w8a16_io"
    quantize_io(d8, dio, GRAPHS)
    gio = cpu_generator(dio, spec)
    w.add("quantized_io", gio, None, w.rate(gio),
          "the KV cache, mask and logits as 16-bit integers (htp.graph_io = quantized): the NPU "
          "converts nothing at the edge; here the host does. The steps below keep it on the chip")
    d4 = w.quantized(export_dir, "w4a16", "W4A16", w.low_gran, 0.22, 0.42)
    g4 = cpu_generator(d4, spec)
    w.add("w4a16", g4, None, w.rate(g4), f"{w.low_gran} 4-bit weights")
    progress.update(0.44, "INT8 KV cache")
    dk = w.kv8(d4, fp, "w4a16_kv8")
    gk = cpu_generator(dk, spec)
    w.add("int8_kv", gk, None, w.rate(gk),
          "uint8 cache I/O, one scale per layer and tensor (as the HTP takes it)")
    progress.update(0.5, f"window of {W} tokens")
    w.add("window", gk, W, w.rate(gk, W),
          f"attention to the last {W} tokens (ring buffer); the host's static graphs still "
          f"hold {C} slots, an export with {W} slots reads {W / C:.0%} of the cache")
    progress.update(0.55, "speculative decoding (prompt lookup)")
    sp = wf.speculative_rate(gk, w.prompt, w.new_tokens, w.k)
    w.add("speculative", gk, None, sp, f"prompt lookup, k <= {w.k}; lossless: the same model "
          "verifies every token", ppl=w.rows[-1]["ppl"])
    return [d8, dio, d4, dk], sp


def measure_pruned(w: WaterfallRun, abl_dir: Path, ablation: dict[str, Any]
                   ) -> tuple[list[Path], dict[str, Any]]:
    """The last step: the pruned checkpoint exported, W4A16 with an INT8 KV cache, the
    window and speculative decoding; the folders of its graphs and its speculative rate."""
    progress = w.progress
    spec = w.spec
    progress.update(0.6, f"exporting the pruned checkpoint (without {ablation['dropped']})")
    dp_fp = w.ctx.out / "pruned_fp32"
    export_llm(abl_dir / "pruned", dp_fp, int(spec["prompt_length"]),
               int(spec["context_length"]), progress=SubProgress(progress, 0.6, 0.7))
    pspec = load_graph_spec(dp_fp)
    dp4 = w.quantized(dp_fp, "pruned_w4a16", "W4A16", w.low_gran, 0.72, 0.9)
    gp_fp = cpu_generator(dp_fp, pspec)
    dpk = w.kv8(dp4, gp_fp, "pruned_w4a16_kv8")
    gp = cpu_generator(dpk, pspec)
    progress.update(0.92, "the pruned model: speed and perplexity")
    psp = wf.speculative_rate(gp, w.prompt, w.new_tokens, w.k)
    w.add("pruned", gp, w.window, psp,
          f"without block(s) {ablation['dropped']}, with everything above")
    return [dp_fp, dp4, dpk], psp
