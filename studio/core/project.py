"""The ``.qstudio`` project file: TOML, human-diffable, versioned, validated, saved atomically.

A project file sits next to its project folder ``<stem>.studio/`` (artifacts, run history,
reports). Paths inside the file are relative to the file's folder; ``sample:NAME`` names a
model or text shipped with the studio.
"""

from __future__ import annotations

import copy
import hashlib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from studio.core import samples
from studio.core.catalog import default_chip_key, get_chip
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_text, check_nesting, check_writable_dir, read_input
from studio.core.samples import SAMPLES
from studio.core.settings import SECTIONS, Settings, check_value, spec_of
from studio.core.settings import check as check_settings
from studio.core.stagegraph import STAGE_NAMES as STAGES  # noqa: F401  (the pages read it here)
from studio.core.stagegraph import default_stages
from studio.core.sweep import parse_spec

SCHEMA_VERSION = 1

# The sections, their keys, types, defaults and ranges: studio.core.settings.
_TOP = {"schema_version", "name", "targets", "sweeps", *SECTIONS}


@dataclass(eq=False)
class Project(Settings):
    """The validated content of a project file (its sections: :class:`Settings`), plus where
    it lives."""

    name: str = "untitled"
    targets: list[str] = field(default_factory=list)
    # recipe sweeps ([[sweeps]] tables, validated by studio.core.sweep.parse_spec)
    sweeps: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Project):
            return NotImplemented
        return self.path == other.path and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    # ---- locations -------------------------------------------------------------
    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    @property
    def folder(self) -> Path:
        """The project folder beside the file: artifacts, run history, reports."""
        assert self.path is not None, "project has not been saved yet"
        return self.path.with_suffix(".studio")

    def resolve(self, ref: str) -> str | Path:
        """A path relative to the project file, or a ``sample:`` reference unchanged."""
        if ref.startswith("sample:"):
            return ref
        p = Path(ref).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)

    def input_path(self, ref: str) -> Path:
        """An existing file or folder for a model/text reference, or a StudioError."""
        r = self.resolve(ref)
        if isinstance(r, str):  # sample:NAME

            name = r.split(":", 1)[1]
            if name in samples.DATA_FILES:
                path = samples.data_path(name)
            else:
                path = samples.sample_path(name)
        else:
            path = r
        if not path.exists():
            raise StudioError(f"{ref!r} not found (looked at {path}): fix the path in the project file")
        return path

    # ---- (de)serialisation ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": self.name}
        for section in self.sections():
            d[section.name] = section.to_dict()
        if not d["model"].get("draft"):  # no draft model: leave its keys out of the file
            d["model"].pop("draft", None)
            if d["model"].get("draft_embedding") == "auto":
                d["model"].pop("draft_embedding", None)
        d["targets"] = list(self.targets)
        if self.sweeps:
            d["sweeps"] = copy.deepcopy(self.sweeps)
        return d

    def copy(self) -> Project:
        p = from_dict(self.to_dict())
        p.path = self.path
        return p


def from_dict(data: dict[str, Any], where: str = "project") -> Project:
    unknown = set(data) - _TOP
    if unknown:
        raise StudioError(
            f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(_TOP))})"
        )
    sections = {name: cls.from_table(data.get(name, {})) for name, cls in SECTIONS.items()}
    name = data.get("name", "")
    if not isinstance(name, str):
        raise StudioError("name must be a string")
    if "targets" in data:
        targets = data["targets"]
    else:
        targets = [default_chip_key()]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise StudioError("targets must be a list of chip names (see studio targets)")
    p = Project(name=name or "untitled", targets=list(targets))
    for section, values in sections.items():
        setattr(p, section, values)
    _kind_defaults(data, p)
    _validate(p)
    p.sweeps = _sweeps(data.get("sweeps", []), p)
    return p


def _validate(p: Project) -> None:
    if not p.name.strip():
        raise StudioError("name must not be empty")
    check_settings(p)

    if not p.targets:
        raise StudioError("targets is empty: name at least one chip (see studio targets)")
    seen: set[str] = set()
    for t in p.targets:
        key = get_chip(t).key  # raises a StudioError naming the known targets
        if key in seen:  # it would be compiled, validated and run twice
            raise StudioError(f"targets lists {t} twice: name each chip once")
        seen.add(key)


def _sweeps(raw: Any, p: Project) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise StudioError("sweeps must be a list of tables: write [[sweeps]]")
    names: set[str] = set()
    out = []
    for i, table in enumerate(raw):
        spec = parse_spec(table, p, where=f"sweeps[{i}]")
        if spec.name in names:
            raise StudioError(f"two sweeps are named {spec.name!r}: give each its own name")
        names.add(spec.name)
        out.append(copy.deepcopy(table))
    return out


# measured on MiniLM W8A16 (seq 32, the HTP simulator): 8 sentences give a worst embedding
# cosine of 0.93 on held-out ones, 40 give 0.987
ENCODER_CALIBRATION_SAMPLES = 40


def infer_kind(source: str) -> str:
    """The model kind a source implies (an .onnx file, an encoder sample, else a causal LM)."""
    if source.lower().endswith(".onnx"):
        return "onnx-graph"
    if source.startswith("sample:"):
        s = SAMPLES.get(source.split(":", 1)[1])
        if s is not None and s.kind == "sentence-encoder":
            return "encoder"
    return "causal-lm"


