"""The layer-wise diff (FP32 vs host QDQ vs the HTP, tensor by tensor) for the project as it
is now: what ``studio layerdiff`` prints and what the GUI plots.

A result belongs to the current settings when it is the artifact of the job the plan would
run now (its key); an older diff, of other settings, is not shown as if it were current.
Nothing here imports the engine or Qt.
"""

from __future__ import annotations

import json
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.core.project import Project
from studio.services.history import current_keys

STAGE = "layerdiff"


class NoLayerDiff(StudioError):
    """There is no layer diff for the current settings (not an error of the project: the
    stage has not run since the settings it reads last changed)."""


def layerdiff_result(project: Project, target: str | None = None) -> dict[str, Any]:
    """The layer diff of ``target`` (default: the project's first target) for the current
    settings: ``{"target", "key", "result", "rows", "extra_outputs", ...}`` where ``result``
    is the stage's result (curves, first jumps, where host QDQ and the HTP part, the worst
    tensors, final-logits figures, metrics with their sources) and ``rows`` one entry per
    tensor with its figures per pair. NoLayerDiff (a StudioError, one line, saying how to make
    one) when there is none; StudioError when it cannot be read."""
    if project.path is None:
        raise StudioError("save the project to a file first: the layer diff lives in its folder")
    target = target or project.targets[0]
    if target not in project.targets:
        raise StudioError(f"target {target!r} is not one of the project's targets "
                          f"({', '.join(project.targets)})")
    key = current_keys(project, [STAGE]).get(f"{STAGE}[{target}]")
    art = ArtifactStore(project.folder / "artifacts").get(key) if key else None
    if art is None:
        raise NoLayerDiff(
            f"no layer diff for the current settings of {target}: run studio --batch "
            f"{project.path} --stages {STAGE}" + (f" --target {target}"
                                                  if len(project.targets) > 1 else "")
        )
    try:
        result = json.loads((art.path / "result.json").read_text())
        data = json.loads((art.path / "layerdiff.json").read_text())
    except (OSError, ValueError):
        raise StudioError(f"the stored layer diff {art.path} is unreadable: run studio --batch "
                          f"{project.path} --stages {STAGE} again") from None
    return {"target": target, "key": key, "result": result, "rows": data["rows"],
            "extra_outputs": data.get("extra_outputs", {}),
            "missing_in_qdq": data.get("missing_in_qdq", [])}
