"""How fast does the LLM runtime generate on the host CPU, against transformers?

Exports ``tiny-coder`` (P=32, C=128, verify graph of 5) and ``tiny-coder-draft`` (no verify
graph) in a child process, so that torch stays out of this one until section 4, then
measures with ONNX Runtime (2 threads): 1. time to first token vs prompt length (past P:
chunked prefill), PNG plot if matplotlib is installed; 2. decode step at ~10/50/90 % of the
context, prefill tok/s; 3. speculative decoding (prompt lookup, draft model; greedy, k=4)
vs plain, peak RSS; 4. the same weights through ``transformers`` ``generate()``. Each ratio
is against a baseline measured in the same run; medians of REPEATS runs after a warm-up.
Every figure is labelled with its source, "measured" (host CPU): no HTP simulator here.

    python benchmarks/bench_generate.py [--quick] [--repeats R] [--new-tokens N]
        [--threads 2] [--plot benchmarks/out/ttft.png] [--json OUT] [--htp]

``--htp`` adds TTFT vs prompt length on the HTP simulator (simulated).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

P, C, K = 32, 128, 4
THREADS = 2  # ORT intra-op threads of the product's CPU sessions; --threads
LENGTHS = [8, 16, 32, 64, 100]
SRC = "measured"  # every figure below: the host CPU (ONNX Runtime / PyTorch)
med = statistics.median


def export_both(out: str) -> None:
    """Runs in a child process: the export loads torch and transformers."""
    from transformers.utils import logging as hf_logging

    from studio.core.samples import sample_path
    from studio.engine.llm_export import export_llm

    hf_logging.disable_progress_bar()
    export_llm(sample_path("tiny-coder"), Path(out) / "target", P, C)
    export_llm(sample_path("tiny-coder-draft"), Path(out) / "draft", P, C, verify_len=0)


def cpu_generator(graph_dir: Path):
    """The product's host-CPU generator (2 threads; with --threads N, N)."""
    from studio.engine import llm_runtime

    return llm_runtime.cpu_generator(graph_dir, llm_runtime.load_graph_spec(graph_dir), THREADS)


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    kb = resource.getrusage(who).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return kb / (1024 * 1024 if sys.platform == "darwin" else 1024)


def stamped(fn) -> tuple[dict, list[float]]:
    """Run ``fn(on_step)``; the perf_counter time at which each token came out."""
    stamps: list[float] = []
    return fn(lambda _i, _t: stamps.append(time.perf_counter())), stamps


def decode_rate(stamps: list[float]) -> float:
    """Tokens after the first, over the time from the first token to the last."""
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def interleaved(fns: dict[Any, Callable[[], Any]], R: int) -> dict[Any, list[Any]]:
    """A warm-up of each, then R rounds, the order reversed every other round so that
    drift on a busy machine hits all alike."""
    for fn in fns.values():
        fn()
    runs: dict[Any, list[Any]] = {name: [] for name in fns}
    for i in range(R):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            runs[name].append(fns[name]())
    return runs


def section_ttft(gen, prompt: list[int], R: int, res: dict) -> None:
    print(f"\n1. time to first token vs prompt length (P={P}, C={C}; past P: verify chunks "
          f"of {gen.verify_len}); baseline: the P-token prompt")
    runs = interleaved({L: partial(gen.generate, prompt[:L], 1) for L in LENGTHS}, R)
    rows = {L: {"ttft_ms": med([r["ttft_s"] for r in rr]) * 1e3, "passes": rr[0]["prompt_chunks"]}
            for L, rr in runs.items()}
    base = rows[P]["ttft_ms"]
    print(f"  {'prompt':>6} {'passes':>6} {'TTFT ms':>9} {'vs P':>6} {'prefill tok/s':>13}  source")
    for L, r in rows.items():
        r["prefill_tok_s"] = L / (r["ttft_ms"] / 1e3)
        print(f"  {L:6d} {r['passes']:6d} {r['ttft_ms']:9.2f} {r['ttft_ms'] / base:6.2f} "
              f"{r['prefill_tok_s']:13.0f}  {SRC}")
    print(f"  prefill: {rows[P]['prefill_tok_s']:.0f} tok/s (P={P} tokens, one pass)  {SRC}")
    res["ttft"] = {"source": SRC, "rows": rows}


