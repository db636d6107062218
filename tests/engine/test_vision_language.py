"""Vision-language models (Qwen2-VL, Qwen2.5-VL) on small random checkpoints built here: the
vision encoder's graph and the language model's graphs against transformers, an image
prompt's greedy tokens against transformers' generate(), the host's image preprocessing and
multimodal positions against transformers' own, and the checkpoint checks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from studio.core.errors import StudioError
from tests.engine.vl_checkpoints import IMAGE, make_vl_checkpoint

P, C = 32, 128
NEW = 80  # greedy tokens compared with transformers
KINDS = ("qwen2_vl", "qwen2_5_vl")


@pytest.fixture(scope="module", params=KINDS)
def vl(request, tmp_path_factory, corpus):
    """(kind, checkpoint, export folder, graph.json) of one family."""
    from studio.engine.llm_export import export_llm

    root = tmp_path_factory.mktemp(request.param)
    ck = make_vl_checkpoint(root / "ck", request.param, corpus)
    spec = export_llm(ck, root / "export", P, C, image_size=IMAGE)
    return request.param, ck, root / "export", spec


def test_the_export_matches_transformers_on_text_and_on_an_image_prompt(vl):
    kind, _ck, out, spec = vl
    assert spec["model_type"] == kind
    assert (out / "vision.onnx").is_file()
    text = spec["export_check"]
    assert text["positions"] == C and text["first_bad_position"] is None
    img = spec["vision"]["export_check"]
    assert img["positions"] == C and img["first_bad_position"] is None
    assert img["encoder_ok"] and img["encoder_cosine"] > 0.99999
    assert img["top1_agreement"] == 1.0
    # the encoder holds 16 image tokens (112 x 112 px); it is checked on that square and on
    # a picture that is not square (84 x 112 px: 4 rows of 3 tokens), whose prompt is
    # checked too: 12 image tokens take 4 positions, later tokens are 8 behind their slot
    assert spec["vision"]["image_tokens"] == 16
    assert img["images"] == ["112 x 112 px", "84 x 112 px"]
    assert img["prompt_image_tokens"] == 12 and img["rope_offset"] == -8
    ins = [i["name"] for i in spec["graphs"]["prefill"]["inputs"]]
    assert "image_embeds" in ins
    pos = next(i for i in spec["graphs"]["prefill"]["inputs"] if i["name"] == "position_ids")
    assert pos["shape"] == [3, 1, P]
    assert "image_embeds" not in [i["name"] for i in spec["graphs"]["decode"]["inputs"]]


def test_greedy_tokens_after_an_image_equal_transformers_generate(vl):
    import torch
    from tokenizers import Tokenizer

    from studio.engine import vision, vision_input
    from studio.engine.checkpoint_load import load_causal_lm
    from studio.engine.llm_runtime import cpu_generator

    _kind, ck, out, spec = vl
    vs = vision_input.vision_spec(spec)
    tok = Tokenizer.from_file(str(ck / "tokenizer.json"))
    patches = vision_input.image_patches(vision_input.calibration_images(3, IMAGE, seed=3)[2], vs)
    rows = vision.encode(vision.encoder_session(out), patches, vs)
    ids = vision_input.image_prompt(vs, tok.encode("Describe:").ids, tok.encode(" the picture\n").ids)
    gen = cpu_generator(out, spec)
    gen.set_image(rows)
    got = gen.generate(ids, NEW, eos_id=None)["tokens"]
    full = load_causal_lm(ck)
    x = torch.tensor([ids])
    want = full.generate(input_ids=x, attention_mask=torch.ones_like(x),
                         pixel_values=torch.from_numpy(patches.pixels),
                         image_grid_thw=torch.tensor([[1, vs.grid, vs.grid]]),
                         mm_token_type_ids=(x == vs.image_token_id).int(),
                         max_new_tokens=NEW, do_sample=False)[0, len(ids):].tolist()
    assert len(got) == NEW and got == want
    # the same prompt without its image would say something else: the image is used
    gen.set_image(np.zeros_like(rows))
    assert gen.generate(ids, 8, eos_id=None)["tokens"] != got[:8]


def test_host_preprocessing_and_positions_equal_transformers(vl, tmp_path):
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor

    from studio.engine import vision_input
    from studio.engine.checkpoint_load import load_causal_lm

    _kind, ck, _out, spec = vl
    vs = vision_input.vision_spec(spec)
    img = (vision_input.calibration_images(1, IMAGE, seed=5)[0] * 255).round().astype(np.uint8)
    path = tmp_path / "im.png"
    Image.fromarray(img.transpose(1, 2, 0)).save(path)
    ours = vision_input.pixel_values(vision_input.load_image(path, vs), vs)
    proc = AutoImageProcessor.from_pretrained(str(ck))
    theirs = proc(images=Image.open(path), return_tensors="np")
    assert theirs["image_grid_thw"].tolist() == [[1, vs.grid, vs.grid]]
    np.testing.assert_array_equal(ours, theirs["pixel_values"])
    # a larger picture is resized within the encoder's pixels, its aspect kept, as the
    # processor resizes it (the checkpoint's processor gives up to 224 x 224 px; this
    # export's encoder 112 x 112)
    Image.fromarray(np.tile(img.transpose(1, 2, 0), (2, 3, 1))).save(tmp_path / "big.png")
    big = vision_input.image_patches(vision_input.load_image(tmp_path / "big.png", vs), vs)
    assert (big.grid_h, big.grid_w) == (6, 8)
    theirs = proc(images=Image.open(tmp_path / "big.png"), return_tensors="np",
                  size={"shortest_edge": IMAGE * IMAGE, "longest_edge": IMAGE * IMAGE})
    assert theirs["image_grid_thw"].tolist() == [[1, 6, 8]]
    np.testing.assert_array_equal(big.pixels, theirs["pixel_values"])
    # transparency is composited onto white, as the processor's convert_to_rgb does
    alpha = (np.arange(IMAGE * IMAGE) % 256).reshape(IMAGE, IMAGE, 1).astype(np.uint8)
    Image.fromarray(np.concatenate([img.transpose(1, 2, 0), alpha], -1), "RGBA").save(
        tmp_path / "alpha.png")
    theirs = proc(images=Image.open(tmp_path / "alpha.png"), return_tensors="np")
    np.testing.assert_array_equal(vision_input.pixel_values(vision_input.load_image(
        tmp_path / "alpha.png", vs), vs), theirs["pixel_values"])

    full = load_causal_lm(ck)
    ids = vision_input.image_prompt(vs, [10, 11, 12], [13, 14])
    x = torch.tensor([ids])
    want, delta = full.model.get_rope_index(
        x, mm_token_type_ids=(x == vs.image_token_id).int(),
        image_grid_thw=torch.tensor([[1, vs.grid, vs.grid]]))
    pos, d = vision_input.mrope_positions(ids, vs)
    assert pos.tolist() == want[:, 0].tolist() and d == int(delta[0, 0])
    # an image that is not square: 3 rows of 2 tokens, then 2 rows of 4 (rows < columns)
    for gh, gw in ((3, 2), (2, 4)):
        ids = vision_input.image_prompt(vs, [10, 11], [13, 14, 15], gh * gw)
        x = torch.tensor([ids])
        want, delta = full.model.get_rope_index(
            x, mm_token_type_ids=(x == vs.image_token_id).int(),
            image_grid_thw=torch.tensor([[1, 2 * gh, 2 * gw]]))
        pos, d = vision_input.mrope_positions(ids, vs, (gh, gw))
        assert pos.tolist() == want[:, 0].tolist() and d == int(delta[0, 0])


def test_bad_images_and_prompts_get_one_line(vl, tmp_path):
    from studio.engine import vision, vision_input
    from studio.engine.llm_runtime import cpu_generator

    _kind, _ck, out, spec = vl
    vs = vision_input.vision_spec(spec)
    (tmp_path / "x.png").write_text("not an image")
    with pytest.raises(StudioError, match="not an image this studio can read"):
        vision_input.load_image(tmp_path / "x.png", vs)
    with pytest.raises(StudioError, match="no image at"):
        vision_input.load_image(tmp_path / "missing.png", vs)
    gen = cpu_generator(out, spec)
    ids = vision_input.image_prompt(vs, [10], [11])
    with pytest.raises(StudioError, match="no image was given"):
        gen.prefill(ids)
    with pytest.raises(StudioError, match=r"image rows are \[3, 64\]"):
        gen.set_image(np.zeros((3, 64), np.float32))
    with pytest.raises(StudioError, match=r"image rows are \[20, 64\], the model takes "
                                          r"\[20, 64\] for a 4 x 5 image \(at most 16 rows\)"):
        gen.set_image(np.zeros((20, 64), np.float32), (4, 5))
    with pytest.raises(StudioError, match="more than the encoder's 16"):
        vision_input.image_patches(np.zeros((3, 56, 280), np.float32), vs)
    with pytest.raises(StudioError, match="image tokens in a row"):
        vision_input.mrope_positions([10, vs.image_token_id, 11], vs)
    # only the prefill graph takes an image: one past its first pass (a chat template's text
    # before it) is refused in one line, not split
    late = [10] * 20 + vision_input.image_prompt(vs, [], [11])
    with pytest.raises(StudioError, match=f"the image's tokens end at token {20 + 1 + vs.tokens} "
                                          f"of the prompt, but the prefill graph takes {P}"):
        gen.prefill_prompt(late)
    text_spec = {k: v for k, v in spec.items() if k != "vision"}
    with pytest.raises(StudioError, match="this model takes no image: it is a text model"):
        vision.image_prompt_ids(text_spec, [10], tmp_path / "x.png", None, gen)


def test_checkpoint_checks_name_the_vision_parts(tmp_path, corpus):
    from studio.engine import checkpoint_check, hf_import
    from studio.engine.llm_export import export_llm

    ck = make_vl_checkpoint(tmp_path / "ck", "qwen2_5_vl", corpus)
    info = hf_import.open_checkpoint(ck)
    assert info.family == "qwen2_5_vl" and info.num_layers == 2 and info.hidden_size == 64
    assert any(lay.kind == "vision" for lay in info.layers)
    assert checkpoint_check.check_checkpoint(ck)["architecture"] == (
        "Qwen2_5_VLForConditionalGeneration")

    no_proc = tmp_path / "no-proc"
    shutil.copytree(ck, no_proc)
    (no_proc / "preprocessor_config.json").unlink()
    with pytest.raises(StudioError, match="no preprocessor_config.json"):
        checkpoint_check.check_checkpoint(no_proc)

    bad_tok = tmp_path / "bad-tok"
    shutil.copytree(ck, bad_tok)
    cfg = json.loads((bad_tok / "config.json").read_text())
    cfg["image_token_id"] = 7
    (bad_tok / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(StudioError, match=r"<\|image_pad\|> is id 4 but config.json's "
                                          "image_token_id is 7"):
        checkpoint_check.check_checkpoint(bad_tok)

    with pytest.raises(StudioError, match="multiple of 28 pixels"):
        export_llm(ck, tmp_path / "e1", P, C, image_size=100)
    with pytest.raises(StudioError, match="raise export.prompt_length to at least 66"):
        export_llm(ck, tmp_path / "e2", P, C, image_size=224)


def test_a_large_tower_keeps_its_weights_beside_the_graph(vl, tmp_path, monkeypatch):
    """Past EXTERNAL_ABOVE bytes (Qwen2.5-VL-3B's tower is 2.7 GB, over one ONNX file's 2 GB)
    the encoder's weights go to vision.onnx.data; the graph computes the same rows."""
    from studio.engine import vision, vision_input
    from studio.engine.checkpoint_load import load_causal_lm
    from studio.engine.llm_export import OPSET

    _kind, ck, out, spec = vl
    vs = vision_input.vision_spec(spec)
    monkeypatch.setattr(vision, "EXTERNAL_ABOVE", 1000)
    got = vision.export_vision(load_causal_lm(ck).model.visual, vs, tmp_path / "vision.onnx",
                               OPSET)
    assert got["external_data"] and (tmp_path / "vision.onnx.data").is_file()
    assert (tmp_path / "vision.onnx").stat().st_size < 100_000
    px = vision_input.image_patches(vision_input.calibration_images(1, IMAGE, seed=4)[0], vs)
    a = vision.encode(vision.encoder_session(out), px, vs)
    b = vision.encode(vision.encoder_session(tmp_path), px, vs)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_encoder_has_a_recipe_of_its_own(vl, tmp_path):
    """The tower's Linear layers are MatMuls over [in, out] weights under their checkpoint
    names (as the language model's), so the encoder's own scheme and per-layer precisions
    apply: a W8A8 project's encoder at W8A16 with the merger's first projection at 4 bits,
    checked against FP32."""
    import onnx

    from studio.engine import vision, vision_input
    from studio.engine.quant_recipe import normalize_recipe

    _kind, _ck, out, _spec = vl
    m = onnx.load(str(out / "vision.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    assert "Gemm" not in ops and ops.count("MatMul") >= 10
    recipe = normalize_recipe({"scheme": "W8A8", "vision_scheme": "W8A16",
                               "vision_overrides": {"visual.merger.mlp.0.weight": "INT4"}})
    images = vision_input.calibration_images(3, IMAGE)
    info = vision.quantize_vision(out, tmp_path, recipe, images, images[:1])
    assert info["scheme"] == "W8A16"
    assert info["matmul_precisions"].get("16x4w") == 1, info["matmul_precisions"]
    assert info["check"]["encoder_cosine_min"] > 0.9


def test_a_vision_scheme_of_the_other_kind_is_refused_in_one_line(tmp_path):
    from studio.core import project as pf

    f = tmp_path / "p.qstudio"
    f.write_text('schema_version = 1\nname = "p"\n[model]\nsource = "sample:tiny-coder"\n'
                 '[quantization]\nscheme = "W8A16"\nvision_scheme = "FP16"\n')
    with pytest.raises(StudioError, match="the vision encoder runs float .FP16. exactly when"):
        pf.load(f)
