"""The vision encoder of a real-size vision-language model on this machine: Qwen2.5-VL-3B's
vision tower (32 blocks, width 1280, window attention; 0.67 B parameters, 2.7 GB in FP32),
built from its published sizes (``resources/configs/qwen2.5-vl-3b.json``) with random
weights — nothing is downloaded — and taken through what the studio does to it:

1. export ``vision.onnx`` for one image size (the weights beside it in ``vision.onnx.data``:
   one ONNX file holds at most 2 GB), checked against the torch tower on a generated image;
2. quantize it (W8A16 by default) on ``--images`` generated images, checked against FP32 on
   two held-out ones (ONNX Runtime, CPU);
3. compile its context binary for ``--target``;
4. with ``--htp``, one image through the binary on the HTP simulator (minutes: the simulator
   is hundreds of times slower than the CPU, and its time follows host load).

Each step's wall time and the process's peak RSS so far are printed, with the CPU's own
time for one image (ONNX Runtime, FP32 and the QDQ graph) as the baseline measured in the
same run.

    python benchmarks/bench_vision_encoder.py [--image 448] [--images 4] [--scheme W8A16]
        [--target snapdragon-8-gen-3] [--htp] [--workdir DIR] [--depth N]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", type=int, default=448)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--scheme", default="W8A16")
    ap.add_argument("--target", default="snapdragon-8-gen-3")
    ap.add_argument("--htp", action="store_true", help="one image on the HTP simulator")
    ap.add_argument("--depth", type=int, default=0, help="fewer blocks (0: the model's)")
    ap.add_argument("--init", type=float, default=0.1,
                    help="the random weights' std (transformers' 0.02 leaves the merger's "
                         "activations too small for a 16-bit scale of their bias)")
    ap.add_argument("--workdir", help="keep the files here (default: a temp folder)")
    args = ap.parse_args()

    import torch
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    from studio.core.catalog import get_chip
    from studio.engine import qnn, vision, vision_input
    from studio.engine.llm_export import OPSET
    from studio.engine.llm_runtime import make_cpu_session

    cfg = json.loads((ROOT / "resources/configs/qwen2.5-vl-3b.json").read_text())
    vc = dict(cfg["vision_config"])
    if args.depth:
        vc["depth"] = args.depth
        vc["fullatt_block_indexes"] = [i for i in vc["fullatt_block_indexes"] if i < args.depth]
    vc["initializer_range"] = args.init
    config = Qwen2_5_VLConfig(vision_config=vc, text_config={"hidden_size": 2048})
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-vl-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []

    def step(name: str, t0: float, note: str = "") -> None:
        rows.append((name, time.perf_counter() - t0, peak_gib(), note))
        print(f"{name:<34} {rows[-1][1]:8.1f} s   peak RSS {rows[-1][2]:5.1f} GiB   {note}",
              flush=True)

    t0 = time.perf_counter()
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
        config.vision_config, attn_implementation="eager").eval()
    n = sum(p.numel() for p in tower.parameters())
    step("build the tower (random)", t0, f"{n / 1e9:.3f} B parameters")
    vs = vision_input.make_vision_spec(
        {**cfg, "vision_config": vc, "image_token_id": 151655, "vision_start_token_id": 151652,
         "vision_end_token_id": 151653}, {}, args.image, "qwen2_5_vl", "the 3B config")
    print(f"image {args.image} px: {vs.patches} patches -> {vs.tokens} image tokens")
    img = vision_input.calibration_images(1, args.image, seed=7)[0]
    px = vision_input.pixel_values(img, vs)
    t0 = time.perf_counter()
    with torch.no_grad():
        ref = tower(torch.from_numpy(px), grid_thw=torch.tensor([[1, vs.grid, vs.grid]]))
    ref = ref.pooler_output.float().numpy()
    step("torch FP32, one image", t0)

    t0 = time.perf_counter()
    info = vision.export_vision(tower, vs, work / "vision.onnx", OPSET)
    step("export vision.onnx", t0, f"weights {info['weight_bytes'] / 1e9:.2f} GB, external "
         f"{info['external_data']}")
    del tower
    (work / "graph.json").write_text(json.dumps({"vision": vs.to_json()}))
    fp32 = make_cpu_session(work / "vision.onnx")
    vision.encode(fp32, px)  # warm
    t0 = time.perf_counter()
    got = vision.encode(fp32, px)
    step("ONNX Runtime FP32, one image", t0, f"cosine vs torch {vision.cosine(got, ref):.6f}")
    cpu_fp32_s = rows[-1][1]
    del fp32  # the FP32 session's weights: not held while the quantizer works
    import gc

    gc.collect()

    stage = work / "q"
    stage.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    q = vision.quantize_vision(work, stage, {"scheme": args.scheme,
                                             "weight_granularity": "per_channel",
                                             "calibration_method": "MinMax"},
                               vision_input.calibration_images(args.images, args.image, seed=0),
                               vision_input.calibration_images(2, args.image, seed=1000), vs=vs)
    step(f"quantize ({args.scheme}, {args.images} images)", t0,
         f"cosine vs FP32 {q['check']['encoder_cosine_min']:.4f} (lowest of 2 held out)")
    qdq = make_cpu_session(stage / "vision.onnx")
    vision.encode(qdq, px)
    t0 = time.perf_counter()
    vision.encode(qdq, px)
    step("ONNX Runtime QDQ, one image", t0)
    cpu_qdq_s = rows[-1][1]
    size = sum(f.stat().st_size for f in stage.iterdir() if f.name.startswith("vision.onnx"))

    chip = get_chip(args.target)
    t0 = time.perf_counter()
    c = qnn.compile_context(stage / "vision.onnx", work / "vision_ctx.onnx", chip,
                            embed=size < (1 << 30))
    binary = sum(f.stat().st_size for f in work.iterdir()
                 if f.name.startswith("vision_ctx") and f.is_file())
    step(f"compile for {chip.name}", t0, f"binary {binary / 1e6:.0f} MB, QNN SDK "
         f"{c.get('sdk_version', '?')}")
    if args.htp:
        sess = qnn.make_session(work / "vision_ctx.onnx", chip, strict=True)
        t0 = time.perf_counter()
        rows_htp = vision.encode(sess, px)
        step("HTP simulator, one image", t0, "simulated: follows the host, not a device "
             f"timing; cosine vs FP32 {vision.cosine(rows_htp, got):.4f}")
        print(f"simulator / CPU FP32: {rows[-1][1] / cpu_fp32_s:.0f}x, "
              f"simulator / CPU QDQ: {rows[-1][1] / cpu_qdq_s:.0f}x")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print(f"CPU QDQ / CPU FP32 for one image: {cpu_qdq_s / cpu_fp32_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
