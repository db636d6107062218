"""Quantizing a decoder exported in parts, one part in memory at a time.

Calibration goes part by part: the first part's feeds are the calibration windows' tokens
(the same windows, prefill lengths and decode positions as :func:`build_calibration_feeds`
picks for one graph), and each later part's are the previous part's FP32 *outputs* on those
windows, so every tensor of every part is observed on the activations the whole graph sees:
N parts get the encodings one graph gets. The outputs handed on are kept per part (small:
windows x positions x hidden), the graphs of a part are quantized as one graph is
(:func:`studio.engine.quantize._quantize_graph`), then the next part is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.partcache import PartCache, files_digest
from studio.core.parts import Part
from studio.core.progress import NullProgress, Progress, SubProgress
from studio.core.recipe import DEFAULT_WEIGHT_ROUNDING, activation_bits, is_float_scheme
from studio.engine import partresume
from studio.engine.calibration import calibration_windows, window_plan
from studio.engine.chain import part_dirs
from studio.engine.llm_runtime import make_cpu_session
from studio.engine.onnxio import load_spec
from studio.engine.part_runner import PartRunner, iter_parts
from studio.engine.qdq import run_quantizer, weight_type_name
from studio.engine.quant_recipe import (
    GRAPHS,
    check_overrides_in,
    normalize_recipe,
    resolve_overrides,
)
from studio.engine.rounding import Source, prefill_rows, round_for_recipe
from studio.engine.weightstore import shared_store


def part_calibration(runner: PartRunner, windows: list[list[int]], inputs: list[Any] | None,
                     decode_per_window: int, progress: Progress = NullProgress(),
                     hand_on: bool = True) -> tuple[list[dict], list[dict], list[dict]]:
    """The prefill and decode feeds of one part on the calibration ``windows``, and what it
    hands the next part (per window: its prefill output [P, H] and its output row at each
    decoded position). ``inputs``: the previous part's hand-on (None for the first part)."""
    P, C = runner.P, runner.C
    pad = int(runner.spec.get("pad_token_id") or 0)
    pre_feeds: list[dict] = []
    dec_feeds: list[dict] = []
    out: list[dict] = []
    for j, window in enumerate(windows):
        progress.check()
        progress.update(j / len(windows), f"calibration window {j + 1}/{len(windows)}")
        w, k, targets = window_plan(window, j, P, C, decode_per_window)
        if inputs is None:
            rows = np.full(P, pad, dtype=np.int64)
            rows[:k] = w[:k]
        else:
            rows = inputs[j]["prefill"]
        pre_feeds.append(runner.prefill_feed(rows, k))
        if not targets and not hand_on:
            out.append({})
            continue
        handed = {"prefill": runner.prefill(rows, k), "rows": {}}
        want = set(targets)
        for pos in range(k, (targets[-1] + 1) if targets else k):
            row = w[pos] if inputs is None else inputs[j]["rows"][pos]
            if pos in want:
                dec_feeds.append(runner.decode_feed(row, pos, copy=True))
            if hand_on or pos < targets[-1]:
                handed["rows"][pos] = np.asarray(runner.step(row, pos), dtype=np.float32).copy()
        out.append(handed)
    return pre_feeds, dec_feeds, out


def _output_cosine(ref, got) -> float:
    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / den) if den else 1.0


def _part_check(src: Path, dst: Path, part: Part, pre_feed: dict, dec_feed: dict) -> dict:
    """Cosine of the quantized part's output against its FP32 graph's, on one calibration
    feed of each graph with the FP32 inputs (CPU)."""
    name = "logits" if part.heads else str(part.hidden_out)
    res = {}
    for graph, feed in (("prefill", pre_feed), ("decode", dec_feed)):
        if feed is None:
            continue
        ref = make_cpu_session(src / f"{graph}.onnx").run([name], feed)[0]
        got = make_cpu_session(dst / f"{graph}.onnx").run([name], feed)[0]
        if graph == "prefill":
            n = int((feed["attention_mask"][0, 0, -1] == 0).sum())  # the real rows
            ref, got = ref[:, :n], got[:, :n]
        res[f"{graph}_output_cosine"] = _output_cosine(ref, got)
    return res