def section_htp(prompt: list[int], res: dict) -> None:
    """TTFT vs prompt length on the HTP simulator: a project of the sample with the same P and
    C, its export / quantize (W8A16) / compile run by the pipeline, then one token generated
    after each prompt length through the compiled context (past P: decode steps)."""
    import asyncio

    from studio.core.catalog import default_chip_key
    from studio.services.generate import load_generator, resolve_device
    from studio.services.projects import NewProjectSpec, create_project

    print(f"\n5. time to first token vs prompt length on the HTP simulator (W8A16, "
          f"{default_chip_key()}); simulated: the simulator's speed follows the host CPU")
    with tempfile.TemporaryDirectory() as d:
        studio = create_project(NewProjectSpec(
            path=Path(d) / "ttft.qstudio", source_kind="sample", source="tiny-coder",
            prompt_length=P, context_length=C, calibration_samples=2, name="ttft"))
        t0 = time.perf_counter()
        try:
            summary = asyncio.run(studio.run_pipeline(["compile"]))
        finally:
            studio.close()
        if summary.state != "succeeded":
            print(f"  the pipeline did not finish ({summary.state}): skipped")
            return
        print(f"  export + quantize + compile: {time.perf_counter() - t0:.0f} s")
        project = studio.project
        gen, _spec, _tok = load_generator(project, resolve_device(project, "htp-sim"))
        rows = {}
        for L in LENGTHS:
            out = gen.generate(prompt[:L], 1)
            rows[L] = {"ttft_ms": out["ttft_s"] * 1e3, "passes": out["prompt_chunks"]}
            print(f"  {L:6d} tokens {rows[L]['passes']:4d} passes {rows[L]['ttft_ms']:10.0f} ms"
                  "  simulated")
        res["ttft_htp"] = {"source": "simulated", "chip": default_chip_key(), "rows": rows}


def plot_ttft(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _plot_ttft_qt(res, path)
    rows = res["ttft"]["rows"]
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4), layout="tight")
    ax.plot(list(rows), [r["ttft_ms"] for r in rows.values()], "o-", label=f"tiny-coder ({SRC})")
    ax.axvline(P, ls="--", c="grey", label=f"P={P} (longer: chunked)")
    ax.set(xlabel="prompt tokens", ylabel="time to first token (ms)",
           title=f"TTFT on the host CPU, C={C}, {THREADS} threads")
    ax.legend()
    fig.savefig(path, dpi=120)
    print(f"  plot: {path}")


def section_fill(gen, prompt: list[int], R: int, res: dict) -> None:
    n0 = 8
    targets = {f"{f}%": min(C - 3, round(C * f / 100)) for f in (10, 50, 90)}
    print(f"\n2. decode step vs context fill (prompt {n0}, {C - n0} new tokens; median of the "
          "steps at pos-2..pos+2 of all runs); baseline: 10 %")
    gen.generate(prompt[:n0], C - n0)  # warm-up
    runs = [gen.generate(prompt[:n0], C - n0)["step_s"] for _ in range(R)]
    rows = {}
    for name, pos in targets.items():  # step_s[i]: the decode step at position n0 + i
        steps = [s[i] for s in runs for i in range(pos - 2 - n0, pos + 3 - n0)]
        rows[name] = {"pos": pos, "step_ms": med(steps) * 1e3}
    base = rows["10%"]["step_ms"]
    print(f"  {'fill':>4} {'pos':>4} {'step ms':>8} {'tok/s':>7} {'vs 10%':>7}  source")
    for name, r in rows.items():
        r["tok_s"] = 1e3 / r["step_ms"]
        print(f"  {name:>4} {r['pos']:4d} {r['step_ms']:8.3f} {r['tok_s']:7.0f} "
              f"{r['step_ms'] / base:7.2f}  {SRC}")
    res["context_fill"] = {"source": SRC, "rows": rows}


