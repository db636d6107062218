"""Chat templates rendered by the studio give the ids transformers gives: the tokenizer's
``apply_chat_template`` (one user message, ``add_generation_prompt=True``) on real tokenizers
built here with the templates checkpoints ship (Qwen2.5's in tokenizer_config.json, a
Llama-3-style one in chat_template.jinja with ``bos_token`` and ``strftime_now``, named
templates), a Qwen2-VL prompt with its image where the template puts it; and a checkpoint
without a template, or with a broken one, gets one line."""

from __future__ import annotations

import json

import pytest

from studio.core.errors import StudioError
from studio.engine import chat_template as ct
from tests.engine.chat_checkpoints import LLAMA3, QWEN2_VL, QWEN25, save_chat_tokenizer

PROMPTS = ["def read_config(self, path):", "  Zürich {braces} and\nnewlines  ",
           "<|im_start|>already special<|im_end|>"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("chat")
    return {
        "qwen-config": save_chat_tokenizer(root / "q", corpus, QWEN25, "config"),
        "llama-jinja": save_chat_tokenizer(root / "l", corpus, LLAMA3, "jinja",
                                           bos="<|begin_of_text|>"),
        "qwen-named": save_chat_tokenizer(root / "n", corpus, QWEN25, "named"),
        "none": save_chat_tokenizer(root / "none", corpus, None),
    }


@pytest.mark.parametrize("name", ["qwen-config", "llama-jinja", "qwen-named"])
def test_prompt_ids_equal_transformers_apply_chat_template(folders, name):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    folder = folders[name]
    hf = AutoTokenizer.from_pretrained(str(folder))
    fmt = ct.prompt_format(folder)
    assert fmt.applied and fmt.template.text == hf.get_chat_template()
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        assert fmt.text(prompt) == hf.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False)
        assert fmt.ids(hf, prompt) == want  # the runtimes' tokenizer
        assert fmt.ids(fast, prompt) == want  # the checkpoint checks' (preflight's) tokenizer
    # what an app without a template engine wraps a prompt in
    before, after = fmt.template.affixes()
    assert before + "x y" + after == fmt.text("x y")
    assert fmt.line().startswith("chat template: " + fmt.template.source)


def test_where_transformers_reads_the_template(folders):
    assert ct.read(folders["qwen-config"]).source == "tokenizer_config.json's chat_template"
    assert ct.read(folders["llama-jinja"]).source == "chat_template.jinja"
    assert dict(ct.read(folders["llama-jinja"]).special)["bos_token"] == "<|begin_of_text|>"
    assert ct.read(folders["qwen-named"]).source.endswith('chat_template "default"')


def test_without_a_template_the_prompt_goes_in_as_written(folders):
    from transformers import AutoTokenizer

    folder = folders["none"]
    hf = AutoTokenizer.from_pretrained(str(folder))
    fmt = ct.prompt_format(folder)
    assert not fmt.applied and fmt.line() == ct.missing_line()
    assert "no chat template in the checkpoint" in fmt.line() and "\n" not in fmt.line()
    assert fmt.ids(hf, PROMPTS[0]) == hf(PROMPTS[0]).input_ids
    # the setting and --raw skip a template the checkpoint has
    off = ct.prompt_format(folders["qwen-config"], "none")
    raw = ct.prompt_format(folders["qwen-config"], raw=True)
    assert not off.applied and 'model.chat_template = "none"' in off.line()
    assert not raw.applied and "--raw" in raw.line() and raw.text("a") == "a"


def test_bad_templates_get_one_line(tmp_path, corpus):
    broken = save_chat_tokenizer(tmp_path / "broken", corpus, "{% for m in messages %}", "jinja")
    with pytest.raises(StudioError, match=r"does not compile \(line 1: .*\): fix it"):
        ct.read(broken)
    refusing = save_chat_tokenizer(tmp_path / "refusing", corpus,
                                   "{{ raise_exception('system messages only') }}")
    with pytest.raises(StudioError, match="refused the prompt: system messages only"):
        ct.prompt_format(refusing).text("hi")
    named = save_chat_tokenizer(tmp_path / "named", corpus, QWEN25, "named")
    cfg = json.loads((named / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": QWEN25}]
    (named / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(StudioError, match=r"no \"default\""):
        ct.read(named)
    (named / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(StudioError, match="is not valid JSON"):
        ct.read(named)
    text_only = save_chat_tokenizer(tmp_path / "text", corpus, QWEN25)
    with pytest.raises(StudioError, match=r"puts no image \(<\|image_pad\|>\)"):
        ct.prompt_format(text_only).text("hi", image=True)


def test_an_image_goes_where_the_vision_language_template_puts_it(tmp_path, corpus):
    """Qwen2-VL's template and transformers' processor steps: the tokenizer renders the
    template (an image block, then the text), the image processor gives the image's grid,
    the one <|image_pad|> becomes one per image token, and the text is tokenized as the
    processor tokenizes it. (transformers' Qwen2VLProcessor class itself needs torchvision,
    which this machine does not have; these are its steps, run with transformers' own
    tokenizer and image processor.)"""
    import numpy as np
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    from studio.engine import vision, vision_input
    from tests.engine.vl_checkpoints import IMAGE, make_vl_checkpoint

    ck = make_vl_checkpoint(tmp_path / "ck", "qwen2_vl", corpus)
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN2_VL
    (ck / "tokenizer_config.json").write_text(json.dumps(cfg))
    hf = AutoTokenizer.from_pretrained(str(ck))
    picture = (vision_input.calibration_images(1, IMAGE, seed=5)[0] * 255).round().astype(np.uint8)
    grid = AutoImageProcessor.from_pretrained(str(ck))(
        images=Image.fromarray(picture.transpose(1, 2, 0)), return_tensors="np")
    image_tokens = int(np.prod(grid["image_grid_thw"][0])) // 4  # merge 2 x 2
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Describe:"}]}]
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    expanded = text.replace("<|image_pad|>", "<|image_pad|>" * image_tokens)
    want = hf(expanded).input_ids  # the processor: special tokens as the tokenizer adds them

    fmt = ct.prompt_format(ck)
    assert fmt.text("Describe:", image=True) == text
    vs = vision_input.make_vision_spec(json.loads((ck / "config.json").read_text()),
                                 vision_input.read_preprocessor(ck), IMAGE, "qwen2_vl", str(ck))
    got = vision.place_image(vs, fmt.ids(hf, "Describe:", image=True, vision=True))
    assert vs.tokens == image_tokens and got == want
    assert got.index(vs.image_token_id) > 10  # inside the user's turn, not first
    # a text prompt to the same model: the template's string branch
    assert fmt.ids(hf, "Describe:", vision=True) == hf.apply_chat_template(
        [{"role": "user", "content": "Describe:"}], add_generation_prompt=True,
        return_dict=False)
    # the prompt as written: the image before it, as before
    raw = ct.prompt_format(ck, raw=True).ids(hf, "Describe:")
    assert vision.place_image(vs, raw)[:2] == [vs.vision_start_token_id, vs.image_token_id]
    with pytest.raises(StudioError, match="image placeholder"):
        vision.place_image(vs, [vs.image_token_id, 10])
