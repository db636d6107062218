"""Model families through the studio as a user drives it: `studio new --checkpoint` (with the
checks), `studio --batch` export and a CPU run, against transformers' greedy generate."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from tests.cli.conftest import studio
from tests.engine.test_families import _hf_greedy, build_checkpoint

PROMPT = "import os\n\ndef read_file(path):"
NEW = 96


# Two families through the CLI (mixed sliding / full layers; a bfloat16 checkpoint): every
# family's numerics against transformers are checked at the engine level
# (tests/engine/test_families.py), the CLI path is the same for all.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma2", "llama3.2-bf16"])
def test_a_family_goes_from_studio_new_to_a_cpu_run_that_matches_transformers(tmp_path, name):
    # seed 1: a random model whose greedy text does not reach EOS within NEW tokens
    ckpt = build_checkpoint(name, tmp_path / "ckpt", seed=1)
    proj = tmp_path / "fam.qstudio"
    r = studio("new", proj, "--checkpoint", ckpt)
    assert r.returncode == 0, r.stderr
    text = proj.read_text()
    text = re.sub(r"prompt_length = \d+", "prompt_length = 16", text)
    text = re.sub(r"context_length = \d+", "context_length = 128", text)
    text = re.sub(r'prompt = ".*"', lambda _m: "prompt = " + json.dumps(PROMPT), text)
    text = re.sub(r"max_new_tokens = \d+", f"max_new_tokens = {NEW}", text)
    text = re.sub(r"devices = \[[^\]]*\]", 'devices = ["cpu"]', text, flags=re.S)
    proj.write_text(text)
    r = studio("--batch", proj, "--stages", "run", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    con = sqlite3.connect(proj.with_suffix(".studio") / "runs.sqlite")
    rows = dict(con.execute("SELECT stage, result FROM jobs WHERE state='succeeded'"))
    con.close()
    export, run = json.loads(rows["export"]), json.loads(rows["run"])
    assert export["spec"]["export_check"]["positions"] == 128  # the whole context checked
    metrics = {m["name"]: m for m in json.loads(r.stdout)["metrics"]}
    assert metrics["export_top1_agreement"]["value"] == 1.0
    assert metrics["export_top1_agreement"]["source"] == "measured"
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(PROMPT).ids
    want = _hf_greedy(ckpt, ids, NEW)  # transformers generate(do_sample=False)
    got = run["tokens"]
    assert len(got) == NEW >= 90  # past the 32-token window of mistral / phi3 / gemma2
    assert got == want
