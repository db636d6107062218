"""What every artifact key hashes of the studio itself: the versions of the tools the stages
run on and a digest of the stage code (a leaf: it imports nothing of the services)."""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from studio.core.fsutil import stat_key

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
    files.sort()
    # read again only when a file was added, removed or written (its time or size changed)
    seen = tuple(map(stat_key, files))
    if _DIGEST.get("seen") != seen:
        h = hashlib.sha256()
        for f in files:
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
        _DIGEST.update(seen=seen, digest=h.hexdigest()[:16])
    return _DIGEST["digest"]


def tool_versions() -> dict[str, str]:
    """``{"qstudio-code": digest, package: version | "missing"}``."""
    # the installed packages, read again when a folder of the import path changed (an
    # install or removal adds or deletes a .dist-info folder there)
    seen = tuple((entry, _mtime(entry)) for entry in sys.path)
    if _VERSIONS.get("seen") != seen:
        got = {}
        for pkg in PACKAGES:
            try:
                got[pkg] = version(pkg)
            except PackageNotFoundError:
                got[pkg] = "missing"
        _VERSIONS.update(seen=seen, versions=got)
    return {"qstudio-code": code_digest(), **_VERSIONS["versions"]}


def _mtime(entry: str) -> int:
    try:
        return os.stat(entry or ".").st_mtime_ns
    except OSError:
        return -1


#: what the last call read, and when it is stale (a key is asked for thousands of times a run)
_DIGEST: dict = {}
_VERSIONS: dict = {}
