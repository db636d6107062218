"""A Genie bundle for a target chip, built and checked: the quantized decode graph (AR-1) and
an AR-N prefill graph with the same context, in Genie's conventions (:mod:`studio.engine.genie`)
and compiled in the order Genie takes them, ``genie_config.json``, ``tokenizer.json``, a
manifest (every file with its SHA-256, the recipe, the check) and a README; then Genie itself
(the wheel's libGenie.so, on the HTP simulator) loads the bundle and its greedy text is
compared with the studio's runtime over the same graphs on held-out prompts.

A model exported in parts (``export.parts``) gets a context binary per part and graph: each
part's quantized decode graph and an AR-N prefill graph exported for each part from the
checkpoint (a part in memory at a time), the residual stream passing between them as
uint16 integers (:func:`studio.engine.genie.genie_graph`), listed in Genie's ``ctx-bins``
in order. A model exported whole can still be split at bundle time (``bundle.parts``).

The bundle stage (``studio/worker/stages/bundle.py``) hands in its settings and labels the
figures from its device."""

from __future__ import annotations

import hashlib
import platform
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json
from studio.core.progress import Progress, SubProgress
from studio.engine.weightstore import graph_bytes


@dataclass(frozen=True)
class BundleSettings:
    """What a bundle is built from: the checkpoint (for the AR-N prefill graph), the recipe
    and calibration text the quantized graphs were made with, the held-out text the check's
    prompts come from, and the ``bundle.*`` settings."""

    checkpoint: Path
    recipe: dict[str, Any]
    calibration_text: str
    heldout_text: str
    prefill_length: int  # 0: the export's prompt length; 1: no prefill graph
    parts: int  # 0: as many as max_context_mb asks for
    max_context_mb: int
    prompts: int
    new_tokens: int
    score_tokens: int = 0  # held-out tokens scored against FP32 on the bundle's binaries
    greedy_prompt: str = ""  # validate's greedy check on the bundle's binaries: its prompt
    greedy_tokens: int = 0  # and its new tokens (0: no greedy check)
    htp_options: dict[str, str] | None = None  # the compile's extra QNN EP options
    graph_io: str = "float"  # htp.graph_io: "quantized" makes the KV cache uint16 I/O


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


def compile_in_order(graph: Path, folder: Path, chip, after: str, tries: int = 16,
                     extra_options: dict[str, str] | None = None):
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
                                   embed=False, extra_options=extra_options)
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


