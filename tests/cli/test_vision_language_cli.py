"""A vision-language project as a user runs it: `studio new --checkpoint` on a small random
Qwen2.5-VL checkpoint (built here), its batch through export, quantize, compile, validate and
run with the picture `studio new` generated beside the project file, then `studio generate
--image` on the HTP simulator with the time to first token split into encoder and prefill;
bad images get one line and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.core import project as pf
from tests.cli.conftest import studio
from tests.engine.conftest import corpus_text
from tests.engine.vl_checkpoints import IMAGE, make_vl_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vl_project(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("vl-cli")
    ck = make_vl_checkpoint(root / "ck", "qwen2_5_vl", corpus_text())
    f = root / "vl.qstudio"
    r = studio("new", f, "--checkpoint", ck, "--image-size", IMAGE)
    assert r.returncode == 0, r.stderr
    p = pf.load(f)
    made = dict(p.export)  # what studio new chose, before the test's budget below
    # the test's budget: a shorter cache, fewer calibration windows and held-out tokens
    p.export["context_length"] = 128
    p.quantization["calibration_samples"] = 3
    p.validation["heldout_tokens"] = 96
    p.validation["greedy_tokens"] = 4
    p.run["max_new_tokens"] = 4
    pf.save(p, f)
    r = studio("--batch", f, "--stages", "export,quantize,compile,validate,run")
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: a gate of the random model failed
    return f, r.stderr, made


def test_new_gives_a_vision_language_project_its_image_and_lengths(vl_project):
    f, _, made = vl_project
    p = pf.load(f)
    assert made["image_size"] == IMAGE
    # 16 image tokens + 2 around them + 32 of text; an answer's room after it
    assert made["prompt_length"] == 50 and made["context_length"] == 306
    assert (f.parent / p.run["image"]).is_file()
    assert p.run["prompt"] == "Describe this image."


def test_the_batch_runs_every_stage_with_the_image(vl_project):
    _f, log, _ = vl_project
    assert "vision encoder 112 px -> 16 image tokens, an image prompt matches too" in log
    assert "the vision encoder's binary beside them" in log
    assert "with an image: encoder cosine" in log
    assert "min_output_cosine" in log  # the encoder's rows, gated
    sim = next(line for line in log.splitlines() if "ok run[htp-sim" in line)
    assert "image: encoder" in sim and "to the first token" in sim


def test_generate_with_an_image_on_the_simulator_splits_the_first_token(vl_project):
    f, _, _ = vl_project
    image = f.parent / pf.load(f).run["image"]
    r = studio("generate", f, "--prompt", "What is it?", "--image", image, "--device",
               "htp-sim", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    img = out["image"]
    assert img["image_tokens"] == 16 and img["encoder_ms"] > 0 and img["prefill_ms"] > 0
    assert out["time_to_first_token_ms"] == pytest.approx(img["encoder_ms"] + img["prefill_ms"])
    assert out["source"] == "simulated" and len(out["tokens"]) == 8
    r = studio("generate", f, "--prompt", "What is it?", "--image", image, "--device",
               "htp-sim", "--max-new-tokens", "4")
    assert r.returncode == 0
    assert "time to first token = vision encoder" in r.stderr


def test_an_agent_runs_the_image_prompt_as_the_local_devices_do(vl_project, tmp_path):
    """The agent receives the image's patches with the prompt, runs its own encoder (its
    CPU's FP32 export, its HTP simulator's compiled context) and gives the local devices'
    tokens; the encoder's time comes back with them."""
    import os

    from tests.cli.test_agent import Agent

    f, _, _ = vl_project
    image = f.parent / pf.load(f).run["image"]
    agent = Agent(tmp_path / "agent")
    try:
        env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(tmp_path / "cfg"))
        r = studio("devices", "add", "lab", "--url", agent.url, "--token-file",
                   agent.token_file, env=env)
        assert r.returncode == 0, r.stderr
        args = ["generate", f, "--prompt", "What is it?", "--image", image,
                "--max-new-tokens", "6", "--json"]
        chip = pf.load(f).targets[0]
        # the agent's HTP simulator: its compiled encoder, uploaded with the binaries (its
        # CPU runs the export's encoder by the same job code)
        for local_dev, remote_dev in (("htp-sim", f"agent:lab@htp-sim:{chip}"),):
            local = json.loads(studio(*args, "--device", local_dev).stdout)
            r = studio(*args, "--device", remote_dev, env=env)
            assert r.returncode == 0, r.stderr[-2000:]
            remote = json.loads(r.stdout)
            assert remote["tokens"] == local["tokens"], remote_dev
            assert remote["image"]["encoder_ms"] > 0
            assert remote["source"] == local["source"]
    finally:
        agent.stop()


def test_bad_images_get_one_line(vl_project, tmp_path):
    f, _, _ = vl_project
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG not really")
    r = studio("generate", f, "--prompt", "x", "--image", bad, "--max-new-tokens", "2")
    assert r.returncode == 2 and "is not an image this studio can read" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = studio("generate", f, "--prompt", "x", "--image", tmp_path / "none.png")
    assert r.returncode == 2 and "no image at" in r.stderr
