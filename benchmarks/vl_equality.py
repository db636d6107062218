"""`studio generate --image` against transformers as users call it, token for token.

For each vision configuration (small random checkpoints built here, nothing is downloaded:
a Qwen2.5-VL tower whose blocks all attend within windows, one whose blocks all attend to the
whole image, the mixed one of the tests, and a Qwen2-VL tower), each source picture (square,
two non-square ones, one larger than the image processor's max_pixels) and each prompt format
(raw: the image then the text; the checkpoint's chat template), it

1. makes the project as a user does: ``studio new P --checkpoint CK`` (the image size the
   CLI picks, or ``--image-size``), ``studio --batch P --stages export``;
2. runs ``studio generate P --image PIC --prompt TEXT [--raw] --max-new-tokens N --json``
   (the FP32 export on the host CPU, ONNX Runtime);
3. runs transformers as its processor does, step by step (``Qwen2_5_VLProcessor`` needs
   torchvision for its video processor, which is not installed here): the checkpoint's image
   processor for ``pixel_values`` and ``image_grid_thw``; the tokenizer's
   ``apply_chat_template`` (an image block, then the text), or the raw text
   ``<|vision_start|><|image_pad|><|vision_end|>`` + prompt; ``<|image_pad|>`` expanded to
   ``grid_thw.prod() // merge_size**2`` tokens as the processor expands it; then
   ``model.generate(..., do_sample=False)``;

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

#: name -> (model_type, vision_config keys over tests/engine/vl_checkpoints.py's)
CONFIGS = {
    "qwen2.5-vl window-only": ("qwen2_5_vl", {"fullatt_block_indexes": [7]}),
    "qwen2.5-vl full-attention": ("qwen2_5_vl", {"fullatt_block_indexes": [0, 1]}),
    "qwen2.5-vl mixed": ("qwen2_5_vl", {"fullatt_block_indexes": [1]}),
    "qwen2-vl": ("qwen2_vl", {}),
}
#: name -> (width, height) of the source picture; the checkpoints' processor gives
#: 112 x 112 to 224 x 224 pixels (min_pixels 12,544, max_pixels 50,176)
PICTURES = {
    "112x112": (112, 112),
    "168x112": (168, 112),
    "112x196": (112, 196),
    "400x300 (> max_pixels)": (400, 300),
}
FORMATS = ("raw", "chat")
PROMPT = "Describe this picture."


def picture(width: int, height: int, seed: int):
    """A PIL RGB picture: a colour gradient, a disc, a box and noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    yy, xx = yy / max(height - 1, 1), xx / max(width - 1, 1)
    c0, c1 = rng.random(3), rng.random(3)
    t = 0.6 * xx + 0.4 * yy
    img = c0[:, None, None] * (1 - t) + c1[:, None, None] * t
    cx, cy, r = rng.random(), rng.random(), 0.2 + 0.2 * rng.random()
    img = np.where(((xx - cx) ** 2 + (yy - cy) ** 2 < r * r)[None], rng.random(3)[:, None, None],
                   img)
    x0, y0 = rng.random(2) * 0.6
    box = (xx > x0) & (xx < x0 + 0.3) & (yy > y0) & (yy < y0 + 0.3)
    img = np.where(box[None], rng.random(3)[:, None, None], img)
    img = np.clip(img + rng.normal(0, 0.05, img.shape), 0, 1)
    return Image.fromarray((img.transpose(1, 2, 0) * 255).round().astype(np.uint8))


def checkpoint(folder: Path, model_type: str, vision: dict) -> Path:
    """A small random checkpoint with Qwen2-VL-Instruct's chat template."""
    from tests.engine.chat_checkpoints import QWEN2_VL
    from tests.engine.conftest import corpus_text
    from tests.engine.vl_checkpoints import make_vl_checkpoint

    ck = make_vl_checkpoint(folder, model_type, corpus_text(), vision=vision)
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN2_VL
    (ck / "tokenizer_config.json").write_text(json.dumps(cfg))
    return ck


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
    return list(out["tokens"]), f"{out['prompt_tokens']} prompt tokens"


class Reference:
    """transformers as a user calls it, step by step as its processor does."""

    def __init__(self, ck: Path):
        import warnings

        from transformers import AutoModelForImageTextToText, AutoTokenizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import Qwen2VLImageProcessor

            self.images = Qwen2VLImageProcessor.from_pretrained(str(ck))
        self.tok = AutoTokenizer.from_pretrained(str(ck))
        self.model = AutoModelForImageTextToText.from_pretrained(str(ck)).eval()
        self.image_token = "<|image_pad|>"

    def text(self, fmt: str) -> str:
        if fmt == "chat":
            messages = [{"role": "user", "content": [{"type": "image"},
                                                     {"type": "text", "text": PROMPT}]}]
            return self.tok.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=False)
        return "<|vision_start|><|image_pad|><|vision_end|>" + PROMPT

    def tokens(self, pic: Path, fmt: str, n: int) -> tuple[list[int], str]:
        import torch
        from PIL import Image

        px = self.images(images=[Image.open(pic)], return_tensors="pt")
        grid = px["image_grid_thw"]
        k = int(grid[0].prod()) // self.images.merge_size ** 2
        text = self.text(fmt).replace(self.image_token, "<|placeholder|>" * k).replace(
            "<|placeholder|>", self.image_token)
        enc = self.tok([text], return_tensors="pt")
        ids = enc["input_ids"]
        image_id = self.tok.convert_tokens_to_ids(self.image_token)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=enc["attention_mask"],
                pixel_values=px["pixel_values"], image_grid_thw=grid,
                mm_token_type_ids=(ids == image_id).int(), max_new_tokens=n, do_sample=False)
        g = grid[0].tolist()
        return out[0, ids.shape[1]:].tolist(), f"grid {g[1]}x{g[2]}, {k} image tokens"


def compare(a: list[int] | None, b: list[int]) -> str:
    if a is None:
        return "studio failed"
    if a == b:
        return "yes"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"no: first differs at {i}"
    return f"no: lengths {len(a)} vs {len(b)}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=0,
                    help="studio new --image-size (0: the CLI's default)")
    ap.add_argument("--workdir", help="keep the files here (default: a temp folder)")
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vl-equality-"))
    work.mkdir(parents=True, exist_ok=True)
    pics = {}
    for i, (name, (w, h)) in enumerate(PICTURES.items()):
        pics[name] = work / f"picture-{w}x{h}.png"
        picture(w, h, seed=10 + i).save(pics[name])
    rows = []
    size_note = f"--image-size {args.image_size}" if args.image_size else "the CLI's image size"
    for cname in args.configs.split(","):
        model_type, vis = CONFIGS[cname]
        t0 = time.perf_counter()
        cwork = work / cname.replace(" ", "-").replace(".", "")
        ck = checkpoint(cwork / "ck", model_type, vis)
        f = make_project(cwork, ck, args.image_size or None)
        spec = json.loads(next((f.with_suffix(".studio") / "artifacts").rglob("graph.json"))
                          .read_text())
        side = spec["vision"]["image_size"]
        ref = Reference(ck)
        for pname, pic in pics.items():
            for fmt in FORMATS:
                want, rnote = ref.tokens(pic, fmt, args.tokens)
                got, snote = studio_tokens(f, pic, fmt, args.tokens)
                rows.append((cname, side, pname, fmt, compare(got, want),
                             f"transformers: {rnote}; studio: {snote}"))
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
