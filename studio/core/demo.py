"""The demo file: what ``studio demo`` (and View → Demo) shows a stakeholder, in which order.

A small TOML file beside the project, ``<project stem>.demo.toml``::

    title = "tiny-coder on Snapdragon 8 Gen 3"
    project = "tiny-coder.qstudio"   # only needed when the demo file is opened by itself
    device = "cpu"                   # live generation: cpu, htp-sim[:CHIP], agent:NAME[@BACKEND]
    prompts = ["def fibonacci(n):", "class Stack:"]
    max_new_tokens = 48
    run = "latest"                   # the run the recorded figures come from (or its number)
    target = "snapdragon-8-gen-3"    # the chip of the waterfall estimate and the bundle
    scenes = ["generate", "waterfall", "accuracy", "profile", "memory", "bundle"]

Every key is optional; a project without a demo file gets :func:`default_spec`. Pure: no
heavy imports, no file system beyond reading the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from studio.core import devices
from studio.core.catalog import get_chip
from studio.core.errors import StudioError

#: the scenes a demo can show, with the title each one carries on stage
SCENES: dict[str, str] = {
    "generate": "Live generation",
    "waterfall": "What each optimization bought",
    "accuracy": "What the deployment costs in accuracy",
    "profile": "Where the time goes",
    "memory": "The memory picture",
    "bundle": "The deployment bundle",
}
DEFAULT_SCENES: tuple[str, ...] = tuple(SCENES)
SUFFIX = ".demo.toml"
MAX_TOKENS = 4096
_KEYS = {"title", "project", "device", "prompts", "max_new_tokens", "run", "target", "scenes"}


@dataclass(frozen=True)
class DemoSpec:
    title: str = ""
    device: str = "cpu"
    prompts: tuple[str, ...] = ()
    max_new_tokens: int = 48
    run: int | None = None  # None: the newest run with results
    target: str = ""  # "": the project's first target
    scenes: tuple[str, ...] = DEFAULT_SCENES
    project: str = ""  # the project file, relative to the demo file ("" : beside it)
    path: Path | None = field(default=None, compare=False)  # the demo file (None: defaults)

    @property
    def run_label(self) -> str:
        return "latest" if self.run is None else str(self.run)


def default_spec() -> DemoSpec:
    return DemoSpec()


def demo_path_for(project_file: Path) -> Path:
    """Where a project's demo file lives: ``<stem>.demo.toml`` beside the project file."""
    project_file = Path(project_file)
    return project_file.with_name(project_file.stem + SUFFIX)


def project_path_for(demo_file: Path, spec: DemoSpec) -> Path:
    """The project a demo file belongs to: its ``project`` key (relative to the demo file),
    else ``<stem>.qstudio`` beside it."""
    demo_file = Path(demo_file)
    if spec.project:
        p = Path(spec.project).expanduser()
        return p if p.is_absolute() else demo_file.parent / p
    name = demo_file.name
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else demo_file.stem
    return demo_file.with_name(stem + ".qstudio")


def parse(text: str, where: str = "the demo file") -> DemoSpec:
    """A demo file's text as a :class:`DemoSpec`; StudioError (one line) on bad input."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StudioError(f"{where} is not valid TOML ({exc}): fix it or remove it") from None
    return from_dict(raw, where)


def load(path: Path) -> DemoSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudioError(f"no demo file {path}: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StudioError(f"cannot read the demo file {path}: {exc}") from None
    spec = parse(text, f"demo file {path.name}")
    return _with_path(spec, path)


def _with_path(spec: DemoSpec, path: Path) -> DemoSpec:
    return replace(spec, path=path)


def from_dict(raw: dict[str, Any], where: str = "the demo file") -> DemoSpec:
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise StudioError(f"{where}: unknown key {unknown[0]!r}; the keys are "
                          f"{', '.join(sorted(_KEYS))}")
    title = raw.get("title", "")
    if not isinstance(title, str):
        raise StudioError(f"{where}: title must be text")
    project = raw.get("project", "")
    if not isinstance(project, str):
        raise StudioError(f"{where}: project must be the project file's path (text)")
    device = raw.get("device", "cpu")
    if not isinstance(device, str) or not device.strip():
        raise StudioError(f"{where}: device must be cpu, htp-sim[:CHIP] or agent:NAME[@BACKEND]")
    check_device(device.strip(), where)
    prompts = raw.get("prompts", [])
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise StudioError(f"{where}: prompts must be a list of texts")
    if any(not p.strip() for p in prompts):
        raise StudioError(f"{where}: prompt {1 + [bool(p.strip()) for p in prompts].index(False)}"
                          " is empty: give some text or remove it")
    n = raw.get("max_new_tokens", 48)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS:
        raise StudioError(f"{where}: max_new_tokens must be a whole number from 1 to "
                          f"{MAX_TOKENS}, not {n!r}")
    run = parse_run(raw.get("run", "latest"), where)
    target = raw.get("target", "")
    if not isinstance(target, str):
        raise StudioError(f"{where}: target must be a chip of the catalog (text)")
    if target:
        try:
            target = get_chip(target).key
        except StudioError as exc:
            raise StudioError(f"{where}: target: {exc.message}") from None
    scenes = raw.get("scenes", list(DEFAULT_SCENES))
    if not isinstance(scenes, list) or not all(isinstance(s, str) for s in scenes):
        raise StudioError(f"{where}: scenes must be a list of scene names "
                          f"({', '.join(SCENES)})")
    for s in scenes:
        if s not in SCENES:
            raise StudioError(f"{where}: unknown scene {s!r}; the scenes are "
                              f"{', '.join(SCENES)}")
    if not scenes:
        raise StudioError(f"{where}: scenes is empty: name at least one of {', '.join(SCENES)}")
    return DemoSpec(title=title.strip(), device=device.strip(), prompts=tuple(prompts),
                    max_new_tokens=n, run=run, target=target, scenes=tuple(scenes),
                    project=project)


def parse_run(value: Any, where: str = "the demo file") -> int | None:
    """``"latest"`` -> None, a run number -> that number."""
    if value in ("latest", None):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StudioError(f"{where}: run must be \"latest\" or a run number (1, 2, …), "
                          f"not {value!r}")
    return value


def check_device(device_id: str, where: str = "the demo file") -> None:
    """The live generation's device, checked for its form (``htp-sim`` alone means the
    project's first target; whether a chip is a target is checked against the project)."""
    try:
        devices.check_name(device_id)  # an adb phone's chip may be the project's only target
    except StudioError as exc:
        raise StudioError(f"{where}: device: {exc.message}") from None


def resolve_device(device_id: str, targets: list[str]) -> str:
    """The live device's id for a project with ``targets`` (``htp-sim`` -> the first
    target's simulator); StudioError when it names a chip that is not a target."""
    dev = devices.resolve(device_id, targets)
    if dev.chip and dev.chip not in targets:
        raise StudioError(f"the demo's device {device_id} runs {dev.chip}, which is not a "
                          f"target of the project ({', '.join(targets) or 'none'}): add it to "
                          "targets or pick another device")
    return dev.id
