"""The pipeline's stages: each a plain function ``stage(ctx, progress) -> result``.

The worker subprocess calls :func:`run_stage` with the job spec from the service layer;
benchmarks and tests may call the same functions directly. A stage writes its files into
``ctx.out`` (a fresh folder that becomes the content-addressed artifact) and returns a
JSON-able result whose ``metrics`` each carry their source.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.catalog import Chip, get_chip
from studio.core.devices import Device, htp_simulator
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.profile import layer_label
from studio.core.progress import Progress, SubProgress
from studio.core.stagegraph import StageConfig
from studio.worker import graph_stages
from studio.worker.context import (
    StageContext,
    _device_metric,
    _host_metric,
    _metric,
    _read_text,
)

GRAPHS = ("prefill", "decode")
# Quantized graphs at least this large get their context binary beside the ONNX model
# (measured: a Qwen2-0.5B-shaped W8A16 graph is 771 MB and embeds; 2 GB would not).
EMBED_LIMIT = 1 << 30


def _tokenizer(export_dir: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(export_dir / "tokenizer"))


def _spec(graphs_dir: Path) -> dict[str, Any]:
    from studio.engine.llm_export import load_spec

    return load_spec(graphs_dir)


# ---- 1. export ----------------------------------------------------------------------------
def export(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import hf_import
    from studio.engine.llm_export import export_llm

    ckpt = ctx.path("model.source")
    info = hf_import.open_checkpoint(ckpt)
    progress.update(0.02, f"exporting {info.architecture} ({info.num_layers} layers)")
    P, C = ctx.get("export.prompt_length"), ctx.get("export.context_length")
    t0 = time.perf_counter()
    spec = export_llm(ckpt, ctx.out, P, C, progress=SubProgress(progress, 0.02, 0.95))
    ctx.fact("export_seconds", time.perf_counter() - t0, "s")
    tok_dir = ctx.out / "tokenizer"
    tok_dir.mkdir()
    for f in ckpt.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy2(f, tok_dir / f.name)
    atomic_write_json(ctx.out / "modelinfo.json", info.to_dict())
    # a graph past 2 GB keeps its weights in <graph>.onnx.data: count both
    sizes = {g: sum(f.stat().st_size for f in ctx.out.glob(f"{g}.onnx*")) for g in GRAPHS}
    chk = spec.get("export_check") or {}
    metrics = []
    if chk:
        # the graphs against transformers over the whole exported context (deterministic)
        detail = (f"ONNX Runtime CPU FP32 vs transformers, teacher-forced over "
                  f"{chk['positions']} positions ({chk['prefill_positions']} prefill + "
                  f"{chk['positions'] - chk['prefill_positions']} decode), "
                  f"tolerance {chk['tolerance']:.3g}")
        metrics = [
            _metric("export_max_abs_logit_diff", chk["max_abs_logit_diff"], "", "measured",
                    "host-cpu", detail=detail),
            _metric("export_top1_agreement", chk["top1_agreement"], "fraction", "measured",
                    "host-cpu", detail=detail),
            _metric("export_positions_checked", chk["positions"], "positions", "measured",
                    "host-cpu"),
        ]
    return {
        "summary": f"prefill [1,{P}] + decode with KV cache {C} ({info.parameters:,} parameters)"
                   + (f"; matches transformers over {chk['positions']} positions "
                      f"(max |Δlogit| {chk['max_abs_logit_diff']:.2g})" if chk else ""),
        "spec": spec, "sizes": sizes, "metrics": metrics,
    }


def draft(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The draft model of speculative decoding, exported for the host CPU (FP32 prefill and
    decode graphs with the target's prompt and context lengths; checked like the target)."""
    from studio.engine import hf_import
    from studio.engine.llm_export import export_llm

    ckpt = ctx.path("model.draft")
    info = hf_import.open_checkpoint(ckpt)
    P, C = ctx.get("export.prompt_length"), ctx.get("export.context_length")
    export_llm(ckpt, ctx.out, P, C, progress=SubProgress(progress, 0.0, 0.98), verify_len=0)
    return {"summary": f"draft {info.architecture} ({info.num_layers} layers, "
                       f"{info.parameters:,} parameters) for the host CPU",
            "parameters": info.parameters}


def _int8_kv(export_dir: Path, out_dir: Path, calibration_text: str) -> dict[str, Any]:
    """Make the graphs in ``out_dir`` INT8-KV, with scales calibrated on the FP32 export."""
    from studio.engine.kvquant import calibrate_kv_scales, kv_bytes, write_int8_kv_graphs

    spec = _spec(export_dir)
    ids = _tokenizer(export_dir)(calibration_text).input_ids
    scales = calibrate_kv_scales(_cpu_generator(export_dir, spec), ids)
    # per layer and tensor: the QNN EP refuses per-axis Q/DQ that stand alone at the edge
    graphs = write_int8_kv_graphs(out_dir, out_dir, scales, per_head=False)
    return {"graphs": graphs, "bits": 8, "bytes": kv_bytes(spec, 8), "granularity": "per_tensor",
            "calibration_tokens": min(len(ids), int(spec["context_length"]))}


