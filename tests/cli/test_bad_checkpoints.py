"""Bad checkpoints are refused in seconds, at `studio new` and at `studio --batch`, with one
line and exit 2, and nothing is written."""

from __future__ import annotations

import json
import shutil

import pytest

from studio.core.samples import sample_path
from tests.cli.conftest import SMALL, default_target, studio


def _copy(tmp_path, name="ckpt"):
    d = tmp_path / name
    shutil.copytree(sample_path("tiny-coder"), d)
    return d


def _no_tokenizer(d):
    (d / "tokenizer.json").unlink()


def _corrupt_tokenizer(d):
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')


def _big_vocab_tokenizer(d):
    cfg = json.loads((d / "config.json").read_text())
    # shrink the model's vocabulary below the tokenizer's 2048 (weights to match)
    from safetensors.numpy import load_file, save_file

    w = load_file(str(d / "model.safetensors"))
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"][:1024]
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg["vocab_size"] = 1024
    (d / "config.json").write_text(json.dumps(cfg))


def _truncated(d):
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 4096])


def _shape_mismatch(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2
    (d / "config.json").write_text(json.dumps(cfg))


CASES = [
    (_no_tokenizer, "no tokenizer.json"),
    (_corrupt_tokenizer, "tokenizer.json cannot be loaded"),
    (_big_vocab_tokenizer, "tokenizer belongs to another model"),
    (_truncated, "truncated"),
    (_shape_mismatch, "do not belong to this config.json"),
]


@pytest.mark.parametrize(("breaker", "message"), [
    # loading the mismatched weights and running the batch's preflight: the slow tier
    pytest.param(*c, id=c[0].__name__[1:],
                 marks=[pytest.mark.slow] if c[0] is _shape_mismatch else [])
    for c in CASES])
def test_a_bad_checkpoint_is_refused_at_new_and_at_batch(tmp_path, breaker, message):
    ckpt = _copy(tmp_path)
    breaker(ckpt)
    proj = tmp_path / "p" / "bad.qstudio"
    proj.parent.mkdir()
    r = studio("new", proj, "--checkpoint", ckpt)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], r.stderr
    assert list(proj.parent.iterdir()) == []  # nothing written: no file, no project folder
    # the same checkpoint named in a hand-written project: refused before any stage runs
    proj.write_text(SMALL.format(target=default_target()).replace(
        'source = "sample:tiny-coder"', f'source = "{ckpt}"'))
    r = studio("--batch", proj, "--quiet")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr.strip().splitlines()[-1]
    assert not proj.with_suffix(".studio").exists()  # no project folder left behind


@pytest.mark.slow
def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    draft = _copy(tmp_path, "draft")
    tok = json.loads((draft / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = next(iter(vocab)), list(vocab)[1]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids: another vocabulary
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    proj = tmp_path / "d.qstudio"
    proj.write_text(SMALL.format(target=default_target()).replace(
        'source = "sample:tiny-coder"', f'source = "sample:tiny-coder"\ndraft = "{draft}"'))
    r = studio("--batch", proj, "--quiet", "--stages", "export")
    assert r.returncode == 2, r.stderr
    assert "another vocabulary" in r.stderr.strip().splitlines()[-1]
    assert not proj.with_suffix(".studio").exists()


@pytest.mark.slow
def test_a_draft_that_does_not_exist_is_refused(tmp_path):
    proj = tmp_path / "d.qstudio"
    proj.write_text(SMALL.format(target=default_target()).replace(
        'source = "sample:tiny-coder"', 'source = "sample:tiny-coder"\ndraft = "nowhere"'))
    r = studio("--batch", proj, "--quiet", "--stages", "export")
    assert r.returncode == 2, r.stderr
    assert "'nowhere' not found" in r.stderr
