"""The validate stage: FP32, host QDQ and the target's compiled context compared on held-out
text (logits, perplexity, greedy agreement)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.progress import Progress, SubProgress
from studio.core.stages.validate import ValidateSettings
from studio.engine import vision, vision_input
from studio.engine.chat_template import prompt_format
from studio.engine.llm_runtime import (
    cpu_generator,
    load_graph_spec,
    load_tokenizer,
    make_cpu_session,
)
from studio.engine.part_runner import StreamedScorer
from studio.engine.sensitivity import greedy_against_fp32
from studio.worker.context import StageContext, device_metric, host_metric, read_text


def _logit_stats(ref, other):
    a = ref.astype(np.float64)
    b = other.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return cos, float(np.abs(a - b).max()), (a.argmax(-1) == b.argmax(-1))


def nll(logits, ids):
    x = logits[:-1].astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum()), len(ids) - 1


def greedy_prompt(ctx: StageContext, tok, spec: dict[str, Any]):
    """The greedy check's first prompt: ``run.prompt`` as the runtimes take it, through the
    checkpoint's chat template (``model.chat_template``; whole, the preflight has checked
    that it fits) or as written (its first P tokens, one prefill pass). Returns (ids, the
    prompt format)."""
    s = ValidateSettings.of(ctx.config)
    fmt = prompt_format(ctx.input("export") / "tokenizer", s.chat_template)
    ids = fmt.ids(tok, s.prompt, vision=bool(spec.get("vision")))
    return (ids if fmt.applied else ids[:int(spec["prompt_length"])]), fmt


def _greedy_agreement(ref, other, tok, first: list[int], heldout: list[int], prompt_len: int,
                      n: int, progress: Progress, extra_prompts: int = 3) -> dict[str, Any]:
    """Greedy generation from the project's prompt (``first``: its ids) and a few held-out
    prompts on both runtimes: the fraction of identical tokens position by position, and
    before the first divergence (one near-tie flip early on shifts everything after it)."""
    prompts = [first]
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


def _format_said(fmt) -> str:
    """How the greedy check's first prompt went in, for its figures' detail."""
    return ("the first is run.prompt through the chat template (" + fmt.template.source + ")"
            if fmt.applied else "run.prompt as written")


#: what the device scores of a model in parts when validation.device_tokens is 0
DEVICE_SLICE_IN_PARTS = 64


def _windows(ids: list[int], window: int) -> list[list[int]]:
    """``ids`` in windows of the context length (a last one of one token is dropped)."""
    out = [ids[i:i + window] for i in range(0, len(ids), window)]
    return [w for w in out if len(w) >= 2]


def _perplexity(windows: list[list[int]], logits: list) -> float:
    sum_nll = cnt = 0.0
    for w, lg in zip(windows, logits, strict=True):
        a, b = nll(lg, w)
        sum_nll, cnt = sum_nll + a, cnt + b
    return math.exp(sum_nll / cnt)


def _compare(ref: list, other: list) -> dict[str, float]:
    cos, maxerr, same = [], 0.0, []
    for r, o in zip(ref, other, strict=True):
        c, m, s = _logit_stats(r, o)
        cos.append(c)
        same.append(s)
        maxerr = max(maxerr, m)
    cos_all, same_all = np.concatenate(cos), np.concatenate(same)
    return {"logits_cosine_mean": float(cos_all.mean()),
            "logits_cosine_min": float(cos_all.min()), "logits_max_abs_error": maxerr,
            "top1_agreement": float(same_all.mean())}


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:

    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    spec = load_graph_spec(export_dir)
    chip = ctx.chip
    dev = ctx.device
    s = ValidateSettings.of(ctx.config)
    greedy_tokens = s.greedy_tokens
    text = read_text(s.path(s.heldout_text), "held-out text")
    tok = load_tokenizer(export_dir)
    ids = tok(text).input_ids[: s.heldout_tokens]
    if len(ids) < 16:
        raise StudioError("the held-out text gives fewer than 16 tokens: use a longer text")
    if len(spec.get("parts") or []) > 1:
        return _validate_in_parts(ctx, progress, spec, tok, ids)
    window = spec["context_length"]
    windows = _windows(ids, window)
    fp16 = s.fp16
    runners = {
        "fp32": cpu_generator(export_dir, spec),
        "host_qdq": cpu_generator(qdir, spec),
        "htp": ctx.backend.open_generator(export_dir, cdir, spec, fp16),
    }
    logits, total = _teacher_forced(runners, windows, progress)
    res: dict[str, Any] = {"tokens": len(ids), "windows": len(windows), "target": chip.key,
                           "device": dev.name, "device_id": dev.id, "source": dev.source}
    ppl = {name: _perplexity(windows, logits[name]) for name in runners}
    for name in ("host_qdq", "htp"):
        res[name] = {**_compare(logits["fp32"], logits[name]), "perplexity": ppl[name]}
    progress.update(total / (total + 1), "greedy agreement")
    first, fmt = greedy_prompt(ctx, tok, spec)
    g = _greedy_agreement(runners["fp32"], runners["htp"], tok, first, ids,
                          spec["prompt_length"], greedy_tokens, progress,
                          extra_prompts=s.greedy_prompts - 1)
    h = res["htp"]
    res.update(
        logits_cosine_mean=h["logits_cosine_mean"], top1_agreement=h["top1_agreement"],
        perplexity_fp32=ppl["fp32"], perplexity_quantized=ppl["htp"],
        perplexity_host_qdq=ppl["host_qdq"], greedy_agreement=g["agreement"],
        greedy_prefix_agreement=g["prefix"], greedy_prompts=g["prompts"],
        greedy_fp32=g["fp32"], greedy_htp=g["htp"], greedy_prompt_format=fmt.to_json(),
    )
    res["metrics"] = _metrics(dev, res, ppl, g, greedy_tokens, _format_said(fmt))
    res["summary"] = (f"cosine {h['logits_cosine_mean']:.4f}, top-1 {h['top1_agreement']:.1%}, "
                      f"ppl {ppl['fp32']:.2f} → {ppl['htp']:.2f} on {dev.name} ({dev.source})")
    if spec.get("vision"):
        _add_images(res, dev, _validate_images(ctx, spec, export_dir, cdir, runners, ids,
                                               progress))
    return res


def _teacher_forced(runners: dict[str, Any], windows: list[list[int]], progress: Progress
                    ) -> tuple[dict[str, list], int]:
    """Each runner's teacher-forced logits of each window, and the count of the passes."""
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
    return logits, total


