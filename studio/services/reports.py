"""The report of any run in the history, in any format: HTML, Markdown, PDF or JSON.

A run's report is assembled from what the run history recorded (each job's result, the
settings the run ran with, the comparison with the previous run with results), the
artifacts those jobs produced (the full sensitivity ranking) and the project's recorded
sweeps, then rendered by the one renderer (:mod:`studio.engine.report`). The report stage
of a pipeline run uses the same renderer; ``studio report`` and the GUI's Reports page use
this module, so any past run can be reported, not only the newest.

The PDF is printed by a front end (Qt lives in ``studio.ui``): callers hand ``write`` a
printer, ``(html, charts) -> PDF bytes``, that takes the print HTML and its charts as SVG.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.compare import compare_with_previous
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_bytes, atomic_write_text, check_output
from studio.core.jobs import JobStore
from studio.core.lazyimport import lazy_module
from studio.core.project import Project
from studio.core.project import from_dict as project_from_dict
from studio.core.sweep import format_value
from studio.engine import report as _report
from studio.services import history
from studio.services.sweeps import recorded, size_figure, sweep_names

jsonschema = lazy_module("jsonschema")

FORMATS: tuple[str, ...] = _report.FORMATS
SUFFIX = {"html": ".html", "md": ".md", "pdf": ".pdf", "json": ".json"}
SCHEMA_PATH: Path = _report.SCHEMA_PATH
#: prints the report: (print HTML, charts name -> SVG markup) -> the PDF file's bytes
PdfPrinter = Callable[[str, dict[str, str]], bytes]


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise StudioError(f"--format {fmt}: choose one of {', '.join(FORMATS)}")
    return fmt


def default_run(jobs: JobStore) -> int:
    """The newest run with results of the project's own (a sweep's points are left out)."""
    ids = history.runs_with_results(jobs)
    if not ids:
        raise StudioError("the project has no run with results yet: run the pipeline "
                          "(studio --batch FILE)")
    return ids[0]


def run_results(jobs: JobStore, run_id: int) -> dict[str, dict[str, Any]]:
    """Each succeeded job's recorded result in run ``run_id`` (label -> result), in
    pipeline order; the report job itself is left out."""
    out: dict[str, dict[str, Any]] = {}
    for job in jobs.jobs(run_id=run_id):
        if job.state == "succeeded" and job.result and not history.plays_role(job, "report"):
            out[job.label] = job.result
    return out


def run_artifacts(jobs: JobStore, store: ArtifactStore, run_id: int) -> dict[str, Path]:
    """The artifact folder each job of the run produced, where still stored."""
    out: dict[str, Path] = {}
    for job in jobs.jobs(run_id=run_id):
        if job.state == "succeeded" and job.artifact_key:
            art = store.get(job.artifact_key)
            if art is not None:
                out[job.label] = Path(art.path)
    return out


def sweep_fronts(project: Project, jobs: JobStore) -> list[dict[str, Any]]:
    """The project's recorded sweeps for the report: each point's accuracy and size with
    their sources, the Pareto front and the best point."""
    out = []
    for name in sweep_names(project, jobs):
        rec = recorded(project, jobs, name)
        if rec is None or not rec["points"]:
            continue
        front, points = set(rec["pareto_front"]), []
        acc_source = size_source = size_title = ""
        for i, p in enumerate(rec["points"]):
            acc, size = p.get("accuracy") or {}, size_figure(p) or {}
            acc_source = acc_source or acc.get("source", "")
            size_source = size_source or size.get("source", "")
            size_title = size_title or size.get("title", "")
            points.append({
                "label": p["label"], "state": p["state"], "reason": p.get("reason") or "",
                "settings": ", ".join(f"{k}={format_value(v)}"
                                      for k, v in p["settings"].items()),
                "run_id": p.get("run_id"), "accuracy": acc.get("value"),
                "size_bytes": size.get("value"), "front": i in front, "best": i == rec["best"],
                "passed": p["state"] == "succeeded" and p.get("gates_passed") is not False})
        out.append({"name": name, "state": rec["state"], "best_rule": rec["best_rule"],
                    "accuracy_metric": rec["accuracy_metric"],
                    "accuracy_title": rec["accuracy_title"],
                    "accuracy_source": acc_source or "simulated",
                    "size_title": size_title or "size", "size_source": size_source or "measured",
                    "points": points})
    return out


def report_data(project: Project, jobs: JobStore, store: ArtifactStore,
                run_id: int | None = None, sweeps: bool = True) -> dict[str, Any]:
    """The report of run ``run_id`` (default: the newest run with results) as the versioned
    report JSON."""
    if run_id is None:
        run_id = default_run(jobs)
    info = history.run_info(project, jobs, run_id)
    if info is None:
        raise StudioError(f"run {run_id} is not in this project's history: see studio info "
                          f"{project.path or ''}".rstrip())
    results = run_results(jobs, run_id)
    if not results:
        raise StudioError(f"run {run_id} has no results ({info.state}): choose a run that "
                          "finished a stage (studio info lists them)")
    if info.settings:
        try:
            ran = project_from_dict(info.settings)
        except StudioError:
            ran = project
    else:
        ran = project  # an old run without its settings: the project as it is now
    ran.name = project.name
    run = {"id": run_id, "state": info.state, "created": info.created,
           "finished": info.finished, "settings_recorded": info.settings is not None,
           "sweep_point": (info.sweep or {}).get("label")}
    return _report.build_report(
        ran, results, compare_with_previous(jobs, run_id),
        run_artifacts(jobs, store, run_id),
        sweep_fronts(project, jobs) if sweeps else None, run)


def render(data: dict[str, Any], fmt: str, pdf: PdfPrinter | None = None) -> bytes:
    """The report in ``fmt`` as the bytes of its file."""
    check_format(fmt)
    if fmt == "pdf":
        if pdf is None:
            raise StudioError("this front end cannot print a PDF: use the studio command "
                              "or the desktop app (--format html, md or json work anywhere)")
        html, charts = _report.render_print(data)
        return pdf(html, charts)
    return _report.render(data, fmt).encode("utf-8")


def render_print(data: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The HTML a PDF printer takes and its charts (SVG markup by ``chart:NAME``)."""
    return _report.render_print(data)


def default_out(project: Project, run_id: int, fmt: str) -> Path:
    return project.folder / "reports" / f"run-{run_id}{SUFFIX[check_format(fmt)]}"


def check_writable(out: Path) -> None:
    """Refuse an output path that cannot be written, before any work: a folder, a link, a
    device, a FIFO or a socket (:func:`studio.core.fsutil.check_output`), or one whose folder
    is not writable."""
    out = check_output(Path(out))
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise StudioError(f"--out {out}: {parent} is not a writable folder")


def write(data: dict[str, Any], fmt: str, out: Path, pdf: PdfPrinter | None = None) -> Path:
    """Render ``data`` as ``fmt`` into ``out`` (atomically: a reader never sees half a
    file)."""
    body = render(data, fmt, pdf)
    check_writable(out)
    try:
        if fmt == "pdf":
            atomic_write_bytes(out, body)
        else:
            atomic_write_text(out, body.decode("utf-8"))
    except OSError as exc:
        raise StudioError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def validate_json(data: dict[str, Any]) -> None:
    """Check ``data`` against the report JSON schema (raises ``jsonschema.ValidationError``)."""
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
