"""Chat templates as a user meets them: `studio new --checkpoint` on a small random Qwen2
whose tokenizer ships Qwen2.5-Instruct's template says where the template comes from (and
`studio info` too); `studio generate` puts the prompt through it — the ids transformers'
apply_chat_template gives, and transformers' greedy tokens after them — and `--raw` (or
model.chat_template = "none") gives the prompt as written; the Genie bundle ships the
template with the manifest entry an app needs, and Genie reads the templated prompt as the
studio does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.core import project as pf
from tests.cli.conftest import studio
from tests.engine.chat_checkpoints import make_chat_checkpoint
from tests.engine.conftest import corpus_text

pytestmark = pytest.mark.slow

PROMPT = "def read_config(self, path):"
NEW = 8


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """(project file, checkpoint, `studio new`'s result): exported."""
    root = tmp_path_factory.mktemp("chat-cli")
    ck = make_chat_checkpoint(root / "ck", corpus_text())
    f = root / "chat.qstudio"
    new = studio("new", f, "--checkpoint", ck)
    assert new.returncode == 0, new.stderr
    p = pf.load(f)
    p.quantization["calibration_samples"] = 2
    p.validation["heldout_tokens"] = 96
    p.validation["greedy_tokens"] = 4
    p.run["max_new_tokens"] = 4
    p.bundle["prompts"] = 1
    p.bundle["new_tokens"] = 8
    pf.save(p, f)
    r = studio("--batch", f, "--stages", "export")
    assert r.returncode == 0, r.stderr[-3000:]
    return f, ck, new


def _gen(f: Path, *args: str) -> dict:
    r = studio("generate", f, "--prompt", PROMPT, "--max-new-tokens", NEW, "--json", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_new_and_info_say_where_the_template_comes_from(chat):
    f, _ck, new = chat
    line = ("prompts   chat template: tokenizer_config.json's chat_template (1,226 characters, "
            "sha256 ")
    assert line in new.stdout and "applied (one user message" in new.stdout
    assert pf.load(f).model.chat_template == "checkpoint"
    info = studio("info", f)
    assert info.returncode == 0 and line in info.stdout
    data = json.loads(studio("info", f, "--json").stdout)
    assert data["model"]["chat_template"] == "checkpoint"
    assert data["prompt_format"].startswith("chat template: tokenizer_config.json's")


def test_generate_applies_the_template_as_transformers_does(chat):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    f, ck, _ = chat
    hf = AutoTokenizer.from_pretrained(str(ck))
    messages = [{"role": "user", "content": PROMPT}]
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    out = _gen(f)
    assert out["prompt_format"]["applied"] and out["prompt_tokens"] == len(ids)
    assert out["prompt_text"] == hf.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=False)
    model = AutoModelForCausalLM.from_pretrained(str(ck))
    x = torch.tensor([ids])
    want = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,
                          do_sample=False)[0, len(ids):].tolist()
    assert out["tokens"][:len(want)] == want  # transformers stops at its eos too

    raw = _gen(f, "--raw")
    assert not raw["prompt_format"]["applied"] and raw["prompt_text"] == PROMPT
    assert raw["prompt_tokens"] == len(hf(PROMPT).input_ids)
    assert raw["tokens"] != out["tokens"]
    # as a user reads it: the template's line on stderr, the prompt as the model read it
    r = studio("generate", f, "--prompt", PROMPT, "--max-new-tokens", 4)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(out["prompt_text"])
    assert r.stderr.splitlines()[0].startswith("chat template: tokenizer_config.json's")
    r = studio("generate", f, "--prompt", PROMPT, "--max-new-tokens", 4, "--raw")
    assert r.stdout.startswith(PROMPT) and "<|im_start|>" not in r.stdout
    assert r.stderr.splitlines()[0] == ("chat template skipped (--raw): the prompt goes in as "
                                        "written")
    # a prompt the template makes too long for the cache: one line, exit 2
    r = studio("generate", f, "--prompt", "x" * 60)  # 60 tokens as written, 134 in it
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "tokens (through the chat template) but the KV cache holds 128" in r.stderr
    # the project's setting turns it off (the export is the same: no stage runs again)
    p = pf.load(f)
    p.model["chat_template"] = "none"
    off = f.with_name("off.qstudio")
    pf.save(p, off)
    from tests.cli.conftest import share_store

    share_store(f, off, stages={"export"})
    got = _gen(off)
    assert got["tokens"] == raw["tokens"]
    assert got["prompt_format"]["note"].startswith("chat template off (model.chat_template")


def test_the_bundle_ships_the_template_and_genie_reads_it(chat, tmp_path):
    f, _ck, _ = chat
    out = tmp_path / "bundle"
    r = studio("bundle", f, "--out", out, "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: a gate of the random model
    res = json.loads(r.stdout)
    templated = [c for c in res["checks"] if c["prompt"].startswith("<|im_start|>system")]
    assert len(templated) == 1 and templated[0]["identical"], res["checks"]
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["chat_template"]
    text = (out / "chat_template.jinja").read_text()
    assert entry["file"] == "chat_template.jinja" and "chat_template.jinja" in manifest["files"]
    import hashlib

    assert entry["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert entry["from"] == "tokenizer_config.json's chat_template"
    before, after = entry["prompt-template"]
    assert templated[0]["prompt"] == before + pf.load(f).run["prompt"] + after
    assert "dialog config takes no prompt template" in entry["genie"]
    assert "`chat_template.jinja`" in (out / "README.md").read_text()
    # Genie from the bundle: the prompt through the bundle's template, or as written
    g = json.loads(studio("generate", f, "--prompt", PROMPT, "--runtime", "genie",
                          "--max-new-tokens", 4, "--json").stdout)
    assert g["prompt_text"] == before + PROMPT + after and g["prompt_format"]["applied"]
    g_raw = json.loads(studio("generate", f, "--prompt", PROMPT, "--runtime", "genie",
                              "--max-new-tokens", 4, "--raw", "--json").stdout)
    assert g_raw["prompt_text"] == PROMPT
