"""The parts a part-by-part stage finished, kept in its work folder across a kill.

A stage over a model in parts (export, quantize) writes each finished part's folder into its
work folder, then marks it: :data:`MARK` holds the part's row (what the stage's result says
of it), :data:`HANDOFF` what the next part starts from (arrays). The work folder of such a
stage is kept per artifact key (:meth:`studio.core.artifacts.ArtifactStore.new_workdir`), so
a re-run after a kill finds the marked parts, keeps them and does only the rest: a kill costs
at most the part in flight. Before the stage returns, :func:`unmark` removes the marks, so
the stored artifact holds only the graphs.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.artifacts import PART_DONE
from studio.core.fsutil import atomic_write_bytes, atomic_write_json
from studio.core.parts import Part

#: in a finished part's folder: its row (and the part it is, to match the plan)
MARK = PART_DONE
#: beside it: what the next part starts from
HANDOFF = ".part-handoff.npz"


def keep_finished(out_dir: Path, plan: list[Part],
                  keep: tuple[str, ...] = ()) -> dict[int, dict[str, Any]]:
    """Prepare ``out_dir`` (a kept work folder) for the ``plan``: the folders of finished
    parts of this plan stay, and the entries named in ``keep`` (the stage checks those
    itself); everything else an interrupted run left is removed. Returns the rows of the
    finished parts by index."""
    out_dir = Path(out_dir)
    names = {p.name: p for p in plan}
    done: dict[int, dict[str, Any]] = {}
    if not out_dir.is_dir():
        return done
    for entry in sorted(out_dir.iterdir()):
        if entry.name in keep:
            continue
        part = names.get(entry.name)
        row = _row(entry / MARK) if part is not None and entry.is_dir() else None
        if part is not None and row is not None and (row.get("start"), row.get("stop")) == (
                part.start, part.stop) and (entry / HANDOFF).is_file():
            done[part.index] = row
            continue
        _remove(entry)
    return done


def clear(out_dir: Path, keep: tuple[str, ...] = ()) -> None:
    """Empty ``out_dir`` (a kept work folder a whole-graph run takes as a fresh one), but
    for the entries named in ``keep``."""
    for entry in Path(out_dir).iterdir():
        if entry.name not in keep:
            _remove(entry)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _row(path: Path) -> dict[str, Any] | None:
    try:
        row = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) else None


def mark(folder: Path, row: dict[str, Any], handoff: dict[str, Any]) -> None:
    """Mark the part in ``folder`` finished: its ``handoff`` arrays, then its row (last: a
    part is finished once its row is there)."""
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v) for k, v in handoff.items()}
    np.savez(buf, **arrays)
    atomic_write_bytes(Path(folder) / HANDOFF, buf.getvalue())
    atomic_write_json(Path(folder) / MARK, row)


def handoff(folder: Path) -> dict[str, Any]:
    """The arrays :func:`mark` kept for the part in ``folder``."""
    with np.load(Path(folder) / HANDOFF) as data:
        return {k: data[k] for k in data.files}


def unmark(out_dir: Path) -> None:
    """Remove every mark and hand-off under ``out_dir`` (the stage is about to return)."""
    for name in (MARK, HANDOFF):
        for f in Path(out_dir).glob(f"*/{name}"):
            f.unlink(missing_ok=True)


def pack_windows(handed: list[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """Calibration hand-ons (per window: ``prefill`` and ``rows`` by position) as flat
    arrays for :func:`mark`."""
    out: dict[str, Any] = {}
    for j, w in enumerate(handed):
        if "prefill" in w:
            out[f"{prefix}{j}.prefill"] = w["prefill"]
        for pos, row in w.get("rows", {}).items():
            out[f"{prefix}{j}.row.{int(pos)}"] = row
    out[f"{prefix}count"] = len(handed)
    return out


def unpack_windows(arrays: dict[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """The inverse of :func:`pack_windows`."""
    n = int(arrays[f"{prefix}count"])
    handed: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in arrays.items():
        if not key.startswith(prefix) or key == f"{prefix}count":
            continue
        rest = key[len(prefix):]
        j, _, what = rest.partition(".")
        if not j.isdigit():
            continue
        w = handed[int(j)]
        if what == "prefill":
            w["prefill"] = value
        elif what.startswith("row."):
            w.setdefault("rows", {})[int(what[4:])] = value
    for w in handed:
        if "prefill" in w:
            w.setdefault("rows", {})
    return handed
