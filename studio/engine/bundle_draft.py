"""The draft model in a Genie bundle: its graphs for the app's CPU side, how to run them,
and what this wheel's Genie can and cannot do with a draft.

What Genie here can do (``libGenie.so`` of onnxruntime-qnn 2.7.0, QNN 2.51, tried on this
host's HTP simulator; ``benchmarks/genie_spd.py`` reproduces it):

* A draft engine on the CPU is Genie's ``QnnGenAiTransformer`` backend, whose library this
  wheel does not ship: ``GenieDialog_create`` fails with :data:`GENIE_CPU_ENGINE_ERROR`.
* Genie's own speculative dialog (``"type": "spd"``, ``"spd": {"version": 1, "draft-len":
  N}``, two engines in the roles ``target`` and ``draft``) with *both* engines ``QnnHtp`` —
  the draft quantized and compiled like the target — loads and runs: its log says
  ``spec-dec: draft_len 3 n_generated 5 n_accepted 2 ...``. But its greedy text is not plain
  greedy decoding's (:data:`GENIE_SPD_FINDING`): the bundle does not ship it.

So the bundle carries the draft for the app's CPU: ``draft/prefill.onnx`` and
``draft/decode.onnx`` (FP32, ONNX Runtime), ``draft/graph.json`` (their I/O conventions) and,
where the draft reads its target's token table (:mod:`studio.core.drafttable`), that table
once, ``draft/embed_tokens.f32`` (float32 [V, H], little-endian), which the app feeds both
graphs as the input ``model.embed_tokens.weight``; the graphs then hold no table of their own
(:func:`studio.engine.shared_table.shared_draft_graphs`). The target verifies the drafted
tokens with its AR-N prefill binary (the AR-N graph takes the last token and up to N - 1
drafted ones in one pass, as ``studio generate --speculative --device htp-sim`` does): a
drafted token is kept while it is the target's argmax.

The bundle stage checks it as the manifest says to run it: the draft from the bundle's own
files on ONNX Runtime's CPU, the target from the bundle's binaries on the HTP simulator, and
greedy speculative decoding against plain greedy decoding over the same binaries, token for
token (they may part only where the target's AR-N and AR-1 graphs rank two tokens within a
near tie).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.drafttable import TableShare
from studio.core.errors import StudioError
from studio.core.fsutil import link_or_copy
from studio.core.progress import SubProgress
from studio.engine.genie import graph_io
from studio.engine.llm_export import export_llm
from studio.engine.llm_runtime import cpu_generator
from studio.engine.onnxio import load_spec
from studio.engine.shared_table import TABLE, checkpoint_share, shared_draft_graphs, target_table
from studio.engine.speculative import DraftModelProposer, speculative_generate

#: the bundle's folder of the draft's files
DRAFT_DIR = "draft"
#: the token table the draft's graphs read, where they read the target's
TABLE_FILE = "embed_tokens.f32"
#: drafted tokens per target pass in the bundle's check
CHECK_K = 4
#: what Genie said to a dialog whose draft engine is on the CPU (status -1 from
#: GenieDialog_create), on this host
GENIE_CPU_ENGINE_ERROR = (
    "Unable to load backend. dlerror(): <onnxruntime_qnn>/libQnnGenAiTransformer.so: cannot "
    "open shared object file: No such file or directory")
#: Genie's spd dialog with two QnnHtp engines, as measured here (benchmarks/genie_spd.py)
GENIE_SPD_FINDING = (
    "Genie's spd dialog (two QnnHtp engines, the draft compiled like the target) loads and "
    "decodes speculatively on the HTP simulator, but its greedy text is not plain greedy "
    "decoding's: the sample at W8A16 (prompt 16, context 64), 3 held-out prompts x 32 new "
    "tokens, draft-len 1 and 3 parted from the basic dialog's text (itself the studio's, "
    "token for token) on every prompt, taking 9 to 10 tokens a run that are not the "
    "target's argmax given the text before them, up to 3.86 logits below it (no near tie); "
    "draft-len 4 failed (GenieDialog_query status -1, \"batch dispatch failed\"); with the "
    "target's own binaries as the draft every token was the target's argmax (one prompt "
    "stopped short of its 32 tokens). Not shipped")


def export_draft(checkpoint: Path, spec: dict[str, Any], work: Path, progress=None) -> Path:
    """The draft checkpoint exported for the host CPU at the target's prompt and context
    lengths (as the ``draft`` stage exports it): its prefill and decode graphs in
    ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    export_llm(Path(checkpoint), work, int(spec["prompt_length"]), int(spec["context_length"]),
               progress=progress, verify_len=0)
    return work


