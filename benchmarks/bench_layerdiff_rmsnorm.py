"""Is the host-QDQ vs HTP gap the RMSNorm? A causal check of what the layer diff points at.

The layer diff of the sample (W8A16) finds host QDQ and the HTP parting at the first
post-attention RMSNorm: host QDQ rounds every step of the decomposed norm (Pow, ReduceMean,
Add, Sqrt, Div, Mul) to 16 bits, the HTP computes the norm in one piece. This removes the
Q/DQ pairs inside every norm of the host QDQ graphs (each norm's output stays quantized) and
scores host QDQ, host QDQ with unrounded norms and the HTP against FP32: on prefill windows
(the layer diff's figures) and, with ``--teacher-forced``, as validate does (windows of C
tokens, prefill then decode steps; the HTP part takes about a minute on the sample).

Run after ``studio --batch FILE --stages layerdiff`` (it reads that run's artifacts):

    python benchmarks/bench_layerdiff_rmsnorm.py FILE [--windows 8] [--teacher-forced]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def unround_norms(export_graph: Path, quant_graph: Path, out: Path) -> int:
    """``quant_graph`` without the Q/DQ pairs on the tensors inside each ``*norm`` module
    (all but the module's last node); returns how many Q/DQ nodes went."""
    import onnx

    from studio.core.recipe import module_of_node

    f, q = onnx.load(str(export_graph)), onnx.load(str(quant_graph))
    mods: dict[str, list] = {}
    for n in f.graph.node:
        if n.op_type != "Constant":
            mods.setdefault(module_of_node(n.name), []).append(n)
    inner = {n.output[0] for m, ns in mods.items() if m.endswith("norm") for n in ns[:-1]}
    consumers: dict[str, list] = {}
    for n in q.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    drop, rewire = set(), {}
    for t in inner:
        for qn in consumers.get(t, []):
            if qn.op_type == "QuantizeLinear":
                drop.add(qn.name)
                for dq in consumers.get(qn.output[0], []):
                    if dq.op_type == "DequantizeLinear":
                        rewire[dq.output[0]] = t
                        drop.add(dq.name)
    keep = [n for n in q.graph.node if n.name not in drop]
    for n in keep:
        for k, i in enumerate(n.input):
            if i in rewire:
                n.input[k] = rewire[i]
    del q.graph.node[:]
    q.graph.node.extend(keep)
    onnx.save(q, str(out))
    return len(drop)


def main() -> int:
    from transformers import PreTrainedTokenizerFast

    from studio.core import project as pf
    from studio.core.artifacts import ArtifactStore
    from studio.core.catalog import get_chip
    from studio.engine import qnn
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session
    from studio.engine.onnxio import load_spec
    from studio.engine.sensitivity import compare_logits, host_session
    from studio.services.history import current_keys

    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--teacher-forced", action="store_true")
    args = ap.parse_args()
    p = pf.load(Path(args.file))
    chip = get_chip(p.targets[0])
    store = ArtifactStore(p.folder / "artifacts")
    arts = {k.split("[")[0]: store.get(v) for k, v in current_keys(p, ["layerdiff"]).items()}
    if any(a is None for a in arts.values()):
        sys.exit(f"run studio --batch {args.file} --stages layerdiff first")
    e, q, c = arts["export"].path, arts["quantize"].path, arts["compile"].path
    spec = load_spec(e)
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    tok = PreTrainedTokenizerFast.from_pretrained(str(e / "tokenizer"))
    ids = tok(p.input_path(p.validation["heldout_text"]).read_text()).input_ids
    with tempfile.TemporaryDirectory() as tmp:
        w = Path(tmp)
        n = sum(unround_norms(e / f"{g}.onnx", q / f"{g}.onnx", w / f"{g}.onnx")
                for g in ("prefill", "decode"))
        print(f"removed {n} Q/DQ nodes inside the RMSNorms (prefill + decode graphs)")
        wins = [ids[i * P:(i + 1) * P] for i in range(args.windows)]
        gen = StaticKVGenerator(make_cpu_session(e / "prefill.onnx"),
                                make_cpu_session(e / "decode.onnx"), spec)
        feeds = [gen.prefill_feed(x) for x in wins]

        def logits(sess):
            return [sess.run(["logits"], f)[0][0] for f in feeds]

        ref = logits(host_session(e / "prefill.onnx"))
        runs = {"host QDQ": logits(host_session(q / "prefill.onnx")),
                "host QDQ, norms unrounded": logits(host_session(w / "prefill.onnx")),
                "HTP (simulated)": logits(qnn.make_session(c / "prefill_ctx.onnx", chip))}
        print(f"prefill, {len(wins)} windows of {P} held-out tokens, vs FP32:")
        for k, v in runs.items():
            s = compare_logits(ref, v, wins)
            agree = compare_logits(runs["HTP (simulated)"], v, wins)["top1_agreement"]
            print(f"  {k:<28} KL {s['kl_divergence']:.3g}  cosine {s['logits_cosine']:.6f}  "
                  f"top-1 {s['top1_agreement']:.1%}  ppl {s['perplexity']:.3f}  "
                  f"top-1 with HTP {agree:.1%}")
        if not args.teacher_forced:
            return 0
        heldout = ids[: p.validation["heldout_tokens"]]
        windows = [x for x in (heldout[i:i + C] for i in range(0, len(heldout), C))
                   if len(x) >= 2]
        gens = {
            "FP32": (e / "prefill.onnx", e / "decode.onnx", make_cpu_session),
            "host QDQ, ORT default (validate)": (q / "prefill.onnx", q / "decode.onnx",
                                                 make_cpu_session),
            "host QDQ, optimizations off": (q / "prefill.onnx", q / "decode.onnx",
                                            host_session),
            "host QDQ, norms unrounded": (w / "prefill.onnx", w / "decode.onnx", host_session),
        }
        tf = {k: [StaticKVGenerator(mk(a), mk(b), spec).teacher_forced_logits(x)
                  for x in windows] for k, (a, b, mk) in gens.items()}
        tf["HTP (simulated)"] = [
            StaticKVGenerator(qnn.make_session(c / "prefill_ctx.onnx", chip),
                              qnn.make_session(c / "decode_ctx.onnx", chip), spec)
            .teacher_forced_logits(x) for x in windows]
        print(f"teacher-forced as validate: {len(heldout)} tokens in windows of {C}:")
        for k, v in tf.items():
            s = compare_logits(tf["FP32"], v, windows)
            print(f"  {k:<34} top-1 {s['top1_agreement']:.2%}  cosine "
                  f"{s['logits_cosine']:.6f}  ppl {s['perplexity']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
