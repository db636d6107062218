"""The optimization waterfall measured on the host CPU."""

from __future__ import annotations

import json
import shutil
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


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The optimization waterfall measured on the host CPU: each step's graphs built here
    (W8A16, W4A16 with a verify graph, INT8 KV, the pruned checkpoint's), its decode rate and
    its held-out perplexity; and what the performance model needs to estimate the steps for
    a chip (the measured tokens per speculative pass)."""
    export_dir, abl_dir = ctx.input("export"), ctx.input("ablation")
    spec = load_graph_spec(export_dir)
    tok = load_tokenizer(export_dir)
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    s = WaterfallSettings.of(ctx.config)
    W = int(s.window or C // 2)
    if not 1 <= W <= C:
        raise StudioError(f"waterfall.window is {W}: give 1..{C} (the context), or 0 for C/2")
    k = int(s.k)
    calib = read_text(s.path(s.calibration_text), "calibration text")
    held = tok(read_text(s.path(s.heldout_text), "held-out text")).input_ids
    score_ids = held[: s.heldout_tokens]
    prompt = held[-(C // 2):] if len(held) > C // 2 else held[: max(1, len(held) // 2)]
    new_tokens = max(2, min(int(s.new_tokens), C - len(prompt) - 1))
    low_gran = s.weight_granularity if weight_bits(s.scheme) == 4 else "per_channel"
    samples = s.calibration_samples
    rows: list[dict[str, Any]] = []
    timer: dict[str, list[int] | None] = {"fp32_tokens": None}

    def add(step: str, gen, window: int | None, speed: dict[str, Any], note: str = "",
            ppl: float | None = None) -> None:
        if ppl is None:
            ppl = wf.perplexity(gen, score_ids, window)
        base = rows[0]["ppl"] if rows else ppl
        if timer["fp32_tokens"] is None:
            timer["fp32_tokens"] = speed["tokens"]
        rows.append({"step": step, "label": wf.LABELS[step], "tokens_per_s": speed["tokens_per_s"],
                     "source": HOST_CPU.source, "device": HOST_CPU.kind, "ppl": ppl,
                     "ppl_change": ppl / base - 1.0,
                     "same_greedy_tokens_as_fp32": wf.same_prefix(timer["fp32_tokens"] or [],
                                                                  speed["tokens"]),
                     "greedy_tokens": len(speed["tokens"]),
                     "note": note, **({"speculative": speed["speculative"]}
                                      if "speculative" in speed else {})})
        progress.log(f"waterfall {wf.LABELS[step]}: {speed['tokens_per_s']:.1f} tok/s "
                     f"(host CPU), ppl {ppl:.2f}")

    def quantized(src, name: str, scheme: str, gran: str, a: float, b: float):
        progress.update(a, f"quantizing {name} ({scheme}{', with a verify graph' if weight_bits(scheme) == 4 else ''})")
        out = ctx.out / name
        quantize_llm(src, out, {"scheme": scheme, "weight_granularity": gran,
                                "samples": samples}, calib, export_dir / "tokenizer",
                     SubProgress(progress, a, b), with_verify=weight_bits(scheme) == 4)
        return out

    def kv8(src, fp_gen, name: str):
        out = ctx.out / name
        scales = calibrate_kv_scales(fp_gen, tok(calib).input_ids)
        write_int8_kv_graphs(src, out, scales, per_head=False)
        for f in src.iterdir():
            if f.is_file() and f.suffix != ".onnx" and not (out / f.name).exists():
                shutil.copy2(f, out / f.name)
        return out

    progress.update(0.01, "FP32 on the host CPU")
    fp = cpu_generator(export_dir, spec)
    add("fp32", fp, None, wf.decode_rate(fp, prompt, new_tokens),
        "the chip's estimate is FP16 (the HTP runs no FP32)")
    d8 = quantized(export_dir, "w8a16", "W8A16", "per_channel", 0.05, 0.2)
    g8 = cpu_generator(d8, spec)
    add("w8a16", g8, None, wf.decode_rate(g8, prompt, new_tokens),
        "QDQ graphs run in float on the host CPU: slower here, faster on the NPU")
    progress.update(0.2, "quantized graph I/O (the W8A16 graphs' edge Q/DQ pairs cut)")
    dio = ctx.out / "w8a16_io"
    quantize_io(d8, dio, GRAPHS)
    gio = cpu_generator(dio, spec)
    add("quantized_io", gio, None, wf.decode_rate(gio, prompt, new_tokens),
        "the KV cache, mask and logits as 16-bit integers (htp.graph_io = quantized): the NPU "
        "converts nothing at the edge; here the host does. The steps below keep it on the chip")
    d4 = quantized(export_dir, "w4a16", "W4A16", low_gran, 0.22, 0.42)
    g4 = cpu_generator(d4, spec)
    add("w4a16", g4, None, wf.decode_rate(g4, prompt, new_tokens), f"{low_gran} 4-bit weights")
    progress.update(0.44, "INT8 KV cache")
    dk = kv8(d4, fp, "w4a16_kv8")
    gk = cpu_generator(dk, spec)
    add("int8_kv", gk, None, wf.decode_rate(gk, prompt, new_tokens),
        "uint8 cache I/O, one scale per layer and tensor (as the HTP takes it)")
    progress.update(0.5, f"window of {W} tokens")
    add("window", gk, W, wf.decode_rate(gk, prompt, new_tokens, window=W),
        f"attention to the last {W} tokens (ring buffer); the host's static graphs still "
        f"hold {C} slots, an export with {W} slots reads {W / C:.0%} of the cache")
    progress.update(0.55, "speculative decoding (prompt lookup)")
    sp = wf.speculative_rate(gk, prompt, new_tokens, k)
    add("speculative", gk, None, sp, f"prompt lookup, k <= {k}; lossless: the same model "
        "verifies every token", ppl=rows[-1]["ppl"])
    ablation = json.loads((abl_dir / "ablation.json").read_text())
    progress.update(0.6, f"exporting the pruned checkpoint (without {ablation['dropped']})")
    dp_fp = ctx.out / "pruned_fp32"
    export_llm(abl_dir / "pruned", dp_fp, P, C, progress=SubProgress(progress, 0.6, 0.7))
    pspec = load_graph_spec(dp_fp)
    dp4 = quantized(dp_fp, "pruned_w4a16", "W4A16", low_gran, 0.72, 0.9)
    gp_fp = cpu_generator(dp_fp, pspec)
    dpk = kv8(dp4, gp_fp, "pruned_w4a16_kv8")
    gp = cpu_generator(dpk, pspec)
    progress.update(0.92, "the pruned model: speed and perplexity")
    psp = wf.speculative_rate(gp, prompt, new_tokens, k)
    add("pruned", gp, W, psp, f"without block(s) {ablation['dropped']}, with everything above")
    for d in (d8, dio, d4, dk, dp_fp, dp4, dpk):  # keep the figures, not the graphs (large)
        shutil.rmtree(d, ignore_errors=True)
    cfg = json.loads((s.path(s.source) / "config.json").read_text())
    result = {
        "steps": rows, "context": C, "window": W, "k": k, "prompt_tokens": len(prompt),
        "new_tokens": new_tokens, "scheme": "W4A16", "weight_granularity": low_gran,
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

