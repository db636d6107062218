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


class HeldOut:
    """The sample's held-out text (its first ``tokens`` tokens) in prefill windows of an FP32
    export, their feeds, and the FP32 prefill graph's logits on them (ONNX Runtime, CPU)."""

    def __init__(self, export: Path, tokens: int, threads: int = 2):
        from studio.core.samples import read_data
        from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
        from studio.engine.onnxio import load_spec
        from studio.engine.sensitivity import heldout_windows
        from studio.samples import load_tokenizer

        self.spec = load_spec(export)
        self.ids = load_tokenizer("tiny-coder")(read_data("heldout")).input_ids[:tokens]
        self.windows = heldout_windows(list(self.ids), int(self.spec["prompt_length"]))
        fp32 = make_cpu_session(export / "prefill.onnx", threads=threads)
        gen = StaticKVGenerator(fp32, make_cpu_session(export / "decode.onnx", threads=1),
                                self.spec)
        self.feeds = [gen.prefill_feed(w) for w in self.windows]
        t0 = time.perf_counter()
        self.reference = self.logits(fp32)
        self.reference_seconds = time.perf_counter() - t0

    def logits(self, session) -> list:
        """Each window's logits rows (float32); a session that renamed the graph's outputs
        (AIMET's appends a suffix) is read by the name that starts with ``logits``."""
        import numpy as np

        name = next(o.name for o in session.get_outputs() if o.name.startswith("logits"))
        return [np.asarray(session.run([name], f)[0][0, : len(w)], dtype=np.float32)
                for w, f in zip(self.windows, self.feeds, strict=True)]

    def score(self, session) -> dict[str, float]:
        """Teacher-forced figures of ``session`` against FP32 (perplexity, logits cosine,
        top-1, KL: :func:`studio.engine.sensitivity.compare_logits`)."""
        from studio.engine.sensitivity import compare_logits

        return compare_logits(self.reference, self.logits(session), self.windows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("quantized", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from studio.engine.sensitivity import compare_logits, host_session

    held = HeldOut(a.export, a.tokens, a.threads)
    rows = [{"graphs": "FP32", "seconds": held.reference_seconds,
             **compare_logits(held.reference, held.reference, held.windows)}]
    for q in a.quantized:
        t0 = time.perf_counter()
        figures = held.score(host_session(q / "prefill.onnx", a.threads))
        res = json.loads((q / "result.json").read_text()) if (q / "result.json").is_file() else {}
        rows.append({"graphs": str(q), "seconds": time.perf_counter() - t0,
                     "summary": res.get("summary", ""), **figures})
    print(f"{len(held.ids)} held-out tokens in {len(held.windows)} windows of "
          f"{held.spec['prompt_length']}; host QDQ (measured on the host CPU) vs FP32")
    print(f"{'graphs':<40} {'perplexity':>11} {'cosine':>9} {'top-1':>7} {'KL':>9}")
    for r in rows:
        print(f"{str(r['graphs'])[-40:]:<40} {r['perplexity']:11.3f} {r['logits_cosine']:9.6f} "
              f"{r['top1_agreement']:7.2%} {r['kl_divergence']:9.5f}")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
