"""The run stage: greedy generation from the project's prompt on one device (the host CPU,
the HTP simulator, an agent, a phone), its timings labelled from the device."""

from __future__ import annotations

import statistics
import time
from typing import Any

from studio.core import figures
from studio.core.devices import Device
from studio.core.progress import Progress
from studio.core.stages.run import RunSettings
from studio.engine.chat_template import prompt_format
from studio.engine.llm_runtime import load_graph_spec, load_tokenizer
from studio.engine.vision import image_prompt_ids, image_timing
from studio.worker.context import StageContext, device_metric


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    export_dir = ctx.input("export")
    spec = load_graph_spec(export_dir)
    tok = load_tokenizer(export_dir)
    dev, be = ctx.device, ctx.backend
    s = RunSettings.of(ctx.config)
    prompt, n = s.prompt, s.max_new_tokens
    compiled = ctx.device_input()  # a chip's compiled context, the quantized graphs, or none
    t0 = time.perf_counter()
    gen = be.open_generator(export_dir, compiled, spec, s.fp16, log=progress.log)
    load_s = time.perf_counter() - t0  # the seed's "first inference very slow": shown apart

    def on_step(i: int, token: int) -> None:
        progress.check()
        progress.update((i + 1) / n, f"token {i + 1}/{n} on {dev.name}")

    # through the checkpoint's chat template (model.chat_template): the image where it puts it
    fmt = prompt_format(export_dir / "tokenizer", s.chat_template)
    vl = bool(spec.get("vision"))
    with_image = bool(s.image) and vl
    ids, image = fmt.ids(tok, prompt, image=with_image, vision=vl), None
    if with_image:  # the picture through the encoder first

        progress.update(0.0, f"running the vision encoder on {dev.name}")
        encoder = be.open_encoder(export_dir, compiled, spec, s.fp16)
        ids, image = image_prompt_ids(spec, ids, s.path(s.image), encoder, gen)
    out = gen.greedy(ids, n, eos_id=spec.get("eos_token_id"), on_step=on_step)
    timed, prefix, note = be.run_figures(out, gen)
    what = be.describe(s.scheme)
    mode = be.run_options.get("htp_performance_mode") if dev.on_npu else None
    if mode:  # the HTP's clock vote the sessions ran with (a device's; no simulator's)
        what += f", performance mode {mode}"
        note = f"{note}; HTP performance mode {mode}" if note else f"HTP performance mode {mode}"
    result = run_result(dev, timed, tok, prompt, what, prefix, note, load_s=load_s)
    result["prompt_format"] = fmt.to_json()
    result["prompt_tokens"] = len(ids)
    if image is not None:
        # time to first token = the encoder, then the prefill of the image prompt

        image_timing(image, out, timed["prefill_s"])
        enc_note = (f"the vision encoder on one {image['resized'][0]} x "
                    f"{image['resized'][1]} px image "
                    f"({image['image_tokens']} image tokens); {note or dev.timing_note}")
        result["metrics"] += [
            device_metric(dev, f"{prefix}encoder_ms", image["encoder_ms"], "ms", enc_note),
            device_metric(dev, f"{prefix}time_to_first_token_ms",
                          image["time_to_first_token_ms"], "ms",
                          "the vision encoder, then the prefill of the image prompt; "
                          + (note or dev.timing_note)),
        ]
        result["image"] = image
        result["summary"] += (f"; image: encoder {image['encoder_ms']:.1f} ms + prefill "
                              f"{image['prefill_ms']:.1f} ms to the first token")
    return result


def run_result(dev: Device, out: dict[str, Any], tok, prompt: str, what: str,
               prefix: str = "", note: str | None = None,
               load_s: float | None = None) -> dict[str, Any]:
    """The run stage's result from a generation on ``dev``: the figures labelled from the
    device. ``prefix`` names timings that are not the graph's latency (``round_trip_`` for adb
    round trips). First against warm (the seed's "first inference very slow"): ``load_s``
    opened the graphs (a context binary's load) before the first token, and the first
    decode step is shown beside the median of the warm ones."""
    steps = out["step_s"]
    median = statistics.median(steps) if steps else float("nan")
    warm = statistics.median(steps[1:]) if len(steps) > 1 else median
    note = dev.timing_note if note is None else note
    metrics = [
        device_metric(dev, f"{prefix}prefill_ms", out["prefill_s"] * 1e3, "ms", note),
        device_metric(dev, f"{prefix}decode_ms_per_token", median * 1e3, "ms", note),
        device_metric(dev, f"{prefix}decode_tokens_per_s", 1.0 / median if steps else 0.0,
                      "tok/s", note),
    ]
    shown = [m for m in metrics if m["name"] in (f"{prefix}decode_tokens_per_s",
                                                  f"{prefix}decode_ms_per_token")]
    if len(steps) > 1:
        metrics.append(device_metric(dev, f"{prefix}first_decode_step_ms", steps[0] * 1e3, "ms",
                                     f"the first decode step; the median of the steps after "
                                     f"it is {warm * 1e3:.4g} ms; {note}"))
        shown.append(metrics[-1])
    if load_s is not None:
        metrics.append(device_metric(dev, f"{prefix}load_ms", load_s * 1e3, "ms",
                                     f"opening the graphs (context load) before the first "
                                     f"token; {note}"))
        shown.append(metrics[-1])
    # the summary writes its figures as every page does (the catalogue's titles and format)
    said = ", ".join(f"{figures.title(m['name'])} {figures.fmt(m['name'], m['value'])}"
                     for m in shown)
    return {
        "summary": f"{len(out['tokens'])} tokens ({dev.source}, {what}): {said}",
        "load_s": load_s, "first_step_s": steps[0] if steps else None, "warm_step_s": warm,
        "device": dev.kind, "device_id": dev.id, "target": dev.chip, "source": dev.source,
        "prompt": prompt, "tokens": out["tokens"], "text": tok.decode(out["tokens"]),
        "prefill_s": out["prefill_s"], "step_s": steps, "metrics": metrics,
    }
