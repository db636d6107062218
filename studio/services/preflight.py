"""Preflight: the input files the planned stages declare, and the settings that depend on
them, checked before anything runs (fail in seconds, not after minutes of stage work).

The declared file references (``core.stagegraph.REFS``) are checked by kind: checkpoints,
encoder folders and ONNX files, sample inputs, text files; then the prompt against the
exported lengths, the precision overrides against the model's layers and the recipe against
the target chips. A checkpoint's full check is remembered per content in the project folder
and on the machine (``checked.json`` of the studio's config folder, keyed by the content and
the studio's code and tool versions): a new project of a checkpoint this machine already
checked does not load it again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.devices import device
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_json, check_writable_dir, sha256_json
from studio.core.project import Project
from studio.core.recipe import is_float_scheme, scheme_refusal
from studio.core.stagegraph import REFS, STAGES, PlannedJob, project_value
from studio.engine import checkpoint_check, hf_import, vision_input
from studio.engine.chat_template import prompt_format
from studio.engine.checkpoint_check import CHECKS_VERSION, check_draft, prompt_length
from studio.engine.device_registry import config_dir
from studio.engine.devices import backend
from studio.engine.onnx_import import open_onnx
from studio.services.precision import override_refusals, unmatched
from studio.services.versions import tool_versions
from studio.worker.context import read_text

__all__ = ["preflight"]

# Content keys of checkpoints verified by this process (a pure function of content and
# code version, so remembering it is safe).
_VERIFIED: set[str] = set()


def _cached_check(project: Project, refs: list[str], what: str,
                  check: Callable[[], Any]) -> None:
    """Run a checkpoint check once per content: the verdict is kept in the project folder,
    keyed by what the checks read of the files and the checks' version, so a warm re-run
    pays nothing; and on the machine, keyed by that and the studio's code and tool versions,
    so a new project of a checkpoint this machine checked (``studio new`` checks it too)
    pays nothing either."""
    folders = [project.input_path(r) for r in refs]
    key = verdict_key(what, folders)
    mine = Verdicts(project.folder / "checks.json")
    if mine.holds(key):
        return
    _check_on_machine(key, what, refs, check)
    if project.folder.is_dir():
        mine.add(key, what, refs)


def verdict_key(what: str, folders: list[Path]) -> str:
    """The key of a check's verdict: what was checked, the checks' version and what they read
    of the folders (:func:`checkpoint_check.check_identity`: never the weights' data, so
    keying a large checkpoint reads its headers, not its gigabytes)."""
    return sha256_json({"what": what, "v": CHECKS_VERSION,
                        "content": [checkpoint_check.check_identity(f) for f in folders]})


def checked_once(what: str, refs: list[str], folders: list[Path],
                 check: Callable[[], Any]) -> None:
    """``check()`` unless this process or the machine's ``checked.json`` holds a passed
    verdict for the folders' content (:func:`verdict_key`); a check that raises leaves no
    verdict. ``studio new --checkpoint`` and the preflight of a run share the verdicts: a
    project made from a checkpoint is not checked again by its first run."""
    _check_on_machine(verdict_key(what, folders), what, refs, check)


def _check_on_machine(key: str, what: str, refs: list[str], check: Callable[[], Any]) -> None:
    machine = Verdicts(config_dir() / "checked.json")
    on_machine = sha256_json({"check": key, "tools": tool_versions()})
    # checked earlier in this process (before the folder existed), or by any project here
    if key not in _VERIFIED and not machine.holds(on_machine):
        check()
    _VERIFIED.add(key)
    try:
        machine.add(on_machine, what, refs, make_folder=True)
    except OSError:  # a read-only config folder: the next new project checks again
        pass


class Verdicts:
    """Checks passed, by key, in a JSON file (a project's ``checks.json``, the machine's
    ``checked.json`` in the studio's config folder); a file that cannot be read or is damaged
    holds none: the check runs again."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def holds(self, key: str) -> bool:
        return key in self.read()

    def add(self, key: str, what: str, refs: list[str], make_folder: bool = False) -> None:
        data = self.read()
        if key in data:
            return
        data[key] = {"what": what, "refs": refs, "checked": time.time()}
        if make_folder:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, data)


