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

import gc
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, atomic_write_text, link_or_copy
from studio.core.progress import Progress, SubProgress
from studio.core.settings import DLC_AUTO_BYTES
from studio.engine import deploy, deployed, genie, qnn
from studio.engine.bundle_draft import add_draft
from studio.engine.bundle_draft import readme_section as draft_readme
from studio.engine.bundle_report import (
    BundleCheck,
    TakenBinaries,
    bundle_figures,
    bundle_manifest,
    bundle_result,
    file_sha256,
    raise_on_defect,
)
from studio.engine.chain import part_dirs
from studio.engine.chat_template import TEMPLATE_FILE, ChatTemplate, prompt_format
from studio.engine.devices.htp_sim import sim_holds_bytes
from studio.engine.llm_runtime import cpu_generator, load_tokenizer, make_cpu_session
from studio.engine.part_runner import iter_parts, run_part_graphs
from studio.engine.sensitivity import compare_logits, greedy_against_fp32
from studio.engine.weightshare import EXECUTED


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
    parts: int  # 0: the compile stage's parts; another count is refused
    prompts: int
    new_tokens: int
    score_tokens: int = 0  # held-out tokens scored against FP32 on the bundle's binaries
    greedy_prompt: str = ""  # validate's greedy check on the bundle's binaries: its prompt
    greedy_tokens: int = 0  # and its new tokens (0: no greedy check)
    htp_options: dict[str, str] | None = None  # the compile's extra QNN EP options
    graph_io: str = "float"  # htp.graph_io: "quantized" makes the KV cache uint16 I/O
    chat_template: str = "checkpoint"  # model.chat_template: how run.prompt goes in
    dlc: str = "auto"  # bundle.dlc: the quantized graphs' DLC files (auto: up to 2 GiB)
    draft: Path | None = None  # model.draft's checkpoint, shipped for the app's CPU
    draft_ref: str = ""  # model.draft as the project names it
    draft_embedding: str = "auto"  # model.draft_embedding: its token table


def dlc_wanted(setting: str, weight_bytes: int, limit: int = DLC_AUTO_BYTES) -> bool:
    """Whether a bundle writes the DLC files of its quantized graphs (``bundle.dlc``): on,
    off, or auto — where the graphs hold at most ``limit`` bytes of weights (each DLC file
    holds its graph's weights again: at 8 B, W4A16, some 8 GB beside 4 GB of binaries)."""
    return setting == "on" or (setting == "auto" and weight_bytes <= limit)


#: what this onnxruntime-qnn's Genie takes of a prompt format, read from the JSON schemas in
#: its libGenie.so: a dialog config (urn:genie:schema:dialog, no additional properties) has
#: no prompt template; only an embedding config has "prompt": {"prompt-template": [...]}
GENIE_TEMPLATE_NOTE = ("Genie's dialog config takes no prompt template (this libGenie.so's "
                       "dialog schema has no such key; only an embedding config's "
                       "prompt.prompt-template): the app wraps the prompt before "
                       "GenieDialog_query")


def ship_template(fmt, out: Path) -> dict[str, Any] | None:
    """The chat template in a bundle (``fmt``: the project's
    :class:`~studio.engine.chat_template.PromptFormat`): ``chat_template.jinja`` beside
    ``tokenizer.json`` and the manifest entry an app needs to render it — the special tokens
    it reads, how transformers renders it, and the two fixed texts it puts around one user
    prompt (``prompt-template``, in the shape of Genie's embedding key) where it does just
    that. None when the project's prompts go in as written."""
    t = fmt.template
    if t is None:
        return None
    atomic_write_text(out / TEMPLATE_FILE, t.text)
    wrap = t.affixes()
    return {"file": TEMPLATE_FILE, "sha256": t.sha256, "from": t.source,
            "special_tokens": dict(t.special),
            "render": "jinja2 as transformers' apply_chat_template renders it: messages = "
                      "[{\"role\": \"user\", \"content\": PROMPT}], add_generation_prompt = "
                      "true, special_tokens as variables; tokenized without adding special "
                      "tokens (the template writes them)",
            "prompt-template": list(wrap) if wrap is not None else None,
            "genie": GENIE_TEMPLATE_NOTE}


