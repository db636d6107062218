"""`studio generate --image` equals transformers as users call it, token for token.

For each vision configuration — Qwen2.5-VL towers whose blocks all attend within windows,
all to the whole image, or both (the mixed one), and a Qwen2-VL tower: small random
checkpoints with Qwen2-VL-Instruct's chat template, built here — the project is made as a
user makes it (``studio new --checkpoint``, ``studio --batch --stages export``), and for
each source picture (square, wide, tall, larger than the image processor's max_pixels,
smaller than its min_pixels) and each prompt format (raw: the image, then the text; the
chat template) ``studio generate --image --json`` on the host CPU (the FP32 export, ONNX
Runtime) gives the greedy tokens transformers' processor steps and ``generate(do_sample=
False)`` give (``tests/engine/vl_reference.py``). The projects and transformers' models
are built once per configuration; the commands run through the command line's entry point
in this process (the commands' own code, without a Python start per case; the stages run in
the studio's worker process, as always)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from studio.core import project as pf
from tests.engine.vl_reference import (
    CONFIGS,
    FORMATS,
    PICTURES,
    PROMPT,
    Reference,
    chat_checkpoint,
    first_difference,
    save_pictures,
)

pytestmark = pytest.mark.slow

NEW = 12  # greedy tokens compared


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, Path]:
    return save_pictures(tmp_path_factory.mktemp("vl-pictures"))


@pytest.fixture(scope="module", params=list(CONFIGS))
def project(request, tmp_path_factory) -> tuple[Path, Reference]:
    """A project of one configuration as a user makes it (the image size `studio new` takes
    from the image processor: 224 px, its max_pixels), exported; and transformers on the
    same checkpoint."""
    root = tmp_path_factory.mktemp("vl-eq")
    ck = chat_checkpoint(root / "ck", request.param)
    f = root / "vl.qstudio"
    rc, _, err = studio("new", f, "--checkpoint", ck)
    assert rc == 0, err
    p = pf.load(f)
    assert p.export["image_size"] == 224
    # the test's budget: a cache with room for the answer only (the export checks it whole)
    p.export["context_length"] = p.export["prompt_length"] + 2 * NEW
    pf.save(p, f)
    rc, _, err = studio("--batch", f, "--stages", "export", "--quiet")
    assert rc == 0, err[-3000:]
    return f, Reference(ck)


def studio(*argv) -> tuple[int, str, str]:
    """``studio ARGV`` through the command line's entry point in this process: (exit code,
    stdout, stderr). A command that keeps stdout for itself (``generate`` points fd 1 at fd 2
    and writes through a duplicate of fd 1) finds a file there; fd 1 and ``sys.stdout`` are
    put back after."""
    from studio.cli.main import main

    sys.stdout.flush()
    kept_fd, kept_out = os.dup(1), sys.stdout
    err = io.StringIO()
    with tempfile.TemporaryFile() as out:
        try:
            os.dup2(out.fileno(), 1)
            sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8")
            with contextlib.redirect_stderr(err):
                rc = main([str(a) for a in argv])
            sys.stdout.close()  # flushed; the command's own duplicate where it made one
        finally:
            sys.stdout = kept_out
            os.dup2(kept_fd, 1)
            os.close(kept_fd)
        out.seek(0)
        return rc, out.read().decode("utf-8"), err.getvalue()


def generate(*argv) -> dict:
    """``studio generate ... --json``'s result."""
    rc, out, err = studio("generate", *argv, "--json")
    assert rc == 0, err[-2000:]
    return json.loads(out)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("picture", list(PICTURES))
def test_generate_with_an_image_equals_transformers(project, pictures, picture, fmt):
    f, ref = project
    want, facts = ref.generate(pictures[picture], fmt, NEW)
    got = generate(f, "--image", pictures[picture], "--prompt", PROMPT,
                   *(["--raw"] if fmt == "raw" else []), "--max-new-tokens", NEW,
                   "--device", "cpu")
    # the same prompt (the image's tokens where the processor puts them) and the same answer
    assert (got["image"]["image_tokens"], got["prompt_tokens"]) == (
        facts["image_tokens"], facts["prompt_tokens"])
    assert got["image"]["image_grid"] == [g // 2 for g in facts["grid"]]
    assert got["tokens"] == want, first_difference(got["tokens"], want)
