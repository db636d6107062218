"""The steps that take a graph other than a causal LM onto the HTP — any ONNX network, or a
sentence encoder exported from its PyTorch weights: the static graph, its sample inputs,
the rewrites and quantization, the placement with the chosen way past refused nodes, the
check against FP32 and the latency per inference. ``studio graph`` (one call, one folder)
and the pipeline's graph stages (one artifact per step) both go through these functions.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.lazyimport import lazy_module
from studio.core.progress import NullProgress, Progress
from studio.core.recipe import PLACEMENTS
from studio.engine import encoder as enc
from studio.engine import rewrites
from studio.engine.graphdata import GraphInput, graph_inputs, load_samples, make_static
from studio.engine.qdq import quantize_graph

onnx = lazy_module("onnx")
ort = lazy_module("onnxruntime")
transformers = lazy_module("transformers")


def inputs_to_json(inputs: list[GraphInput]) -> list[dict[str, Any]]:
    return [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape)} for i in inputs]


def inputs_from_json(rows: list[dict[str, Any]]) -> list[GraphInput]:
    return [GraphInput(r["name"], r["dtype"], tuple(r["shape"])) for r in rows]


def static_graph(kind: str, source: Path, out: Path, shapes: dict[str, list[int]] | None,
                 seq_len: int, progress: Progress | None = None) -> dict[str, Any]:
    """``out/static.onnx``: an ONNX file with its input shapes fixed, or (``kind`` encoder)
    the encoder exported from its PyTorch weights at ``[1, seq_len]`` and checked against
    torch, its tokenizer saved in ``out/tokenizer``. Returns the inputs and, for the
    encoder, the export's check."""
    progress = progress or NullProgress()
    out.mkdir(parents=True, exist_ok=True)
    if kind == "encoder":
        progress.update(0.05, f"loading the encoder {source.name}")
        e = enc.load_encoder(source)
        enc.export_onnx(e, out / "static.onnx", seq_len=seq_len, progress=progress)
        progress.update(0.8, "checking the ONNX export against torch")
        check = enc.check_onnx(e, out / "static.onnx").to_dict()
        if not check["passed"]:
            raise StudioError(f"the exported encoder parts from torch (cosine "
                              f"{check['min_cosine']:.5f} < {check['threshold']}): the export "
                              "is wrong; report it with the model")
        e.tokenizer.save_pretrained(str(out / "tokenizer"))

        inputs = graph_inputs(onnx.load(str(out / "static.onnx"), load_external_data=False))
        return {"inputs": inputs_to_json(inputs), "export_check": check, "seq_len": seq_len}
    progress.update(0.1, f"fixing the input shapes of {source.name}")
    inputs = make_static(source, out / "static.onnx", shapes)
    return {"inputs": inputs_to_json(inputs), "export_check": None}


def text_feeds(tokenizer_dir: Path, texts: list[str], seq_len: int) -> list[dict[str, Any]]:
    """An encoder's feeds: each text through its tokenizer, padded to ``seq_len``."""
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    feeds = []
    for t in texts:
        enc = tok([t], padding="max_length", truncation=True, max_length=seq_len,
                  return_tensors="np")
        feeds.append({"input_ids": enc["input_ids"].astype("int64"),
                      "attention_mask": enc["attention_mask"].astype("int64")})
    return feeds