def _add_row(info: dict[str, Any], row: dict[str, Any]) -> None:
    """A quantized part's row into quant.json's content: the layers of its decode graph
    (which holds every layer of the part) into the model's list."""
    info["layers"] += row["graphs"]["decode"].pop("layers", [])
    row["graphs"]["prefill"].pop("layers", None)
    info["parts"].append(row)


def _feeds_digest(*groups: list[dict]) -> str:
    """The digest of calibration feeds (each a dict of name -> array): their names, types,
    shapes and bytes."""
    h = hashlib.sha256()
    for g_i, feeds in enumerate(groups):
        for f_i, feed in enumerate(feeds):
            for name in sorted(feed):
                a = np.ascontiguousarray(feed[name])
                h.update(f"{g_i}/{f_i}/{name}/{a.dtype.str}/{a.shape}".encode())
                h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _resolved(src: Path, recipe: dict) -> dict[str, dict]:
    """What the recipe's rules give each graph of a part (read without its weights)."""
    return {g: resolve_overrides(onnx.load(str(src / f"{g}.onnx"), load_external_data=False),
                                 recipe) for g in ("prefill", "decode")}


def _finish_part(out_dir: Path, dst: Path, part: Part, row: dict[str, Any],
                 feeds: tuple[int, int], resume: bool, handed_next: list[Any],
                 r_handed: list[Any] | None, info: dict[str, Any]) -> None:
    """Move a quantized part into place, mark it finished (with what it hands the next part)
    and add its row to the model's."""
    target = out_dir / part.name
    if target.exists():
        shutil.rmtree(target)
    os.replace(dst, target)
    if resume:  # finished: a re-run after a kill starts from the next part
        kept_arrays: dict[str, Any] = {}
        if not part.heads:
            kept_arrays.update(partresume.pack_windows(handed_next, "c."))
            if r_handed is not None:
                kept_arrays.update(partresume.pack_windows(r_handed, "r."))
        partresume.mark(target, {**row, "_feeds": list(feeds)}, kept_arrays)
    _add_row(info, row)