def ship_draft(out: Path, draft_export: Path, share: TableShare, target_export: Path,
               work: Path) -> dict[str, Any]:
    """The draft's files in ``out/draft``: its graphs (reading the target's token table as an
    input, with the table written once, where ``share`` says so), its ``graph.json``.
    Returns the manifest's file list and the graphs' I/O."""
    folder = out / DRAFT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    src = Path(draft_export)
    dropped = None
    if share.shareable:
        done = shared_draft_graphs(src, work / "draft-shared")
        src, dropped = work / "draft-shared", done["graph_bytes_dropped"]
        table = target_table(target_export)
        if table.shape != (share.draft_vocab, share.draft_width):
            raise StudioError(f"the target's token table is {list(table.shape)}, the draft "
                              f"reads [{share.draft_vocab}, {share.draft_width}]")
        table.astype("<f4", copy=False).tofile(folder / TABLE_FILE)
    spec = load_spec(src)
    if len(spec.get("parts") or []) > 1:
        raise StudioError("the draft model is exported in parts: a bundle carries a draft "
                          "exported whole")
    for f in src.iterdir():
        if f.name == "graph.json":
            shutil.copy2(f, folder / f.name)
        elif f.suffix == ".onnx" and f.stem in ("prefill", "decode"):
            shutil.copy2(f, folder / f.name)
        elif f.name.endswith(".data"):  # external weights the graphs name
            link_or_copy(f, folder / f.name)
    files = sorted(f"{DRAFT_DIR}/{f.name}" for f in folder.iterdir() if f.is_file())
    return {"files": files, "graph_bytes_dropped": dropped,
            "graphs": {g: graph_io(folder / f"{g}.onnx") for g in ("prefill", "decode")}}


def draft_generator(folder: Path):
    """The bundle's draft as an app runs it: ONNX Runtime on the CPU over ``draft/`` — its
    prefill and decode graphs — fed the token table file where they take it (one mapping of
    the file for both graphs)."""
    folder = Path(folder)
    spec = load_spec(folder)
    feeds = {}
    if (folder / TABLE_FILE).is_file():
        shape = (int(spec["vocab_size"]), int(spec["hidden_size"]))
        feeds[TABLE] = np.memmap(folder / TABLE_FILE, dtype="<f4", mode="r", shape=shape)
    return cpu_generator(folder, spec, fixed_feeds=feeds)


def check_draft(target, folder: Path, prompts: list[tuple[list[int], int, list[int]]],
                runner_up: list[list[tuple[int, float]]], k: int = CHECK_K,
                progress=None) -> dict[str, Any]:
    """Greedy speculative decoding with the bundle's draft (``folder``) proposing and
    ``target`` (the bundle's binaries: a :class:`studio.engine.deployed.DeployedGenerator`)
    verifying, against plain greedy decoding over the same binaries (``prompts``: ids, new
    tokens, the plain tokens; ``runner_up``: each plain token's second best and its gap)."""
    draft = draft_generator(folder)
    rows = []
    for i, (ids, n, plain) in enumerate(prompts):
        if progress is not None:
            progress.check()
            progress.update(i / max(1, len(prompts)), f"prompt {i + 1}/{len(prompts)}: the "
                            "draft on the CPU, the target's binaries verifying")
        out = speculative_generate(target, DraftModelProposer(draft), ids, n,
                                   k=min(k, max(1, target.verify_len - 1)))
        got = out["tokens"][:len(plain)]
        first = next((j for j, (a, b) in enumerate(zip(got, plain, strict=False)) if a != b),
                     None)
        gap = runner_up[i][first][1] if first is not None and first < len(runner_up[i]) \
            else None
        sp = out["speculative"]
        rows.append({"prompt_tokens": len(ids), "new_tokens": len(plain),
                     "identical": got == plain, "first_difference_at_token": first,
                     "gap_there": gap, "acceptance_rate": sp["acceptance_rate"],
                     "tokens_per_target_pass": sp["tokens_per_target_pass"],
                     "target_passes": sp["target_passes"]})
    tokens = sum(r["new_tokens"] for r in rows)
    passes = sum(r["target_passes"] for r in rows)
    return {"runtime": "the draft from the bundle's files on ONNX Runtime (CPU), the target "
                       "from the bundle's binaries on the QNN HTP simulator, AR-"
                       f"{target.verify_len} verify passes",
            "reference": "plain greedy decoding over the same binaries",
            "k": k, "prompts": rows, "identical": sum(r["identical"] for r in rows),
            "tokens": tokens,
            "tokens_per_target_pass": (sum(r["tokens_per_target_pass"] * r["target_passes"]
                                           for r in rows) / passes) if passes else None}


