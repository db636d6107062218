"""What every artifact key hashes of the studio itself: the versions of the tools the stages
run on and a digest of the stage code (a leaf: it imports nothing of the services)."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

#: the packages whose versions go into every key
PACKAGES: tuple[str, ...] = ("qstudio", "torch", "transformers", "onnx", "onnxruntime",
                             "onnxruntime-qnn")
#: the core modules whose facts decide what a stage computes (the family table, the recipe's
#: rule of which layers get which precision, the names in graph.json)
CORE_INPUTS: tuple[str, ...] = ("core/families.py", "core/recipe.py", "core/graphspec.py")


def code_digest() -> str:
    """The studio's own stage code is an input too: editing it re-runs the stages. Covers
    every module of the engine and the worker and the core modules of ``CORE_INPUTS``
    (sorted relative paths and contents)."""
    root = Path(__file__).resolve().parents[1]
    files = [root / c for c in CORE_INPUTS]
    for folder in ("engine", "worker"):
        files += (root / folder).rglob("*.py")
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def tool_versions() -> dict[str, str]:
    """``{"qstudio-code": digest, package: version | "missing"}``."""
    out = {"qstudio-code": code_digest()}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "missing"
    return out
