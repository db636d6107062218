"""The Studio session: one open project with its command stack, run history and pipeline.

There are no singletons: the CLI, the GUI and the tests each build their own session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.catalog import default_chip_key, get_chip
from studio.core.commands import CommandStack, SetValue
from studio.core.errors import StudioError
from studio.core.fsutil import check_destination, check_writable_dir
from studio.core.jobs import JobStore
from studio.core.project import Project
from studio.core.samples import sample_overrides
from studio.services.pipeline import Pipeline, RunSummary
from studio.services.vision import vision_defaults


class Studio:
    def __init__(self, project: Project):
        if project.path is None:
            raise StudioError("save the project to a file before opening it in a session")
        self.project = project
        self.commands = CommandStack(project)
        folder = project.folder
        check_writable_dir(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self.store = ArtifactStore(folder / "artifacts").open()
            self.jobs = JobStore(folder / "runs.sqlite")
        except OSError as exc:
            raise StudioError(f"cannot use the project folder {folder}: {exc.strerror}") from None
        interrupted = self.jobs.mark_interrupted()
        # another process's run or sweep writes into tmp/ now: leave it alone
        busy = any(r["state"] == "running" for r in self.jobs.runs()) or any(
            sw["state"] == "running" for sw in self.jobs.sweeps())
        if interrupted or not busy:
            self.store.clean_tmp()
        self.interrupted_jobs = interrupted
        self.pipeline = Pipeline(project, self.jobs, self.store)

    # ---- opening and saving ---------------------------------------------------------
    @classmethod
    def open(cls, path: Path) -> Studio:
        return cls(projectfile.load(Path(path)))

    @staticmethod
    def new_file(path: Path) -> Path:
        """Where a new project goes: ``path`` with the ``.qstudio`` suffix, refused in one
        line when something is there already, or by the one rule for every writer of a
        user's path (:func:`studio.core.fsutil.check_destination`: its folder must exist)."""
        path = Path(path)
        if path.suffix != ".qstudio":
            path = path.with_suffix(".qstudio")
        if path.exists() or path.is_symlink():
            raise StudioError(f"{path} already exists: choose another name or open it")
        return check_destination(path)

    @classmethod
    def create(cls, path: Path, source: str, targets: list[str] | None = None,
               name: str | None = None, image_size_name: str = "export.image_size",
               **sections: Any) -> Studio:
        path = cls.new_file(path)
        if "overrides" not in sections.get("quantization", {}):
            rules = sample_overrides(source, [get_chip(t) for t in
                                              (targets or [default_chip_key()])])
            if rules:  # the sample's own rules, written into the file where one sees them
                sections = {**sections, "quantization": {
                    **sections.get("quantization", {}), "overrides": rules}}

        # a VL model: its image (``image_size_name`` set it) and lengths
        sections = vision_defaults(source, path, sections, image_size_name)
        p = projectfile.new_project(name or path.stem, source, targets, **sections)
        projectfile.save(p, path)
        return cls(p)

    def save(self) -> Path:
        path = projectfile.save(self.project)
        self.commands.mark_clean()
        return path

    def close(self) -> None:
        self.jobs.close()

    # ---- edits --------------------------------------------------------------------------
    def set(self, section: str, key: str, value: Any, label: str = ""):
        return self.commands.push(SetValue(section, key, value, label))

    # ---- pipeline -----------------------------------------------------------------------
    async def run_pipeline(self, stages: list[str] | None = None,
                           targets: list[str] | None = None,
                           remeasure: bool = False) -> RunSummary:
        return await self.pipeline.run(stages, targets, remeasure=remeasure)
