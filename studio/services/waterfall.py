"""The optimization waterfall for ``studio waterfall`` the GUI and the report: the steps the
waterfall stage measured on the host CPU, beside the same steps estimated for a chip by the
performance model (each figure with its source)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.project import Project
from studio.core.units import signed
from studio.engine.waterfall import LABELS, with_estimate
from studio.services.generate import run_stages
from studio.services.history import current_keys


def stored(project: Project, run: bool = True) -> dict[str, Any] | None:
    """The waterfall stage's result for the current settings (run when missing and ``run``)."""
    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    key = current_keys(project, ["waterfall"]).get("waterfall")
    store = ArtifactStore(project.folder / "artifacts")
    art = store.get(key) if key else None
    if art is None and run:
        run_stages(project, ["waterfall"], "the waterfall")
        art = store.get(key) if key else None
    if art is None:
        return None
    return json.loads((Path(art.path) / "waterfall.json").read_text())


def waterfall(project: Project, chip: str | None = None, run: bool = True) -> dict[str, Any]:
    chip = get_chip(chip or project.targets[0]).key  # an unknown chip: one line, before work
    data = stored(project, run)
    if data is None:
        raise StudioError(f"no waterfall for the current settings: run studio --batch "
                          f"{project.path} --stages waterfall")
    return with_estimate(data, chip or project.targets[0])


def table_lines(data: dict[str, Any]) -> list[str]:
    """The waterfall as text rows (the CLI and the report)."""
    lines = [f"{'step':<16} {'host CPU tok/s':>14} {data['chip_name'] + ' tok/s':>26} "
             f"{'perplexity':>11} {'change':>8}",
             f"{'':<16} {'(measured)':>14} {'(estimated)':>26}"]
    for r in data["steps"]:
        est = r.get("estimated_tokens_per_s")
        lines.append(f"{LABELS.get(r['step'], r['step']):<16} {r['tokens_per_s']:>14.1f} "
                     f"{(f'{est:.1f}' if est else '-'):>26} {r['ppl']:>11.2f} "
                     f"{signed(r['ppl_change'], '.1%'):>8}")
    return lines
