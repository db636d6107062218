"""QDQ quantization of an LLM's static-KV graphs for the QNN HTP backend
(:func:`quantize_llm`): calibration feeds from :mod:`studio.engine.calibration`, each graph
through the quantizer (:mod:`studio.engine.qdq`) with the recipe
(:mod:`studio.engine.quant_recipe`), the prefill and decode graphs calibrated separately with
the same weights and so the same weight scales, a vision-language model's encoder too, and a
self-check of the quantized logits against FP32."""


from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.core.recipe import (
    DEFAULT_WEIGHT_ROUNDING,
    activation_bits,
    is_float_scheme,
)
from studio.engine import vision, vision_input
from studio.engine.calibration import build_calibration_feeds, calibration_windows
from studio.engine.llm_runtime import make_cpu_session
from studio.engine.onnxio import load_spec
from studio.engine.qdq import (
    activation_encodings,
    run_quantizer,
    weight_type_name,
)
from studio.engine.quant_recipe import (
    GRAPHS,
    check_overrides,
    normalize_recipe,
)
from studio.engine.rounding import Source, prefill_rows, round_for_recipe
from studio.engine.weightstore import WEIGHTS_FILE, shared_store


def _logit_cosine(ref, other) -> float:
    a = np.asarray(ref, dtype=np.float64).reshape(-1, ref.shape[-1])
    b = np.asarray(other, dtype=np.float64).reshape(-1, other.shape[-1])
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return float(cos.mean())


def _self_check(graphs_dir: Path, out_dir: Path, pre_feed: dict, dec_feed: dict | None) -> dict:
    """Cosine of the quantized logits vs FP32 on one calibration feed of each graph (CPU)."""
    res = {}
    for graph, feed in (("prefill", pre_feed), ("decode", dec_feed)):
        if feed is None:
            continue
        ref = make_cpu_session(graphs_dir / f"{graph}.onnx").run(["logits"], feed)[0]
        got = make_cpu_session(out_dir / f"{graph}.onnx").run(["logits"], feed)[0]
        if graph == "prefill":
            n = int(
                (feed["attention_mask"][0, 0, -1] == 0).sum()
            )  # the last real row sees n tokens
            ref, got = ref[:, :n], got[:, :n]
        res[f"{graph}_logits_cosine"] = _logit_cosine(ref, got)
    return res