def section_speculative(gen, draft, prompt: list[int], N: int, R: int, res: dict) -> None:
    from studio.engine import speculative as sp

    ids = prompt[:P]
    ways = {"plain": lambda cb: gen.generate(ids, N, on_step=cb),
            "prompt-lookup": lambda cb: sp.speculative_generate(
                gen, sp.PromptLookupProposer(), ids, N, k=K, on_step=cb),
            "draft-model": lambda cb: sp.speculative_generate(
                gen, sp.DraftModelProposer(draft), ids, N, k=K, on_step=cb)}
    print(f"\n3. speculative vs plain decoding: greedy, k={K} (adaptive), prompt {P}, {N} new "
          "tokens; decode tok/s as in 4. (draft prefill included); baseline: plain")
    runs = interleaved({w: partial(stamped, fn) for w, fn in ways.items()}, R)
    rows: dict[str, dict[str, Any]] = {}  # time split: of the first run, seconds
    print(f"  {'':13s} {'tok/s':>7} {'vs plain':>8} {'accept':>7} {'tok/pass':>8} {'same':>5} "
          f"{'draft/verify/host s':>20}  source")
    for w, rr in runs.items():
        st = rr[0][0].get("speculative", {})
        r = rows[w] = {"decode_tok_s": med([decode_rate(t) for _, t in rr]),
                       "acceptance": st.get("acceptance_rate"),
                       "tokens_per_pass": st.get("tokens_per_target_pass", 1.0),
                       "time_split_s": st.get("time_split_s"),
                       "same_tokens": rr[0][0]["tokens"] == runs["plain"][0][0]["tokens"]}
        r["ratio"] = r["decode_tok_s"] / rows["plain"]["decode_tok_s"]
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        split = "-" if not r["time_split_s"] else "/".join(
            f"{v:.3f}" for v in r["time_split_s"].values())
        print(f"  {w:13s} {r['decode_tok_s']:7.1f} {r['ratio']:8.2f} {acc:>7} "
              f"{r['tokens_per_pass']:8.2f} {'yes' if r['same_tokens'] else 'NO':>5} "
              f"{split:>20}  {SRC}")
    res["speculative"] = {"source": SRC, "k": K, "new_tokens": N, "rows": rows}


def section_transformers(gen, ckpt: Path, prompt: list[int], N: int, R: int, res: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cfg = model.generation_config  # greedy, exactly N new tokens: no stop at EOS
    cfg.eos_token_id, cfg.do_sample, cfg.max_new_tokens = None, False, N
    ids = torch.tensor([prompt[:P]])

    class Stamps(list):  # a streamer: put(prompt ids) once, then put(token) as each is picked
        def put(self, _value) -> None:
            self.append(time.perf_counter())

        def end(self) -> None:
            pass

    def hf() -> tuple[float, float, list[int]]:
        s, t0 = Stamps(), time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=cfg,
                                 streamer=s)
        return s[1] - t0, decode_rate(s[1:]), out[0, P:].tolist()

    def studio() -> tuple[float, float, list[int]]:
        out, st = stamped(lambda cb: gen.generate(prompt[:P], N, on_step=cb))
        return out["ttft_s"], decode_rate(st), out["tokens"]

    print(f"\n4. studio (ONNX Runtime) vs transformers generate(): greedy, prompt {P}, {N} new "
          f"tokens, float32, {THREADS} threads each, eager attention; baseline: transformers")
    print("  decode tok/s = (new tokens - 1) / (time of the last token - time of the first), "
          "token times from studio's on_step and a transformers streamer's put(), both called "
          "as each token is picked; TTFT: from the call to the first token")
    runs = interleaved({"studio": studio, "transformers": hf}, R)
    rows = {}
    for name, rr in runs.items():
        r = rows[name] = {"ttft_ms": med([x[0] for x in rr]) * 1e3,
                          "decode_tok_s": med([x[1] for x in rr]),
                          "all_decode_tok_s": [round(x[1], 1) for x in rr]}
        print(f"  {name:12s}: TTFT {r['ttft_ms']:7.2f} ms  decode {r['decode_tok_s']:7.1f} tok/s "
              f"(runs: {r['all_decode_tok_s']})  {SRC}")
    ratio = rows["studio"]["decode_tok_s"] / rows["transformers"]["decode_tok_s"]
    same = runs["studio"][0][2] == runs["transformers"][0][2]
    print(f"  decode ratio studio / transformers: {ratio:.2f}x (claim >= 5x: "
          f"{'met' if ratio >= 5 else 'NOT met'})  {SRC}")
    print(f"  TTFT ratio transformers / studio: "
          f"{rows['transformers']['ttft_ms'] / rows['studio']['ttft_ms']:.2f}x  {SRC}")
    print(f"  same greedy tokens: {'yes' if same else 'NO'}")
    res["transformers"] = {"source": SRC, "new_tokens": N, "rows": rows,
                           "decode_ratio": ratio, "same_tokens": same}