def _check_checkpoint(project: Project, ref: str) -> Path:
    path = project.input_path(ref)
    if path.is_file() and path.suffix == ".onnx":
        open_onnx(path)  # a corrupt file gets a clear error
        raise StudioError(
            f"{path.name} is an ONNX model: the LLM pipeline starts from a Hugging Face "
            "checkpoint folder (export makes its prefill and decode graphs)"
        )

    hf_import.open_checkpoint(path)  # cheap: the family, config and headers, every time
    _cached_check(project, [ref], "checkpoint",
                  lambda: checkpoint_check.check_checkpoint(path))
    return path


def _check_graph_source(project: Project, ref: str) -> None:
    """An encoder's folder or an ONNX file, checked in seconds before any stage runs."""
    path = project.input_path(ref)
    if project.model["kind"] == "onnx-graph":
        open_onnx(path)  # a corrupt file gets a clear error
    elif not (path / "config.json").is_file():
        raise StudioError(f"{path} is not a sentence-encoder folder: expected config.json, "
                          "tokenizer files and model weights (or use sample:minilm)")


def _check_samples(path: Path, key: str) -> None:
    if not path.is_file() or path.suffix.lower() not in (".npz", ".npy"):
        raise StudioError(f"{key}: {path} is not a .npz or .npy file of sample inputs")


def _check_text(path: Path, what: str) -> None:
    """The text the stage will read, read the same way: a regular UTF-8 file, not empty."""
    read_text(path, what)


def _check_images(path: Path, key: str) -> None:
    """A folder of images (or, for run.image, one image) that the stage can read."""
    if path.is_dir():
        for f in vision_input.image_files(path):
            vision_input.read_picture(f)
    elif path.is_file() and key == "run.image":
        vision_input.read_picture(path)
    else:
        raise StudioError(f"{key}: {path} is not " + ("an image" if key == "run.image"
                                                      else "a folder of images"))


def _check_lengths(project: Project, model: Path, new_tokens: list[str]) -> None:
    """The prompt, tokenized as the runtime will, against the exported lengths."""
    P, C = project.export["prompt_length"], project.export["context_length"]
    n = prompt_length(model, project.run["prompt"], project.model.chat_template)
    if n >= C:  # longer than P is fine: the rest is prefilled in chunks
        raise StudioError(
            f"run.prompt is {n} tokens{_templated(project, model)} but the KV cache holds {C} "
            "(export.context_length; "
            f"the prefill graph takes {P} at once, the rest in chunks): shorten the prompt or "
            "raise export.context_length"
        )
    for key in new_tokens:
        want = project_value(project, key)
        if n + want > C:
            raise StudioError(
                f"{key} = {want} does not fit: the {n}-token prompt"
                f"{_templated(project, model)} leaves {C - n} positions "
                f"of the {C}-token context (export.context_length); lower {key.split('.')[1]} "
                "or raise export.context_length"
            )


def _templated(project: Project, model: Path) -> str:
    """" (through the chat template)" where run.prompt goes in through one."""
    fmt = prompt_format(model, project.model.chat_template)
    return " (through the chat template)" if fmt.applied else ""


def _check_overrides(project: Project, model: Path) -> None:
    # patterns that name ONNX nodes ("/lm_head/MatMul") are checked by quantize itself
    bad = [p for p in unmatched(project, hf_import.open_checkpoint(model)) if not p.startswith("/")]
    if bad:
        raise StudioError(
            f"quantization.overrides: {', '.join(repr(b) for b in bad)} match(es) no layer of the "
            "model; use names like model.layers.0, *.mlp.down_proj or lm_head (see studio info)"
        )


#: the checks a stage declaration may ask for (``StageDecl.preflight``)
CHECKS: dict[str, str] = {
    "draft": "the project names a draft model",
    "overrides": "every override rule names a layer of the model",
    "graph-calibration": "an ONNX graph has calibration samples",
    "prompt-fits": "the prompt and the stage's new tokens fit the context",
}


