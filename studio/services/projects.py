"""Projects: new-project creation (the wizard and ``studio new``), the file on disk
(signatures, autosave, edits), the model a project names, its reports.

Nothing here imports Qt; heavy libraries (onnx) are imported inside the functions that need
them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core import samples
from studio.core.catalog import default_chip_key
from studio.core.commands import SetValue
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_text
from studio.core.project import Project
from studio.core.stagegraph import (
    DEFAULT_STAGES,
    MODEL_KINDS,
    STAGES,
    default_stages,
    kind_stages,
)
from studio.engine import checkpoint_check, hf_import

# The ONNX graph description the model views show; re-exported for the UI, which talks
# only to services.
from studio.engine.onnx_import import OnnxGraph as OnnxGraph
from studio.engine.onnx_import import OnnxNode as OnnxNode
from studio.engine.onnx_import import module_of_node as module_of_node
from studio.engine.onnx_import import open_onnx
from studio.engine.onnx_import import read_onnx_graph as read_onnx_graph
from studio.services.edits import project_edits as project_edits
from studio.services.generate import stored_artifact
from studio.services.graphs import check_graph_samples
from studio.services.partplan import PartPlan, part_plan  # noqa: F401  (read from here)
from studio.services.preflight import checked_once
from studio.services.session import Studio

SOURCE_KINDS = ("sample", "checkpoint", "onnx")

@dataclass
class NewProjectSpec:
    """Everything the new-project wizard asks; ``create_project`` turns it into a project."""

    path: Path  # the .qstudio file to write
    source_kind: str  # "sample" | "checkpoint" | "onnx"
    source: str  # a sample name, or the path of a checkpoint folder / an .onnx file
    targets: list[str] = field(default_factory=list)
    name: str = ""
    scheme: str = "W8A16"
    weight_granularity: str = "per_channel"
    calibration_samples: int = 8
    prompt_length: int = 32
    context_length: int = 128
    stages: list[str] = field(default_factory=lambda: list(DEFAULT_STAGES))
    gates: dict[str, float] = field(default_factory=dict)
    # encoders and ONNX graphs ([graph] and quantization.placement)
    placement: str = "strict"
    calibration: str = ""  # .npz / .npy of sample inputs (ONNX graphs)
    validation: str = ""
    shapes: dict[str, list[int]] = field(default_factory=dict)
    seq_len: int = 128

    @property
    def model_kind(self) -> str:
        """The project kind the source makes (model.kind)."""
        if self.source_kind == "onnx":
            return "onnx-graph"
        if self.source_kind == "sample":
            return projectfile.infer_kind(f"sample:{self.source.strip()}")
        return "causal-lm"

def file_stem(name: str) -> str:
    """The file name a project's name gives (``My model 2`` -> ``My-model-2``)."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name.strip()).strip("-.")
    return s or "project"


def path_taken(path: Path) -> str:
    """Why a new project cannot be written at ``path`` ("" when it can): the file exists, or
    its project folder does (an earlier project's history and artifacts would become the new
    one's)."""
    path = Path(path).expanduser()
    if path.suffix != ".qstudio":
        path = path.with_suffix(".qstudio")
    if path.exists():
        return f"{path.name} already exists"
    if path.with_suffix(".studio").exists():
        return (f"its project folder {path.with_suffix('.studio').name} already exists (an "
                "earlier project's run history and artifacts)")
    return ""


def free_project_name(folder: Path, name: str) -> str:
    """``name``, or ``name 2``, ``name 3``… : the first whose file and project folder in
    ``folder`` are both free (what the wizard proposes)."""
    folder = Path(folder).expanduser()
    base = name.strip() or "project"
    candidate, n = base, 1
    while path_taken(folder / f"{file_stem(candidate)}.qstudio"):
        n += 1
        candidate = f"{base} {n}"
    return candidate


