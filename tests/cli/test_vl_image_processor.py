"""The checkpoint's image processor is the truth: `studio new --checkpoint` on a
vision-language checkpoint sizes the image from its processor's min_pixels / max_pixels and
keeps the context within the model's max_position_embeddings, or refuses in one line (exit
2); so does an --image-size the processor does not give, and the export of one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from tests.cli.conftest import studio
from tests.engine.conftest import corpus_text
from tests.engine.vl_checkpoints import IMAGE, make_vl_checkpoint


@pytest.fixture(scope="module")
def only_112(tmp_path_factory) -> Path:
    """The issue's checkpoint: a Qwen2.5-VL whose processor gives 112 x 112 px only (min_pixels
    = max_pixels = 112 x 112) and whose language model has 512 positions."""
    root = tmp_path_factory.mktemp("vl-112")
    return make_vl_checkpoint(root / "ck", "qwen2_5_vl", corpus_text(),
                              min_pixels=IMAGE * IMAGE, max_pixels=IMAGE * IMAGE)


def _variant(src: Path, dest: Path, processor: dict | None = None,
             positions: int | None = None) -> Path:
    """``src`` with another image processor range (``processor``: keys to set, None values
    removed) or another max_position_embeddings (the weights do not depend on either)."""
    shutil.copytree(src, dest)
    if processor is not None:
        pre = json.loads((dest / "preprocessor_config.json").read_text())
        for k, v in processor.items():
            if v is None:
                pre.pop(k, None)
            else:
                pre[k] = v
        (dest / "preprocessor_config.json").write_text(json.dumps(pre))
    if positions is not None:
        cfg = json.loads((dest / "config.json").read_text())
        cfg["text_config"]["max_position_embeddings"] = positions
        (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _one_line_refusal(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_the_processors_only_size_is_the_projects(only_112, tmp_path):
    f = tmp_path / "vl.qstudio"
    r = studio("new", f, "--checkpoint", only_112)
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    # 112 px, not 448: what transformers' processor makes of any picture (16 image tokens)
    assert p.export["image_size"] == 112
    assert (p.export["prompt_length"], p.export["context_length"]) == (50, 306)
    assert "112 px a side (export.image_size) -> 16 image tokens" in r.stdout
    assert ("112–112 px a side (preprocessor_config.json size.shortest_edge / "
            "size.longest_edge: min_pixels 12,544, max_pixels 12,544") in r.stdout
    assert "of 512 (config.json's max_position_embeddings)" in r.stdout
    info = studio("info", f)
    assert info.returncode == 0 and "-> 16 image tokens" in info.stdout


@pytest.mark.slow  # runs studio new and an export check in subprocesses (10–25 s)
def test_an_image_size_the_processor_does_not_give_is_refused(only_112, tmp_path):
    line = _one_line_refusal(studio("new", tmp_path / "a.qstudio", "--checkpoint", only_112,
                                    "--image-size", 448))
    assert line == ("error: --image-size 448 is outside the checkpoint's image processor, "
                    "which gives 112–112 px a side (preprocessor_config.json size.shortest_edge "
                    "/ size.longest_edge: min_pixels 12,544, max_pixels 12,544; multiples of "
                    "28 px): give --image-size from 112 to 112, a multiple of 28"), line
    assert not (tmp_path / "a.qstudio").exists() and not (tmp_path / "a-image.png").exists()
    line = _one_line_refusal(studio("new", tmp_path / "b.qstudio", "--checkpoint", only_112,
                                    "--image-size", 100))
    assert "--image-size 100 is not a multiple of 28 pixels a side" in line
    # the export of a project file edited past the range: refused before the model loads
    from studio.engine.llm_export import export_llm

    with pytest.raises(StudioError, match="export.image_size 224 is outside the checkpoint's "
                                          "image processor, which gives 112–112 px"):
        export_llm(only_112, tmp_path / "e", 64, 128, image_size=224)


@pytest.mark.slow  # runs studio new and an export check in subprocesses (10–25 s)
def test_the_context_stays_within_max_position_embeddings(only_112, tmp_path):
    # transformers' default range (56-980 px): 448 px, 256 image tokens; the 546 positions
    # a prompt and an answer would take are more than the model's 512
    wide = _variant(only_112, tmp_path / "wide", {"size": None, "min_pixels": None,
                                                  "max_pixels": None})
    f = tmp_path / "wide.qstudio"
    r = studio("new", f, "--checkpoint", wide)
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    assert p.export["image_size"] == 448 and p.export["context_length"] == 512
    assert p.export["prompt_length"] == 256 + 2 + 32
    assert "56–980 px a side (transformers' defaults: min_pixels 3,136" in r.stdout
    # 200 positions: the largest image that leaves room for 32 tokens of text and as many
    # for an answer (308 px, 121 tokens); given, an image that fits at all is taken
    short = _variant(wide, tmp_path / "short", positions=200)
    f = tmp_path / "short.qstudio"
    r = studio("new", f, "--checkpoint", short)
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    assert p.export["image_size"] == 308 and p.export["context_length"] == 200
    assert p.export["prompt_length"] == 121 + 2 + 32
    r = studio("new", tmp_path / "given.qstudio", "--checkpoint", short, "--image-size", 392)
    assert r.returncode == 0, r.stderr
    p = pf.load(tmp_path / "given.qstudio")
    assert (p.export["prompt_length"], p.export["context_length"]) == (199, 200)
    line = _one_line_refusal(studio("new", tmp_path / "c.qstudio", "--checkpoint", short,
                                    "--image-size", 448))
    assert line == ("error: one 448 px image is 256 tokens: with 2 around them, a text token "
                    "and an answer's, more than config.json's max_position_embeddings 200: give "
                    "--image-size 392 or less"), line
    tiny = _variant(only_112, tmp_path / "tiny", positions=16)
    line = _one_line_refusal(studio("new", tmp_path / "d.qstudio", "--checkpoint", tiny))
    assert "does not fit config.json's max_position_embeddings 16" in line


@pytest.mark.slow  # runs studio new and an export check in subprocesses (10–25 s)
def test_a_processor_range_that_holds_no_image_is_refused(only_112, tmp_path):
    odd = _variant(only_112, tmp_path / "odd", {"min_pixels": 100 * 100, "max_pixels": 100 * 100})
    line = _one_line_refusal(studio("new", tmp_path / "e.qstudio", "--checkpoint", odd))
    assert "min_pixels 10,000 and max_pixels 10,000 hold no square image of a multiple of 28 px" \
        in line
    upside = _variant(only_112, tmp_path / "upside", {"min_pixels": 200_000,
                                                      "max_pixels": 100_000})
    line = _one_line_refusal(studio("new", tmp_path / "f.qstudio", "--checkpoint", upside))
    assert "min_pixels 200,000 is more than max_pixels 100,000" in line


def test_the_first_pass_holds_what_a_chat_template_puts_before_the_image(only_112, tmp_path):
    """With Qwen2-VL's template the image comes after the system turn and the user's header:
    the prefill's first pass (the only one that takes an image) holds them too."""
    from studio.engine.chat_template import prompt_format
    from studio.engine.checkpoint_check import load_tokenizer
    from tests.engine.chat_checkpoints import QWEN2_VL

    ck = _variant(only_112, tmp_path / "chat")
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    cfg["chat_template"] = QWEN2_VL
    (ck / "tokenizer_config.json").write_text(json.dumps(cfg))
    frame = len(prompt_format(ck).ids(load_tokenizer(ck), "", image=True, vision=True)) - 1
    f = tmp_path / "chat.qstudio"
    r = studio("new", f, "--checkpoint", ck)
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    assert frame > 20 and p.export["prompt_length"] == 16 + frame + 32
    assert p.export["context_length"] == p.export["prompt_length"] + 256
    assert f"16 tokens, {frame} the chat template writes around them, 32 of text" in r.stdout