def bundle_template(folder: Path):
    """The chat template a bundle ships (a :class:`~studio.engine.chat_template.ChatTemplate`
    read from its manifest entry and file), None when it ships none."""
    try:
        entry = json.loads((Path(folder) / "manifest.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        raise StudioError(f"{folder}/manifest.json cannot be read ({exc}): build the bundle "
                          "again") from None
    if not entry:
        return None
    try:
        text = (Path(folder) / entry["file"]).read_text(encoding="utf-8")
        special = tuple(sorted(dict(entry.get("special_tokens") or {}).items()))
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise StudioError(f"the bundle's chat template cannot be read ({exc}): build the "
                          "bundle again") from None
    return ChatTemplate(text, f"the bundle's {entry['file']}", special)


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


def readme(spec: dict[str, Any], chip, sdk: str, N: int, cl: int, parts: int,
           ctx_names: list[str], kv_dtype: str = "float32",
           template: dict[str, Any] | None = None, prompt_format: str = "") -> str:
    """The bundle's README: how to run it on the device, what its graphs are, and how a
    prompt goes in (its chat template)."""
    return _readme_run(spec, chip, sdk, N, cl, parts, ctx_names, kv_dtype) + _readme_prompt(
        template, prompt_format)


def _readme_prompt(template: dict[str, Any] | None, prompt_format: str) -> str:
    if template is None:
        return f"\nPrompts: {prompt_format}.\n" if prompt_format else ""
    wrap = template["prompt-template"]
    example = None
    if wrap:  # bash's $'...' keeps the template's newlines
        text = f"{wrap[0]}def fibonacci(n):{wrap[1]}"
        example = "$'" + text.replace("\\", "\\\\").replace("'", "\\'").replace(
            "\n", "\\n") + "'"
    return ("\nPrompts go in through the checkpoint's chat template, `" + template["file"]
            + f"` ({template['from']}; `manifest.json` → `chat_template`): one user message, "
            "the assistant's turn opened, rendered as transformers' `apply_chat_template` "
            "does. " + GENIE_TEMPLATE_NOTE + "."
            + (" The command above gives a prompt as written; for one prompt the template is "
               "two fixed texts around it (`manifest.json` → `chat_template` → "
               "`prompt-template`), so through the template it is:\n\n```\ngenie-t2t-run -c "
               f"genie_config.json -p {example}\n```\n" if example else
               " It does more to a prompt than wrap it: render it with a template engine.\n"))


def _readme_run(spec: dict[str, Any], chip, sdk: str, N: int, cl: int, parts: int,
                ctx_names: list[str], kv_dtype: str) -> str:
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


#: beside a bundle of weight-shared binaries, the separate binaries the simulator executes
SIMULATOR_DIR = "simulator"


def simulator_folder(bundle: Path) -> Path:
    """The folder Genie on the simulator loads for ``bundle``: the bundle itself, or where it
    ships weight-shared binaries (which the x86 simulator cannot load) the separately compiled
    ones it was checked against, kept beside it."""
    sim = Path(bundle).parent / SIMULATOR_DIR
    return sim if sim.is_dir() else Path(bundle)


def _fits_simulator(record: dict[str, Any]) -> bool:
    return int(record["binary_bytes"]) <= sim_holds_bytes()


def fp32_by_part(export_dir: Path, spec: dict[str, Any], ids: list[int]
                 ) -> tuple[list[Any], Any]:
    """The FP32 export over ``ids`` one part at a time (one part's graphs in memory): each
    part's hand-off [n, hidden] but the last's, and the logits [n, V]."""
    n, vocab = len(ids), int(spec["vocab_size"])
    logits = np.empty((n, vocab), np.float32)

    def on_logits(p: int, row) -> None:
        logits[p] = np.asarray(row, np.float32)[:vocab]

    x: Any = np.asarray(ids, dtype=np.int64)
    hidden = []
    for part, folder in zip(iter_parts(spec), part_dirs(spec, export_dir), strict=True):
        x = run_part_graphs(folder, part, spec, x, n, make_cpu_session,
                             on_logits if part.heads else None)
        if not part.heads:
            hidden.append(np.asarray(x, np.float32))
        gc.collect()
    return hidden, logits


def part_checks(scorer, export_dir: Path, spec: dict[str, Any], prompts: list[list[int]],
                progress: Progress) -> list[dict[str, Any]]:
    """Each prompt through the shipped binaries part by part (each part loaded alone, fed the
    hand-off the part before recorded): per part its hand-off against the FP32 export's
    hidden states there (read with the encoding in its binary), and for the last part its
    tokens against FP32's on the same prompt. The FP32 export runs a part at a time too."""
    vocab = int(spec["vocab_size"])
    out = []
    for i, ids in enumerate(prompts):
        progress.check()
        got = scorer.teacher_forced_logits(ids, progress=SubProgress(
            progress, i / len(prompts), (i + 0.7) / len(prompts)))
        progress.update((i + 0.7) / len(prompts), f"prompt {i + 1}/{len(prompts)}: the FP32 "
                                                   "export part by part")
        ref_hidden, ref = fp32_by_part(export_dir, spec, ids)
        parts = []
        for k, (raw, enc, want) in enumerate(zip(scorer.handoffs, scorer.handoff_encodings,
                                                 ref_hidden, strict=True)):
            row: dict[str, Any] = {"part": k + 1, "loaded_alone": True,
                                   "handoff_finite": True}
            if enc is not None:
                scale, offset = enc
                value = (raw.astype(np.float64) + offset) * scale
                a, b = value.ravel(), want.astype(np.float64).ravel()
                row["handoff_cosine_to_fp32"] = float(
                    a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))
                row["handoff_finite"] = bool(np.isfinite(value).all())
            row["handoff_range"] = [int(raw.min()), int(raw.max())]
            parts.append(row)
        same = int((got[:, :vocab].argmax(-1) == ref.argmax(-1)).sum())
        parts.append({"part": len(parts) + 1, "loaded_alone": True, "tokens": len(ids),
                      "top1_same_as_fp32": same})
        out.append({"prompt_tokens": len(ids), "parts": parts,
                    "top1_agreement": same / len(ids)})
    return out


