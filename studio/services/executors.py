"""Where work runs: the executor a project's ``pipeline.executor`` names.

- ``local``: this machine's worker processes (:class:`studio.services.workers.LocalPool`), a
  stage's parts in processes of their own, as many at once as ``pipeline.part_processes``
  says (0: as the cores and the free memory allow);
- ``ray``: a Ray cluster (:class:`studio.services.ray_executor.RayExecutor`), a stage's
  parts as Ray tasks of their own.

How a stage's parts run travels in the job spec (``spec["parts"]``, read by
:mod:`studio.worker.parts`), so the stage asks its executor for its sub-work, not a pool of
its own. ``studio sweep --executor`` overrides the project's choice for one sweep.
"""

from __future__ import annotations

from typing import Any

from studio.core.errors import StudioError
from studio.core.project import Project
from studio.core.settings import EXECUTORS
from studio.services.ray_executor import RayExecutor
from studio.services.workers import LocalPool, local_workers
from studio.worker.parts import PartsConfig

__all__ = ["EXECUTORS", "executor_name", "make_executor", "model_bytes", "parts_spec"]


def executor_name(project: Project, asked: str | None = None) -> str:
    """The executor to run on: ``asked`` (a command's flag), else the project's setting."""
    name = asked or project.pipeline["executor"]
    if name not in EXECUTORS:
        raise StudioError(f"--executor {name!r} is not one of {', '.join(EXECUTORS)}")
    return name


def model_bytes(project: Project) -> int:
    """The bytes of the project's model weights (0: not found): what a job's memory request
    grows with (:func:`studio.services.workers.job_memory`)."""
    try:
        src = project.input_path(project.model["source"])
    except StudioError:
        return 0
    files = [src] if src.is_file() else list(src.rglob("*.safetensors")) + list(
        src.rglob("*.bin"))
    return sum(f.stat().st_size for f in files if f.is_file())


def parts_spec(project: Project) -> dict[str, Any]:
    """How a stage's parts run on this machine, as the job spec carries it."""
    return PartsConfig.local(project).to_spec()


def make_executor(project: Project, store, name: str, workers: int | None,
                  ray_address: str | None = None, transfer: str = "auto",
                  model_bytes: int = 0) -> tuple[Any, str]:
    """The executor ``name`` for ``project``'s jobs, and a note when it runs fewer workers
    than asked (the cores or the memory hold fewer)."""
    if name == "ray":
        return RayExecutor(store, ray_address, workers, transfer, model_bytes), ""
    n, why = local_workers(workers, model_bytes)
    note = why if workers is not None and n != workers else ""
    return LocalPool(n, store.tmp, parts_spec(project)), note
