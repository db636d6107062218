"""Pruning by ablation for ``studio prune`` and the GUI: the ablation stage's ranked table
and its pruned checkpoint, copied out as a new model source with a project file for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_copytree, check_destination
from studio.core.project import Project
from studio.core.settings import check_value, spec_of
from studio.engine.hf_import import open_checkpoint
from studio.services.generate import stored_artifact


def ablation_result(project: Project, drop: int | None = None,
                    run: bool = True) -> tuple[dict[str, Any], Path] | None:
    """(the ablation table, the pruned checkpoint folder in the store) for ``project`` with
    ``drop`` blocks dropped (default its ``pruning.drop_blocks``); runs the ablation stage
    when the store does not hold it (``run``), else None."""
    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    if drop is not None:
        project = project.copy()
        project.pruning["drop_blocks"] = int(drop)
    check_drop(project)
    folder = stored_artifact(project, "ablation", "the ablation", run=run)
    if folder is None:
        return None

    return json.loads((folder / "ablation.json").read_text()), folder / "pruned"


def check_drop(project: Project) -> None:
    """``pruning.drop_blocks`` (or ``--drop``) against the model's blocks, before the
    ablation runs: at least one block must stay."""
    drop = project.pruning["drop_blocks"]
    check_value("pruning.drop_blocks", drop, spec_of("pruning.drop_blocks"))
    if project.model["kind"] != "causal-lm":
        raise StudioError(f"pruning drops the blocks of a causal LM, not of a "
                          f"{project.model['kind']} model")

    source = project.input_path(project.model["source"])
    blocks = open_checkpoint(source).num_layers
    if drop >= blocks:
        raise StudioError(f"pruning.drop_blocks = {drop}: the model has {blocks} blocks and at "
                          f"least one must stay (at most {blocks - 1})")


def check_prune_out(out: Path) -> None:
    """``--out``: a new (or empty) folder, and a path for its project file beside it."""
    if out.is_dir() and not out.is_symlink() and any(out.iterdir()):
        raise StudioError(f"{out} exists and is not empty: choose a new folder for the "
                          "pruned checkpoint")
    check_destination(out, folder=True, marker="")
    check_destination(out.with_suffix(".qstudio"))


def prune(project: Project, drop: int | None = None, out: Path | None = None) -> dict[str, Any]:
    """The ablation table; with ``out``, the pruned checkpoint copied to ``out`` and a
    project file ``out.qstudio`` that uses it as its model source (same recipe)."""
    if out is not None:  # before the ablation runs
        check_prune_out(out)
    got = ablation_result(project, drop)
    assert got is not None
    table, pruned = got
    result: dict[str, Any] = {"ablation": table, "source": "measured", "device": "host-cpu"}
    if out is None:
        return result
    check_prune_out(out)
    atomic_copytree(pruned, out)
    proj = project.copy()
    proj.name = f"{project.name}-pruned"
    proj.model["source"] = str(out)
    proj.model["draft"] = project.model.get("draft", "")
    for section in ("quantization", "validation"):  # text references relative to the old file
        for key, value in getattr(proj, section).items():
            if isinstance(value, str) and key.endswith("_text") and not value.startswith("sample:"):
                getattr(proj, section)[key] = str(project.input_path(value))
    if proj.model["draft"] and not proj.model["draft"].startswith("sample:"):
        proj.model["draft"] = str(project.input_path(proj.model["draft"]))
    pfile = out.with_suffix(".qstudio")
    projectfile.save(proj, pfile)
    result.update({"checkpoint": str(out), "project": str(pfile)})
    return result