def build_bundle(export_dir: Path, qdir: Path, cdir: Path, chip, spec: dict[str, Any],
                 out_root: Path, settings: BundleSettings, source: str,
                 progress: Progress) -> dict[str, Any]:
    """The bundle under ``out_root/bundle``: the compile stage's deployable binaries of
    ``cdir`` (:mod:`studio.engine.deploy`) copied — nothing is compiled here — with
    ``genie_config.json``, ``tokenizer.json``, a manifest and a README, and checked: where the
    simulator holds them all, Genie's greedy text against the studio's runtime over the same
    binaries (equal by construction; a difference other than a near tie is a defect); where
    it does not, each part loaded alone and fed the recorded hand-off of the part before,
    the last part's tokens against FP32. ``source``: the label of the device the check runs
    on.

    Returns the stage's result with ``figures``: (name, value, unit, detail, timed) rows for
    the caller to label from its device (``timed``: a timing, which takes the device's
    note). Raises when Genie's text differs other than at a near tie."""
    record = compiled_record(spec, cdir, settings)
    taken = take_binaries(record, cdir, out_root, progress)
    tok = load_tokenizer(export_dir)
    fmt = prompt_format(export_dir / "tokenizer", settings.chat_template)
    prompts = check_prompts(settings, tok, fmt, record.get("prefill_ar") or 1)
    write_genie_files(export_dir, spec, taken)
    check = check_bundle(export_dir, cdir, chip, spec, out_root, settings, record, taken,
                         tok, fmt, prompts, progress)
    template = ship_template(fmt, taken.out)  # before the file list: the manifest lists it too
    files = {f.relative_to(taken.out).as_posix(): {"bytes": f.stat().st_size,
                                                   "sha256": file_sha256(f)}
             for f in sorted(taken.out.rglob("*")) if f.is_file()}
    manifest = bundle_manifest(chip, spec, settings.recipe, source, record, taken, check,
                               template, fmt.line(), files)
    progress.update(0.96, "writing the DLC files of the quantized graphs")
    dlc = write_dlc(record, qdir, chip, out_root, settings, manifest)
    progress.update(0.98, "writing the manifest")
    atomic_write_json(taken.out / "manifest.json", manifest)
    cl, N = int(record["context_size"]), record.get("prefill_ar") or 1
    (taken.out / "README.md").write_text(
        readme(spec, chip, record.get("sdk_version", ""), N, cl, int(record["parts"]),
               taken.ctx_names, manifest["kv_cache"]["dtype"], template, fmt.line())
        + ("" if check.draft is None else draft_readme(check.draft)))
    figures = bundle_figures(check, int(record["parts"]))
    raise_on_defect(check)
    return bundle_result(chip, source, record, taken, check, files, dlc, manifest, figures)


