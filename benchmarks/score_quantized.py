"""Host QDQ figures of quantized graphs against their FP32 export, for models too large to
validate on the HTP simulator in a benchmark (e.g. the weight roundings on the 0.5 B shape).

    python benchmarks/score_quantized.py EXPORT_DIR QUANT_DIR [QUANT_DIR ...]
        [--tokens 128] [--threads 2] [--json out.json]

The held-out text is the sample's; its first ``--tokens`` tokens are cut into windows of the
export's prompt length, run through the FP32 prefill graph (ONNX Runtime, CPU) and through
each quantized prefill graph as a host QDQ model (graph optimizations off, so the CPU does
not fuse the quantized weights away), and compared position by position, teacher-forced:
perplexity, mean logits cosine, top-1 agreement and KL divergence to FP32 — the sensitivity
stage's figures (``studio.engine.sensitivity.compare_logits``), measured on the host, not the
HTP. One model in one part only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("quantized", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from studio.core.samples import read_data
    from studio.engine.llm_export import load_spec
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
    from studio.engine.sensitivity import compare_logits, heldout_windows, host_session
    from studio.samples import load_tokenizer

    spec = load_spec(a.export)
    ids = load_tokenizer("tiny-coder")(read_data("heldout")).input_ids[: a.tokens]
    windows = heldout_windows(list(ids), int(spec["prompt_length"]))
    fp32 = make_cpu_session(a.export / "prefill.onnx", threads=a.threads)
    gen = StaticKVGenerator(fp32, make_cpu_session(a.export / "decode.onnx", threads=1), spec)
    feeds = [gen.prefill_feed(w) for w in windows]

    def logits(session) -> list:
        return [session.run(["logits"], f)[0][0, : len(w)] for w, f in zip(windows, feeds, strict=True)]

    t0 = time.perf_counter()
    ref = logits(fp32)
    rows = [{"graphs": "FP32", "seconds": time.perf_counter() - t0,
             **compare_logits(ref, ref, windows)}]
    del fp32, gen
    for q in a.quantized:
        t0 = time.perf_counter()
        got = logits(host_session(q / "prefill.onnx", a.threads))
        res = json.loads((q / "result.json").read_text()) if (q / "result.json").is_file() else {}
        rows.append({"graphs": str(q), "seconds": time.perf_counter() - t0,
                     "summary": res.get("summary", ""), **compare_logits(ref, got, windows)})
    print(f"{len(ids)} held-out tokens in {len(windows)} windows of {spec['prompt_length']}; "
          "host QDQ (measured on the host CPU) vs FP32")
    print(f"{'graphs':<40} {'perplexity':>11} {'cosine':>9} {'top-1':>7} {'KL':>9}")
    for r in rows:
        print(f"{str(r['graphs'])[-40:]:<40} {r['perplexity']:11.3f} {r['logits_cosine']:9.6f} "
              f"{r['top1_agreement']:7.2%} {r['kl_divergence']:9.5f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