def sentences(text: str) -> list[str]:
    """The calibration text of an encoder: one sample per non-empty line."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def sample_feeds(inputs: list[GraphInput], calibration: Path | None, validation: Path | None,
                 samples: int, tokenizer_dir: Path | None = None, text: str = "",
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(calibration feeds, validation feeds, where the validation feeds come from): from
    ``.npz`` / ``.npy`` files checked against ``inputs``, or for an encoder from ``text``
    (a sentence a line) through its tokenizer. At most ``samples`` calibration feeds; without
    validation data the last calibration samples (at most 4) stand in, and it says so."""
    if tokenizer_dir is not None:
        lines = sentences(text)
        if len(lines) < 2:
            raise StudioError("the encoder's calibration text has fewer than 2 lines: give a "
                              "text with a sentence per line")
        seq_len = int(inputs[0].shape[1])
        held_n = min(4, len(lines) // 4 or 1)
        calib = text_feeds(tokenizer_dir, lines[:-held_n][:samples], seq_len)
        held = text_feeds(tokenizer_dir, lines[-held_n:], seq_len)
        return calib, held, f"the calibration text's last {held_n} lines (not calibrated on)"
    if calibration is None:
        raise StudioError("no calibration data: give a .npz file with one array per graph "
                          "input (graph.calibration, or --calibration)")
    feeds = load_samples(calibration, inputs)[:samples]
    if validation is not None:
        return feeds, load_samples(validation, inputs, "validation data"), "validation data"
    return feeds, feeds[-min(len(feeds), 4):], (
        "the last calibration samples (give validation data for held-out figures)")


def rewrite_and_quantize(static: Path, out: Path, placement: str, feeds: list[dict[str, Any]],
                         held: list[dict[str, Any]], scheme: str, weight_granularity: str,
                         progress: Progress | None = None, method: str = "MinMax",
                         overrides: dict[str, str] | None = None,
                         weight_rounding: str = "nearest") -> dict[str, Any]:
    """``out/graph.onnx`` (the float graph after the rewrites quantization needs, and with
    placement ``rewrite`` the catalogue's: each checked against the original on ``held``)
    and ``out/quantized.onnx`` calibrated on ``feeds``."""
    progress = progress or NullProgress()
    if placement not in PLACEMENTS:
        raise StudioError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")
    progress.update(0.05, "rewriting what quantization cannot take"
                    + (" and the ops the HTP refuses" if placement == "rewrite" else ""))
    names = [r.name for r in rewrites.PREPARE] + (
        [r.name for r in rewrites.CATALOGUE] if placement == "rewrite" else [])
    graph = out / "graph.onnx"
    applied = rewrites.apply_rewrites(static, graph, names)
    check = rewrites.check_rewrite(static, graph, held) if applied else None
    progress.check()
    progress.update(0.2, f"quantizing ({scheme}, {weight_granularity}) on {len(feeds)} "
                         "calibration samples")
    quant = quantize_graph(graph, out / "quantized.onnx",
                           {"scheme": scheme, "weight_granularity": weight_granularity,
                            "samples": len(feeds), "calibration_method": method,
                            "overrides": dict(overrides or {}),
                            "weight_rounding": weight_rounding}, feeds)
    return {"rewrites": applied, "rewrite_check": check,
            "quantization": {k: quant[k] for k in ("calibration_feeds", "matmul_precisions",
                                                    "qdq_nodes")}
            | {"scheme": scheme, "weight_granularity": weight_granularity,
               "calibration_method": method, "overrides": dict(overrides or {}),
               "weight_rounding": weight_rounding,
               **({"rounding": quant["rounding"]} if "rounding" in quant else {})}}


def _reason(node: dict[str, Any]) -> str:
    return node["reason"].split(".")[0]


def place(quantized: Path, chip, placement: str, fp16: bool = False) -> dict[str, Any]:
    """The placement report of ``quantized`` on ``chip`` under the chosen way forward: each
    node the HTP refuses with the EP's reason, the NPU↔CPU transitions and their bytes."""
    report = rewrites.partition(quantized, chip, fp16=fp16)
    report["placement"] = placement
    return report


def check_placement(report: dict[str, Any], chip, option: str = "quantization.placement",
                    ) -> None:
    """Unless the placement is ``partition``, refused nodes are a :class:`StudioError`
    naming each with its reason and the ways forward (``option``: how the user sets it)."""
    placement = report["placement"]
    if placement != "partition" and not report["all_on_npu"]:
        refused = [n for n in report["cpu_nodes"]
                   if n["op_type"] not in ("QuantizeLinear", "DequantizeLinear")]
        named = "; ".join(f"{n['name']} ({n['op_type']}: {_reason(n)})" for n in refused)
        how = (f"no rewrite in the catalogue covers it; use {option} partition (the CPU "
               "takes it)" if placement == "rewrite" else
               f"use {option} rewrite (known equivalents) or partition (the CPU takes them)")
        raise StudioError(f"{len(report['cpu_nodes'])} node(s) cannot run on the NPU of "
                          f"{chip.name}: {named}; {how}")


def latency(session, feed: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Wall time per inference: one warm-up (timed apart: the first inference), then
    ``repeats`` timed runs (median, spread)."""
    t0 = time.perf_counter()
    session.run(None, feed)
    first = time.perf_counter() - t0
    wall = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, feed)
        wall.append(time.perf_counter() - t0)
    med = statistics.median(wall)
    return {"median_ms": med * 1e3, "min_ms": min(wall) * 1e3, "max_ms": max(wall) * 1e3,
            "first_ms": first * 1e3, "repeats": repeats,
            "per_s": 1.0 / med if med > 0 else 0.0}


def cpu_session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def encoder_ranking(tokenizer_dir: Path, seq_len: int, reference, deployed) -> dict[str, Any]:
    """The encoder's task check: the shipped retrieval set embedded by the FP32 graph and by
    the deployed one, ranked by cosine (top-1 agreement, Kendall's tau, recall@1), and the
    embeddings' cosine to FP32 over every text of the set."""
    s = enc.load_similarity_set()
    queries = [q["text"] for q in s["queries"]]
    rel = [q["relevant"] for q in s["queries"]]

    def embed(session, texts: list[str]) -> np.ndarray:
        name = session.get_outputs()[0].name
        return np.concatenate([session.run([name], f)[0]
                               for f in text_feeds(tokenizer_dir, texts, seq_len)])

    rd, rq = embed(reference, s["documents"]), embed(reference, queries)
    gd, gq = embed(deployed, s["documents"]), embed(deployed, queries)
    ranking = enc.ranking_check(rd, rq, gd, gq, rel)
    cos = np.atleast_1d(enc.embedding_cosine(np.concatenate([rd, rq]), np.concatenate([gd, gq])))
    ranking["embedding_cosine_mean"] = float(cos.mean())
    ranking["embedding_cosine_min"] = float(cos.min())
    ranking["texts"] = len(cos)
    return ranking


def inputs_of(path: Path) -> list[GraphInput]:
    return graph_inputs(onnx.load(str(path), load_external_data=False))
