"""Deployable bundles: build the Genie bundle of a project for one target chip (the
``bundle`` stage: Genie-ready graph, config, tokenizer, manifest, checked by Genie on the HTP
simulator) and copy it where the user wants it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_copytree
from studio.core.project import Project


def build_bundle(project: Project, target: str | None = None,
                 out: Path | None = None) -> dict[str, Any]:
    """Run the bundle stage for ``target`` (default: the first target; the store serves what
    it holds) and copy the bundle to ``out`` (default: the project folder's
    ``bundles/<chip>``). Returns the stage's result with ``folder``."""
    from studio.core.catalog import get_chip
    from studio.services.generate import _run_stages
    from studio.services.history import current_keys

    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    chip = get_chip(target or project.targets[0]).key
    if chip not in project.targets:
        raise StudioError(f"{chip} is not a target of this project: add it to targets first")
    p = project.copy()
    p.targets = [chip]
    _run_stages(p, ["bundle"], "the Genie bundle")
    key = current_keys(p, ["bundle"]).get(f"bundle[{chip}]")
    art = ArtifactStore(p.folder / "artifacts").get(key) if key else None
    if art is None:
        raise StudioError(f"the bundle stage left no result: see studio --batch {p.path} "
                          "--stages bundle")
    result = json.loads((art.path / "result.json").read_text())
    dest = Path(out) if out else p.folder / "bundles" / chip
    atomic_copytree(art.path / "bundle", dest)
    return {**result, "folder": str(dest)}