def quantize_parts(graphs_dir: Path, out_dir: Path, recipe: dict, calibration_text: str,
                   tokenizer_dir: Path, progress: Progress = NullProgress(),
                   resume: bool = False, cache: PartCache | None = None,
                   salt: str = "") -> dict:
    """Quantize the FP32 graphs of every part of ``graphs_dir`` into ``out_dir/<part>/``
    (graph.json and quant.json at the top); returns quant.json's content.

    ``resume``: ``out_dir`` is a kept work folder (:mod:`studio.engine.partresume`): the
    parts an interrupted run finished there are kept, with what they hand the next part,
    and the quantization goes on from the first part it did not finish.

    ``cache``: finished parts by part key (:mod:`studio.core.partcache`; ``salt`` tells the
    code and tool versions apart): a part whose graphs, calibration inputs and resolved
    precisions are those of a part quantized before is taken from there."""
    graphs_dir, out_dir = Path(graphs_dir), Path(out_dir)
    recipe = normalize_recipe(recipe)
    spec = load_spec(graphs_dir)
    parts = list(iter_parts(spec))
    dirs = part_dirs(spec, graphs_dir)
    _check_parts(graphs_dir, parts, dirs, recipe)
    out_dir.mkdir(parents=True, exist_ok=True)
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    windows = calibration_windows(calibration_text, tokenizer_dir, length=C,
                                  count=recipe["samples"], min_length=min(C, P + 1))
    info = _parts_info(recipe, windows, parts)
    r_windows = calibration_windows(calibration_text, tokenizer_dir, length=C,
                                    count=recipe["rounding_samples"], min_length=min(C, P + 1)
                                    ) if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING \
        else []
    if r_windows:
        info["rounding_samples"] = recipe["rounding_samples"]
    run = _PartsRun(spec, recipe, out_dir, parts, windows, r_windows, info, resume, cache,
                    salt, progress)
    first = run.keep_finished()
    run.stage = Path(tempfile.mkdtemp(dir=out_dir, prefix=".quantize."))
    try:
        for part, src in list(zip(parts, dirs, strict=True))[first:]:
            run.quantize_part(part, src)
        if run.reused:
            info["parts_reused"] = [k + 1 for k in run.reused]
            progress.log(f"{len(run.reused)} of {len(parts)} parts (" + ", ".join(
                str(k + 1) for k in run.reused) + "): their graphs, calibration inputs and "
                "precisions are those of a part quantized before, taken from then")
        info["calibration"]["prefill_feeds"] = run.feeds[0]
        info["calibration"]["decode_feeds"] = run.feeds[1]
    finally:
        shutil.rmtree(run.stage, ignore_errors=True)
    partresume.unmark(out_dir)
    qspec = dict(spec)
    qspec["quantization"] = {k: info[k] for k in ("scheme", "weight_granularity",
                                                  "activation_type", "weight_type")}
    atomic_write_json(out_dir / "graph.json", qspec)
    atomic_write_json(out_dir / "quant.json", info)
    progress.update(1.0, f"{recipe['scheme']} graphs of {len(parts)} parts written")
    out = json.loads(json.dumps(info))
    if run.run_facts:  # not in quant.json: timings are run facts
        out["run_facts"] = run.run_facts
    return out


def _check_parts(graphs_dir: Path, parts: list[Part], dirs: list[Path],
                 recipe: dict[str, Any]) -> None:
    """Refuses a model in one graph and a float scheme; checks the recipe's overrides over
    all parts at once (before the slow part)."""
    if len(parts) < 2:
        raise StudioError(f"{graphs_dir} holds one graph, not parts: quantize it with quantize_llm")
    if is_float_scheme(recipe["scheme"]):
        raise StudioError(f"{recipe['scheme']} keeps the float graphs: a model exported in parts "
                          "takes an integer scheme (W8A16, W4A16, ...) so far")
    check_overrides_in(dirs, recipe)  # before the slow part: over all parts at once


def _parts_info(recipe: dict[str, Any], windows: list[list[int]], parts: list[Part]
                ) -> dict[str, Any]:
    """quant.json's content before the parts' rows."""
    return {
        "scheme": recipe["scheme"], "weight_granularity": recipe["weight_granularity"],
        "samples": recipe["samples"], "overrides": dict(recipe["given"]),
        "weight_rounding": recipe["weight_rounding"],
        "activation_type": "QUInt16" if activation_bits(recipe["scheme"]) == 16 else "QUInt8",
        "weight_type": weight_type_name(recipe),
        "calibration": {"method": recipe["calibration_method"], "windows": len(windows),
                        "window_tokens": len(windows[0]), "by_part": "each part on the "
                        "previous part's FP32 outputs"},
        "graphs": {g: {"file": f"{g}.onnx", "parts": [p.name for p in parts]} for g in GRAPHS},
        "parts": [], "layers": [],
    }


@dataclass
class _PartFeeds:
    """One part's calibration feeds, what it hands the next part, and the rounding's
    prompts (empty without rounding)."""

    pre: list[dict]
    dec: list[dict]
    handed_next: list[Any]
    r_pre: list[dict]