def _metrics(dev, res: dict[str, Any], ppl: dict[str, float], g: dict[str, Any],
             greedy_tokens: int, said: str) -> list[dict[str, Any]]:
    """The stage's metrics: the target's against FP32, and the host's figures."""
    h = res["htp"]
    return [
        device_metric(dev, "logits_cosine_mean", h["logits_cosine_mean"], ""),
        device_metric(dev, "logits_max_abs_error", h["logits_max_abs_error"], ""),
        device_metric(dev, "top1_agreement", h["top1_agreement"], "fraction"),
        device_metric(dev, "perplexity_quantized", ppl["htp"], ""),
        device_metric(dev, "greedy_agreement", g["agreement"], "fraction",
                       f"{g['prompts']} prompts x {greedy_tokens} tokens, position by position"
                       f"; {said}"),
        device_metric(dev, "greedy_prefix_agreement", g["prefix"], "fraction",
                       f"tokens identical before the first divergence; {said}"),
        host_metric("perplexity_fp32", ppl["fp32"]),
        host_metric("perplexity_host_qdq", ppl["host_qdq"]),
        host_metric("logits_cosine_host_qdq", res["host_qdq"]["logits_cosine_mean"]),
        host_metric("top1_agreement_host_qdq", res["host_qdq"]["top1_agreement"], "fraction"),
    ]


