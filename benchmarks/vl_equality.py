"""`studio generate --image` against transformers as users call it, token for token.

For each vision configuration (small random checkpoints built here, nothing is downloaded:
a Qwen2.5-VL tower whose blocks all attend within windows, one whose blocks all attend to the
whole image, the mixed one of the tests, and a Qwen2-VL tower), each source picture (square,
two non-square ones, one larger than the image processor's max_pixels, one smaller than its
min_pixels) and each prompt format (raw: the image then the text; the checkpoint's chat
template), it

1. makes the project as a user does: ``studio new P --checkpoint CK`` (the image size the
   CLI picks, or ``--image-size``), ``studio --batch P --stages export``;
2. runs ``studio generate P --image PIC --prompt TEXT [--raw] --max-new-tokens N --json``
   (the FP32 export on the host CPU, ONNX Runtime);
3. runs transformers as its processor does, step by step
   (``tests/engine/vl_reference.py``: ``Qwen2_5_VLProcessor`` needs torchvision for its video
   processor, which is not installed here): the checkpoint's image processor for
   ``pixel_values`` and ``image_grid_thw``; the tokenizer's ``apply_chat_template`` (an image
   block, then the text), or the raw text ``<|vision_start|><|image_pad|><|vision_end|>`` +
   prompt; ``<|image_pad|>`` expanded to ``grid_thw.prod() // merge_size**2`` tokens as the
   processor expands it; then ``model.generate(..., do_sample=False)``;

and prints the table: config x picture x format, tokens equal (yes / the first differing
position).

    python benchmarks/vl_equality.py [--tokens 32] [--image-size PX] [--workdir DIR]
        [--out FILE] [--configs NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.vl_reference import PROMPT  # noqa: E402


def studio(*args, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "studio.cli", *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=1800)
    if check and r.returncode != 0:
        raise SystemExit(f"studio {' '.join(map(str, args))} failed ({r.returncode}):\n"
                         f"{r.stderr[-3000:]}")
    return r


def make_project(work: Path, ck: Path, image_size: int | None) -> Path:
    f = work / "vl.qstudio"
    extra = ["--image-size", image_size] if image_size else []
    studio("new", f, "--checkpoint", ck, *extra)
    studio("--batch", f, "--stages", "export")
    return f


def studio_tokens(f: Path, pic: Path, fmt: str, n: int) -> tuple[list[int] | None, str]:
    raw = ["--raw"] if fmt == "raw" else []
    r = studio("generate", f, "--image", pic, "--prompt", PROMPT, *raw, "--max-new-tokens", n,
               "--json", "--device", "cpu", check=False)
    if r.returncode != 0:
        return None, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"
    out = json.loads(r.stdout)
    img = out.get("image") or {}
    return list(out["tokens"]), (f"{img.get('image_tokens')} image tokens, "
                                 f"{out['prompt_tokens']} prompt tokens")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=0,
                    help="studio new --image-size (0: the CLI's default)")
    ap.add_argument("--workdir", help="keep the files here (default: a temp folder)")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--configs", default="", help="comma-separated (default: all)")
    args = ap.parse_args()

    from tests.engine.vl_reference import (
        CONFIGS,
        FORMATS,
        Reference,
        chat_checkpoint,
        first_difference,
        save_pictures,
    )

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vl-equality-"))
    work.mkdir(parents=True, exist_ok=True)
    pics = save_pictures(work / "pictures")
    rows = []
    size_note = f"--image-size {args.image_size}" if args.image_size else "the CLI's image size"
    for cname in args.configs.split(",") if args.configs else CONFIGS:
        t0 = time.perf_counter()
        cwork = work / cname.replace(" ", "-").replace(".", "")
        ck = chat_checkpoint(cwork / "ck", cname)
        f = make_project(cwork, ck, args.image_size or None)
        spec = json.loads(next((f.with_suffix(".studio") / "artifacts").rglob("graph.json"))
                          .read_text())
        side = spec["vision"]["image_size"]
        ref = Reference(ck)
        for pname, pic in pics.items():
            for fmt in FORMATS:
                want, facts = ref.generate(pic, fmt, args.tokens)
                got, snote = studio_tokens(f, pic, fmt, args.tokens)
                g = facts["grid"]
                rows.append((cname, side, pname, fmt, first_difference(got, want),
                             f"transformers: grid {g[0]}x{g[1]} patches, "
                             f"{facts['image_tokens']} image tokens, "
                             f"{facts['prompt_tokens']} prompt tokens; studio: {snote}"))
                print(" | ".join(map(str, rows[-1])), flush=True)
        print(f"# {cname}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    lines = [f"VL equality: studio generate --image (CPU, FP32 export) vs transformers "
             f"generate, {args.tokens} greedy tokens, {size_note}", "",
             "| config | export.image_size | picture (W x H) | prompt format | tokens equal "
             "| notes |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
