"""The validate stage: FP32, host QDQ and the target's compiled context compared on held-out
text (logits, perplexity, greedy agreement)."""

from __future__ import annotations

import math
from typing import Any

from studio.core.errors import StudioError
from studio.core.progress import Progress, SubProgress
from studio.engine.llm_runtime import cpu_generator, load_graph_spec, load_tokenizer
from studio.worker.context import StageContext, device_metric, host_metric, read_text


def _logit_stats(ref, other):
    import numpy as np

    a = ref.astype(np.float64)
    b = other.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return cos, float(np.abs(a - b).max()), (a.argmax(-1) == b.argmax(-1))


def nll(logits, ids):
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


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:

    import numpy as np

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = load_graph_spec(export_dir)
    chip = ctx.chip
    dev = ctx.device
    greedy_tokens = ctx.get("validation.greedy_tokens")
    text = read_text(ctx.path("validation.heldout_text"), "held-out text")
    tok = load_tokenizer(export_dir)
    ids = tok(text).input_ids[: ctx.get("validation.heldout_tokens")]
    if len(ids) < 16:
        raise StudioError("the held-out text gives fewer than 16 tokens: use a longer text")
    window = spec["context_length"]
    windows = [ids[i:i + window] for i in range(0, len(ids), window)]
    windows = [w for w in windows if len(w) >= 2]
    fp16 = ctx.fp16
    runners = {
        "fp32": cpu_generator(export_dir, spec),
        "host_qdq": cpu_generator(qdir, spec),
        "htp": ctx.backend.open_generator(export_dir, cdir, spec, fp16),
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
        sum_nll = cnt = 0.0
        for w, lg in zip(windows, logits[name], strict=True):
            a, b = nll(lg, w)
            sum_nll, cnt = sum_nll + a, cnt + b
        ppl[name] = math.exp(sum_nll / cnt)
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
        device_metric(dev, "logits_cosine_mean", h["logits_cosine_mean"], ""),
        device_metric(dev, "logits_max_abs_error", h["logits_max_abs_error"], ""),
        device_metric(dev, "top1_agreement", h["top1_agreement"], "fraction"),
        device_metric(dev, "perplexity_quantized", ppl["htp"], ""),
        device_metric(dev, "greedy_agreement", g["agreement"], "fraction",
                       f"{g['prompts']} prompts x {greedy_tokens} tokens, position by position"),
        device_metric(dev, "greedy_prefix_agreement", g["prefix"], "fraction",
                       "tokens identical before the first divergence"),
        host_metric("perplexity_fp32", ppl["fp32"]),
        host_metric("perplexity_host_qdq", ppl["host_qdq"]),
        host_metric("logits_cosine_host_qdq", res["host_qdq"]["logits_cosine_mean"]),
        host_metric("top1_agreement_host_qdq", res["host_qdq"]["top1_agreement"], "fraction"),
    ]
    res["summary"] = (f"cosine {h['logits_cosine_mean']:.4f}, top-1 {h['top1_agreement']:.1%}, "
                      f"ppl {ppl['fp32']:.2f} → {ppl['htp']:.2f} on {dev.name} ({dev.source})")
    return res