def ablation(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Pruning by ablation: held-out perplexity with each block dropped in turn, ranked, and
    a checkpoint without the ``pruning.drop_blocks`` least important blocks (``pruned/``)."""
    import math

    from transformers import PreTrainedTokenizerFast

    from studio.engine.ablation import ablate_blocks, write_pruned_checkpoint

    ckpt = ctx.path("model.source")
    n_drop = int(ctx.get("pruning.drop_blocks"))
    text = _read_text(ctx.path("validation.heldout_text"), "held-out text")
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(ckpt))
    except Exception as exc:  # noqa: BLE001 - a checkpoint without a fast tokenizer
        raise StudioError(f"the checkpoint {ckpt} has no tokenizer.json to read the held-out "
                          f"text with ({type(exc).__name__})") from None
    ids = tok(text).input_ids[: ctx.get("validation.heldout_tokens")]
    table = ablate_blocks(ckpt, ids, window=int(ctx.get("export.context_length")),
                          progress=SubProgress(progress, 0.0, 0.9))
    if not 1 <= n_drop < table["num_blocks"]:
        raise StudioError(f"pruning.drop_blocks is {n_drop}: drop 1..{table['num_blocks'] - 1} "
                          f"of the model's {table['num_blocks']} blocks")
    drop = sorted(r["block"] for r in table["blocks"][:n_drop])
    progress.update(0.92, f"writing the checkpoint without block(s) {drop}")
    write_pruned_checkpoint(ckpt, drop, ctx.out / "pruned")
    progress.update(0.95, "perplexity of the pruned checkpoint")
    from studio.engine.ablation import heldout_nll
    from studio.engine.llm_export import load_causal_lm

    nll, count = heldout_nll(load_causal_lm(ctx.out / "pruned"), ids, table["window"])

    pruned_ppl = math.exp(nll / count)
    table.update({"dropped": drop, "pruned_ppl": pruned_ppl,
                  "pruned_delta": pruned_ppl / table["baseline_ppl"] - 1.0})
    atomic_write_json(ctx.out / "ablation.json", table)
    best = table["blocks"][0]
    return {
        "summary": (f"{table['num_blocks']} blocks ablated over {table['tokens']} held-out "
                    f"tokens (ppl {table['baseline_ppl']:.2f}); least important block "
                    f"{best['block']} (+{best['delta']:.1%}); pruned checkpoint without "
                    f"{drop}: ppl {pruned_ppl:.2f} ({table['pruned_delta']:+.1%})"),
        "ablation": table,
        "metrics": [_metric("pruned_perplexity", pruned_ppl, "ppl", "measured", "host-cpu")],
    }


def waterfall(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The optimization waterfall measured on the host CPU: each step's graphs built here
    (W8A16, W4A16 with a verify graph, INT8 KV, the pruned checkpoint's), its decode rate and
    its held-out perplexity; and what the performance model needs to estimate the steps for
    a chip (the measured tokens per speculative pass)."""
    from studio.engine import waterfall as wf
    from studio.engine.kvquant import calibrate_kv_scales, write_int8_kv_graphs
    from studio.engine.llm_export import export_llm
    from studio.engine.quantize import quantize_llm

    export_dir, abl_dir = ctx.input("export"), ctx.input("ablation")
    spec = _spec(export_dir)
    tok = _tokenizer(export_dir)
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    W = int(ctx.get("waterfall.window") or C // 2)
    if not 1 <= W <= C:
        raise StudioError(f"waterfall.window is {W}: give 1..{C} (the context), or 0 for C/2")
    k = int(ctx.get("waterfall.k"))
    calib = _read_text(ctx.path("quantization.calibration_text"), "calibration text")
    held = tok(_read_text(ctx.path("validation.heldout_text"), "held-out text")).input_ids
    score_ids = held[: ctx.get("validation.heldout_tokens")]
    prompt = held[-(C // 2):] if len(held) > C // 2 else held[: max(1, len(held) // 2)]
    new_tokens = max(2, min(int(ctx.get("waterfall.new_tokens")), C - len(prompt) - 1))
    low_gran = (ctx.get("quantization.weight_granularity")
                if ctx.get("quantization.scheme") == "W4A16" else "per_channel")
    samples = ctx.get("quantization.calibration_samples")
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
                     "source": "measured", "device": "host-cpu", "ppl": ppl,
                     "ppl_change": ppl / base - 1.0,
                     "same_greedy_tokens_as_fp32": wf.same_prefix(timer["fp32_tokens"] or [],
                                                                  speed["tokens"]),
                     "greedy_tokens": len(speed["tokens"]),
                     "note": note, **({"speculative": speed["speculative"]}
                                      if "speculative" in speed else {})})
        progress.log(f"waterfall {wf.LABELS[step]}: {speed['tokens_per_s']:.1f} tok/s "
                     f"(host CPU), ppl {ppl:.2f}")

    def quantized(src, name: str, scheme: str, gran: str, a: float, b: float):
        progress.update(a, f"quantizing {name} ({scheme}{', with a verify graph' if scheme == 'W4A16' else ''})")
        out = ctx.out / name
        quantize_llm(src, out, {"scheme": scheme, "weight_granularity": gran,
                                "samples": samples}, calib, export_dir / "tokenizer",
                     SubProgress(progress, a, b), with_verify=scheme == "W4A16")
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
    fp = _cpu_generator(export_dir, spec)
    add("fp32", fp, None, wf.decode_rate(fp, prompt, new_tokens),
        "the chip's estimate is FP16 (the HTP runs no FP32)")
    d8 = quantized(export_dir, "w8a16", "W8A16", "per_channel", 0.05, 0.2)
    g8 = _cpu_generator(d8, spec)
    add("w8a16", g8, None, wf.decode_rate(g8, prompt, new_tokens),
        "QDQ graphs run in float on the host CPU: slower here, faster on the NPU")
    d4 = quantized(export_dir, "w4a16", "W4A16", low_gran, 0.22, 0.42)
    g4 = _cpu_generator(d4, spec)
    add("w4a16", g4, None, wf.decode_rate(g4, prompt, new_tokens), f"{low_gran} 4-bit weights")
    progress.update(0.44, "INT8 KV cache")
    dk = kv8(d4, fp, "w4a16_kv8")
    gk = _cpu_generator(dk, spec)
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
    pspec = _spec(dp_fp)
    dp4 = quantized(dp_fp, "pruned_w4a16", "W4A16", low_gran, 0.72, 0.9)
    gp_fp = _cpu_generator(dp_fp, pspec)
    dpk = kv8(dp4, gp_fp, "pruned_w4a16_kv8")
    gp = _cpu_generator(dpk, pspec)
    progress.update(0.92, "the pruned model: speed and perplexity")
    psp = wf.speculative_rate(gp, prompt, new_tokens, k)
    add("pruned", gp, W, psp, f"without block(s) {ablation['dropped']}, with everything above")
    for d in (d8, d4, dk, dp_fp, dp4, dpk):  # keep the figures, not the graphs (large)
        shutil.rmtree(d, ignore_errors=True)
    cfg = json.loads((ctx.path("model.source") / "config.json").read_text())
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
        "metrics": [_metric("waterfall_final_tokens_per_s", last["tokens_per_s"], "tok/s",
                            "measured", "host-cpu")],
    }


# ---- 2. quantize --------------------------------------------------------------------------
def _recipe(ctx: StageContext) -> dict[str, Any]:
    """The quantization recipe of the project's settings (what the quantize stage applies)."""
    return {"scheme": ctx.get("quantization.scheme"),
            "weight_granularity": ctx.get("quantization.weight_granularity"),
            "samples": ctx.get("quantization.calibration_samples"),
            "overrides": ctx.get("quantization.overrides"),
            "calibration_method": ctx.get("quantization.calibration_method"),
            "block_size": ctx.get("quantization.block_size")}


def quantize(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine.quantize import quantize_llm

    recipe = _recipe(ctx)
    scheme, gran, samples = recipe["scheme"], recipe["weight_granularity"], recipe["samples"]
    overrides, method = recipe["overrides"], recipe["calibration_method"]
    text = _read_text(ctx.path("quantization.calibration_text"), "calibration text")
    export_dir = ctx.input("export")
    t0 = time.perf_counter()
    info = quantize_llm(export_dir, ctx.out, recipe, text, export_dir / "tokenizer", progress)
    kv = ctx.get("quantization.kv_cache") or "float"
    if kv == "int8":
        progress.update(0.97, "INT8 KV cache: per-head scales from the FP32 cache, uint8 I/O")
        info["kv_cache"] = _int8_kv(export_dir, ctx.out, text)
    ctx.fact("quantize_seconds", time.perf_counter() - t0, "s")
    return {
        "summary": f"{scheme} {gran}, {samples} calibration windows ({method})"
                   + (", INT8 KV cache" if kv == "int8" else "")
                   + (f", overrides {', '.join(f'{k}={v}' for k, v in overrides.items())}"
                      if overrides else ""),
        "quant": info, "layers": info.get("layers", []), "metrics": [],
    }


# ---- 3. compile ---------------------------------------------------------------------------
def _htp_options(ctx: StageContext) -> dict[str, str]:
    """Extra QNN EP options the recipe needs: block-wise (LPBQ) weights need the HTP's
    block-quant optimization (~5x slower without)."""
    return ({"enable_block_quant_weight_optimization": "1"}
            if ctx.get("quantization.weight_granularity") == "per_block" else {})


def compile_(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    from studio.engine import qnn

    qdir = ctx.input("quantize")
    fp16 = ctx.fp16
    chip = ctx.chip
    extra = _htp_options(ctx)
    placement, compiled = {}, {}
    for i, g in enumerate(GRAPHS):
        progress.check()
        progress.update(i / 2, f"checking placement of {g} on {chip.name}")
        rep = qnn.placement_report(qdir / f"{g}.onnx", chip, fp16=fp16, extra_options=extra)
        placement[g] = rep
        if not rep["all_on_npu"]:
            names = ", ".join(f"{n['name']} ({n['op_type']})" for n in rep["cpu_nodes"][:5])
            raise StudioError(
                f"{len(rep['cpu_nodes'])} node(s) of the {g} graph cannot run on the NPU of "
                f"{chip.name}: {names}; change their precision or the recipe"
            )
        progress.update(i / 2 + 0.25, f"compiling {g} context binary for {chip.name}")
        # a context binary is embedded in its ONNX model unless the model would come near
        # protobuf's 2 GB limit (real 1-8 B LLMs): then it is written beside it (_qnn.bin)
        size = sum(f.stat().st_size for f in qdir.glob(f"{g}.onnx*"))
        compiled[g] = qnn.compile_context(qdir / f"{g}.onnx", ctx.out / f"{g}_ctx.onnx", chip,
                                          fp16=fp16, embed=size < EMBED_LIMIT,
                                          extra_options=extra)
    shutil.copy2(qdir / "graph.json", ctx.out / "graph.json")
    atomic_write_json(ctx.out / "placement.json", placement)
    sdk = compiled["decode"].get("sdk_version", "")
    if extra:
        progress.log("warning: block-wise (LPBQ) 4-bit weights: the x86 HTP simulator was "
                     "measured computing them wrong (logits cosine ~0.62 vs 0.999 on the host "
                     "QDQ model, tiny-coder); validate on a device before trusting them")
    ctx.fact("compile_seconds", sum(c.get("seconds", 0.0) for c in compiled.values()), "s")
    return {
        "summary": f"context binaries for {chip.name} (QNN SDK {sdk}); all nodes on the NPU",
        "placement": {g: {k: v for k, v in r.items() if k != "cpu_nodes"} for g, r in placement.items()},
        "sdk_version": sdk, "tool": {"qnn_sdk": sdk}, "metrics": [],
    }


# ---- sessions -------------------------------------------------------------------------------
def _cpu_generator(graph_dir: Path, spec: dict[str, Any]):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    verify = graph_dir / "verify.onnx"
    return StaticKVGenerator(make_cpu_session(graph_dir / "prefill.onnx"),
                             make_cpu_session(graph_dir / "decode.onnx"), spec,
                             make_cpu_session(verify) if verify.is_file() else None)


def _htp_generator(compile_dir: Path, chip: Chip, spec: dict[str, Any], fp16: bool):
    from studio.engine import qnn
    from studio.engine.llm_runtime import StaticKVGenerator

    return StaticKVGenerator(
        qnn.make_session(compile_dir / "prefill_ctx.onnx", chip, strict=True, fp16=fp16),
        qnn.make_session(compile_dir / "decode_ctx.onnx", chip, strict=True, fp16=fp16),
        spec,
    )


# ---- 4. validate ----------------------------------------------------------------------------
def _logit_stats(ref, other):
    import numpy as np

    a = ref.astype(np.float64)
    b = other.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return cos, float(np.abs(a - b).max()), (a.argmax(-1) == b.argmax(-1))


def _nll(logits, ids):
    import numpy as np

    x = logits[:-1].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum()), len(ids) - 1


def _greedy_agreement(ref, other, tok, prompt: str, heldout: list[int], prompt_len: int,
                      n: int, progress: Progress, extra_prompts: int = 3) -> dict[str, Any]:
    """Greedy generation from the project's prompt and a few held-out prompts on both
    runtimes: the fraction of identical tokens position by position, and before the first
    divergence (one near-tie flip early on shifts everything after it)."""
    prompts = [tok(prompt).input_ids[:prompt_len]]
    plen = min(16, prompt_len)
    step = max(1, (len(heldout) - plen) // max(1, extra_prompts))
    prompts += [heldout[i:i + plen] for i in range(0, len(heldout) - plen, step)][:extra_prompts]
    same = prefix = total = 0
    texts: dict[str, str] = {}
    for k, pr in enumerate(prompts):
        progress.check()
        a = ref.greedy(pr, n)["tokens"]
        b = other.greedy(pr, n)["tokens"]
        if k == 0:
            texts = {"fp32": tok.decode(a), "htp": tok.decode(b)}
        same += sum(x == y for x, y in zip(a, b, strict=False))
        run = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            run += 1
        prefix += run
        total += max(len(a), 1)
    return {"agreement": same / total, "prefix": prefix / total, "prompts": len(prompts), **texts}


def validate(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    import math

    import numpy as np

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = _spec(export_dir)
    chip = ctx.chip
    dev = ctx.device
    greedy_tokens = ctx.get("validation.greedy_tokens")
    text = _read_text(ctx.path("validation.heldout_text"), "held-out text")
    tok = _tokenizer(export_dir)
    ids = tok(text).input_ids[: ctx.get("validation.heldout_tokens")]
    if len(ids) < 16:
        raise StudioError("the held-out text gives fewer than 16 tokens: use a longer text")
    window = spec["context_length"]
    windows = [ids[i:i + window] for i in range(0, len(ids), window)]
    windows = [w for w in windows if len(w) >= 2]
    fp16 = ctx.fp16
    runners = {
        "fp32": _cpu_generator(export_dir, spec),
        "host_qdq": _cpu_generator(qdir, spec),
        "htp": _htp_generator(cdir, chip, spec, fp16),
    }
    logits: dict[str, list] = {k: [] for k in runners}
    total = len(windows) * len(runners)
    done = 0
    for name, gen in runners.items():
        for w in windows:
            progress.check()
            sub = SubProgress(progress, done / (total + 1), (done + 1) / (total + 1))
            sub.update(0, f"teacher-forced logits: {name}, {len(w)} tokens")
            logits[name].append(gen.teacher_forced_logits(w, progress=sub))
            done += 1
    res: dict[str, Any] = {"tokens": len(ids), "windows": len(windows), "target": chip.key,
                           "device": dev.name, "device_id": dev.id, "source": dev.source}
    ppl = {}
    for name in runners:
        nll = cnt = 0.0
        for w, lg in zip(windows, logits[name], strict=True):
            a, b = _nll(lg, w)
            nll, cnt = nll + a, cnt + b
        ppl[name] = math.exp(nll / cnt)
    for name in ("host_qdq", "htp"):
        cos, maxerr, same = [], 0.0, []
        for r, o in zip(logits["fp32"], logits[name], strict=True):
            c, m, s = _logit_stats(r, o)
            cos.append(c)
            same.append(s)
            maxerr = max(maxerr, m)
        cos_all, same_all = np.concatenate(cos), np.concatenate(same)
        res[name] = {"logits_cosine_mean": float(cos_all.mean()),
                     "logits_cosine_min": float(cos_all.min()), "logits_max_abs_error": maxerr,
                     "top1_agreement": float(same_all.mean()), "perplexity": ppl[name]}
    progress.update(total / (total + 1), "greedy agreement")
    g = _greedy_agreement(runners["fp32"], runners["htp"], tok, ctx.get("run.prompt"), ids,
                          spec["prompt_length"], greedy_tokens, progress)
    h = res["htp"]
    res.update(
        logits_cosine_mean=h["logits_cosine_mean"], top1_agreement=h["top1_agreement"],
        perplexity_fp32=ppl["fp32"], perplexity_quantized=ppl["htp"],
        perplexity_host_qdq=ppl["host_qdq"], greedy_agreement=g["agreement"],
        greedy_prefix_agreement=g["prefix"], greedy_prompts=g["prompts"],
        greedy_fp32=g["fp32"], greedy_htp=g["htp"],
    )
    res["metrics"] = [
        _device_metric(dev, "logits_cosine_mean", h["logits_cosine_mean"], ""),
        _device_metric(dev, "logits_max_abs_error", h["logits_max_abs_error"], ""),
        _device_metric(dev, "top1_agreement", h["top1_agreement"], "fraction"),
        _device_metric(dev, "perplexity_quantized", ppl["htp"], ""),
        _device_metric(dev, "greedy_agreement", g["agreement"], "fraction",
                       f"{g['prompts']} prompts x {greedy_tokens} tokens, position by position"),
        _device_metric(dev, "greedy_prefix_agreement", g["prefix"], "fraction",
                       "tokens identical before the first divergence"),
        _metric("perplexity_fp32", ppl["fp32"], "", "measured", "host-cpu"),
        _metric("perplexity_host_qdq", ppl["host_qdq"], "", "measured", "host-cpu"),
        _metric("logits_cosine_host_qdq", res["host_qdq"]["logits_cosine_mean"], "", "measured",
                "host-cpu"),
        _metric("top1_agreement_host_qdq", res["host_qdq"]["top1_agreement"], "fraction",
                "measured", "host-cpu"),
    ]
    res["summary"] = (f"cosine {h['logits_cosine_mean']:.4f}, top-1 {h['top1_agreement']:.1%}, "
                      f"ppl {ppl['fp32']:.2f} → {ppl['htp']:.2f} on {dev.name} ({dev.source})")
    return res


# ---- 5. run ----------------------------------------------------------------------------------
def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    export_dir = ctx.input("export")
    spec = _spec(export_dir)
    tok = _tokenizer(export_dir)
    dev = ctx.device
    prompt, n = ctx.get("run.prompt"), ctx.get("run.max_new_tokens")
    scheme = ctx.get("quantization.scheme")
    if dev.kind == "agent":
        return _run_on_agent(ctx, progress, export_dir, spec, tok, prompt, n, scheme)
    if dev.kind == "adb":
        return _run_on_adb(ctx, progress, spec, tok, prompt, n, scheme)
    if dev.kind == "host-cpu":
        gen = _cpu_generator(export_dir, spec)
        what = "FP32 on the host CPU"
    else:
        chip = ctx.chip
        gen = _htp_generator(ctx.input("compile", chip.key), chip, spec, ctx.fp16)
        what = f"{scheme} on the {dev.name}"
    prompt_ids = tok(prompt).input_ids

    def on_step(i: int, token: int) -> None:
        progress.check()
        progress.update((i + 1) / n, f"token {i + 1}/{n}")

    out = gen.greedy(prompt_ids, n, eos_id=spec.get("eos_token_id"), on_step=on_step)
    return _run_result(dev, out, tok, prompt, what)


def _run_result(dev: Device, out: dict[str, Any], tok, prompt: str, what: str,
                prefix: str = "", note: str | None = None) -> dict[str, Any]:
    """The run stage's result from a generation on ``dev`` (here, on an agent or a phone):
    the figures labelled from the device. ``prefix`` names timings that are not the graph's
    latency (``round_trip_`` for adb round trips)."""
    steps = out["step_s"]
    median = statistics.median(steps) if steps else float("nan")
    note = dev.timing_note if note is None else note
    metrics = [
        _device_metric(dev, f"{prefix}prefill_ms", out["prefill_s"] * 1e3, "ms", note),
        _device_metric(dev, f"{prefix}decode_ms_per_token", median * 1e3, "ms", note),
        _device_metric(dev, f"{prefix}decode_tokens_per_s", 1.0 / median if steps else 0.0,
                       "tok/s", note),
    ]
    return {
        "summary": f"{len(out['tokens'])} tokens, {1.0 / median:.1f} tok/s ({dev.source}, {what})",
        "device": dev.kind, "device_id": dev.id, "target": dev.chip, "source": dev.source,
        "prompt": prompt, "tokens": out["tokens"], "text": tok.decode(out["tokens"]),
        "prefill_s": out["prefill_s"], "step_s": steps, "metrics": metrics,
    }


def _run_on_agent(ctx: StageContext, progress: Progress, export_dir: Path, spec: dict[str, Any],
                  tok, prompt: str, n: int, scheme: str) -> dict[str, Any]:
    """The run stage on a registered agent: the export (its CPU) or the target's compiled
    context (its HTP) goes up by content hash, the tokens stream back."""
    from studio.engine.device_registry import Registry, parse_device_id

    dev = ctx.device
    name, backend = parse_device_id(dev.id)
    client = Registry().client(name)
    sdk = None
    if backend == "cpu":
        folder, files = export_dir, ["prefill.onnx", "decode.onnx", "graph.json"]
        what = "FP32 on the agent's CPU"
    else:
        folder = ctx.input("compile", ctx.chip.key)
        sdk = json.loads((folder / "result.json").read_text()).get("sdk_version")
        files = [p.name for p in sorted(folder.iterdir()) if p.is_file()
                 and (p.name.endswith((".onnx", ".bin")) or p.name == "graph.json")]
        what = f"{scheme} on the agent's {backend}"
    progress.update(0.02, f"uploading to agent {name} (files it holds already are skipped)")
    model = client.upload_folder(folder, [f for f in files if (folder / f).is_file()])
    prompt_ids = tok(prompt).input_ids

    def on_token(i: int, _token: int) -> None:
        progress.update((i + 1) / n, f"token {i + 1}/{n} on agent {name}")

    eos = [spec["eos_token_id"]] if spec.get("eos_token_id") is not None else []

    def cancelled() -> bool:  # a cancelled job stops here; the agent's job ends with it
        progress.check()
        return False

    out = client.generate(model, backend, prompt_ids, n, {}, eos, sdk, on_token=on_token,
                          should_stop=cancelled)
    if out.get("source") and out["source"] != dev.source:
        raise StudioError(f"agent {name} labels its {backend} figures {out['source']!r}, not "
                          f"{dev.source!r}: name the backend as the agent lists it")
    return _run_result(dev, out, tok, prompt, what)


def adb_phone(dev: Device, log=None):
    """The phone an ``adb:SERIAL@CHIP`` device names, with the QAIRT SDK from the settings."""
    from studio.core.catalog import get_chip
    from studio.engine.adb import AdbPhone
    from studio.engine.device_registry import Registry

    sdk, _where = Registry().sdk_root()
    return AdbPhone(dev.serial, sdk, get_chip(dev.chip), log=log)


def adb_generator(cdir: Path, dev: Device, spec: dict[str, Any], log=None):
    """A generator whose prefill and decode graphs run on a phone through qnn-net-run (one
    call per pass: the context is loaded each time), with its sessions."""
    from studio.engine.llm_runtime import StaticKVGenerator

    phone = adb_phone(dev, log)
    pre = phone.session(cdir / "prefill_ctx.onnx")
    dec = phone.session(cdir / "decode_ctx.onnx")
    return StaticKVGenerator(pre, dec, spec), pre, dec


def adb_timings(out: dict[str, Any], pre, dec) -> dict[str, Any] | None:
    """The generation's prefill and per-token times as the phone's own execute times (from
    qnn-net-run's profiling logs); None when a pass has none (no profile viewer)."""
    steps = len(out["step_s"])
    log_pre, log_dec = list(pre.execute_log), list(dec.execute_log)
    if not log_pre or any(v is None for v in log_pre + log_dec) or len(log_dec) < steps:
        return None
    extra = log_dec[:len(log_dec) - steps]  # prompt tokens past P go through decode steps
    return {**out, "prefill_s": (sum(log_pre) + sum(extra)) / 1e6,  # type: ignore[arg-type]
            "step_s": [v / 1e6 for v in log_dec[len(log_dec) - steps:]]}  # type: ignore[operator]


def _run_on_adb(ctx: StageContext, progress: Progress, spec: dict[str, Any], tok, prompt: str,
                n: int, scheme: str) -> dict[str, Any]:
    """The run stage on a phone over adb: the target's compiled context runs through
    qnn-net-run, one call per pass (UNVERIFIED ON HARDWARE: no phone here)."""
    dev = ctx.device
    gen, pre, dec = adb_generator(ctx.input("compile", ctx.chip.key), dev, spec,
                                  log=progress.log)

    def on_step(i: int, token: int) -> None:
        progress.check()
        progress.update((i + 1) / n, f"token {i + 1}/{n} on phone {dev.serial}")

    out = gen.greedy(tok(prompt).input_ids, n, eos_id=spec.get("eos_token_id"), on_step=on_step)
    what = f"{scheme} on {dev.name}"
    timed = adb_timings(out, pre, dec)
    if timed is None:
        return _run_result(dev, out, tok, prompt, what, prefix="round_trip_",
                           note="adb round trips (push, context load, run, pull), not the "
                           "graph's latency: the SDK has no qnn-profile-viewer to read the "
                           "phone's own times")
    return _run_result(dev, timed, tok, prompt, what)


def _profile_on_adb(ctx: StageContext, progress: Progress, cdir: Path,
                    repeats: int) -> list[tuple[dict[str, Any], float]]:
    """The profile stage's repeats on a phone: qnn-net-run at the detailed level, its
    profiling log turned into the QNN CSV by the SDK's viewer (the phone's load is not
    measured: 0)."""
    from studio.engine import qnn

    dev = ctx.device
    phone = adb_phone(dev, progress.log)
    sess = phone.session(cdir / "decode_ctx.onnx", profiling="detailed")
    sess.profile_dir = ctx.out / "repeats"
    feeds = qnn.synthetic_feeds(sess, {"position_ids": int(_spec(cdir)["prompt_length"])})
    out = []
    for i in range(repeats):
        progress.check()
        progress.update(0.05 + 0.8 * i / repeats,
                        f"profiling decode step {i + 1}/{repeats} on phone {dev.serial}")
        sess.run(None, feeds)
        if sess.last_profile_csv is None:
            raise StudioError("qnn-net-run wrote no profiling log on the phone, or the SDK has "
                              "no qnn-profile-viewer to read it")
        out.append(({"csv": str(sess.last_profile_csv), "op_trace": None, "level": "detailed",
                     "source": dev.source}, 0.0))
    return out


def _profile_on_agent(ctx: StageContext, progress: Progress, cdir: Path,
                      repeats: int) -> list[tuple[dict[str, Any], float]]:
    """The profile stage's repeats run on a registered agent's HTP backend: the compiled
    context goes up by content hash; each repeat's CSV and op trace come back and are written
    here, with the load of the agent's host."""
    from studio.engine.device_registry import Registry, parse_device_id

    name, backend = parse_device_id(ctx.device.id)
    client = Registry().client(name)
    files = [p.name for p in sorted(cdir.iterdir()) if p.is_file()
             and (p.name.endswith((".onnx", ".bin")) or p.name == "graph.json")]
    progress.update(0.02, f"uploading to agent {name} (files it holds already are skipped)")
    model = client.upload_folder(cdir, files)
    sdk = json.loads((cdir / "result.json").read_text()).get("sdk_version")

    def on_progress(i: int, n: int) -> None:
        progress.update(0.05 + 0.8 * i / n, f"profiled decode step {i}/{n} on agent {name}")

    got = client.profile(model, backend, repeats, sdk, ctx.fp16, on_progress=on_progress)
    if got.get("source") != ctx.device.source:
        raise StudioError(f"agent {name} labels its {backend} figures {got.get('source')!r}, "
                          f"not {ctx.device.source!r}: name the backend as the agent lists it")
    out = []
    folder = ctx.out / "repeats"
    folder.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(got["repeats"]):
        csv_path = folder / f"qnn_profile_{i + 1}.csv"
        csv_path.write_text(r["csv"])
        trace = None
        if r.get("op_trace"):
            trace = folder / f"qnn_profile_{i + 1}_op_trace.json"
            trace.write_text(r["op_trace"])
        out.append(({"csv": str(csv_path), "op_trace": str(trace) if trace else None,
                     "level": r.get("level"), "source": r.get("source", ctx.device.source)},
                    float(r.get("other_load") or 0.0)))
    if len(out) != repeats:
        raise StudioError(f"agent {name} returned {len(out)} profiled runs, not {repeats}")
    return out


# ---- 6. profile ------------------------------------------------------------------------------
def profile(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """One decode step profiled ``profile.repeats`` times on the simulator, each run with the
    host load it ran under; the median per op, the spread, and the seed's op table."""
    from studio.engine import qnn, qnn_profile
    from studio.engine.hostload import HostLoadMeter
    from studio.engine.opblocks import node_blocks

    cdir, qdir = ctx.input("compile", ctx.config.chip), ctx.input("quantize")
    chip = ctx.chip
    dev = ctx.device
    spec = _spec(cdir)
    repeats = int(ctx.get("profile.repeats") or 5)
    blocks = node_blocks(qdir / "decode.onnx")
    costs = qnn_profile.node_costs(qdir / "decode.onnx")
    runs, loads = [], []
    remote = (_profile_on_agent(ctx, progress, cdir, repeats) if dev.kind == "agent" else
              _profile_on_adb(ctx, progress, cdir, repeats) if dev.kind == "adb" else None)
    for i in range(repeats):
        progress.check()
        if remote is not None:
            info, load = remote[i]
        else:
            progress.update(0.05 + 0.8 * i / repeats,
                            f"profiling decode step {i + 1}/{repeats} on {chip.name}")
            csv_path = ctx.out / "repeats" / f"qnn_profile_{i + 1}.csv"
            with HostLoadMeter() as meter:
                info = qnn.profile_decode_step(cdir / "decode_ctx.onnx", chip, spec, csv_path,
                                               fp16=ctx.fp16, runs=1)
            load = meter.sample.other_load if meter.sample else 0.0
        runs.append(qnn_profile.parse_profile_run(info, onnx_path=qdir / "decode.onnx",
                                                  chip=chip))
        loads.append(load)
        partial = qnn_profile.merge_repeats(runs, loads)
        table = qnn_profile.event_table(partial, blocks)
        _partial(progress, {"by_block": table.group_sum("block", "cycles"),
                            "unit": partial.unit, "stats": partial.stats,
                            "repeat": i + 1, "repeats": repeats})
    progress.update(0.86, "reading the compiler's DDR traffic (optrace)")
    prof = qnn_profile.merge_repeats(runs, loads)
    prof.device = dev.id
    table = qnn_profile.event_table(prof, blocks, costs=costs)
    table, bytes_source = _compiler_traffic(ctx, table, spec, progress)
    prof.stats["bytes_source"] = bytes_source
    table.save(ctx.out / "events.npz")
    progress.update(0.93, "timing the step on the host CPU (ONNX Runtime profiler)")
    host = _host_timeline(ctx, qdir / "decode.onnx", spec)
    atomic_write_json(ctx.out / "profile.json", prof.to_dict())
    by_type = prof.totals_by_op_type()
    by_layer = {layer_label(k): v for k, v in prof.totals_by_layer().items()}
    metric = "cycles" if prof.unit == "cycles" else "dur"
    by_block = table.group_sum("block", metric)
    top = sorted(by_type.items(), key=lambda kv: -kv[1])[:10]
    stats = prof.stats
    note = ("simulator cycles follow the host CPU: relative cost of ops, not device latency; "
            f"median of {stats['runs']} runs, ±{stats.get('spread', 0):.0%} (median deviation)"
            if prof.source == "simulated" else "")
    warn = "" if stats.get("reliable") else " · UNRELIABLE: " + "; ".join(stats["warnings"])
    return {
        "summary": (f"{len(prof.ops)} HTP ops in one decode step, median of {stats['runs']} "
                    f"runs ({prof.source}, {chip.name}){warn}"),
        "by_op_type": dict(top), "by_layer": by_layer, "by_block": by_block,
        "counts_by_block": table.group_count("block"), "unit": prof.unit,
        "bytes_source": bytes_source, "host_timeline": host,
        "source": prof.source, "ops": len(prof.ops), "stats": stats,
        "metrics": [_metric("decode_step_total", stats["median"], prof.unit, prof.source,
                            dev.kind, chip.key, note)],
    }


# Quantized graphs at least this large are not recompiled for an optrace profile (minutes
# and GBs for a 0.5B model): their bytes moved stay analytic.
OPTRACE_LIMIT = 256 << 20


def _compiler_traffic(ctx: StageContext, table, spec, progress: Progress):
    """Replace the analytic bytes moved by the compiler's own per-op DRAM / VTCM traffic
    and DMA flags: one optrace profile of the quantized graph (the context binary keeps no
    schematic). Returns (table, "compiler (optrace)" | "analytic")."""
    from studio.engine import qnn, qnn_profile
    from studio.engine.profile_import import copy_traffic, merge_bandwidth

    qdir = ctx.input("quantize")
    graph = qdir / "decode.onnx"
    size = sum(f.stat().st_size for f in qdir.glob("decode.onnx*"))
    if size >= OPTRACE_LIMIT:
        progress.log(f"bytes moved stay analytic: {graph.name} is {size >> 20} MiB, too large "
                     "to recompile for an optrace profile here")
        return table, "analytic"
    try:
        info = qnn.profile_decode_step(graph, ctx.chip, spec, ctx.out / "optrace" / "ops.csv",
                                       fp16=ctx.fp16, level="optrace")
        if not info["schematic"]:
            raise StudioError("the optrace profile wrote no schematic")
        oprof = qnn_profile.parse_profile_run(info, onnx_path=graph, chip=ctx.chip)
        traffic = merge_bandwidth(qnn_profile.event_table(oprof), oprof.ops,
                                  info["schematic"][0])
    except StudioError as exc:
        progress.log(f"bytes moved stay analytic: {exc.message}")
        return table, "analytic"
    merged, matched = copy_traffic(table, traffic)
    if matched < len(table) // 2:
        progress.log(f"bytes moved stay analytic: only {matched} of {len(table)} ops matched "
                     "the optrace profile")
        return table, "analytic"
    return merged, "compiler (optrace)"


def _host_timeline(ctx: StageContext, graph: Path, spec) -> dict[str, Any]:
    """The quantized decode step on the host CPU under ONNX Runtime's profiler: a measured
    timeline (per node, per thread) saved as host_events.npz."""
    from statistics import median

    from studio.engine import qnn
    from studio.engine.opblocks import node_blocks
    from studio.engine.profile_import import import_profile

    info = qnn.profile_host_cpu(graph, ctx.out / "host" / "ort_profile.json",
                                position=int((spec or {}).get("prompt_length", 0)), runs=3)
    prof = import_profile(info["json"], source="measured", fmt="ort-json")
    blocks = node_blocks(graph)
    from studio.core.events import EventTable

    assert prof.table is not None  # an ONNX Runtime profile always has its events
    rows = prof.table.rows()
    for r in rows:
        r["block"] = blocks.get(r["onnx_node"], r["block"])
    EventTable.from_rows(rows, time_unit="us").save(ctx.out / "host_events.npz")
    return {"source": "measured", "device": "host-cpu", "runs": info["runs"],
            "events": len(rows), "step_ms_median": 1e3 * median(info["wall_s"])}


def _partial(progress: Progress, data: dict[str, Any]) -> None:
    """Hand a partial result to whoever watches the job (the GUI draws it live)."""
    send = getattr(progress, "partial", None)
    if send is not None:
        send(data)


# ---- 7. report -------------------------------------------------------------------------------
def report(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The run's report. It is not cached: it reads the run history (the settings this run
    ran with, and the previous run to compare with)."""
    from studio.core.project import from_dict
    from studio.engine.report import write_report

    results = {}
    for label, path in ctx.inputs.items():
        results[label] = json.loads((path / "result.json").read_text())
    settings = ctx.history.get("settings")
    if not settings:
        raise StudioError("the report needs the run history's record of this run")
    project = from_dict(settings)
    project.name = ctx.get("name")
    project.gates = {k.split(".", 1)[1]: ctx.get(k) for k in ctx.config.settings
                     if k.startswith("gates.")}
    # the full sensitivity ranking lives in its artifact; the project's sweeps (with their
    # Pareto fronts) come from the service that started the run
    html, data = write_report(project, results, ctx.out, ctx.history.get("comparison"),
                              artifacts=dict(ctx.inputs), sweeps=ctx.history.get("sweeps"),
                              run=ctx.history.get("run"))
    return {"summary": f"report with {len(results)} stage results", "files": [html.name, data.name],
            "metrics": []}


# ---- 8. sensitivity ----------------------------------------------------------------------------
def sensitivity(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """Each weighted layer, each key activation, then each block, raised (and lowered) alone
    over the base scheme, scored on the host QDQ prefill graph against FP32."""
    from studio.engine.sensitivity import VariantBench, analyze, confirm_on_htp, resolve_choices

    scheme = ctx.get("quantization.scheme")
    high, low = resolve_choices(scheme, ctx.get("sensitivity.high"), ctx.get("sensitivity.low"))
    export_dir = ctx.input("export")
    calib = _read_text(ctx.path("quantization.calibration_text"), "calibration text")
    held = _read_text(ctx.path("validation.heldout_text"), "held-out text")
    ids = _tokenizer(export_dir)(held).input_ids[: ctx.get("sensitivity.heldout_tokens")]
    if len(ids) < 16:
        raise StudioError("the held-out text gives fewer than 16 tokens: use a longer text")
    recipe = {"scheme": scheme, "weight_granularity": ctx.get("quantization.weight_granularity"),
              "samples": ctx.get("quantization.calibration_samples")}
    t0 = time.perf_counter()
    with VariantBench(export_dir, recipe, ids, ctx.out, calibration_text=calib,
                      tokenizer_dir=export_dir / "tokenizer",
                      progress=SubProgress(progress, 0.0, 0.1)) as bench:
        confirm = ctx.get("sensitivity.confirm_on_htp")
        data = analyze(bench, high, low, SubProgress(progress, 0.1, 0.85 if confirm else 1.0))
        if confirm:
            data["htp"] = confirm_on_htp(bench, data, get_chip(confirm),
                                         ctx.get("sensitivity.confirm_top"),
                                         SubProgress(progress, 0.85, 1.0))
        shutil.copy2(bench.ranges, ctx.out / "calibration_ranges.json")
    seconds = time.perf_counter() - t0
    v = data["variants"]
    ctx.fact("sensitivity_seconds", seconds, "s",
             f"{v['measured']} variants measured, {v['quantizer_runs']} quantizer runs")
    atomic_write_json(ctx.out / "sensitivity.json", data)
    by_name = {e["name"]: e for e in data["layers"] + data["blocks"] + data["points"]}

    def rows(names: list[str], direction: str) -> list[dict[str, Any]]:
        return [{"name": n, **by_name[n][direction]["delta"]} for n in names]

    rk = data["ranking"]
    where = (f"prefill graph, {data['heldout']['tokens']} held-out tokens in windows of "
             f"{data['heldout']['window_tokens']}")
    base, fp32 = data["base"], data["fp32"]
    top = rk["raise"][0]
    metrics = [
        # its own name: validate owns perplexity_fp32 (its held-out text, its token count)
        _host_metric("sensitivity_perplexity_fp32", fp32["perplexity"], "", where),
        _host_metric("perplexity_base", base["perplexity"], "", f"{scheme}, {where}"),
        _host_metric("logits_cosine_base", base["logits_cosine"], "", f"{scheme}, {where}"),
        _host_metric("kl_divergence_base", base["kl_divergence"], "nats", f"{scheme}, {where}"),
        _host_metric("top_raise_kl_change", by_name[top]["raise"]["delta"]["kl_divergence"],
                     "nats", f"{top} raised to {high}"),
        _host_metric("top_raise_perplexity_change", by_name[top]["raise"]["delta"]["perplexity"],
                     "", f"{top} raised to {high}"),
    ]
    htp = data.get("htp")
    if htp:
        sim = htp_simulator(htp["chip"])
        metrics.append(_device_metric(sim, "kl_divergence_base_htp", htp["base"]["kl_divergence"],
                                      "nats", f"{scheme}, {where}"))
        for e in htp["entries"][:1]:
            metrics.append(_device_metric(sim, "top_raise_kl_change_htp",
                                          e["delta"]["kl_divergence"], "nats",
                                          f"{e['name']} raised to {high}"))
    if rk["raise_points"]:
        top_point = rk["raise_points"][0]
        metrics.append(_host_metric(
            "top_point_raise_kl_change", by_name[top_point]["raise"]["delta"]["kl_divergence"],
            "nats", f"{top_point} raised to {high}"))
    if low:
        worst = rk["lower"][0]
        metrics.append(_host_metric(
            "top_lower_perplexity_change", by_name[worst]["lower"]["delta"]["perplexity"], "",
            f"{worst} lowered to {low}"))
    return {
        "summary": (f"{len(data['layers'])} layers, {len(data['points'])} key activations and "
                    f"{len(data['blocks'])} blocks, one at a time over {scheme}: raised to {high}"
                    + (f", lowered to {low}" if low else "")
                    + f"; most to gain from {high}: {', '.join(rk['raise'][:3])}"
                    + (f"; of the key activations: {rk['raise_points'][0]}"
                       if rk["raise_points"] else "")
                    + (f"; on the HTP simulator ({htp['chip']}) {htp['host_gain_confirmed']} of "
                       f"the top {htp['tried']} gain too" if htp else "")),
        "scheme": scheme, "high": high, "low": low, "graph": data["graph"],
        "heldout_tokens": data["heldout"]["tokens"], "fp32": fp32, "base": base,
        "ranking": {k: names[:5] for k, names in rk.items()},
        "top_raise": rows(rk["raise"][:5], "raise"),
        "top_lower": rows(rk["lower"][:5], "lower") if low else [],
        "blocks_raise": rows(rk["raise_blocks"], "raise"),
        "points_raise": rows(rk["raise_points"][:5], "raise"),
        "htp": ({"chip": htp["chip"], "base": htp["base"],
                 "confirmed": f"{htp['host_gain_confirmed']} of {htp['tried']}",
                 "entries": [{"name": e["name"], "host": e["host_delta"], "htp": e["delta"]}
                             for e in htp["entries"]]} if htp else None),
        "variants": data["variants"], "files": ["sensitivity.json"], "metrics": metrics,
    }


# ---- 9. auto precision ------------------------------------------------------------------------
def autoprecision(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The fewest layers or key activations raised (greedy by the sensitivity ranking, each
    step measured) that meet the project's target; the override rules to copy into
    ``quantization.overrides``."""
    from studio.engine.sensitivity import VariantBench, auto_precision

    export_dir, sdir = ctx.input("export"), ctx.input("sensitivity")
    try:
        sens = json.loads((sdir / "sensitivity.json").read_text())
    except (OSError, ValueError):
        raise StudioError("the sensitivity result is missing or unreadable: re-run sensitivity") from None
    recipe = {"scheme": sens["scheme"], "weight_granularity": sens["weight_granularity"],
              "samples": sens["calibration_samples"]}
    metric = ctx.get("autoprecision.metric")
    t0 = time.perf_counter()
    with VariantBench(export_dir, recipe, sens["heldout"]["ids"], ctx.out,
                      ranges=sdir / "calibration_ranges.json",
                      progress=SubProgress(progress, 0.0, 0.1)) as bench:
        # weighted layers and key activations in one ranking, by what raising each alone
        # gained (a sensitivity result from before key activations were ranked has none)
        units = sens["layers"] + sens.get("points", [])
        gains = {e["name"]: -e["raise"]["delta"]["kl_divergence"] for e in units}
        order = {name: i for i, name in enumerate(
            sens["ranking"]["raise"] + sens["ranking"].get("raise_points", []))}
        ranking = sorted(gains, key=lambda n: (-gains[n], order[n]))
        res = auto_precision(bench, ranking, sens["high"], metric,
                             ctx.get("autoprecision.max_perplexity_change"),
                             ctx.get("autoprecision.min_logits_cosine"), gains,
                             SubProgress(progress, 0.1, 1.0))
    ctx.fact("autoprecision_seconds", time.perf_counter() - t0, "s",
             f"{res['variants']['measured']} variants measured")
    res["base_matches_sensitivity"] = all(
        abs(res["before"][k] - sens["base"][k]) <= 1e-9 * max(1.0, abs(sens["base"][k]))
        for k in ("perplexity", "logits_cosine", "kl_divergence"))
    atomic_write_json(ctx.out / "autoprecision.json", res)
    b, a = res["before"], res["after"]
    target = (f"perplexity within {ctx.get('autoprecision.max_perplexity_change'):.1%} of FP32"
              if metric == "perplexity"
              else f"logits cosine >= {ctx.get('autoprecision.min_logits_cosine')}")
    what = (f"{res['raised']} layer(s) raised to {res['high']}" if res["met"]
            else f"target not met with the {len(res['tried'])} layers that gained from "
                 f"{res['high']} raised")
    detail = f"{res['scheme']} + overrides, prefill graph, {sens['heldout']['tokens']} tokens"
    return {
        "summary": (f"{target}: {what}; perplexity {b['perplexity']:.3f} → {a['perplexity']:.3f} "
                    f"(FP32 {res['fp32']['perplexity']:.3f}), cosine {b['logits_cosine']:.5f} → "
                    f"{a['logits_cosine']:.5f}, weights {b['weight_bytes']:,} → "
                    f"{a['weight_bytes']:,} bytes"),
        "met": res["met"], "raised": res["raised"], "high": res["high"],
        "overrides": res["overrides"], "target": res["target"], "metric": metric,
        "before": b, "after": a,
        "curve": [{k: s[k] for k in ("step", "action", "perplexity", "logits_cosine",
                                     "kl_divergence", "weight_bytes",
                                     "activation_bytes_per_token", "meets_target")}
                  for s in res["steps"]],
        "base_matches_sensitivity": res["base_matches_sensitivity"],
        "files": ["autoprecision.json"],
        "metrics": [
            _host_metric("layers_raised", res["raised"], "layers", f"to {res['high']}"),
            _host_metric("perplexity_before", b["perplexity"], "", detail),
            _host_metric("perplexity_after", a["perplexity"], "", detail),
            _host_metric("logits_cosine_before", b["logits_cosine"], "", detail),
            _host_metric("logits_cosine_after", a["logits_cosine"], "", detail),
            _host_metric("weight_bytes_before", b["weight_bytes"], "B", "weighted layers"),
            _host_metric("weight_bytes_after", a["weight_bytes"], "B", "weighted layers"),
        ],
    }


# ---- 10. layer diff ----------------------------------------------------------------------------
def layerdiff(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """FP32 vs host QDQ vs the HTP, tensor by tensor, on held-out windows of the prefill graph:
    where the errors jump and where host QDQ and the HTP part."""
    from studio.core.layerdiff import PAIR_TITLES, summarize
    from studio.engine.layerdiff import layer_diff

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = _spec(export_dir)
    P = int(spec["prompt_length"])
    chip, dev = ctx.chip, ctx.device
    text = _read_text(ctx.path("validation.heldout_text"), "held-out text")
    ids = _tokenizer(export_dir)(text).input_ids
    want = ctx.get("layerdiff.windows")
    windows = [ids[i * P:(i + 1) * P] for i in range(min(want, len(ids) // P))]
    if not windows:
        raise StudioError(f"the held-out text gives {len(ids)} tokens, fewer than one prefill "
                          f"window of P={P}: use a longer text")
    if len(windows) < want:
        progress.log(f"warning: the held-out text gives {len(windows)} window(s) of {P} "
                     f"tokens, not {want}")
    data = layer_diff(export_dir, qdir, windows, mode=ctx.get("layerdiff.tensors"),
                      htp={"chip": chip, "fp16": ctx.fp16, "extra_options": _htp_options(ctx),
                           "base": cdir / "prefill_ctx.onnx"},
                      work_parent=ctx.out, progress=progress)
    seconds = data.pop("seconds")  # a run fact: kept out of the artifact
    ctx.fact("layerdiff_seconds", seconds["total"], "s",
             f"{data['probes']} tensors x {len(windows)} windows; HTP "
             f"{seconds.get('htp_probed', 0.0):.1f} s with extra outputs, "
             f"{seconds.get('htp', 0.0):.1f} s without")
    s = summarize(data)
    data["summary"] = {k: v for k, v in s.items() if k != "line"}
    atomic_write_json(ctx.out / "layerdiff.json", data)
    progress.log(f"layer diff: {s['line']}")
    changed = [k for k, v in data["extra_outputs"].items() if not v["logits_identical"]]
    if changed:
        progress.log("warning: the extra outputs changed the final logits of "
                     + ", ".join(changed) + ": their figures are not the plain graph's")
    lg = data["logits"]
    where = (f"prefill graph, {len(windows)} held-out window(s) of {P} tokens, "
             f"{data['probes']} tensors")

    def host(name: str, value: float, unit: str, detail: str) -> dict[str, Any]:
        return _metric(name, value, unit, "measured", "host-cpu", chip.key, detail)

    def boundary_max(pair: str) -> float:
        return max(s["curves"][pair]["rel_error"])

    metrics = [
        host("layerdiff_kl_host_qdq", lg["qdq"]["kl_divergence"], "nats",
                     f"host QDQ, graph optimizations off, {where}"),
        host("layerdiff_kl_host_qdq_ort_default", lg["qdq_default"]["kl_divergence"],
                     "nats", f"host QDQ, ONNX Runtime's default optimizations (as validate), "
                             f"{where}"),
        host("layerdiff_top1_host_qdq", lg["qdq"]["top1_agreement"], "fraction", where),
        host("layerdiff_boundary_rel_error_max_host_qdq", boundary_max("qdq_vs_fp32"),
                     "", "largest ||QDQ - FP32|| / ||FP32|| between blocks"),
        _device_metric(dev, "layerdiff_kl_htp", lg["htp"]["kl_divergence"], "nats", where),
        _device_metric(dev, "layerdiff_top1_htp", lg["htp"]["top1_agreement"], "fraction",
                       where),
        _device_metric(dev, "layerdiff_boundary_rel_error_max_htp", boundary_max("htp_vs_fp32"),
                       "", "largest ||HTP - FP32|| / ||FP32|| between blocks"),
        _device_metric(dev, "layerdiff_boundary_rel_error_max_htp_vs_host_qdq",
                       boundary_max("htp_vs_qdq"), "",
                       "largest ||HTP - QDQ|| / ||QDQ|| between blocks"),
        _device_metric(dev, "layerdiff_extra_outputs_logits_change_htp",
                       data["extra_outputs"]["htp"]["logits_max_abs_change"], "",
                       "max |logits with extra outputs - compiled context's logits|"),
    ]
    return {
        "summary": s["line"], "target": chip.key, "device": dev.name, "device_id": dev.id,
        "source": dev.source, "graph": "prefill", "tensors": data["tensors"],
        "windows": len(windows), "window_tokens": P, "probes": data["probes"],
        "pairs": data["pairs"], "pair_titles": {p: PAIR_TITLES[p] for p in data["pairs"]},
        "curves": s["curves"], "first_jump": s["first_jump"], "parting": s.get("parting"),
        "worst": s["worst"], "apart": s.get("apart", []), "logits": lg,
        "extra_outputs": data["extra_outputs"], "files": ["layerdiff.json"],
        "metrics": metrics,
    }


# ---- bundle ----------------------------------------------------------------------------------
def bundle_prompts(text: str, tok, n: int, length: int = 12, long: int = 0) -> list[str]:
    """``n`` held-out prompts starting at lines spread evenly over the text (no two starting
    alike), each ``length`` tokens long (running on over line ends) — the last one ``long``
    tokens when that is larger (a prompt longer than the AR-N prefill graph takes at once)."""
    starts, offset = [], 0
    for line in text.splitlines(keepends=True):
        if len(line.strip()) > 8 and not line[0].isspace():
            starts.append(offset)
        offset += len(line)
    wants = [length] * n
    if long > length:
        wants[-1] = long
    spread = [int(i * len(starts) / n) for i in range(n)]
    order = spread + [i for i in range(len(starts)) if i not in spread]
    out: list[str] = []
    for i in order:
        want = wants[len(out)]
        ids = tok(text[starts[i]:starts[i] + 40 * want]).input_ids
        if len(ids) < want:
            continue
        prompt = tok.decode(ids[:want])
        if len(tok(prompt).input_ids) == want and all(prompt[:8] != o[:8] for o in out):
            out.append(prompt)
        if len(out) == n:
            break
    if len(out) < n:
        raise StudioError(f"the held-out text gives {len(out)} prompts, the bundle check wants "
                          f"{n}: use a longer text or fewer bundle.prompts")
    return out


def _compile_in_order(graph: Path, folder: Path, chip, after: str, tries: int = 16):
    """Compile ``graph`` so that its QNN graph name sorts after ``after``: Genie takes the
    graphs of a split bundle in the order of their names, and the QNN EP names a graph from
    a hash of the model file's name — so a part is compiled under another file name until it
    sorts after the part before it (the first part until its hash starts with 1, which leaves
    the others room). Returns (the compile result, the graph name)."""
    import onnx

    from studio.engine import qnn

    prefix = "QNNExecutionProvider_QNNExecutionProvider_"
    for salt in range(tries):
        src = folder / f"{graph.stem}_{salt}.onnx"
        src.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(graph, src)
        comp = qnn.compile_context(src, folder / "ctx" / f"{src.stem}_ctx.onnx", chip,
                                   embed=False)
        name = onnx.load(comp["ctx_path"], load_external_data=False).graph.node[0].name
        first_ok = bool(after) or not name.startswith(prefix) or name[len(prefix):][:1] == "1"
        if name > after and first_ok:
            return comp, name
    raise StudioError(f"could not give the Genie graph {graph.name} a name that sorts after "
                      f"the previous part's in {tries} tries: build with fewer parts")


#: Genie and the studio's runtime run the same context binaries, yet their logits can
#: differ by about 0.01 (measured: a 0.0095 gap between the best two tokens flipped on the
#: small sample in some builds). A parting where the studio's best two tokens lie closer than
#: this, and Genie took the second, is a near tie, not a defect of the bundle.
GENIE_TIE_GAP = 0.05


def _parting(genie_text: str, ref: list[int], runner_up: list[tuple[int, float]],
             tok) -> dict[str, Any]:
    """Where Genie's text leaves the studio's tokens ``ref``: the token index, the studio's
    gap between its best and second-best token there, and whether Genie took that second
    token at a gap within :data:`GENIE_TIE_GAP` (a near tie)."""
    t = next((k for k in range(len(ref)) if not genie_text.startswith(tok.decode(ref[:k + 1]))),
             len(ref))
    if t >= len(runner_up):
        return {"token": t, "gap": None, "near_tie": False}
    second, gap = runner_up[t]
    rest = genie_text[len(tok.decode(ref[:t])):]
    took_second = bool(rest) and (rest.startswith(tok.decode([second]))
                                  or tok.decode([second]).startswith(rest))
    return {"token": t, "gap": round(gap, 5), "near_tie": took_second and gap <= GENIE_TIE_GAP}


def _genie_prefill_graph(ctx: StageContext, spec: dict[str, Any], N: int, cl: int,
                         work: Path, progress: Progress) -> Path:
    """The AR-N prefill graph: exported from the checkpoint with N new tokens over CL - N
    cache slots, quantized with the recipe and the decode graph's activation scales, in
    Genie's conventions."""
    from studio.engine import genie
    from studio.engine.calibration import ar_calibration_feeds, calibration_windows
    from studio.engine.llm_export import export_ar_graph
    from studio.engine.quantize import quantize_like

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    progress.update(0.0, f"exporting the AR-{N} prefill graph ({cl - N} cache slots)")
    export_ar_graph(ctx.path("model.source"), spec, N, cl - N, work / f"prefill_ar{N}.onnx")
    progress.update(0.5, f"quantizing the AR-{N} prefill graph with the decode graph's scales")
    text = _read_text(ctx.path("quantization.calibration_text"), "calibration text")
    windows = calibration_windows(text, export_dir / "tokenizer",
                                  length=int(spec["context_length"]),
                                  count=int(ctx.get("quantization.calibration_samples")),
                                  min_length=N + 2)
    feeds = ar_calibration_feeds(export_dir, spec, windows, N, cl - N)
    quantize_like(work / f"prefill_ar{N}.onnx", work / f"prefill_ar{N}_q.onnx",
                  qdir / "decode.onnx", _recipe(ctx), feeds)
    out = work / f"prefill_ar{N}_genie.onnx"
    genie.genie_graph(work / f"prefill_ar{N}_q.onnx", out, spec)
    return out


def bundle(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """A Genie bundle for the target chip: the quantized decode graph (AR-1) and an AR-N
    prefill graph with the same context, in Genie's conventions and compiled,
    ``genie_config.json``, ``tokenizer.json``, a manifest and a README; then Genie itself (the
    wheel's libGenie.so, on the HTP simulator) loads the bundle and its greedy text is
    compared with the studio's runtime over the same graphs on held-out prompts."""
    import hashlib
    import platform

    from studio.engine import genie, qnn

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    chip = ctx.chip
    spec = _spec(export_dir)
    if ctx.fp16:
        raise StudioError("a Genie bundle is made from a quantized graph: use a W8A16, W8A8 or "
                          "W4A16 scheme, not FP16")
    if spec.get("sliding_window") and spec["sliding_window"] < spec["context_length"]:
        raise StudioError("this model has sliding-window layers: Genie bundles of them are not "
                          "supported yet")
    C = int(spec["context_length"])
    cl = C + 1
    N = int(ctx.get("bundle.prefill_length")) or int(spec["prompt_length"])
    if N >= cl - 1:
        raise StudioError(f"bundle.prefill_length {N} leaves no room in the context of {cl}: "
                          f"choose 1 (no prefill graph) to {cl - 2}")
    out = ctx.out / "bundle"
    work = ctx.out / "work"
    progress.update(0.02, "rewriting the decode graph to Genie's conventions")
    genie.genie_graph(qdir / "decode.onnx", work / "decode_genie.onnx", spec)
    variants = {1: work / "decode_genie.onnx"}
    if N > 1:
        variants = {N: _genie_prefill_graph(ctx, spec, N, cl, work,
                                            SubProgress(progress, 0.03, 0.12)),
                    **variants}
    weights = sum(f.stat().st_size for f in qdir.glob("decode.onnx*"))
    parts = int(ctx.get("bundle.parts")) or max(
        1, -(-weights // (int(ctx.get("bundle.max_context_mb")) << 20)))
    out.mkdir(parents=True, exist_ok=True)
    ctx_names: list[str] = []
    graph_rows: list[dict[str, Any]] = []
    sessions: dict[int, list[Any]] = {}
    compiled: list[tuple[Path, str]] = []
    total = len(variants) * parts
    for ar, graph in variants.items():
        kind = "decode" if ar == 1 else "prefill"
        graphs = [graph]
        if parts > 1:
            progress.update(0.12, f"splitting the AR-{ar} graph into {parts} parts of "
                                  "consecutive blocks")
            graphs = genie.split_graph(graph, work / f"parts{ar}", spec, parts)
        previous = ""
        for i, part in enumerate(graphs):
            progress.update(0.13 + 0.12 * len(compiled) / total,
                            f"compiling the AR-{ar} graph"
                            + (f", part {i + 1}/{parts}" if parts > 1 else "")
                            + f" for {chip.name}")
            comp, previous = _compile_in_order(part, work / "ctx" / f"{ar}_{i}", chip, previous)
            sdk = comp["sdk_version"]
            name = (f"{kind}_ar{ar}_cl{cl}.bin" if parts == 1 else
                    f"{kind}_ar{ar}_cl{cl}_part{i + 1}_of_{parts}.bin")
            sessions.setdefault(ar, []).append(
                qnn.make_session(Path(comp["ctx_path"]), chip, strict=True))
            compiled.append((Path(comp["bin_files"][0]), name))
            ctx_names.append(name)
            graph_rows.append({"file": name, "kind": kind, "ar": ar, "context_size": cl,
                               "part": i + 1, "parts": parts, **genie.graph_io(part),
                               "qnn_graph": previous})

    tok = _tokenizer(export_dir)
    text = _read_text(ctx.path("validation.heldout_text"), "held-out text")
    n_prompts = int(ctx.get("bundle.prompts"))
    prompts = bundle_prompts(text, tok, n_prompts,
                             long=N + N // 2 + 1 if N > 1 and n_prompts > 1 else 0)
    want = int(ctx.get("bundle.new_tokens"))
    # the studio's runtime over the bundle's own graphs, before they move into the bundle
    runner = genie.BundleRunner(sessions, spec, cl)
    refs, ups = [], []
    for i, prompt in enumerate(prompts):
        progress.check()
        ids = tok(prompt).input_ids
        n = max(1, min(want, cl - 1 - len(ids)))
        progress.update(0.25 + 0.25 * i / len(prompts),
                        f"prompt {i + 1}/{len(prompts)}: {n} tokens from the studio's runtime "
                        "over the bundle's graphs")
        refs.append((ids, n, runner.greedy(ids, n), runner.prompt_passes))
        ups.append(list(runner.runner_up))
    passes = dict(runner.passes)
    del runner, sessions
    for src, name in compiled:
        shutil.move(src, out / name)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copy(export_dir / "tokenizer" / "tokenizer.json", out / "tokenizer.json")
    cfg = genie.genie_config(spec, ctx_names)
    atomic_write_json(out / "genie_config.json", cfg)

    progress.update(0.5, "loading the bundle in Genie (HTP simulator)")
    ref_gen = _htp_generator(cdir, chip, spec, False)
    checks = []
    with genie.GenieDialog(out) as dialog:
        for i, (prompt, (ids, n, ref, prompt_passes)) in enumerate(zip(prompts, refs,
                                                                         strict=True)):
            progress.check()
            progress.update(0.5 + 0.45 * i / len(prompts),
                            f"prompt {i + 1}/{len(prompts)}: {n} tokens from Genie")
            g = dialog.query(prompt, n)
            ref_text = tok.decode(ref)
            same = g["text"] == ref_text
            prefix = next((k for k, (a, b) in enumerate(zip(g["text"], ref_text, strict=False))
                           if a != b), min(len(g["text"]), len(ref_text)))
            # and the studio's own path (its prefill graph of P tokens, then its decode graph),
            # for reference: other graphs with their own quantization can part at a near tie
            ref_gen.reset()
            pre = tok.decode(ref_gen.greedy(ids, n, eos_id=spec.get("eos_token_id"))["tokens"])
            parted = None if same else _parting(g["text"], ref, ups[i], tok)
            if parted is not None:
                progress.log(f"prompt {i + 1}: Genie gave {g['text']!r}, the studio's runtime "
                             f"over the same graphs {ref_text!r} ({parted})")
            checks.append({"prompt": prompt, "prompt_tokens": len(ids), "new_tokens": n,
                           "studio_tokens": len(ref), "identical": same,
                           "prompt_passes": prompt_passes,
                           "first_difference_at_char": None if same else prefix,
                           "parted": parted,
                           "genie_text": g["text"], "studio_text": ref_text,
                           "same_as_prefill_path": pre == g["text"],
                           "genie_wall_s": g["wall_s"], "genie_first_text_s": g["first_text_s"]})
        load_s = dialog.load_s
    identical = sum(c["identical"] for c in checks)
    ties = [c for c in checks if c["parted"] and c["parted"]["near_tie"]]
    via_prefill = sum(c["same_as_prefill_path"] for c in checks)
    tokens = sum(c["studio_tokens"] for c in checks)
    rate = tokens / sum(c["genie_wall_s"] for c in checks)

    def sha(f: Path) -> str:
        return hashlib.sha256(f.read_bytes()).hexdigest()

    files = {f.name: {"bytes": f.stat().st_size, "sha256": sha(f)}
             for f in sorted(out.iterdir()) if f.is_file()}
    from importlib.metadata import version

    manifest = {
        "format": "genie-bundle", "version": 1, "model": spec.get("model_type"),
        "chip": {"key": chip.key, "name": chip.name, "htp_arch": chip.htp_arch,
                 "soc_model": chip.soc_model},
        "qnn_sdk": sdk, "onnxruntime_qnn": version("onnxruntime-qnn"),
        "built_on": platform.platform(),
        "recipe": {k: ctx.get(f"quantization.{k}") for k in ("scheme", "weight_granularity")},
        "context_size": cl, "prefill_ar": N if N > 1 else None,
        "graphs": graph_rows,
        "weights_bytes": weights,
        "files": files,
        "verification": {"runtime": "Genie (libGenie.so) on the QNN HTP simulator",
                         "reference": "the studio's runtime over the bundle's graphs",
                         "source": "simulated", "prompts": len(checks),
                         "identical": identical, "tokens": tokens,
                         "same_as_prefill_path": via_prefill},
    }
    progress.update(0.96, "writing the DLC files of the quantized graphs")
    dlc = {}
    for kind in ("prefill", "decode"):
        dlc[kind] = qnn.export_dlc(qdir / f"{kind}.onnx", chip, ctx.out / "dlc" / f"{kind}.dlc")
    manifest["dlc"] = {**{g: {k: d[k] for k in ("file", "bytes")} for g, d in dlc.items()},
                       "note": "for Qualcomm's on-device tools; not runnable on this host"}
    atomic_write_json(out / "manifest.json", manifest)
    (out / "README.md").write_text(
        f"# Genie bundle: {spec.get('model_type')} for {chip.name}\n\n"
        f"Built by QStudio with QNN SDK {sdk}. On the device, with the QAIRT "
        "SDK's `genie-t2t-run` and its HTP libraries beside these files:\n\n"
        "```\ngenie-t2t-run -c genie_config.json -p \"def fibonacci(n):\"\n```\n\n"
        + (f"The prompt goes through the AR-{N} prefill graph, {N} tokens per pass, and new "
           "tokens through the AR-1 decode graph; both " if N > 1 else
           "Prompts and new tokens go through the AR-1 decode graph one token per pass; it ")
        + f"{'hold' if N > 1 else 'holds'} a context of {cl} positions"
        + (f", each in {parts} context binaries of consecutive blocks" if parts > 1 else "")
        + f": {', '.join(f'`{n}`' for n in ctx_names)}. "
        "`manifest.json` lists every file with its SHA-256 and the check against the studio's "
        "runtime on the HTP simulator.\n")
    note = "Genie's wall time on the HTP simulator: follows the host CPU, not device latency"
    metrics = [
        _metric("genie_identical_prompts", identical / len(checks), "fraction", "simulated",
                "htp-sim", chip.key, f"{identical} of {len(checks)} prompts, {tokens} tokens, "
                "against the studio's runtime over the bundle's own graphs"),
        _metric("genie_same_as_prefill_path", via_prefill / len(checks), "fraction",
                "simulated", "htp-sim", chip.key, "against the studio's runtime with its own "
                "prefill graph (other graphs: may part at a near tie)"),
        _metric("genie_tokens_per_s", rate, "tok/s", "simulated", "htp-sim", chip.key, note),
        _metric("genie_load_s", load_s, "s", "simulated", "htp-sim", chip.key, note),
    ]
    bad = [c for c in checks if not c["identical"] and c not in ties]
    if bad:
        p = bad[0]["parted"]
        raise StudioError(f"Genie's greedy text differs from the studio's on {len(bad)} of "
                          f"{len(checks)} prompts (first at character "
                          f"{bad[0]['first_difference_at_char']} of {bad[0]['prompt']!r}, "
                          f"new token {p['token']}" + (f", where the studio's best two tokens "
                          f"are {p['gap']:.3g} apart" if p["gap"] is not None else "") + ")")
    return {
        "summary": (f"Genie bundle for {chip.name}: {len(files) + 2} files"
                    + (f" ({len(ctx_names)} context binaries)" if len(ctx_names) > 1 else "")
                    + ", Genie's greedy text "
                    f"equals the studio's on {identical}/{len(checks)} prompts ({tokens} tokens, "
                    "simulated"
                    + (f"; parted at a near tie on {len(ties)}: best two logits "
                       + ", ".join(f"{c['parted']['gap']:.3g}" for c in ties) + " apart"
                       if ties else "")
                    + f"; with the studio's own prefill graph {via_prefill}/{len(checks)})"),
        "target": chip.key, "source": "simulated", "bundle": "bundle", "files": files,
        "checks": checks, "context_size": cl, "qnn_sdk": sdk, "prefill_ar": N if N > 1 else None,
        "studio_passes": {f"ar{k}": v for k, v in passes.items()},
        "ctx_bins": ctx_names,
        "dlc": {g: {"file": f"dlc/{d['file']}", "bytes": d["bytes"], "entries": d["entries"]}
                for g, d in dlc.items()},
        "metrics": metrics,
    }


STAGE_FUNCTIONS: dict[str, Callable[[StageContext, Progress], dict[str, Any]]] = {
    "export": export, "quantize": quantize, "compile": compile_, "validate": validate,
    "run": run, "profile": profile, "report": report, "draft": draft, "ablation": ablation,
    "waterfall": waterfall,
    "sensitivity": sensitivity, "autoprecision": autoprecision, "layerdiff": layerdiff,
    "bundle": bundle, **graph_stages.STAGE_FUNCTIONS,
}


def _history(spec: dict[str, Any]) -> dict[str, Any]:
    """The run history facts a stage may read: this run's settings and the comparison with
    the previous run (read-only)."""
    h = spec.get("history") or {}
    if not h.get("db") or not Path(h["db"]).exists() or h.get("run_id") is None:
        return {}
    from studio.core.jobs import JobStore

    store = JobStore(Path(h["db"]))
    try:
        run = store.run(int(h["run_id"]))
        out: dict[str, Any] = {"settings": (run or {}).get("config", {}).get("settings"),
                               "sweeps": h.get("sweeps")}
        if run is not None:
            out["run"] = {"id": run["id"], "state": run["state"], "created": run["created"],
                          "finished": run.get("finished"), "settings_recorded": bool(
                              (run.get("config") or {}).get("settings"))}
        try:
            from studio.core.compare import compare_with_previous

            out["comparison"] = compare_with_previous(store, int(h["run_id"]))
        except ImportError:
            pass
        return out
    finally:
        store.close()


def run_in_process(project, job, inputs: dict[str, Path], out: Path,
                   progress: Progress) -> dict[str, Any]:
    """Run one planned job here, without a worker (benchmarks, experiments): the stage sees
    the same frozen config the pipeline would hand it."""
    from studio.core.stagegraph import stage_config

    ctx = StageContext(stage_config(project, job), dict(inputs), Path(out))
    result = STAGE_FUNCTIONS[job.stage](ctx, progress)
    atomic_write_json(ctx.out / "result.json", result)
    return result


def run_stage(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Entry point of the worker: build the context from the job spec and run the stage.

    Returns ``{"result": ..., "facts": [...]}``: the result is written into the artifact;
    the facts (timings of this run) go to the run history only."""
    config = StageConfig.from_dict(spec["config"])
    ctx = StageContext(config, {k: Path(v) for k, v in spec.get("inputs", {}).items()},
                       Path(spec["workdir"]),
                       _history(spec) if config.stage == "report" else {})
    fn = STAGE_FUNCTIONS[config.stage]
    result = fn(ctx, progress)
    atomic_write_json(ctx.out / "result.json", result)
    return {"result": result, "facts": ctx.facts}