def source_ref(kind: str, source: str) -> str:
    """Check a model source and return how the project file names it (one-line errors)."""
    source = source.strip()
    if kind not in SOURCE_KINDS:
        raise StudioError(
            f"unknown model source kind {kind!r}; use one of {', '.join(SOURCE_KINDS)}"
        )
    if not source:
        raise StudioError("choose a model: a sample, a checkpoint folder or an .onnx file")
    if kind == "sample":
        samples.sample(source)  # an unknown sample: the known ones named
        samples.sample_path(source)  # missing files: a clear error
        return f"sample:{source}"
    path = Path(source).expanduser().resolve()
    if kind == "checkpoint":
        # family, complete weights matching config.json, a tokenizer that fits: seconds now
        # instead of a crash minutes into the export; once per content on this machine (the
        # first run's preflight takes this verdict)
        checked_once("checkpoint", [str(path)], [path],
                     lambda: checkpoint_check.check_checkpoint(path))
        return str(path)

    if path.suffix.lower() != ".onnx":
        raise StudioError(f"{path.name} is not an .onnx file")
    open_onnx(path)
    return str(path)

def _kind_stages(kind: str, asked: list[str]) -> list[str]:
    """The stages asked for that a ``kind`` project has; a choice made for another kind
    (nothing of this kind's own but the report) gives the kind's defaults."""
    mine = [s for s in kind_stages(kind) if s in asked]
    own = [s for s in mine if not set(MODEL_KINDS) <= set(STAGES[s].kinds)]
    return mine if not asked or own else list(default_stages(kind))


def create_project(spec: NewProjectSpec):
    """Validate a wizard's answers and write the project: returns an open ``Studio``."""
    path = Path(spec.path).expanduser()
    if path.suffix != ".qstudio":
        path = path.with_suffix(".qstudio")
    if path.exists():
        raise StudioError(f"{path} already exists: choose another name or open it")
    taken = path_taken(path)
    if taken:
        raise StudioError(f"{taken}: choose another name, or move that folder away")
    if spec.source_kind not in SOURCE_KINDS:
        raise StudioError(f"unknown model source kind {spec.source_kind!r}")
    kind = spec.model_kind
    sections: dict[str, Any] = {
        "export": {
            "prompt_length": int(spec.prompt_length),
            "context_length": int(spec.context_length),
        },
        "quantization": {
            "scheme": spec.scheme,
            "weight_granularity": spec.weight_granularity,
            "calibration_samples": int(spec.calibration_samples),
        },
        "pipeline": {"stages": _kind_stages(kind, spec.stages)},
    }
    if kind != "causal-lm":
        sections["quantization"]["placement"] = spec.placement
        graph: dict[str, Any] = {"seq_len": int(spec.seq_len), "shapes": dict(spec.shapes)}
        for key in ("calibration", "validation"):
            value = getattr(spec, key).strip()
            if value:
                graph[key] = str(Path(value).expanduser().resolve())
        if kind == "onnx-graph":
            source_ref(spec.source_kind, spec.source)  # a corrupt file first
            # without samples the graph can be inspected; a run asks for them
            if graph.get("calibration"):
                check_graph_samples(
                    Path(spec.source).expanduser(), graph["shapes"], Path(graph["calibration"]),
                    Path(graph["validation"]) if graph.get("validation") else None)
        sections["graph"] = graph
    if spec.gates:
        sections["gates"] = dict(spec.gates)
    if not sections["pipeline"]["stages"]:
        raise StudioError("choose at least one pipeline stage")
    targets = list(spec.targets)
    if not targets:
        targets = [default_chip_key()]
    # The settings first (cheap, one-line errors), then the model itself.
    draft_ref = (
        f"sample:{spec.source.strip()}"
        if spec.source_kind == "sample"
        else str(Path(spec.source.strip() or ".").expanduser())
    )
    projectfile.new_project(spec.name.strip() or path.stem, draft_ref, targets, **sections)
    ref = source_ref(spec.source_kind, spec.source)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Studio.create(path, ref, targets, name=spec.name.strip() or path.stem, **sections)

@dataclass(frozen=True)
class FileSignature:
    mtime_ns: int
    size: int
    sha256: str