def draft_manifest(ref: str, shipped: dict[str, Any], share: TableShare,
                   check: dict[str, Any], spec: dict[str, Any], verify_ar: int) -> dict[str, Any]:
    """The manifest's ``draft`` entry: what the draft is, how the app runs it beside the
    target, what Genie here can and cannot do with it, and the check."""
    table = share.to_dict()
    if share.shareable:
        table.update(file=f"{DRAFT_DIR}/{TABLE_FILE}", input=TABLE, dtype="float32",
                     shape=[share.draft_vocab, share.draft_width], byte_order="little",
                     graph_bytes_dropped=shipped["graph_bytes_dropped"])
    return {
        "model": ref, "files": shipped["files"], "graphs": shipped["graphs"],
        "runs_on": "the app's CPU: ONNX Runtime (FP32) over draft/prefill.onnx and "
                   "draft/decode.onnx; Genie here cannot run it (see genie)",
        "how_to_run": [
            "prefill: draft/prefill.onnx over the prompt (input_ids, position_ids, "
            "attention_mask as draft/graph.json describes; P tokens a pass, right-padded)",
            "draft: draft/decode.onnx one token a step over its own KV cache "
            f"[1, {spec.get('num_kv_heads')}, {spec.get('context_length')}, "
            f"{spec.get('head_dim')}] per layer, up to k tokens after the last agreed one",
            f"verify: the target's AR-{verify_ar} prefill binary over the last agreed token "
            f"and up to {verify_ar - 1} drafted ones in one pass; keep the drafted tokens "
            "while each is the target's argmax, then the target's own next token; both "
            "caches roll back to the kept prefix (rows past it stay hidden by the masks)",
            *([f"token table: feed {DRAFT_DIR}/{TABLE_FILE} (float32 [{share.draft_vocab}, "
               f"{share.draft_width}], the target's table) as the input {TABLE} of both "
               "graphs: one array for the two"] if share.shareable else []),
        ],
        "token_table": table,
        "genie": {"cpu_draft_engine": "QnnGenAiTransformer: GenieDialog_create fails (status "
                                      f"-1): {GENIE_CPU_ENGINE_ERROR}",
                  "spd_dialog": GENIE_SPD_FINDING},
        "check": {k: check[k] for k in ("runtime", "reference", "k", "identical", "tokens",
                                        "tokens_per_target_pass")}
        | {"prompts": len(check["prompts"]), "by_prompt": check["prompts"]},
    }


def readme_section(entry: dict[str, Any]) -> str:
    """The README's paragraph on the draft."""
    t = entry["token_table"]
    c = entry["check"]
    return (
        "\n## Speculative decoding: the draft on the CPU\n\n"
        f"`draft/` holds the draft model ({entry['model']}) for the app's CPU: "
        + "; ".join(entry["how_to_run"]) + ". "
        + (f"The token table is the target's: {t['why']}. " if t["shareable"] else
           f"It keeps its own token table: {t['why']}. ")
        + f"Checked on the HTP simulator: {c['identical']} of {c['prompts']} prompts gave "
        f"plain greedy decoding's tokens ({c['tokens']} tokens"
        + (f", {c['tokens_per_target_pass']:.2f} per target pass" if
           c["tokens_per_target_pass"] else "") + ").\n\n"
        "Genie here cannot run the draft itself: a CPU draft engine "
        f"({entry['genie']['cpu_draft_engine']}); {entry['genie']['spd_dialog']}.\n")


def add_draft(out: Path, out_root: Path, target_checkpoint: Path, draft: Path, ref: str,
              mode: str, spec: dict[str, Any], export_dir: Path, target,
              prompts: list[tuple[list[int], int, list[int]]],
              runner_up: list[list[tuple[int, float]]], progress) -> dict[str, Any]:
    """The draft in the bundle ``out``: exported for the CPU, its files shipped (the target's
    token table where it may read it: ``mode``, ``model.draft_embedding``), checked against
    plain greedy decoding over the target's binaries (``target``), and its manifest entry."""
    share = checkpoint_share(target_checkpoint, draft, mode)
    work = Path(tempfile.mkdtemp(dir=out_root, prefix=".draft-"))
    try:
        progress.update(0.0, "exporting the draft model for the CPU")
        exported = export_draft(draft, spec, work / "export", SubProgress(progress, 0.0, 0.4))
        shipped = ship_draft(out, exported, share, export_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    check = check_draft(target, out / DRAFT_DIR, prompts, runner_up,
                        progress=SubProgress(progress, 0.4, 1.0))
    return draft_manifest(ref, shipped, share, check, spec, target.verify_len)