def _add_images(res: dict[str, Any], dev, img: dict[str, Any]) -> None:
    """A vision-language model's figures on held-out images added to ``res``."""
    res["image"] = img
    # the min_output_cosine gate judges the vision encoder's rows on the held-out images
    res["output_cosine_min"] = img["encoder_cosine_min"]
    detail = (f"{img['images']} held-out images ({img['source']}), each before "
              f"{img['answer_tokens'] // max(img['images'], 1)} tokens of held-out text")
    res["metrics"] += [
        device_metric(dev, "encoder_cosine_min", img["encoder_cosine_min"], "",
                      "the vision encoder's image rows against FP32; " + detail),
        device_metric(dev, "image_answer_top1_agreement", img["top1_agreement"],
                      "fraction", "the text after an image, teacher-forced; " + detail),
        device_metric(dev, "image_answer_logits_cosine", img["logits_cosine_mean"], "",
                      "the text after an image, teacher-forced; " + detail),
        device_metric(dev, "image_answer_perplexity", img["perplexity"], "", detail),
        host_metric("image_answer_perplexity_fp32", img["perplexity_fp32"], "", detail),
    ]
    res["summary"] += (f"; with an image: encoder cosine {img['encoder_cosine_min']:.4f}, "
                       f"answer top-1 {img['top1_agreement']:.1%}")