def file_signature(path: Path) -> FileSignature | None:
    """What the file on disk is now (None when it is gone)."""
    try:
        st = os.stat(path)
        data = Path(path).read_bytes()
    except OSError:
        return None
    return FileSignature(st.st_mtime_ns, st.st_size, hashlib.sha256(data).hexdigest())

def changed_on_disk(before: FileSignature | None, path: Path) -> bool:
    now = file_signature(path)
    if before is None or now is None:
        return before != now
    return now.sha256 != before.sha256

def autosave_path(project: Project) -> Path:
    """Where unsaved edits are kept between autosaves (inside the project folder)."""
    return project.folder / "autosave.qstudio"

def _autosave_base_path(project: Project) -> Path:
    return project.folder / "autosave.base.json"

def write_autosave(project: Project, base: dict[str, Any] | None = None) -> Path:
    """Keep the project as edited, and the version the edits were made on (``base``), so that
    restoring replays only the user's own edits on whatever the file holds later."""
    path = autosave_path(project)
    path.parent.mkdir(parents=True, exist_ok=True)
    if base is not None:
        atomic_write_text(_autosave_base_path(project), json.dumps(base, default=str))
    atomic_write_text(path, projectfile.dumps(project))
    return path

def discard_autosave(project: Project) -> None:
    for p in (autosave_path(project), _autosave_base_path(project)):
        try:
            p.unlink()
        except FileNotFoundError:
            pass

def read_autosave(project: Project) -> tuple[Project, list[SetValue], float] | None:
    """Unsaved edits of an earlier session: (autosaved project, the edits, when) or None.

    The edits are those the user made on the base version, minus what ``project`` already
    has; a change made to the file by someone else since then is not undone.
    """
    path = autosave_path(project)
    if not path.exists():
        return None
    try:
        saved = projectfile.load(path)
    except StudioError:
        return None
    base = None
    try:
        base = projectfile.from_dict(json.loads(_autosave_base_path(project).read_text()))
    except (OSError, ValueError, StudioError):
        base = None
    if base is not None:
        current = project.to_dict()
        edits = [
            e
            for e in project_edits(base, saved)
            if (current.get(e.key) if not e.section else current[e.section].get(e.key)) != e.value
        ]
    else:
        edits = project_edits(project, saved)
    if not edits:
        return None
    return saved, edits, path.stat().st_mtime

def model_source_kind(project: Project) -> str:
    src = project.model["source"]
    if src.startswith("sample:"):
        return "sample"
    return "onnx" if src.lower().endswith(".onnx") else "checkpoint"

def describe_model(project: Project):
    """A ``ModelInfo`` for checkpoints and samples, an ``OnnxGraph`` for ONNX files."""
    path = project.input_path(project.model["source"])
    if path.is_file() and path.suffix.lower() == ".onnx":
        return read_onnx_graph(path)
    if project.model["kind"] == "encoder":  # its graph, once the import stage exported it
        art = stored_artifact(project, "import", "the exported encoder", run=False)
        if art is None:
            raise StudioError("the encoder's graph shows here once the import stage has "
                              "exported it from its PyTorch weights: run the pipeline")
        return read_onnx_graph(art / "static.onnx")

    return hf_import.open_checkpoint(path)

def report_files(project: Project) -> list[Path]:
    """HTML reports of the project, newest first (``latest.html`` first when present)."""
    folder = project.folder / "reports"
    if not folder.is_dir():
        return []
    files = sorted(
        folder.glob("*.html"), key=lambda p: (p.name != "latest.html", -p.stat().st_mtime)
    )
    return files

def netron_available() -> bool:
    return importlib.util.find_spec("netron") is not None

def open_in_netron(path: Path) -> str:
    """Serve ``path`` with Netron in the browser; returns the address."""
    import netron  # optional, not a dependency: the page offers it only where installed

    address = netron.start(str(path), browse=True)
    if isinstance(address, tuple):
        return f"http://{address[0]}:{address[1]}"
    return str(address)