def preflight(project: Project, jobs: list[PlannedJob]) -> None:
    """Check the input files the planned stages declare, and the settings that depend on
    them, before anything runs: fail in seconds, not after minutes of stage work."""
    decls = [STAGES[j.stage] for j in jobs]
    checks = {c for d in decls for c in d.preflight}
    unknown = checks - set(CHECKS)
    if unknown:  # a declaration names a check this module does not have
        raise StudioError(f"unknown preflight check(s) {', '.join(sorted(unknown))}")
    _check_devices_known(jobs)  # first: it reads a small file, the checks below read models
    if "draft" in checks and not project.model.get("draft"):
        raise StudioError("the project has no draft model: set model.draft (for example "
                          "\"sample:tiny-coder-draft\") to export one")
    checked: set[str] = set()
    model: Path | None = None
    for job in jobs:
        for key in STAGES[job.stage].settings:
            kind = REFS.get(key)
            if kind is None or key in checked:
                continue
            checked.add(key)
            ref = project_value(project, key)
            if key == "model.source" and project.model["kind"] != "causal-lm":
                _check_graph_source(project, ref)
            elif kind == "samples":
                if ref:
                    _check_samples(project.input_path(ref), key)
            elif kind == "images":
                if ref:
                    _check_images(project.input_path(ref), key)
            elif kind == "checkpoint":
                if not ref:  # an optional checkpoint (model.draft) not set
                    continue
                checked_model = _check_checkpoint(project, ref)
                if key == "model.source":
                    model = checked_model
            else:
                _check_text(project.input_path(ref), key.split(".", 1)[1].replace("_", " "))
    if project.model.get("draft"):
        draft_ref = project.model["draft"]
        target = model or project.input_path(project.model["source"])
        draft = project.input_path(draft_ref)

        _cached_check(project, [project.model["source"], draft_ref], "draft",
                      lambda: check_draft(target, draft))
    if ("graph-calibration" in checks and project.model["kind"] == "onnx-graph"
            and not project.graph["calibration"]):
        raise StudioError("graph.calibration is empty: an ONNX graph is calibrated on sample "
                          "inputs; give a .npz file with one array per graph input (studio new "
                          "--onnx MODEL --calibration DATA.npz)")
    new_tokens = sorted({d.new_tokens for d in decls if "prompt-fits" in d.preflight})
    if model is None and (new_tokens or "overrides" in checks):
        model = project.input_path(project.model["source"])
    if model is not None and model.is_dir():
        if new_tokens:
            _check_lengths(project, model, new_tokens)
        if "overrides" in checks and project.quantization["overrides"]:
            _check_overrides(project, model)
    _check_targets_run_the_recipe(project, jobs)
    check_writable_dir(project.folder)


def _check_devices_known(jobs: list[PlannedJob]) -> None:
    """The devices the planned jobs run on, as far as this machine knows them without
    reaching them: an agent that ``run.devices`` names must be registered (studio devices
    add), refused here rather than when its run stage starts, after the rest of the run."""
    for dev_id in dict.fromkeys(j.target for j in jobs if STAGES[j.stage].fan_out == "device"):
        try:
            backend(device(dev_id)).check_known()
        except StudioError as exc:
            raise StudioError(f"run.devices: {dev_id}: {exc.message}") from None


def _check_targets_run_the_recipe(project: Project, jobs: list[PlannedJob]) -> None:
    """The recipe's float parts (the FP16 scheme, FP16 / FP32 override rules) need a target
    whose HTP runs float: refused before any stage runs, with the Precision page's reason."""
    keys = sorted({j.chip for j in jobs if j.chip})
    if not keys:
        return
    chips = [get_chip(k) for k in keys]
    why = scheme_refusal(project.quantization["scheme"], chips)
    if why is None and not is_float_scheme(project.quantization.scheme):
        found = override_refusals(project, None, chips=chips)
        why = found[0] if found else None
    if why:
        raise StudioError(why)
