"""transformers as users call it on a vision-language prompt, for comparing the studio with:
small random checkpoints with Qwen2-VL-Instruct's chat template (built here: no downloads),
pictures generated here, and :class:`Reference` — what ``Qwen2_5_VLProcessor`` + ``generate``
do, step by step (the processor class itself needs torchvision for its video processor,
which is not installed here): the checkpoint's image processor gives ``pixel_values`` and
``image_grid_thw``; the tokenizer's ``apply_chat_template`` renders an image block and the
text (or the raw text is ``<|vision_start|><|image_pad|><|vision_end|>`` + the prompt);
``<|image_pad|>`` is expanded to ``grid_thw.prod() // merge_size**2`` tokens as the
processor expands it; then ``model.generate(..., do_sample=False)``."""

from __future__ import annotations

import json
from pathlib import Path

#: vision configurations: name -> (model_type, vision_config keys over vl_checkpoints.VISION)
CONFIGS = {
    # every block attends within its window (the one full-attention index is past the depth)
    "qwen2.5-vl window-only": ("qwen2_5_vl", {"fullatt_block_indexes": [7]}),
    "qwen2.5-vl full-attention": ("qwen2_5_vl", {"fullatt_block_indexes": [0, 1]}),
    "qwen2.5-vl mixed": ("qwen2_5_vl", {"fullatt_block_indexes": [1]}),
    "qwen2-vl": ("qwen2_vl", {}),
}
#: source pictures: name -> (width, height); the checkpoints' image processor gives 112 x 112
#: to 224 x 224 pixels (min_pixels 12,544, max_pixels 50,176)
PICTURES = {
    "112x112": (112, 112),
    "168x112": (168, 112),
    "112x196": (112, 196),
    "400x300 (> max_pixels)": (400, 300),
    "56x84 (< min_pixels)": (56, 84),
}
FORMATS = ("raw", "chat")
PROMPT = "Describe this picture."
IMAGE_TOKEN = "<|image_pad|>"


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


def save_pictures(folder: Path) -> dict[str, Path]:
    """:data:`PICTURES` as PNG files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for i, (name, (w, h)) in enumerate(PICTURES.items()):
        out[name] = folder / f"picture-{w}x{h}.png"
        picture(w, h, seed=10 + i).save(out[name])
    return out


def chat_checkpoint(folder: Path, config: str) -> Path:
    """A small random checkpoint of ``config`` (:data:`CONFIGS`) with Qwen2-VL-Instruct's
    chat template in its tokenizer_config.json."""
    from tests.engine.chat_checkpoints import QWEN2_VL
    from tests.engine.conftest import corpus_text
    from tests.engine.vl_checkpoints import make_vl_checkpoint

    model_type, vision = CONFIGS[config]
    ck = make_vl_checkpoint(folder, model_type, corpus_text(), vision=vision)
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN2_VL
    (ck / "tokenizer_config.json").write_text(json.dumps(cfg))
    return ck


class Reference:
    """transformers on one checkpoint, as its processor and ``generate`` run a prompt."""

    def __init__(self, ck: Path):
        import warnings

        from transformers import AutoModelForImageTextToText, AutoTokenizer

        with warnings.catch_warnings():  # without torchvision: the PIL-backed processor
            warnings.simplefilter("ignore")
            from transformers import Qwen2VLImageProcessor

            self.images = Qwen2VLImageProcessor.from_pretrained(str(ck))
        self.tok = AutoTokenizer.from_pretrained(str(ck))
        self.model = AutoModelForImageTextToText.from_pretrained(str(ck)).eval()

    def text(self, fmt: str, prompt: str = PROMPT) -> str:
        """The prompt's text before the image is expanded: through the chat template (an
        image block, then the text) or raw (the image, then the text)."""
        if fmt == "chat":
            messages = [{"role": "user", "content": [{"type": "image"},
                                                     {"type": "text", "text": prompt}]}]
            return self.tok.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=False)
        return "<|vision_start|>" + IMAGE_TOKEN + "<|vision_end|>" + prompt

    def generate(self, pic: Path, fmt: str, new_tokens: int, prompt: str = PROMPT
                 ) -> tuple[list[int], dict]:
        """The greedy tokens after the prompt with the picture, and what the processor made
        of it (its grid and image tokens)."""
        import torch
        from PIL import Image

        with Image.open(pic) as opened:
            px = self.images(images=[opened], return_tensors="pt")
        grid = px["image_grid_thw"]
        k = int(grid[0].prod()) // self.images.merge_size ** 2
        text = self.text(fmt, prompt).replace(IMAGE_TOKEN, "<|placeholder|>" * k).replace(
            "<|placeholder|>", IMAGE_TOKEN)
        enc = self.tok([text], return_tensors="pt")
        ids = enc["input_ids"]
        image_id = self.tok.convert_tokens_to_ids(IMAGE_TOKEN)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=enc["attention_mask"],
                pixel_values=px["pixel_values"], image_grid_thw=grid,
                mm_token_type_ids=(ids == image_id).int(), max_new_tokens=new_tokens,
                do_sample=False)
        return out[0, ids.shape[1]:].tolist(), {"grid": grid[0].tolist()[1:],
                                                "image_tokens": k,
                                                "prompt_tokens": int(ids.shape[1])}


def first_difference(got: list[int] | None, want: list[int]) -> str:
    """"yes" when the tokens are equal, else where they first differ."""
    if got is None:
        return "studio failed"
    if got == want:
        return "yes"
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"no: first differs at {i}"
    return f"no: lengths {len(got)} vs {len(want)}"