def compiled_record(spec: dict[str, Any], cdir: Path, settings: BundleSettings
                    ) -> dict[str, Any]:
    """The compile stage's record of its deployable binaries (:func:`studio.engine.deploy.read`),
    refused where the model has no Genie bundle or the bundle's settings ask for other
    binaries than those."""
    why_not = deploy.supported(spec, False)
    if why_not:
        raise StudioError(f"no Genie bundle for this model: {why_not}")
    record = deploy.read(cdir)
    if record is None:
        raise StudioError("the compile stage's output holds no deployable binaries: run "
                          "studio --batch FILE --stages compile again")
    N, parts = record.get("prefill_ar") or 1, int(record["parts"])
    if settings.parts not in (0, parts):
        raise StudioError(f"bundle.parts is {settings.parts}, but the compile stage's binaries "
                          f"are in {parts} part(s): the bundle ships those binaries; set "
                          f"export.parts = {settings.parts} (or \"auto\") and bundle.parts = 0")
    if settings.prefill_length and settings.prefill_length != N and not (
            settings.prefill_length == 1 and N == 1):
        raise StudioError(f"bundle.prefill_length {settings.prefill_length} differs from the "
                          f"compiled AR-{N} prefill graph: run the compile stage again")
    return record


def take_binaries(record: dict[str, Any], cdir: Path, out_root: Path,
                  progress: Progress) -> TakenBinaries:
    """The compile stage's context binaries copied (hard links where the store allows) into
    the bundle, or where weight-shared ones ship, the executed ones into a folder beside it."""
    out = out_root / "bundle"
    shared = record.get("shared") or []
    # the separate binaries the simulator executes: the bundle's own where no weight-shared
    # ones ship, else a folder of the stage's beside it (Genie on the simulator loads them:
    # the check here, `studio generate --runtime genie` and the playground later)
    run_dir = out_root / SIMULATOR_DIR if shared else out
    for d in {out, run_dir}:
        d.mkdir(parents=True, exist_ok=True)
    rows = sorted(record["graphs"], key=lambda r: (-r["ar"], r["part"]))
    progress.update(0.02, f"taking the compile stage's {len(rows) + len(shared)} context "
                          "binaries (the validated ones; hard links where the store allows)")
    for r in rows:
        progress.check()
        deploy.write_binary(Path(cdir) / r["ctx"], run_dir / r["file"])
    for r in shared:
        link_or_copy(Path(cdir) / r["bin"], out / r["file"])
    run_names = [r["file"] for r in rows]
    graph_rows = [{k: r[k] for k in ("file", "kind", "ar", "context_size", "part", "parts",
                                     "inputs", "outputs", "qnn_graph")}
                  | {"executed": EXECUTED, "shipped": not shared} for r in rows]
    shared_rows = [{k: r[k] for k in ("file", "part", "bytes", "separate_bytes", "graphs",
                                      "executed", "structure")} for r in shared]
    return TakenBinaries(out, run_dir, rows, shared, run_names,
                         [r["file"] for r in shared] or run_names, graph_rows, shared_rows)


