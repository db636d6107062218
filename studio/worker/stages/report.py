"""The run's report (reads the run history)."""

from __future__ import annotations

import json
from typing import Any

from studio.core.errors import StudioError
from studio.core.progress import Progress
from studio.core.project import from_dict
from studio.core.stages.report import ReportSettings
from studio.engine.report import write_report
from studio.worker.context import StageContext


def run(ctx: StageContext, progress: Progress) -> dict[str, Any]:
    """The run's report. It is not cached: it reads the run history (the settings this run
    ran with, and the previous run to compare with)."""
    results = {}
    for label, path in ctx.inputs.items():
        results[label] = json.loads((path / "result.json").read_text())
    settings = ctx.history.get("settings")
    if not settings:
        raise StudioError("the report needs the run history's record of this run")
    project = from_dict(settings)
    s = ReportSettings.of(ctx.config)
    project.name = s.name
    project.gates = s.gates()
    # the full sensitivity ranking lives in its artifact; the project's sweeps (with their
    # Pareto fronts) come from the service that started the run
    html, data = write_report(project, results, ctx.out, ctx.history.get("comparison"),
                              artifacts=dict(ctx.inputs), sweeps=ctx.history.get("sweeps"),
                              run=ctx.history.get("run"),
                              device_plan=ctx.history.get("device_plan"))
    return {"summary": f"report with {len(results)} stage results", "files": [html.name, data.name],
            "metrics": []}