def _plot_ttft_qt(res: dict, path: Path) -> None:
    """The TTFT plot with pyqtgraph (offscreen) when matplotlib is not installed: one panel
    per device, as their scales differ by orders of magnitude."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph as pg
    from PySide6.QtWidgets import QApplication

    _app = QApplication.instance() or QApplication([])
    win = pg.GraphicsLayoutWidget()
    win.setBackground("w")
    win.resize(900, 360)
    for key, title, color in (("ttft", "host CPU (measured)", "#1b7f3b"),
                              ("ttft_htp", "HTP simulator (simulated)", "#8a5a00")):
        if key not in res:
            continue
        rows = res[key]["rows"]
        plot = win.addPlot(title=f"time to first token, {title}")
        plot.plot(list(rows), [r["ttft_ms"] for r in rows.values()], pen=pg.mkPen(color, width=2),
                  symbol="o", symbolBrush=color)
        plot.addLine(x=P, pen=pg.mkPen("#888", style=pg.QtCore.Qt.PenStyle.DashLine))
        plot.setLabel("bottom", f"prompt tokens (P={P}: longer prompts are chunked)")
        plot.setLabel("left", "ms")
    win.show()
    for _ in range(5):  # lay the plots out before grabbing them
        _app.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    win.grab().save(str(path))
    win.close()
    print(f"  plot: {path}")


def main() -> int:
    global THREADS
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="3 repeats (about 2 minutes)")
    ap.add_argument("--repeats", type=int, default=None, help="default 7 (--quick: 3)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=THREADS, help="ORT and torch threads")
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "out" / "ttft.png")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--htp", action="store_true",
                    help="also TTFT on the HTP simulator (runs export, quantize and compile)")
    a = ap.parse_args()
    R, N, THREADS = a.repeats or (3 if a.quick else 7), min(a.new_tokens, C - P), a.threads
    from transformers import PreTrainedTokenizerFast

    from studio.core.samples import data_path, sample_path

    ckpt = sample_path("tiny-coder")
    tok = PreTrainedTokenizerFast.from_pretrained(str(ckpt))
    text = data_path("heldout").read_text(encoding="utf-8")
    prompt = tok(text[text.index("\ndef ") + 1:])["input_ids"][:max(LENGTHS)]  # code, not header
    res: dict[str, Any] = {"P": P, "C": C, "threads": THREADS, "repeats": R}
    print(f"tiny-coder, P={P}, C={C}, {THREADS} threads, medians of {R} repeats; source: "
          f"{SRC} = host CPU" + (" (the HTP simulator's figures: simulated)" if a.htp else
                                 " (no HTP simulator figures in this run)"))
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        child = mp.get_context("spawn").Process(target=export_both, args=(d,))
        child.start()
        child.join()
        if child.exitcode != 0:
            print(f"export failed (exit status {child.exitcode})")
            return 1
        print(f"export (child process): {time.perf_counter() - t0:.1f} s, its peak RSS "
              f"{peak_rss_mb(resource.RUSAGE_CHILDREN):.0f} MB")
        gen, draft = cpu_generator(Path(d) / "target"), cpu_generator(Path(d) / "draft")
        section_ttft(gen, prompt, R, res)
        if a.htp:
            section_htp(prompt, res)
        plot_ttft(res, a.plot)
        section_fill(gen, prompt, R, res)
        section_speculative(gen, draft, prompt, N, R, res)
        res["peak_rss_mb_ort"] = peak_rss_mb()
        print(f"\npeak RSS of this process after 1.-3. (ONNX Runtime only, torch "
              f"{'loaded' if 'torch' in sys.modules else 'not loaded'}): "
              f"{res['peak_rss_mb_ort']:.0f} MB  {SRC}")
        section_transformers(gen, ckpt, prompt, N, R, res)
        res["peak_rss_mb_all"] = peak_rss_mb()
        print(f"\npeak RSS of this process after 4. (torch + transformers too): "
              f"{res['peak_rss_mb_all']:.0f} MB  {SRC}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
        print(f"results: {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
