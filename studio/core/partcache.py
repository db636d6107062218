"""Finished parts, kept by what produced them: a re-run redoes only the parts that changed.

A stage that works part by part (quantize, compile of a model in parts) is one job with one
artifact key, so any change of its settings (one layer's precision) gives a new key. Each
of its parts, though, depends only on its own inputs: its graphs' content, the calibration
inputs it is handed, the recipe as it applies to *its* layers, the target. The stage hashes
those into a *part key* and keeps the finished part under it in ``<store>/parts/``; the next
run with another artifact key finds the parts whose key did not change and takes them
instead of computing them again (raising one layer to 8 bits re-quantizes and re-compiles
only the part that holds it).

The files are hard links to the stored artifacts' (no second copy on disk; every writer
replaces files, never rewrites one in place). An entry none of whose files is linked from
anywhere else any more (its artifacts were removed) is pruned when the store opens.

Pure Python: no heavy import.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from studio.core.fsutil import atomic_write_json, link_or_copy, sha256_file, sha256_json

#: the row an entry keeps beside its files (what the stage records for the part)
ROW = ".part-row.json"


def files_digest(folder: Path, names: list[str] | None = None) -> str:
    """The digest of a part folder's files (``names``, or every file but hidden ones)."""
    folder = Path(folder)
    chosen = names if names is not None else sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith("."))
    return sha256_json({n: sha256_file(folder / n) for n in chosen if (folder / n).is_file()})



class PartCache:
    """The finished parts of part-by-part stages, by part key (``None`` root: no cache)."""

    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None

    @staticmethod
    def key(stage: str, **facts: Any) -> str:
        """The part key: everything the part's output depends on, as JSON."""
        return sha256_json({"stage": stage, **facts})

    def _entry(self, key: str) -> Path | None:
        return None if self.root is None else self.root / key[:2] / key

    def get(self, key: str, dst: Path) -> dict[str, Any] | None:
        """Put the kept part of ``key`` into ``dst`` (linked) and return its row; None when
        there is none (``dst`` is then untouched)."""
        entry = self._entry(key)
        if entry is None or not (entry / ROW).is_file():
            return None
        try:
            row = json.loads((entry / ROW).read_text())
            files = [p for p in sorted(entry.rglob("*")) if p.is_file() and p.name != ROW]
            if not all(f.stat().st_size == row["_sizes"].get(str(f.relative_to(entry)))
                       for f in files) or len(files) != len(row["_sizes"]):
                return None  # damaged: computed again (and stored again)
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        dst = Path(dst)
        if dst.exists():
            shutil.rmtree(dst)
        for f in files:
            link_or_copy(f, dst / f.relative_to(entry))
        row.pop("_sizes", None)
        return dict(row)

    def put(self, key: str, src: Path, row: dict[str, Any]) -> None:
        """Keep the finished part in ``src`` (its files, hidden ones left out) under ``key``
        with ``row``; a failure to keep it is not an error (the part is computed again)."""
        entry = self._entry(key)
        if entry is None or (entry / ROW).is_file():
            return
        src = Path(src)
        tmp = self.root / "tmp" / uuid.uuid4().hex  # type: ignore[operator]
        try:
            files = [p for p in sorted(src.rglob("*")) if p.is_file()
                     and not any(x.startswith(".") for x in p.relative_to(src).parts)]
            for f in files:
                link_or_copy(f, tmp / f.relative_to(src))
            atomic_write_json(tmp / ROW, {**row, "_sizes": {
                str(f.relative_to(src)): f.stat().st_size for f in files}})
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, entry)
        except OSError:
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def prune(self) -> int:
        """Remove entries whose files are linked from nowhere else (their artifacts are
        gone) and what an interrupted :meth:`put` left; returns how many went."""
        if self.root is None or not self.root.is_dir():
            return 0
        shutil.rmtree(self.root / "tmp", ignore_errors=True)
        n = 0
        for entry in self.root.glob("*/*"):
            if not entry.is_dir():
                continue
            try:
                files = [p for p in entry.rglob("*") if p.is_file() and p.name != ROW]
                alone = all(p.stat().st_nlink <= 1 for p in files)
            except OSError:
                alone = True
            if alone:
                shutil.rmtree(entry, ignore_errors=True)
                n += 1
        return n
