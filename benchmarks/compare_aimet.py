"""The studio's weight rounding against AIMET's, on one prefill graph.

AIMET (``aimet-onnx``) is optional and large (it brings its own CUDA torch): install it in a
virtual environment that sees the studio's packages, and run this script with that
environment's Python:

    python3 -m venv --system-site-packages /tmp/aimetenv
    /tmp/aimetenv/bin/pip install aimet-onnx
    /tmp/aimetenv/bin/python benchmarks/compare_aimet.py EXPORT_DIR \
        [--studio NAME=QUANT_DIR ...] [--tokens 256] [--candidates 20] [--json out.json]

EXPORT_DIR is a studio FP32 export (``prefill.onnx``, ``graph.json``); each ``--studio``
names a studio quantize artifact of the same export (W4A16 per channel, e.g. nearest and
seqmse). AIMET gets the same graph, the same calibration windows (the sample's calibration
text, ``--samples`` windows of the context length, their prefill feeds) and the HTP v75
per-channel configuration, 4-bit weights and 16-bit activations, once with its min-max
weight encodings and once after ``aimet_onnx.apply_seq_mse``. Every variant is scored on
the host against FP32, teacher-forced on the sample's held-out text in prefill windows
(``studio.engine.sensitivity.compare_logits``: perplexity, logits cosine, top-1, KL), and the
per-channel weight scales of AIMET's SeqMSE are set beside the studio's (the median ratio
and the share within 5 %, over every 4-bit weight).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _studio_scales(quant_dir: Path) -> dict:
    """Weight name -> per-channel scales of a studio QDQ prefill graph."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(quant_dir / "prefill.onnx")).graph
    inits = {i.name: i for i in g.initializer}
    out = {}
    for name, t in inits.items():
        if name.endswith("_quantized") and (name[: -len("_quantized")] + "_scale") in inits:
            base = name[: -len("_quantized")]
            scale = numpy_helper.to_array(inits[base + "_scale"])
            if scale.ndim == 1 and t.data_type in (22, 21):  # INT4 / UINT4 per channel
                out[base] = scale
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("export", type=Path)
    ap.add_argument("--studio", action="append", default=[], metavar="NAME=QUANT_DIR")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--config", default="htp_quantsim_config_v75_per_channel_linear.json")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    import aimet_onnx
    import numpy as np
    import onnx
    from aimet_onnx import apply_seq_mse
    from aimet_onnx.quantsim import QuantizationSimModel
    from score_quantized import HeldOut  # this folder's script: the same held-out scoring

    from studio.core.progress import NullProgress
    from studio.core.samples import read_data
    from studio.engine.calibration import build_calibration_feeds, calibration_windows
    from studio.engine.sensitivity import compare_logits, host_session
    from studio.samples import sample_path

    held = HeldOut(a.export, a.tokens)
    spec, windows = held.spec, held.windows
    P, C = int(spec["prompt_length"]), int(spec["context_length"])
    rows = []
    for item in a.studio:
        name, _, path = item.partition("=")
        t0 = time.perf_counter()
        figures = held.score(host_session(Path(path) / "prefill.onnx"))
        rows.append({"variant": f"studio {name}", "seconds_scoring": time.perf_counter() - t0,
                     **figures})

    wins = calibration_windows(read_data("calibration"), sample_path("tiny-coder"), length=C,
                               count=a.samples, min_length=min(C, P + 1))
    calib, _ = build_calibration_feeds(a.export, spec, wins, NullProgress(), decode_per_window=0)
    cfg = str(Path(aimet_onnx.__file__).parent / "common" / "quantsim_config" / a.config)
    model = onnx.load(str(a.export / "prefill.onnx"))
    scales_aimet = {}
    for variant in ("min-max", "seqmse"):
        t0 = time.perf_counter()
        sim = QuantizationSimModel(model, param_type="int4", activation_type="int16",
                                   config_file=cfg, providers=["CPUExecutionProvider"])
        if variant == "seqmse":
            apply_seq_mse(sim, calib, num_candidates=a.candidates)
        sim.compute_encodings(calib)
        took = time.perf_counter() - t0
        rows.append({"variant": f"AIMET {variant}", "seconds": took,
                     **held.score(sim.session)})
        if variant == "seqmse":
            for name, op in sim.qc_quantize_op_dict.items():
                try:
                    enc = op.get_encodings()
                except Exception:  # noqa: BLE001 - an activation quantizer without encodings
                    continue
                if enc and len(enc) > 1 and getattr(op, "bitwidth", 0) == 4:
                    scales_aimet[name] = np.array([e.delta for e in enc])
    compare = []
    for item in a.studio:
        name, _, path = item.partition("=")
        ours = _studio_scales(Path(path))
        ratios = [ours[k] / scales_aimet[k] for k in ours if k in scales_aimet
                  and ours[k].shape == scales_aimet[k].shape]
        if ratios:
            r = np.concatenate(ratios)
            compare.append({"studio": name, "weights": len(ratios), "channels": int(r.size),
                            "median_ratio": float(np.median(r)),
                            "within_5_percent": float(np.mean(np.abs(r - 1) <= 0.05))})
    print(f"{len(held.ids)} held-out tokens in {len(windows)} prefill windows of {P}; figures "
          f"measured on the host CPU vs FP32; AIMET {aimet_onnx.__version__ if hasattr(aimet_onnx, '__version__') else ''} "
          f"({a.config}, {a.samples} calibration windows, {a.candidates} SeqMSE candidates)")
    print(f"{'variant':<22} {'perplexity':>11} {'cosine':>9} {'top-1':>7} {'KL':>9} {'s':>7}")
    print(f"{'FP32':<22} {compare_logits(held.reference, held.reference, windows)['perplexity']:11.3f}")
    for r in rows:
        print(f"{r['variant']:<22} {r['perplexity']:11.3f} {r['logits_cosine']:9.6f} "
              f"{r['top1_agreement']:7.2%} {r['kl_divergence']:9.5f} {r.get('seconds', 0):7.1f}")
    for c in compare:
        print(f"weight scales, studio {c['studio']} / AIMET seqmse: {c['weights']} weights, "
              f"{c['channels']} channels, median ratio {c['median_ratio']:.3f}, "
              f"{c['within_5_percent']:.0%} within 5 %")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "scales": compare}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