def _validate_images(ctx: StageContext, spec: dict, export_dir, cdir, runners: dict,
                     ids: list[int], progress: Progress) -> dict[str, Any]:
    """A vision-language model on held-out images: each through the FP32 encoder and the
    device's, their rows compared; then the image before a window of the held-out text,
    teacher-forced through FP32 and the device (each with its own encoder's rows), compared
    on the text after the image (the answer's tokens)."""
    vs = vision_input.vision_spec(spec)
    assert vs is not None
    s = ValidateSettings.of(ctx.config)
    images = vision.images_for(s.path(s.heldout_images) if s.heldout_images else None,
                               2, vs, seed=1000)
    fp32_enc = vision.encoder_session(export_dir)
    dev_enc = ctx.backend.open_encoder(export_dir, cdir, spec, s.fp16)
    C = int(spec["context_length"])
    cos, ref_l, dev_l, answers = [], [], [], []
    for i, img in enumerate(images):
        progress.check()
        progress.update(0.95, f"held-out image {i + 1}/{len(images)}: encoder and answer")
        px = vision_input.image_patches(img, vs)
        rows_ref, rows_dev = vision.encode(fp32_enc, px, vs), vision.encode(dev_enc, px, vs)
        cos.append(vision.cosine(rows_dev, rows_ref))
        # each image before its own stretch of the held-out text (overlapping when short)
        room = C - px.tokens - 2
        start = min(i * len(ids) // (2 * len(images)), max(0, len(ids) - 16))
        text = ids[start:start + room]
        prompt = vision_input.image_prompt(vs, [], text, px.tokens)
        first = px.tokens + 1  # the row of <|vision_end|>: it predicts the first text token
        got = []
        for name, rows in (("fp32", rows_ref), ("htp", rows_dev)):
            runners[name].set_image(rows, px.llm_grid)
            got.append(runners[name].teacher_forced_logits(prompt)[first:])
        ref_l.append(got[0])
        dev_l.append(got[1])
        answers.append(np.asarray(prompt[first:], dtype=np.int64))  # <|vision_end|>, text
    # the rows that predict the answer's tokens (the last row predicts past the text)
    cmp = _compare([r[:-1] for r in ref_l], [d[:-1] for d in dev_l])

    def ppl(logits: list) -> float:
        scored = [nll(lg, a) for lg, a in zip(logits, answers, strict=True)]
        return float(np.exp(sum(t for t, _ in scored) / sum(n for _, n in scored)))

    return {"images": len(images),
            "source": "the project's folder" if s.heldout_images else "generated here",
            "encoder_cosine_min": float(min(cos)), "encoder_cosine_mean": float(np.mean(cos)),
            "answer_tokens": int(sum(len(a) - 1 for a in answers)),
            "logits_cosine_mean": cmp["logits_cosine_mean"],
            "top1_agreement": cmp["top1_agreement"],
            "perplexity": ppl(dev_l), "perplexity_fp32": ppl(ref_l)}


def _validate_in_parts(ctx: StageContext, progress: Progress, spec: dict, tok,
                       ids: list[int]) -> dict[str, Any]:
    """Validation of a model in parts that scales with its size: FP32 and the host QDQ graphs
    score every held-out token part by part (one part's graphs in memory at a time:
    :class:`studio.engine.part_runner.StreamedScorer`), the device scores the first
    ``validation.device_tokens`` of them (the chained compiled parts), and the device is
    judged against FP32 on those same tokens. The greedy check generates on the device and
    scores that text with FP32 part by part: the tokens before the first divergence are
    exactly those of FP32's own greedy text; after it, each token is FP32's choice given the
    device's text. Every figure says which tokens it is on."""
    export_dir, qdir = ctx.input("export"), ctx.input("quantize")
    cdir = ctx.input("compile", ctx.config.chip)
    dev = ctx.device
    window = int(spec["context_length"])
    s = ValidateSettings.of(ctx.config)
    n_dev = min(len(ids), int(s.device_tokens or DEVICE_SLICE_IN_PARTS))
    n_dev = max(n_dev, 2)
    windows, dev_windows = _windows(ids, window), _windows(ids[:n_dev], window)
    n_parts = len(spec["parts"])
    scorers = {"fp32": StreamedScorer(export_dir, spec, make_cpu_session),
               "host_qdq": StreamedScorer(qdir, spec, make_cpu_session)}
    logits: dict[str, list] = {k: [] for k in scorers}
    steps = 2 * len(windows) + len(dev_windows) + 2
    done = 0
    for name, scorer in scorers.items():
        for w in windows:
            sub = SubProgress(progress, done / steps, (done + 1) / steps)
            sub.update(0, f"{name} part by part: {len(w)} tokens, {n_parts} parts")
            logits[name].append(scorer.teacher_forced_logits(w, progress=sub))
            done += 1
    progress.update(done / steps, f"the device: the first {n_dev} held-out tokens")
    # part by part where the device can (one part's binaries loaded at a time), else chained
    scorer = ctx.backend.part_scorer(cdir, spec, s.fp16)
    htp: Any = None
    if scorer is None:
        htp = scorer = ctx.backend.open_generator(export_dir, cdir, spec, s.fp16)
    dev_logits = []
    for w in dev_windows:
        sub = SubProgress(progress, done / steps, (done + 1) / steps)
        sub.update(0, f"{dev.name}: {len(w)} tokens through {n_parts} parts")
        dev_logits.append(scorer.teacher_forced_logits(w, progress=sub))
        done += 1
    # FP32 on the device's tokens: the first rows of its windows (causal: the same logits)
    fp32_slice = [lg[:len(w)] for lg, w in zip(logits["fp32"], dev_windows, strict=False)]
    ppl = {"fp32": _perplexity(windows, logits["fp32"]),
           "host_qdq": _perplexity(windows, logits["host_qdq"]),
           "fp32_slice": _perplexity(dev_windows, fp32_slice),
           "htp": _perplexity(dev_windows, dev_logits)}
    res: dict[str, Any] = {"tokens": len(ids), "windows": len(windows), "target": ctx.chip.key,
                           "device": dev.name, "device_id": dev.id, "source": dev.source,
                           "device_tokens": n_dev, "scored_by_part": n_parts}
    res["host_qdq"] = {**_compare(logits["fp32"], logits["host_qdq"]),
                       "perplexity": ppl["host_qdq"]}
    res["htp"] = {**_compare(fp32_slice, dev_logits), "perplexity": ppl["htp"]}
    progress.update(done / steps, "greedy agreement: the device's text scored by FP32")
    prompt, fmt = greedy_prompt(ctx, tok, spec)
    n = int(s.greedy_tokens)
    greedy_note = ""
    if htp is None:  # generation needs every part's binaries loaded at once
        try:
            htp = ctx.backend.open_generator(export_dir, cdir, spec, s.fp16)
        except StudioError as exc:
            greedy_note = (f"no greedy check: the {dev.name} cannot hold the {n_parts} parts' "
                           f"binaries at once to generate ({str(exc)[:200]})")
            progress.log(greedy_note)
    if htp is None:
        return _finish_in_parts(dev, ids, n_dev, n_parts, ppl, res, None, greedy_note)
    got = htp.greedy(prompt, min(n, window - len(prompt)))["tokens"]
    seq = (prompt + got)[:window]
    scored = scorers["fp32"].teacher_forced_logits(
        seq, progress=SubProgress(progress, (done + 1) / steps, 1.0))

    j = greedy_against_fp32(scored, prompt, got)
    first = j["first_difference"]
    g = {"agreement": j["agreement"], "prefix": j["prefix"], "prompts": 1,
         "fp32": tok.decode(got[:first] + j["fp32_choice"][first:first + 1]),
         "htp": tok.decode(got), "tokens": len(got), "said": _format_said(fmt),
         "format": fmt.to_json()}
    return _finish_in_parts(dev, ids, n_dev, n_parts, ppl, res, g, "")


def _finish_in_parts(dev, ids: list[int], n_dev: int, n_parts: int, ppl: dict[str, float],
                     res: dict[str, Any], g: dict[str, Any] | None, greedy_note: str
                     ) -> dict[str, Any]:
    """The result of :func:`_validate_in_parts`: its figures, each saying which tokens it is
    on (``g``: the greedy check, None when the device could not generate)."""
    h = res["htp"]
    res.update(
        logits_cosine_mean=h["logits_cosine_mean"], top1_agreement=h["top1_agreement"],
        perplexity_fp32=ppl["fp32_slice"], perplexity_quantized=ppl["htp"],
        perplexity_fp32_heldout=ppl["fp32"], perplexity_host_qdq=ppl["host_qdq"],
    )
    if g is not None:
        res.update(greedy_agreement=g["agreement"], greedy_prefix_agreement=g["prefix"],
                   greedy_prompts=g["prompts"], greedy_fp32=g["fp32"], greedy_htp=g["htp"],
                   greedy_prompt_format=g["format"])
    else:
        res["greedy_note"] = greedy_note
    on_dev = f"on the first {n_dev} of {len(ids)} held-out tokens"
    on_all = f"on all {len(ids)} held-out tokens, scored part by part on the host"
    greedy = [] if g is None else [
        device_metric(dev, "greedy_agreement", g["agreement"], "fraction",
                       f"{g['tokens']} tokens the device generated, each against FP32's choice "
                       f"given the device's text; {g['said']}"),
        device_metric(dev, "greedy_prefix_agreement", g["prefix"], "fraction",
                       "tokens identical to FP32's greedy text before the first divergence; "
                       + g["said"])]
    res["metrics"] = [
        device_metric(dev, "logits_cosine_mean", h["logits_cosine_mean"], "", on_dev),
        device_metric(dev, "logits_max_abs_error", h["logits_max_abs_error"], "", on_dev),
        device_metric(dev, "top1_agreement", h["top1_agreement"], "fraction", on_dev),
        device_metric(dev, "perplexity_quantized", ppl["htp"], "", on_dev),
        *greedy,
        host_metric("perplexity_fp32", ppl["fp32_slice"], "", on_dev + " (the device's)"),
        host_metric("perplexity_fp32_heldout", ppl["fp32"], "", on_all),
        host_metric("perplexity_host_qdq", ppl["host_qdq"], "", on_all),
        host_metric("logits_cosine_host_qdq", res["host_qdq"]["logits_cosine_mean"], "", on_all),
        host_metric("top1_agreement_host_qdq", res["host_qdq"]["top1_agreement"], "fraction",
                    on_all),
    ]
    res["summary"] = (f"cosine {h['logits_cosine_mean']:.4f}, top-1 {h['top1_agreement']:.1%}, "
                      f"ppl {ppl['fp32_slice']:.2f} → {ppl['htp']:.2f} on {dev.name} "
                      f"({dev.source}; the first {n_dev} held-out tokens; host QDQ ppl "
                      f"{ppl['host_qdq']:.2f} on all {len(ids)}, {n_parts} parts)"
                      + ("; no greedy check: the device cannot hold every part to generate"
                         if g is None else ""))
    return res