@dataclass
class _PartsRun:
    """One quantization of a model in parts, part after part: what the part before handed
    on (``handed``; ``r_handed`` the rounding's), the last part's feed counts and the parts
    taken from the cache."""

    spec: dict[str, Any]
    recipe: dict[str, Any]
    out_dir: Path
    parts: list[Part]
    windows: list[list[int]]
    r_windows: list[list[int]]
    info: dict[str, Any]
    resume: bool
    cache: PartCache | None
    salt: str
    progress: Progress
    stage: Path = Path()
    handed: list[Any] | None = None
    r_handed: list[Any] | None = None
    feeds: tuple[int, int] = (0, 0)
    reused: list[int] = field(default_factory=list)
    run_facts: dict[str, float] = field(default_factory=dict)

    def keep_finished(self) -> int:
        """With ``resume``, the parts an interrupted run finished kept (their rows, what the
        last of them hands on); the index of the first part to quantize."""
        parts, out_dir = self.parts, self.out_dir
        done = partresume.keep_finished(out_dir, parts) if self.resume else {}
        first = 0
        while first in done:
            first += 1
        for i in range(first):  # what an interrupted run finished
            self.feeds = tuple(done[i].pop("_feeds"))  # type: ignore[assignment]
            _add_row(self.info, done[i])
        if first:
            kept = partresume.handoff(out_dir / parts[first - 1].name)
            self.handed = partresume.unpack_windows(kept, "c.") if "c.count" in kept else None
            self.r_handed = partresume.unpack_windows(kept, "r.") if "r.count" in kept \
                else None
            self.progress.log(f"part{'s 1-' if first > 1 else ' '}{first} of {len(parts)}: "
                              "kept from an interrupted run of this quantization")
        return first

    def quantize_part(self, part: Part, src: Path) -> None:
        """One part: calibrated on what the part before hands on, taken from the cache or
        quantized, moved into place."""
        share = 1.0 / len(self.parts)
        sub = SubProgress(self.progress, part.index * share, (part.index + 1) * share)
        dst = self.stage / part.name
        dst.mkdir()
        cal = self.calibrate(part, src, sub)
        if not cal.dec:
            raise StudioError("the calibration text gave no decode samples; give a longer "
                              "calibration text")
        cache_key = None
        if self.cache is not None and self.cache.root is not None:
            cache_key = self.from_cache(part, src, dst, cal)
            if cache_key is None:
                return
        row = self.quantize_graphs(part, src, dst, cal, sub)
        if cache_key is not None:
            self.cache.put(cache_key, dst, row)  # type: ignore[union-attr]
        self.feeds = (len(cal.pre), len(cal.dec))
        _finish_part(self.out_dir, dst, part, row, feeds=self.feeds, resume=self.resume,
                     handed_next=cal.handed_next,
                     r_handed=(self.r_handed or []) if self.r_windows else None,
                     info=self.info)
        self.handed = cal.handed_next

    def calibrate(self, part: Part, src: Path, sub: Progress) -> _PartFeeds:
        """The part's calibration feeds on what the part before hands on (the rounding's
        prompts too, handed on as the calibration's are)."""
        runner = PartRunner(src, part, self.spec, make_cpu_session)
        pre, dec, handed_next = part_calibration(
            runner, self.windows, self.handed, self.recipe["decode_per_window"],
            SubProgress(sub, 0.0, 0.2), hand_on=not part.heads)
        r_pre: list[dict] = []
        if self.r_windows:  # the rounding's prompts, handed on as the calibration's are
            r_pre, _, self.r_handed = part_calibration(runner, self.r_windows, self.r_handed,
                                                       0, SubProgress(sub, 0.2, 0.2),
                                                       hand_on=not part.heads)
        runner.close()
        del runner
        return _PartFeeds(pre, dec, handed_next, r_pre)

    def from_cache(self, part: Part, src: Path, dst: Path, cal: _PartFeeds) -> str | None:
        """The part taken from the cache where a part with its graphs, calibration inputs
        and resolved precisions was quantized before (None: taken and moved into place);
        else the key to keep it under."""
        recipe, cache = self.recipe, self.cache
        assert cache is not None
        # what this part's output depends on: its graphs, the inputs it is calibrated
        # (and rounded) on, and the recipe as it applies to its own layers
        resolved = _resolved(src, recipe)
        cache_key = cache.key(
            "quantize-part", salt=self.salt, part=part.as_dict(),
            recipe={k: v for k, v in recipe.items() if k not in ("overrides", "given")},
            resolved={g: {k: r[k] for k in ("init_overrides", "nodes_to_exclude",
                                            "per_channel_weights")}
                      for g, r in resolved.items()},
            graphs=files_digest(src),
            feeds=_feeds_digest(cal.pre, cal.dec, cal.r_pre if self.r_windows else []))
        kept_row = cache.get(cache_key, dst)
        if kept_row is None:
            return cache_key
        for g, r in resolved.items():  # which rule set what: this recipe's words
            kept_row["graphs"][g].update(patterns=r["patterns"], layers=r["layers"])
        self.reused.append(part.index)
        _finish_part(self.out_dir, dst, part, kept_row, feeds=(len(cal.pre), len(cal.dec)),
                     resume=self.resume, handed_next=cal.handed_next,
                     r_handed=(self.r_handed or []) if self.r_windows else None,
                     info=self.info)
        self.handed, self.feeds = cal.handed_next, (len(cal.pre), len(cal.dec))
        return None

    def quantize_graphs(self, part: Part, src: Path, dst: Path, cal: _PartFeeds,
                        sub: Progress) -> dict[str, Any]:
        """The part's weights rounded where the recipe says, its two graphs quantized into
        ``dst`` and checked against FP32; the part's row."""
        recipe, parts, progress = self.recipe, self.parts, self.progress
        pre, dec = cal.pre, cal.dec
        row: dict[str, Any] = {**part.as_dict(), "graphs": {}}
        rounded, a0 = None, 0.2
        if recipe["weight_rounding"] != DEFAULT_WEIGHT_ROUNDING:
            # this part's weights, rounded on this part's calibration inputs (the previous
            # part's FP32 outputs); sequential within the part
            sub.update(0.2, f"part {part.index + 1}/{len(parts)}: rounding the weights "
                            f"({recipe['weight_rounding']})")
            rounded, row["rounding"], seconds = round_for_recipe(
                [Source(src / "prefill.onnx", cal.r_pre,
                        [prefill_rows(f) for f in cal.r_pre]),
                 Source(src / "decode.onnx", dec, [None] * len(dec))],
                recipe, self.stage / ".rounding", SubProgress(sub, 0.2, 0.5))
            shutil.rmtree(self.stage / ".rounding", ignore_errors=True)
            self.run_facts["rounding_seconds"] = (self.run_facts.get("rounding_seconds", 0)
                                                  + seconds)
            a0 = 0.5
        span = (0.9 - a0) / 2
        with shared_store(dst) as store:  # the part's two graphs: one copy of its weights
            for g_i, (graph, feeds) in enumerate((("prefill", pre), ("decode", dec))):
                progress.check()
                sub.update(a0 + span * g_i, f"part {part.index + 1}/{len(parts)}: "
                                            f"quantizing {graph}.onnx ({recipe['scheme']})")
                row["graphs"][graph] = run_quantizer(
                    src / f"{graph}.onnx", dst / f"{graph}.onnx", recipe, feeds,
                    SubProgress(sub, a0 + span * g_i, a0 + span * (g_i + 1)),
                    rounded=rounded, store=store)
        sub.update(0.92, f"part {part.index + 1}/{len(parts)}: checking against FP32")
        row["check"] = _part_check(src, dst, part, pre[0], dec[-1])
        progress.log(f"part {part.index + 1}/{len(parts)} (blocks {part.start}-"
                     f"{part.stop - 1}): quantized vs FP32 output cosine "
                     + ", ".join(f"{k} {v:.4f}" for k, v in row["check"].items()))
        return row