def _kind_defaults(data: dict[str, Any], p: Project) -> None:
    """The defaults that depend on the model's kind, where the file leaves them out."""
    if "kind" not in data.get("model", {}):
        p.model.kind = infer_kind(p.model.source)
    kind = p.model.kind
    check_value("model.kind", kind, spec_of("model.kind"))  # its stages need a known kind
    if "stages" not in data.get("pipeline", {}):
        p.pipeline.stages = list(default_stages(kind))
    if kind == "encoder":  # a sentence a sample: more of them than an LLM's windows
        given = data.get("quantization", {})
        if "calibration_text" not in given:
            p.quantization.calibration_text = "sample:sentences"
        if "calibration_samples" not in given:
            p.quantization.calibration_samples = ENCODER_CALIBRATION_SAMPLES


# ---- migrations -------------------------------------------------------------------
def _migrate_0_to_1(d: dict[str, Any]) -> dict[str, Any]:
    """Schema 0 (pre-release) spelled export lengths ``prompt_len`` / ``context_len``."""
    export = d.get("export", {})
    for old, new in (("prompt_len", "prompt_length"), ("context_len", "context_length")):
        if old in export:
            export[new] = export.pop(old)
    d["schema_version"] = 1
    return d


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _migrate_0_to_1}


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version")
    if version is None:
        raise StudioError("schema_version is missing: add schema_version = 1 at the top")
    if not isinstance(version, int) or isinstance(version, bool):
        raise StudioError(f"schema_version must be an integer, not {version!r}")
    if version > SCHEMA_VERSION:
        raise StudioError(
            f"schema_version {version} was written by a newer QStudio (this one reads up to "
            f"{SCHEMA_VERSION}): upgrade QStudio"
        )
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise StudioError(f"schema_version {version} is not supported (oldest: {min(MIGRATIONS)})")
        data = MIGRATIONS[version](copy.deepcopy(data))
        version = data["schema_version"]
    return data


# ---- files ------------------------------------------------------------------------
#: the largest project file read (a generous bound: a file with many sweeps is some KB)
MAX_PROJECT_BYTES = 8 << 20


def load(path: Path) -> Project:
    path = Path(path)
    data = loads(read_input(path, MAX_PROJECT_BYTES, "project file"), path.name)
    try:
        p = from_dict(migrate(data), where=path.name)
    except StudioError as exc:
        raise StudioError(f"{path.name}: {exc.message}") from None
    p.path = path.resolve()
    return p


def file_record(project: Project) -> dict[str, Any] | None:
    """What a run records of the project file it ran: its path, the SHA-256 of its bytes and
    whether the settings the run ran with are the file's (``matches``: False for a sweep's
    point, a variant of the file, or settings never saved). None when the project has no file
    or it cannot be read."""
    if project.path is None:
        return None
    path = Path(project.path)
    try:
        raw = path.read_bytes()
        on_disk = from_dict(migrate(loads(raw, path.name)), where=path.name).to_dict()
    except (OSError, StudioError):
        return None
    return {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
            "matches": on_disk == project.to_dict()}


def loads(raw: bytes, name: str) -> dict[str, Any]:
    """A project file's bytes as TOML: UTF-8 (a byte-order mark is allowed), well-formed,
    nested at most :data:`studio.core.fsutil.MAX_NESTING` deep; else one line."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise StudioError(f"{name} is not a text file: is it really a .qstudio project?") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudioError(f"{name} is not valid TOML ({exc}): fix the file") from None
    except RecursionError:
        raise StudioError(f"{name} nests tables or lists too deeply: fix the file") from None
    check_nesting(data, name)
    return data


def dumps(project: Project) -> str:
    return tomli_w.dumps(project.to_dict())


def save(project: Project, path: Path | None = None) -> Path:
    target = Path(path) if path else project.path
    if target is None:
        raise StudioError("the project has no file yet: choose where to save it")

    check_writable_dir(target.parent)
    atomic_write_text(target, dumps(project))
    project.path = target.resolve()
    return project.path


def new_project(name: str, source: str, targets: list[str] | None = None, **sections) -> Project:
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "model": {"source": source},
    }
    if targets:
        data["targets"] = targets
    for k, v in sections.items():
        data[k] = v
    return from_dict(data)


# ---- a sweep point ----------------------------------------------------------------
def apply_point(project: Project, settings: Mapping[str, Any]) -> Project:
    """The project with a point's settings, validated (a StudioError names what is wrong)."""
    data = project.to_dict()
    for key, value in settings.items():
        value = copy.deepcopy(value)
        if key == "targets":
            data["targets"] = [value] if isinstance(value, str) else value
            continue
        section, _, leaf = key.partition(".")
        if section == "quantization" and leaf.startswith("overrides."):
            rules = dict(data["quantization"].get("overrides") or {})
            pattern = leaf[len("overrides."):]
            rules.pop(pattern, None)
            if value not in ("", None):
                rules[pattern] = value  # written last: wins over the project's rules
            data["quantization"]["overrides"] = rules
            continue
        data.setdefault(section, {})[leaf] = value
    variant = from_dict(data)
    variant.path = project.path
    return variant
