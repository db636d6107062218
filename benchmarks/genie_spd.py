"""What this wheel's Genie does with a draft model: its own speculative dialog (``spd``) with
the draft as a second QnnHtp engine, and a draft engine on the CPU.

Builds two bundles on the HTP simulator (W8A16, prompt 16, context 64, the default chip):
the sample target ``tiny-coder`` and its draft ``tiny-coder-draft`` compiled as a model of
its own, then runs on held-out prompts:

* Genie's ``basic`` dialog over the target's binaries (plain greedy decoding; the bundle's
  own check has it equal to the studio's runtime over the same binaries);
* Genie's ``spd`` dialog (``{"version": 1, "draft-len": N}``, engines ``[target, draft]``,
  both ``QnnHtp``) for each ``--draft-len``, and the same with the target's own binaries as
  the draft (its profile's ``token-acceptance-rate`` is printed where Genie fills it in: it
  gave 1.75 tokens per iteration once with a logger bound, null without);
* where a spd text parts from the plain one: the studio's runtime over the target's
  binaries, teacher-forced over the spd text, says at each token Genie took that is not the
  target's argmax how far below the best it ranks (a near tie is within 1e-2 logits);
* a dialog whose draft engine is ``QnnGenAiTransformer`` (Genie's CPU backend): the error.

    python benchmarks/genie_spd.py [--prompts 3] [--tokens 32] [--draft-len 1,3,4]
        [--workdir DIR] [--json OUT]

``studio.engine.bundle_draft.GENIE_SPD_FINDING`` states what this printed on this host.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: two logits this close are a near tie: the AR-N and AR-1 graphs may rank them either way
NEAR_TIE = 1e-2

#: the benchmark's project: the sample at W8A16, a short prompt and context, one bundle prompt
SETTINGS = {
    "export": {"prompt_length": 16, "context_length": 64},
    "quantization": {"scheme": "W8A16", "weight_granularity": "per_channel",
                     "calibration_samples": 2},
    "bundle": {"prompts": 1, "new_tokens": 8},
}


def bundle(work: Path, name: str, model: str) -> tuple[Any, Path]:
    """(the project, the stored bundle's folder) of ``model``, built by studio bundle."""
    from studio.core import project as pf
    from studio.core.catalog import default_chip_key
    from studio.services.bundle import stored_bundle

    f = work / f"{name}.qstudio"
    if not f.is_file():
        pf.save(pf.new_project(name, f"sample:{model}", [default_chip_key()], **SETTINGS), f)
    r = subprocess.run([sys.executable, "-m", "studio.cli", "bundle", str(f), "--json"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"studio bundle {f} failed:\n{r.stderr[-2000:]}")
    p = pf.load(f)
    folder, _result = stored_bundle(p, build=False)
    return p, folder


def spd_config(target: dict[str, Any], draft: dict[str, Any], draft_len: int) -> dict[str, Any]:
    """Genie's spd dialog from two plain dialog configs: the target's context, sampler and
    tokenizer, its engine in the role target and the draft's in the role draft."""
    t = json.loads(json.dumps(target["dialog"]))
    te, de = t.pop("engine"), json.loads(json.dumps(draft["dialog"]["engine"]))
    te["role"], de["role"] = "target", "draft"
    t.update(type="spd", spd={"version": 1, "draft-len": int(draft_len)}, engine=[te, de])
    return {"dialog": t}


def run_dialog(cfg: dict[str, Any], prompts: list[str], n: int) -> list[dict[str, Any]]:
    from studio.core.fsutil import atomic_write_json
    from studio.engine.genie import GenieDialog

    with tempfile.TemporaryDirectory(prefix="genie-spd-") as tmp:
        atomic_write_json(Path(tmp) / "cfg.json", cfg)  # its paths are absolute
        with GenieDialog(Path(tmp), "cfg.json", profile=True) as dialog:
            return [dialog.query(p, n) for p in prompts]


def departures(runner, tok, prompt: str, text: str) -> list[dict[str, Any]]:
    """Each token of ``text`` (after ``prompt``) that is not the target's argmax given the
    text before it: its index, and how far below the best the target ranks it."""
    ids = tok(prompt).input_ids
    full = tok(prompt + text).input_ids
    if full[:len(ids)] != ids:
        return [{"token": None, "note": "the text does not tokenize after the prompt alone"}]
    logits = runner.teacher_forced(full[:-1])
    out = []
    for j, t in enumerate(full[len(ids):]):
        row = logits[len(ids) - 1 + j]
        best = int(row.argmax())
        if best != t:
            out.append({"token": j, "took": tok.decode([t]), "best": tok.decode([best]),
                        "gap": round(float(row[best] - row[t]), 4)})
    return out


def cpu_engine_error(target: dict[str, Any], draft_folder: Path) -> str:
    """What Genie says to a spd dialog whose draft engine is its CPU backend."""
    from studio.engine.genie import _genie_message, library_path
    from studio.engine.qnn import capture_native_stderr

    cfg = spd_config(target, target, 1)
    de = cfg["dialog"]["engine"][1]
    de["backend"] = {"version": 1, "type": "QnnGenAiTransformer",
                     "QnnGenAiTransformer": {"version": 1}}
    de["model"] = {"version": 1, "type": "library",
                   "library": {"version": 1, "model-bin": str(draft_folder / "none.bin")}}
    lib = ctypes.CDLL(str(library_path()))
    c, d = ctypes.c_void_p(), ctypes.c_void_p()
    with capture_native_stderr() as cap:
        st = lib.GenieDialogConfig_createFromJson(json.dumps(cfg).encode(), ctypes.byref(c))
        st2 = lib.GenieDialog_create(c, ctypes.byref(d)) if st == 0 else None
    if d:
        lib.GenieDialog_free(d)
    if c:
        lib.GenieDialogConfig_free(c)
    return f"config status {st}, create status {st2}: {_genie_message(cap.text)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--draft-len", default="1,3,4")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="genie-spd-"))
    work.mkdir(parents=True, exist_ok=True)
    from studio.core.samples import data_path
    from studio.engine import deployed
    from studio.engine.bundle import SIMULATOR_DIR, bundle_prompts
    from studio.engine.genie import local_config
    from studio.engine.llm_runtime import load_tokenizer
    from studio.services.generate import stored_artifact

    print(f"building the target's and the draft's bundles in {work} …", flush=True)
    tp, tfolder = bundle(work, "target", "tiny-coder")
    _dp, dfolder = bundle(work, "draft", "tiny-coder-draft")
    tsim, dsim = (f.parent / SIMULATOR_DIR if (f.parent / SIMULATOR_DIR).is_dir() else f
                  for f in (tfolder, dfolder))
    target, draft = local_config(tsim), local_config(dsim)
    export = stored_artifact(tp, "export", "the export", run=False)
    tok = load_tokenizer(export)
    prompts = bundle_prompts(data_path("heldout").read_text(), tok, a.prompts, long=25)
    n = a.tokens
    report: dict[str, Any] = {"prompts": prompts, "tokens": n, "runs": {}}
    plain = [r["text"] for r in run_dialog(target, prompts, n)]
    report["plain"] = plain
    chip = tp.targets[0]
    from studio.core.catalog import get_chip

    cdir = stored_artifact(tp, f"compile[{get_chip(chip).key}]", "the compile", run=False)
    from studio.engine.llm_runtime import load_graph_spec

    runner = deployed.open_runner(cdir, get_chip(chip), load_graph_spec(export))
    studio = [tok.decode(runner.greedy(tok(p).input_ids, n)) for p in prompts]
    print(f"Genie basic dialog = the studio's runtime over the same binaries on "
          f"{sum(a_ == b for a_, b in zip(plain, studio, strict=True))}/{len(prompts)} prompts")
    runs = [(f"draft-len {k}", draft, int(k)) for k in a.draft_len.split(",")]
    runs.append(("draft-len 3, the target as its own draft", target, 3))
    from studio.core.errors import StudioError

    for name, d, k in runs:
        try:
            got = run_dialog(spd_config(target, d, k), prompts, n)
        except StudioError as exc:  # Genie's own failure, said as it said it
            report["runs"][name] = {"error": exc.message}
            print(f"spd, {name}: {exc.message}")
            continue
        rows = []
        for p, g, ref in zip(prompts, got, plain, strict=True):
            prof = g["profile"] or {}
            rows.append({"identical": g["text"] == ref, "text": g["text"],
                         "tokens_per_iteration": prof.get("token-acceptance-rate"),
                         "departures": [] if g["text"] == ref else
                         departures(runner, tok, p, g["text"])})
        report["runs"][name] = rows
        gaps = [x["gap"] for r in rows for x in r["departures"] if x.get("gap") is not None]
        far = [g for g in gaps if g > NEAR_TIE]
        rates = [r["tokens_per_iteration"] for r in rows if r["tokens_per_iteration"]]
        print(f"spd, {name}: plain greedy's text on "
              f"{sum(r['identical'] for r in rows)}/{len(rows)} prompts"
              + (f"; Genie took {len(gaps)} tokens that are not the target's argmax given "
                 f"its own text, {len(far)} of them more than {NEAR_TIE} logits below it "
                 f"(up to {max(gaps):.2f})" if gaps else "")
              + (f"; tokens per iteration {rates}" if rates else ""))
    report["cpu_draft_engine"] = cpu_engine_error(target, dsim)
    print(f"a QnnGenAiTransformer (CPU) draft engine: {report['cpu_draft_engine']}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=str))
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