def check_prompts(settings: BundleSettings, tok, fmt, N: int) -> list[str]:
    """The check's held-out prompts (the last longer than the AR-N prefill graph takes at
    once), and ``run.prompt`` through the chat template where one applies."""
    n_prompts = settings.prompts
    prompts = bundle_prompts(settings.heldout_text, tok, n_prompts,
                             long=N + N // 2 + 1 if N > 1 and n_prompts > 1 else 0)
    if fmt.applied and settings.greedy_prompt:
        # run.prompt through the chat template, as an app hands it to Genie: Genie's
        # tokenizer must read the template's special tokens as the studio's does
        prompts.append(fmt.text(settings.greedy_prompt))
    return prompts


def write_genie_files(export_dir: Path, spec: dict[str, Any], taken: TakenBinaries) -> None:
    """``tokenizer.json`` and ``genie_config.json`` beside the shipped binaries and beside
    the executed ones."""
    for d, names in {taken.out: taken.ctx_names, taken.run_dir: taken.run_names}.items():
        shutil.copy(export_dir / "tokenizer" / "tokenizer.json", d / "tokenizer.json")
        atomic_write_json(d / "genie_config.json", genie.genie_config(spec, names))


def check_bundle(export_dir: Path, cdir: Path, chip, spec: dict[str, Any], out_root: Path,
                 settings: BundleSettings, record: dict[str, Any], taken: TakenBinaries,
                 tok, fmt, prompts: list[str], progress: Progress) -> BundleCheck:
    """The bundle checked: where the simulator holds it whole, the studio's runtime over its
    binaries (each prompt's greedy tokens; the figures and the draft of what ships), then
    Genie's text against those tokens; where it does not (or Genie cannot load it), each
    part loaded alone."""
    check = BundleCheck()
    whole = _fits_simulator(record)
    runner = None
    if whole:
        # the studio's runtime over the very binaries the bundle holds
        try:
            runner = deployed.open_runner(cdir, chip, spec, settings.htp_options, record)
        except qnn.SimulatorFull as exc:  # the byte budget is a measure, not a law
            check.genie_note = (f"the simulator could not load every binary at once "
                                f"({exc.message})")
            progress.log(check.genie_note + ": checked part by part instead")
            whole = False
    if runner is not None:
        refs, ups = studio_reference(runner, export_dir, spec, out_root, settings, taken.out,
                                     tok, fmt, prompts, int(record["context_size"]), check,
                                     progress)
        del runner
        whole = genie_check(taken.run_dir, prompts, refs, ups, tok, check, progress)
    if not whole:
        progress.update(0.5, f"checking the {int(record['parts'])} parts one at a time (the "
                             "simulator does not hold the whole bundle)")
        check.by_part = part_checks(deployed.PartScorer(cdir, chip, spec, settings.htp_options),
                                    export_dir, spec, [tok(p).input_ids for p in prompts],
                                    SubProgress(progress, 0.5, 0.95))
        for r in taken.graph_rows:
            r["executed"] = "executed on the HTP simulator, part by part"
    return check


def studio_reference(runner, export_dir: Path, spec: dict[str, Any], out_root: Path,
                     settings: BundleSettings, out: Path, tok, fmt, prompts: list[str],
                     cl: int, check: BundleCheck, progress: Progress
                     ) -> tuple[list[tuple[list[int], int, list[int], int]],
                                list[list[tuple[int, float]]]]:
    """The studio's runtime over the shipped binaries (``runner``): each prompt's greedy
    tokens with the runner-up at each (``refs``, ``ups``), its passes, and into ``check`` the
    figures of the shipped binaries against FP32 and the draft for the app's CPU."""
    refs, ups = [], []
    for i, prompt in enumerate(prompts):
        progress.check()
        ids = tok(prompt).input_ids
        n = max(1, min(settings.new_tokens, cl - 1 - len(ids)))
        progress.update(0.1 + 0.3 * i / len(prompts),
                        f"prompt {i + 1}/{len(prompts)}: {n} tokens from the studio's "
                        "runtime over the shipped binaries")
        refs.append((ids, n, runner.greedy(ids, n), runner.prompt_passes))
        ups.append(list(runner.runner_up))
    check.passes = dict(runner.passes)
    if settings.score_tokens:  # the figures of what ships: its own binaries against FP32
        greedy_ids = None
        if settings.greedy_prompt:  # as validate's greedy check takes it
            greedy_ids = fmt.ids(tok, settings.greedy_prompt)
            if not fmt.applied:
                greedy_ids = greedy_ids[:int(spec["prompt_length"])]
        check.accuracy = score_shipped(runner, export_dir, spec,
                                       tok(settings.heldout_text).input_ids,
                                       settings.score_tokens, cl, progress, greedy_ids,
                                       settings.greedy_tokens)
        if check.accuracy.get("greedy"):
            check.accuracy["greedy"]["text"] = tok.decode(check.accuracy["greedy"].pop("ids"))
    if settings.draft is not None:  # the draft for the app's CPU, checked on these binaries

        check.draft = add_draft(out, out_root, settings.checkpoint, settings.draft,
                                settings.draft_ref, settings.draft_embedding, spec, export_dir,
                                deployed.DeployedGenerator(runner, spec),
                                [(ids, n, ref) for ids, n, ref, _ in refs], ups,
                                SubProgress(progress, 0.4, 0.5))
    return refs, ups


def genie_check(run_dir: Path, prompts: list[str],
                refs: list[tuple[list[int], int, list[int], int]],
                ups: list[list[tuple[int, float]]], tok, check: BundleCheck,
                progress: Progress) -> bool:
    """Genie on the simulator over the executed binaries: each prompt's text against the
    studio's tokens ``refs`` (into ``check``). False where Genie cannot load the bundle."""
    progress.update(0.5, "loading the bundle in Genie (HTP simulator)")
    try:
        dialog = genie.GenieDialog(run_dir)
    except StudioError as exc:  # Genie holds less than ONNX Runtime's sessions
        check.genie_note = f"Genie on the simulator could not load the whole bundle ({exc})"
        progress.log(check.genie_note + ": checked part by part instead")
        return False
    with dialog:
        for i, (prompt, (ids, n, ref, prompt_passes)) in enumerate(
                zip(prompts, refs, strict=True)):
            progress.check()
            progress.update(0.5 + 0.45 * i / len(prompts),
                            f"prompt {i + 1}/{len(prompts)}: {n} tokens from Genie")
            g = dialog.query(prompt, n)
            ref_text = tok.decode(ref)
            same = g["text"] == ref_text
            prefix = next((k for k, (a, b) in enumerate(
                zip(g["text"], ref_text, strict=False)) if a != b),
                min(len(g["text"]), len(ref_text)))
            parted = None if same else parting(g["text"], ref, ups[i], tok)
            if parted is not None:
                progress.log(f"prompt {i + 1}: Genie gave {g['text']!r}, the studio's "
                             f"runtime over the same binaries {ref_text!r} ({parted})")
            check.checks.append({"prompt": prompt, "prompt_tokens": len(ids),
                                 "new_tokens": n, "studio_tokens": len(ref),
                                 "identical": same, "prompt_passes": prompt_passes,
                                 "first_difference_at_char": None if same else prefix,
                                 "parted": parted, "genie_text": g["text"],
                                 "studio_text": ref_text, "genie_wall_s": g["wall_s"],
                                 "genie_first_text_s": g["first_text_s"]})
        check.load_s = dialog.load_s
    return True


def write_dlc(record: dict[str, Any], qdir: Path, chip, out_root: Path,
              settings: BundleSettings, manifest: dict[str, Any]) -> dict[str, Any]:
    """The DLC files of the quantized graphs under ``out_root/dlc`` where ``bundle.dlc`` and
    their size say (:func:`dlc_wanted`), and the manifest's entry for them either way."""
    exported = record.get("part_names") or []
    dlc = {}
    weights = int(record.get("weights_bytes") or 0)
    if dlc_wanted(settings.dlc, weights):
        for folder in exported if len(exported) > 1 else [""]:
            for kind in ("prefill", "decode"):
                key = f"{folder}/{kind}" if folder else kind
                dlc[key] = qnn.export_dlc(qdir / folder / f"{kind}.onnx", chip,
                                          out_root / "dlc" / f"{key}.dlc")
        manifest["dlc"] = {**{g: {k: d[k] for k in ("file", "bytes")} for g, d in dlc.items()},
                           "note": "the studio's quantized graphs for Qualcomm's on-device "
                                   "tools (not the bundle's binaries); not runnable on this host"}
    else:
        manifest["dlc"] = {"note": (
            f"not written (bundle.dlc = {settings.dlc}"
            + (f": the quantized graphs hold {weights / 2**30:.2f} GiB of weights, over "
               f"{DLC_AUTO_BYTES >> 30} GiB" if settings.dlc == "auto" else "")
            + "): Genie does not read them; set bundle.dlc = \"on\" for Qualcomm's own "
              "on-device tools")}
    return dlc