def quantize_llm(
    graphs_dir: Path,
    out_dir: Path,
    recipe: dict,
    calibration_text: str,
    tokenizer_dir: Path,
    progress: Progress = NullProgress(),
    with_verify: bool = False,
    images: list[Any] | None = None,
) -> dict:
    """Quantize the FP32 graphs of ``graphs_dir`` into ``out_dir``; returns quant.json's
    content. ``with_verify``: the verify graph (speculative decoding) too, calibrated on the
    true next tokens of the calibration windows. A vision-language model's prefill and
    decode graphs are calibrated on image prompts too (``images``, [3, S, S] arrays; None:
    ``samples`` images generated here), and its vision encoder on those images
    (:func:`studio.engine.vision.quantize_vision`)."""
    graphs_dir, out_dir = Path(graphs_dir), Path(out_dir)
    recipe = normalize_recipe(recipe)
    spec = load_spec(graphs_dir)
    _check_folders(graphs_dir, out_dir, spec)
    info = _quant_info(recipe)
    run_facts: dict[str, float] = {}
    images_in = _VisionImages.of(spec, recipe, images)

    # Everything is written into a staging folder and moved into place at the end, so a
    # cancelled or failed run leaves no half-quantized graphs.
    stage = Path(tempfile.mkdtemp(dir=out_dir, prefix=".quantize."))
    try:
        if is_float_scheme(recipe["scheme"]):
            _copy_float_graphs(graphs_dir, stage, recipe, info, with_verify, images_in,
                               progress)
        else:
            _quantize_graphs(graphs_dir, stage, recipe, calibration_text, tokenizer_dir,
                             spec, info, run_facts, with_verify, images_in, progress)
        for f in sorted(stage.iterdir()):
            os.replace(f, out_dir / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return _write_quant_json(out_dir, spec, recipe, info, run_facts, progress)


def _check_folders(graphs_dir: Path, out_dir: Path, spec: dict[str, Any]) -> None:
    """Refuses an export without its graphs or already quantized, and an output folder that
    is the export's (``out_dir`` is made here)."""
    for g in GRAPHS:
        if not (graphs_dir / f"{g}.onnx").is_file():
            raise StudioError(f"{graphs_dir} has no {g}.onnx; re-run the export")
    if spec.get("dtype", "float32") != "float32" or "quantization" in spec:
        raise StudioError(
            f"{graphs_dir} holds already-quantized graphs; quantize the FP32 export instead"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() == graphs_dir.resolve():
        raise StudioError(
            "the quantized graphs need their own folder; choose an output folder other than the export"
        )


def _quant_info(recipe: dict[str, Any]) -> dict[str, Any]:
    """quant.json's entries of the recipe."""
    return {
        "scheme": recipe["scheme"],
        "weight_granularity": recipe["weight_granularity"],
        "samples": recipe["samples"],
        "overrides": dict(recipe["given"]),
        "weight_rounding": recipe["weight_rounding"],
        **({"rounding_samples": recipe["rounding_samples"]}
           if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING else {}),
    }


@dataclass
class _VisionImages:
    """A vision-language model's calibration images and two held-out ones (``vs`` None and
    no images for a text model)."""

    vs: Any
    images: list[Any]
    held: list[Any]

    @classmethod
    def of(cls, spec: dict[str, Any], recipe: dict[str, Any],
           images: list[Any] | None) -> _VisionImages:
        vs = vision_input.vision_spec(spec)
        images = list(images or [])
        held_images: list[Any] = []
        if vs is not None:
            images = images or vision_input.calibration_images(
                int(recipe["samples"]), vs.image_size, seed=0)
            if not images:
                raise StudioError("a vision-language model is calibrated on images: give at "
                                  "least one (quantization.calibration_images)")
            held_images = vision_input.calibration_images(2, vs.image_size, seed=1000)
        return cls(vs, images, held_images)


def _copy_float_graphs(graphs_dir: Path, stage: Path, recipe: dict[str, Any],
                       info: dict[str, Any], with_verify: bool, vis: _VisionImages,
                       progress: Progress) -> None:
    """A float scheme (FP16 on the HTP): the FP32 graphs copied as they are (a vision
    encoder still quantized), the recipe's overrides and rounding ignored."""
    progress.update(0.1, f"{recipe['scheme']}: copying the float graphs")
    for f in sorted(graphs_dir.iterdir()):
        wanted = ("prefill.onnx", "decode.onnx", *(("verify.onnx",) if with_verify else ()),
                  WEIGHTS_FILE)
        if f.name.startswith(wanted) and f.is_file():
            progress.check()
            shutil.copyfile(f, stage / f.name)  # the stage is private: moved at the end
    if recipe["overrides"]:
        progress.log("FP16 scheme: overrides are ignored (every op runs in FP16)")
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        progress.log(f"{recipe['scheme']} scheme: weight_rounding "
                     f"{recipe['weight_rounding']} is ignored (float weights)")
        info["weight_rounding"] = f"ignored ({recipe['scheme']} keeps float weights)"
    info.update(
        activation_type="float16 (on the HTP)",
        weight_type="float16 (on the HTP)",
        note="float graphs; run them on the HTP with enable_htp_fp16_precision=1",
        overrides_ignored=bool(recipe["overrides"]),
        graphs={g: {"file": f"{g}.onnx"} for g in GRAPHS},
    )
    if vis.vs is not None:
        info["graphs"]["vision"] = vision.quantize_vision(
            graphs_dir, stage, recipe, vis.images, vis.held)


@dataclass
class _Calibration:
    """The calibration's windows and the feeds of each graph they give (``ver_feeds``: the
    verify graph's, None without it)."""

    windows: list[list[int]]
    pre_feeds: list[dict]
    dec_feeds: list[dict]
    ver_feeds: list[dict] | None


def _calibrate(graphs_dir: Path, spec: dict[str, Any], recipe: dict[str, Any],
               calibration_text: str, tokenizer_dir: Path, with_verify: bool,
               vis: _VisionImages, progress: Progress) -> _Calibration:
    """The calibration feeds: windows of the calibration text through the FP32 graphs (a
    vision-language model's image prompts too)."""
    progress.update(0.0, "tokenizing the calibration text")
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    windows = calibration_windows(
        calibration_text,
        tokenizer_dir,
        length=C,
        count=recipe["samples"],
        min_length=min(C, P + 1),
    )
    progress.check()
    ver_feeds: list[dict] | None = [] if with_verify else None
    pre_feeds, dec_feeds = build_calibration_feeds(
        graphs_dir,
        spec,
        windows,
        SubProgress(progress, 0.02, 0.2),
        decode_per_window=recipe["decode_per_window"],
        verify_feeds=ver_feeds,
    )
    if vis.vs is not None:  # image prompts: the image rows' ranges and the image's positions
        progress.update(0.18, f"calibration: {len(vis.images)} image prompts through the "
                              "FP32 encoder and graphs")
        img_pre, img_dec = vision.image_prompt_feeds(graphs_dir, spec, windows, vis.images)
        pre_feeds += img_pre
        dec_feeds += img_dec
    progress.log(
        f"calibration: {len(windows)} windows of {len(windows[0])} tokens -> "
        f"{len(pre_feeds)} prefill and {len(dec_feeds)} decode feeds"
        + (f" ({len(vis.images)} of them image prompts)" if vis.vs is not None else "")
    )
    if not dec_feeds:
        raise StudioError(
            "the calibration text gave no decode samples; give a longer calibration text"
        )
    return _Calibration(windows, pre_feeds, dec_feeds, ver_feeds)


def _round_weights(graphs_dir: Path, stage: Path, spec: dict[str, Any], recipe: dict[str, Any],
                   calibration_text: str, tokenizer_dir: Path, dec_feeds: list[dict],
                   info: dict[str, Any], run_facts: dict[str, float], progress: Progress):
    """The weights rounded by the recipe's ``weight_rounding`` on the layers' inputs: the
    prompts of ``rounding_samples`` windows (prefill rows) and the calibration's decode
    feeds. Returns the rounded weights and the progress fraction it reached."""
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    progress.update(0.2, f"rounding the weights ({recipe['weight_rounding']})")
    # the layers' inputs: prompts of rounding_samples windows (prefill rows) and
    # the calibration's decode feeds (later positions)
    r_pre, _ = build_calibration_feeds(
        graphs_dir, spec, calibration_windows(
            calibration_text, tokenizer_dir, length=C,
            count=recipe["rounding_samples"], min_length=min(C, P + 1)),
        SubProgress(progress, 0.2, 0.22), decode_per_window=0)
    rounded, info["rounding"], seconds = round_for_recipe(
        [Source(graphs_dir / "prefill.onnx", r_pre,
                [prefill_rows(f) for f in r_pre]),
         Source(graphs_dir / "decode.onnx", dec_feeds, [None] * len(dec_feeds))],
        recipe, stage / ".rounding", SubProgress(progress, 0.22, 0.5))
    shutil.rmtree(stage / ".rounding", ignore_errors=True)
    run_facts["rounding_seconds"] = seconds
    return rounded, 0.5


def _calibration_info(recipe: dict[str, Any], cal: _Calibration, vis: _VisionImages
                      ) -> dict[str, Any]:
    """quant.json's entries of the quantized types and the calibration."""
    return dict(
        activation_type=(
            "QUInt16" if activation_bits(recipe["scheme"]) == 16 else "QUInt8"
        ),
        weight_type=weight_type_name(recipe),
        calibration={
            "method": recipe["calibration_method"],
            "windows": len(cal.windows),
            "window_tokens": len(cal.windows[0]),
            "prefill_feeds": len(cal.pre_feeds),
            "decode_feeds": len(cal.dec_feeds),
            "decode_positions": sorted(
                int(f["position_ids"].reshape(-1)[0]) for f in cal.dec_feeds
            ),
            **({"image_prompts": len(vis.images)} if vis.vs is not None else {}),
        },
        graphs={},
    )


def _quantize_graphs(graphs_dir: Path, stage: Path, recipe: dict[str, Any],
                     calibration_text: str, tokenizer_dir: Path, spec: dict[str, Any],
                     info: dict[str, Any], run_facts: dict[str, float], with_verify: bool,
                     vis: _VisionImages, progress: Progress) -> None:
    """An integer scheme: calibrate, round the weights where the recipe says, quantize each
    graph (a vision encoder too) and check the quantized logits against FP32."""
    check_overrides(graphs_dir, recipe)  # before the slow part
    cal = _calibrate(graphs_dir, spec, recipe, calibration_text, tokenizer_dir, with_verify,
                     vis, progress)
    rounded, a0 = None, 0.2
    if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
        rounded, a0 = _round_weights(graphs_dir, stage, spec, recipe, calibration_text,
                                     tokenizer_dir, cal.dec_feeds, info, run_facts, progress)
    info.update(_calibration_info(recipe, cal, vis))
    n_graphs = 3 if cal.ver_feeds else 2
    cuts = [a0 + (0.9 - a0) * i / n_graphs for i in range(n_graphs + 1)]
    steps = [(g, f, cuts[i], cuts[i + 1]) for i, (g, f) in enumerate(
        (("prefill", cal.pre_feeds), ("decode", cal.dec_feeds),
         *((("verify", cal.ver_feeds),) if cal.ver_feeds else ())))]
    with shared_store(stage) as store:
        for graph, feeds, a, b in steps:
            progress.check()
            progress.update(a, f"quantizing {graph}.onnx ({recipe['scheme']})")
            info["graphs"][graph] = run_quantizer(
                graphs_dir / f"{graph}.onnx",
                stage / f"{graph}.onnx",
                recipe,
                feeds,
                SubProgress(progress, a, b),
                shared=activation_encodings(stage / "decode.onnx")
                if graph == "verify" else None,
                rounded=rounded,
                store=store,
            )
            progress.log(f"quantized {graph}.onnx: MatMuls "
                         f"{info['graphs'][graph]['matmul_precisions']}")
    if vis.vs is not None:
        progress.update(0.9, f"quantizing the vision encoder on {len(vis.images)} images")
        info["graphs"]["vision"] = vision.quantize_vision(
            graphs_dir, stage, recipe, vis.images, vis.held)
        progress.log("quantized vision.onnx: image rows vs FP32 cosine "
                     f"{info['graphs']['vision']['check']['encoder_cosine_min']:.4f} "
                     "(lowest of 2 held-out images)")
    progress.update(0.92, "checking the quantized graphs against FP32 (CPU)")
    info["check"] = _self_check(graphs_dir, stage, cal.pre_feeds[0], cal.dec_feeds[-1])
    progress.log(
        "quantized vs FP32 logits cosine on a calibration sample: "
        + ", ".join(f"{k} {v:.4f}" for k, v in info["check"].items())
    )


def _write_quant_json(out_dir: Path, spec: dict[str, Any], recipe: dict[str, Any],
                      info: dict[str, Any], run_facts: dict[str, float],
                      progress: Progress) -> dict:
    """``graph.json`` and ``quant.json`` of the quantized graphs (what each weighted layer
    got, from the decode graph, which has every layer); returns quant.json's content with
    the run's facts."""
    if "decode" in info.get("graphs", {}) and "layers" in info["graphs"]["decode"]:
        # what each weighted layer got, as applied (the decode graph has every layer)
        info["layers"] = info["graphs"]["decode"]["layers"]
        for g in info["graphs"].values():
            g.pop("layers", None)
    qspec = dict(spec)
    qspec["quantization"] = {
        k: info[k] for k in ("scheme", "weight_granularity", "activation_type", "weight_type")
    }
    atomic_write_json(out_dir / "graph.json", qspec)
    atomic_write_json(out_dir / "quant.json", info)
    progress.update(1.0, f"{recipe['scheme']} graphs written")
    out = json.loads(json.dumps(info))
    if run_facts:  # not in quant.json: timings are run facts
        out["run_facts"] = run_facts
    return out