def parting(genie_text: str, ref: list[int], runner_up: list[tuple[int, float]],
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


def score_shipped(runner, export_dir: Path, spec: dict[str, Any], ids: list[int], tokens: int,
                  cl: int, progress: Progress, prompt: list[int] | None = None,
                  greedy_tokens: int = 0) -> dict[str, Any]:
    """The bundle's own binaries scored like validate: ``tokens`` held-out tokens in windows
    the context holds, the studio's runtime over the bundle's graphs (``runner``) against the
    FP32 export teacher-forced on the same windows — the figures of the bytes that ship; and,
    with ``greedy_tokens``, validate's greedy check: the binaries' greedy text after
    ``prompt``, each token against FP32's choice given that text."""
    from studio.engine.llm_runtime import cpu_generator
    from studio.engine.sensitivity import compare_logits, greedy_against_fp32

    width = min(cl - 1, max(2, tokens))
    windows = [ids[i:i + width] for i in range(0, min(len(ids), tokens), width)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise StudioError("the held-out text is too short to score the bundle: give a longer "
                          "text or set bundle.score_tokens = 0")
    progress.update(0.45, f"scoring {sum(map(len, windows))} held-out tokens on the bundle's "
                          "own binaries against FP32")
    fp32 = cpu_generator(export_dir, spec)
    vocab = int(spec["vocab_size"])
    ref = [fp32.teacher_forced_logits(w)[:, :vocab] for w in windows]
    got = [runner.teacher_forced(w)[:, :vocab] for w in windows]
    out: dict[str, Any] = compare_logits(ref, got, windows)
    out["fp32_perplexity"] = compare_logits(ref, ref, windows)["perplexity"]
    out["tokens"] = sum(map(len, windows))
    out["windows"] = len(windows)
    if prompt and greedy_tokens:
        n = max(1, min(greedy_tokens, cl - 1 - len(prompt)))
        new = runner.greedy(prompt, n)
        j = greedy_against_fp32(fp32.teacher_forced_logits(prompt + new)[:, :vocab], prompt,
                                new)
        out["greedy"] = {"tokens": len(new), "agreement": j["agreement"],
                         "prefix_agreement": j["prefix"], "ids": new}
    return out


def ar_feeds(export_dir: Path, spec: dict[str, Any], N: int, cl: int,
             settings: BundleSettings) -> list[dict]:
    """Calibration feeds for an AR-N graph over CL - N slots (the whole model's, a model in
    parts chained), from the recipe's calibration windows."""
    from studio.engine.calibration import ar_calibration_feeds, calibration_windows

    windows = calibration_windows(settings.calibration_text, export_dir / "tokenizer",
                                  length=int(spec["context_length"]),
                                  count=int(settings.recipe["samples"]), min_length=N + 2)
    return ar_calibration_feeds(export_dir, spec, windows, N, cl - N)


def genie_prefill_graph(export_dir: Path, qdir: Path, spec: dict[str, Any], N: int, cl: int,
                        work: Path, settings: BundleSettings, progress: Progress) -> Path:
    """The AR-N prefill graph: exported from the checkpoint with N new tokens over CL - N
    cache slots, quantized with the recipe and the decode graph's activation scales, in
    Genie's conventions."""
    from studio.engine import genie
    from studio.engine.llm_export import export_ar_graph
    from studio.engine.quantize import quantize_like

    progress.update(0.0, f"exporting the AR-{N} prefill graph ({cl - N} cache slots)")
    export_ar_graph(settings.checkpoint, spec, N, cl - N, work / f"prefill_ar{N}.onnx")
    progress.update(0.5, f"quantizing the AR-{N} prefill graph with the decode graph's scales")
    feeds = ar_feeds(export_dir, spec, N, cl, settings)
    quantize_like(work / f"prefill_ar{N}.onnx", work / f"prefill_ar{N}_q.onnx",
                  qdir / "decode.onnx", settings.recipe, feeds)
    out = work / f"prefill_ar{N}_genie.onnx"
    genie.genie_graph(work / f"prefill_ar{N}_q.onnx", out, spec,
                      kv_encodings=kv_encodings(qdir, settings))
    return out


def kv_encodings(graphs_dir: Path, settings: BundleSettings) -> dict[str, Any] | None:
    """The one encoding per cache tensor every Genie graph of a part takes, from its decode
    graph (the AR-N graph is quantized with the decode graph's scales), for a bundle with
    quantized graph I/O; None for float KV I/O."""
    if settings.graph_io != "quantized":
        return None
    from studio.engine.graphio import cache_encodings

    return cache_encodings(graphs_dir / "decode.onnx")


def genie_parts(graphs: list[Path], spec: dict[str, Any], work: Path, stem: str,
                kv: list[dict[str, Any] | None] | None = None) -> list[Path]:
    """Each part's quantized graph (decode or AR-N, in order) in Genie's conventions, the
    residual stream passing from part to part as the handing part's uint16 integers (``kv``:
    each part's cache encodings, for quantized KV I/O)."""
    from studio.engine import genie

    out, handoff = [], {}
    for i, src in enumerate(graphs):
        dst = work / f"{stem}_part{i + 1}_of_{len(graphs)}.onnx"
        handoff = genie.genie_graph(src, dst, spec, handoff,
                                    kv_encodings=kv[i] if kv else None)["handoff_out"]
        out.append(dst)
    return out


def genie_prefill_parts(export_dir: Path, qdir: Path, spec: dict[str, Any], N: int, cl: int,
                        work: Path, settings: BundleSettings, progress: Progress) -> list[Path]:
    """The AR-N prefill graph of a model exported in parts, one graph per part: each part's
    exported from the checkpoint a part at a time (:func:`studio.engine.llm_parts.export_part_ar_graphs`),
    calibrated on what the previous parts' float AR-N graphs hand it, and quantized with the
    recipe and its own decode graph's activation scales."""
    import numpy as np

    from studio.engine.llm_parts import export_part_ar_graphs, iter_parts
    from studio.engine.llm_runtime import make_cpu_session
    from studio.engine.quantize import quantize_like

    parts = list(iter_parts(spec))
    floats = export_part_ar_graphs(settings.checkpoint, spec, N, cl - N, work / "ar",
                                   SubProgress(progress, 0.0, 0.5))
    progress.update(0.5, f"calibration feeds for the AR-{N} graphs")
    feeds = ar_feeds(export_dir, spec, N, cl, settings)
    out = []
    for part, src in zip(parts, floats, strict=True):
        progress.check()
        progress.update(0.55 + 0.45 * part.index / len(parts),
                        f"part {part.index + 1}/{len(parts)}: quantizing its AR-{N} graph with "
                        "its decode graph's scales")
        sess = make_cpu_session(src)
        names = [i.name for i in sess.get_inputs()]
        mine = [{k: f[k] for k in names} for f in feeds]
        if part.hidden_out:
            for f, m in zip(feeds, mine, strict=True):  # what the next part takes
                f[part.hidden_out] = np.asarray(sess.run([part.hidden_out], m)[0])
        del sess
        dst = src.with_name("ar_q.onnx")
        quantize_like(src, dst, qdir / part.name / "decode.onnx", settings.recipe, mine)
        out.append(dst)
    return genie_parts(out, spec, work, f"prefill_ar{N}_genie",
                       [kv_encodings(qdir / p.name, settings) for p in parts])


def readme(spec: dict[str, Any], chip, sdk: str, N: int, cl: int, parts: int,
           ctx_names: list[str], kv_dtype: str = "float32") -> str:
    """The bundle's README: how to run it on the device, and what its graphs are."""
    return (
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
        + ("The KV cache goes in and out (`past_*_in` / `past_*_out`) as uint16 integers, one "
           "encoding per tensor for every graph (`manifest.json` → `kv_cache`): the new rows "
           "are copied into the cache as they come, nothing converts the cache at the edge. "
           if kv_dtype == "uint16" else "")
        + "`manifest.json` lists every file with its SHA-256 and the check against the studio's "
        "runtime on the HTP simulator.\n")


def compile_graphs(variants: dict[int, Path | list[Path]], parts: int, spec: dict[str, Any],
                   chip, cl: int, work: Path, progress: Progress,
                   extra_options: dict[str, str] | None = None):
    """Each AR-n graph (split into ``parts`` of consecutive blocks, unless given as its parts'
    graphs already) compiled in the order Genie takes them. Returns (the sessions of each
    AR-n's parts, (context binary, its name in the bundle) pairs, the names, the manifest's
    graph rows, the QNN SDK version)."""
    from studio.engine import genie, qnn

    ctx_names: list[str] = []
    graph_rows: list[dict[str, Any]] = []
    sessions: dict[int, list[Any]] = {}
    compiled: list[tuple[Path, str]] = []
    sdk = ""
    total = len(variants) * parts
    for ar, graph in variants.items():
        kind = "decode" if ar == 1 else "prefill"
        graphs = graph if isinstance(graph, list) else [graph]
        if parts > 1 and len(graphs) == 1:
            progress.update(0.12, f"splitting the AR-{ar} graph into {parts} parts of "
                                  "consecutive blocks")
            graphs = genie.split_graph(graph, work / f"parts{ar}", spec, parts)
        previous = ""
        for i, part in enumerate(graphs):
            progress.update(0.13 + 0.12 * len(compiled) / total,
                            f"compiling the AR-{ar} graph"
                            + (f", part {i + 1}/{parts}" if parts > 1 else "")
                            + f" for {chip.name}")
            comp, previous = compile_in_order(part, work / "ctx" / f"{ar}_{i}", chip, previous,
                                              extra_options=extra_options)
            sdk = comp["sdk_version"]
            name = (f"{kind}_ar{ar}_cl{cl}.bin" if parts == 1 else
                    f"{kind}_ar{ar}_cl{cl}_part{i + 1}_of_{parts}.bin")
            sessions.setdefault(ar, []).append(
                qnn.make_session(Path(comp["ctx_path"]), chip, strict=True,
                                 extra_options=extra_options))
            compiled.append((Path(comp["bin_files"][0]), name))
            ctx_names.append(name)
            graph_rows.append({"file": name, "kind": kind, "ar": ar, "context_size": cl,
                               "part": i + 1, "parts": parts, **genie.graph_io(part),
                               "qnn_graph": previous})
    return sessions, compiled, ctx_names, graph_rows, sdk


def build_bundle(export_dir: Path, qdir: Path, chip, spec: dict[str, Any], out_root: Path,
                 settings: BundleSettings, open_reference: Callable[[], Any], source: str,
                 progress: Progress) -> dict[str, Any]:
    """Build the bundle under ``out_root/bundle`` (and the DLC files of the quantized graphs
    under ``out_root/dlc``) from the export, the quantized graphs ``qdir`` and their ``spec``,
    and check it: Genie's greedy text against the studio's runtime over the bundle's own
    graphs, and against ``open_reference()`` (the studio's generator over the target's
    compiled context). ``source``: the label of the device the check runs on.

    Returns the stage's result with ``figures``: (name, value, unit, detail, timed) rows for
    the caller to label from its device (``timed``: a timing, which takes the device's
    note). Raises when Genie's text differs other than at a near tie."""
    from studio.engine import genie, qnn
    from studio.engine.llm_runtime import load_tokenizer

    if spec.get("sliding_window") and spec["sliding_window"] < spec["context_length"]:
        raise StudioError("this model has sliding-window layers: Genie bundles of them are not "
                          "supported yet")
    C = int(spec["context_length"])
    cl = C + 1
    N = settings.prefill_length or int(spec["prompt_length"])
    if N >= cl - 1:
        raise StudioError(f"bundle.prefill_length {N} leaves no room in the context of {cl}: "
                          f"choose 1 (no prefill graph) to {cl - 2}")
    out = out_root / "bundle"
    work = out_root / "work"
    exported = [p["name"] for p in spec.get("parts") or []]
    variants: dict[int, Path | list[Path]]
    if len(exported) > 1:  # exported in parts: a context binary per part and graph
        if settings.parts not in (0, len(exported)):
            raise StudioError(f"bundle.parts is {settings.parts}, but this model was exported "
                              f"in {len(exported)} parts: its bundle has a context binary per "
                              "part; set bundle.parts = 0")
        progress.update(0.02, f"rewriting the {len(exported)} parts' decode graphs to "
                              "Genie's conventions")
        variants = {1: genie_parts([qdir / p / "decode.onnx" for p in exported], spec, work,
                                   "decode_genie",
                                   [kv_encodings(qdir / p, settings) for p in exported])}
        if N > 1:
            variants = {N: genie_prefill_parts(export_dir, qdir, spec, N, cl, work, settings,
                                               SubProgress(progress, 0.03, 0.12)),
                        **variants}
        weights = sum(graph_bytes(qdir / p / "decode.onnx") for p in exported)
        parts = len(exported)
    else:
        progress.update(0.02, "rewriting the decode graph to Genie's conventions")
        genie.genie_graph(qdir / "decode.onnx", work / "decode_genie.onnx", spec,
                          kv_encodings=kv_encodings(qdir, settings))
        variants = {1: work / "decode_genie.onnx"}
        if N > 1:
            variants = {N: genie_prefill_graph(export_dir, qdir, spec, N, cl, work, settings,
                                               SubProgress(progress, 0.03, 0.12)),
                        **variants}
        weights = graph_bytes(qdir / "decode.onnx")
        parts = settings.parts or max(1, -(-weights // (settings.max_context_mb << 20)))
    out.mkdir(parents=True, exist_ok=True)
    sessions, compiled, ctx_names, graph_rows, sdk = compile_graphs(
        variants, parts, spec, chip, cl, work, progress, settings.htp_options)

    tok = load_tokenizer(export_dir)
    text = settings.heldout_text
    n_prompts = settings.prompts
    prompts = bundle_prompts(text, tok, n_prompts,
                             long=N + N // 2 + 1 if N > 1 and n_prompts > 1 else 0)
    want = settings.new_tokens
    # the studio's runtime over the bundle's own graphs, before they move into the bundle
    runner = genie.BundleRunner(sessions, spec, cl)
    kv_dtype = str(runner.keys.dtype)  # as the compiled graphs take the cache
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
    accuracy = None
    if settings.score_tokens:  # the figures of what ships: its own binaries against FP32
        prompt = (tok(settings.greedy_prompt).input_ids[:int(spec["prompt_length"])]
                  if settings.greedy_prompt else None)
        accuracy = score_shipped(runner, export_dir, spec, tok(text).input_ids,
                                 settings.score_tokens, cl, progress, prompt,
                                 settings.greedy_tokens)
        if accuracy.get("greedy"):
            accuracy["greedy"]["text"] = tok.decode(accuracy["greedy"].pop("ids"))
    del runner, sessions
    for src, name in compiled:
        shutil.move(src, out / name)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copy(export_dir / "tokenizer" / "tokenizer.json", out / "tokenizer.json")
    cfg = genie.genie_config(spec, ctx_names)
    atomic_write_json(out / "genie_config.json", cfg)

    progress.update(0.5, "loading the bundle in Genie (HTP simulator)")
    ref_gen = open_reference()
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
            parted = None if same else parting(g["text"], ref, ups[i], tok)
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

    kv_cache: dict[str, Any] = {"dtype": kv_dtype}
    if settings.graph_io == "quantized":  # what an app other than Genie needs to feed them
        kv_cache["encodings"] = ([kv_encodings(qdir / p, settings) for p in exported]
                                 if len(exported) > 1 else [kv_encodings(qdir, settings)])
    manifest = {
        "format": "genie-bundle", "version": 1, "model": spec.get("model_type"),
        "chip": {"key": chip.key, "name": chip.name, "htp_arch": chip.htp_arch,
                 "soc_model": chip.soc_model},
        "qnn_sdk": sdk, "onnxruntime_qnn": version("onnxruntime-qnn"),
        "built_on": platform.platform(),
        "recipe": {k: settings.recipe[k] for k in ("scheme", "weight_granularity")},
        "context_size": cl, "prefill_ar": N if N > 1 else None,
        "graphs": graph_rows,
        "kv_cache": kv_cache,
        "weights_bytes": weights,
        "files": files,
        "verification": {"runtime": "Genie (libGenie.so) on the QNN HTP simulator",
                         "reference": "the studio's runtime over the bundle's graphs",
                         "source": source, "prompts": len(checks),
                         "identical": identical, "tokens": tokens,
                         "same_as_prefill_path": via_prefill,
                         "accuracy_on_these_binaries": accuracy},
    }
    if spec.get("vision"):  # a vision-language model: its encoder's binary beside
        from studio.engine.vision import bundle_encoder

        progress.update(0.95, "compiling the vision encoder's context binary into the bundle")
        manifest["vision"] = bundle_encoder(export_dir, qdir, out, chip, False,
                                            settings.htp_options)
        for name in (manifest["vision"]["file"], "vision.json"):
            f = out / name
            files[name] = {"bytes": f.stat().st_size, "sha256": sha(f)}
    progress.update(0.96, "writing the DLC files of the quantized graphs")
    dlc = {}
    for folder in exported if len(exported) > 1 else [""]:
        for kind in ("prefill", "decode"):
            key = f"{folder}/{kind}" if folder else kind
            dlc[key] = qnn.export_dlc(qdir / folder / f"{kind}.onnx", chip,
                                      out_root / "dlc" / f"{key}.dlc")
    manifest["dlc"] = {**{g: {k: d[k] for k in ("file", "bytes")} for g, d in dlc.items()},
                       "note": "for Qualcomm's on-device tools; not runnable on this host"}
    atomic_write_json(out / "manifest.json", manifest)
    text = readme(spec, chip, sdk, N, cl, parts, ctx_names, kv_cache["dtype"])
    if manifest.get("vision"):
        from studio.engine.vision import bundle_readme

        text += bundle_readme(manifest["vision"])
    (out / "README.md").write_text(text)
    timed = "Genie's wall time"
    figures = [  # (name, value, unit, detail, whether it is a timing of the device)
        ("genie_identical_prompts", identical / len(checks), "fraction",
         f"{identical} of {len(checks)} prompts, {tokens} tokens, against the studio's runtime "
         "over the bundle's own graphs", False),
        ("genie_same_as_prefill_path", via_prefill / len(checks), "fraction",
         "against the studio's runtime with its own prefill graph (other graphs: may part at "
         "a near tie)", False),
        *([] if accuracy is None else [
            (f"bundle_{k}", accuracy[k], unit, f"{accuracy['tokens']} held-out tokens on the "
             "bundle's own binaries (the studio's runtime over them, as Genie runs a prompt) "
             "against FP32", False)
            for k, unit in (("logits_cosine", ""), ("kl_divergence", "nats"),
                            ("top1_agreement", "fraction"), ("perplexity", ""))]),
        *([] if not (accuracy or {}).get("greedy") else [
            ("bundle_greedy_agreement", accuracy["greedy"]["agreement"], "fraction",
             f"{accuracy['greedy']['tokens']} tokens the bundle's binaries generated after "
             "run.prompt, each against FP32's choice given that text", False)]),
        ("genie_tokens_per_s", rate, "tok/s", timed, True),
        ("genie_load_s", load_s, "s", timed, True),
    ]
    bad = [c for c in checks if not c["identical"] and c not in ties]
    if bad:
        p = bad[0]["parted"]
        raise StudioError(f"Genie's greedy text differs from the studio's on {len(bad)} of "
                          f"{len(checks)} prompts (first at character "
                          f"{bad[0]['first_difference_at_char']} of {bad[0]['prompt']!r}, "
                          f"new token {p['token']}" + (f", where the studio's best two tokens "
                          f"are {p['gap']:.3g} apart" if p["gap"] is not None else "")
                          + "): not a near tie; studio bisect shows where the quantized graphs "
                          "leave FP32")
    return {
        "summary": (f"Genie bundle for {chip.name}: {len(files) + 2} files"
                    + (f" ({len(ctx_names)} context binaries)" if len(ctx_names) > 1 else "")
                    + ", Genie's greedy text "
                    f"equals the studio's on {identical}/{len(checks)} prompts ({tokens} tokens, "
                    f"{source}"
                    + (f"; parted at a near tie on {len(ties)}: best two logits "
                       + ", ".join(f"{c['parted']['gap']:.3g}" for c in ties) + " apart"
                       if ties else "")
                    + f"; with the studio's own prefill graph {via_prefill}/{len(checks)})"
                    + ("" if accuracy is None else
                       f"; the shipped binaries against FP32 on {accuracy['tokens']} held-out "
                       f"tokens: cosine {accuracy['logits_cosine']:.4f}, top-1 "
                       f"{accuracy['top1_agreement']:.1%}, ppl {accuracy['fp32_perplexity']:.2f}"
                       f" → {accuracy['perplexity']:.2f}")),
        "target": chip.key, "source": source, "bundle": "bundle", "files": files,
        "checks": checks, "context_size": cl, "accuracy": accuracy, "qnn_sdk": sdk,
        "prefill_ar": N if N > 1 else None,
        # the figures the project's gates judge, of the binaries that ship (as validate's are
        # of the compile stage's)
        **({} if accuracy is None else {
            "logits_cosine_mean": accuracy["logits_cosine"],
            "top1_agreement": accuracy["top1_agreement"],
            "perplexity_fp32": accuracy["fp32_perplexity"],
            "perplexity_quantized": accuracy["perplexity"]}),
        "studio_passes": {f"ar{k}": v for k, v in passes.items()},
        "ctx_bins": ctx_names,
        "dlc": {g: {"file": f"dlc/{d['file']}", "bytes": d["bytes"], "entries": d["entries"]}
                for g, d in dlc.items()},
        "figures": figures,
    }


