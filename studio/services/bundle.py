"""Deployable bundles: build the Genie bundle of a project for one target chip (the
``bundle`` stage: Genie-ready graph, config, tokenizer, manifest, checked by Genie on the HTP
simulator) and copy it where the user wants it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.catalog import get_chip
from studio.core.errors import Cancelled, StudioError
from studio.core.fsutil import atomic_copytree, check_destination, check_output
from studio.core.progress import Progress
from studio.core.project import Project
from studio.core.stagegraph import STAGES
from studio.engine.bundle import bundle_template, simulator_folder
from studio.engine.chat_template import AS_WRITTEN, PromptFormat
from studio.engine.genie import GenieDialog
from studio.services.generate import stored_artifact
from studio.services.jobrunner import job_gates

#: a file every bundle holds: a folder with it is an earlier bundle, which ``--out`` replaces
BUNDLE_MARKER = "genie_config.json"


def stored_bundle(project: Project, target: str | None = None, parts: int | None = None,
                  prefill_length: int | None = None,
                  build: bool = True) -> tuple[Path, dict[str, Any]]:
    """(the bundle folder in the store, the stage's result) for ``target`` (default: the first
    target), running the bundle stage when the store does not hold it yet. ``parts``: the
    number of context binaries, ``prefill_length``: the AR-N prefill graph's N (None: the
    project's ``bundle`` settings)."""
    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    chip = get_chip(target or project.targets[0]).key
    if chip not in project.targets:
        raise StudioError(f"{chip} is not a target of this project: add it to targets first")
    p = project.copy()
    p.targets = [chip]
    if parts is not None:
        if parts < 1:
            raise StudioError(f"--parts must be at least 1, not {parts}")
        p.bundle["parts"] = parts
    if prefill_length is not None:
        if prefill_length < 1:
            raise StudioError(f"--prefill-length must be at least 1 (1: no prefill graph), "
                              f"not {prefill_length}")
        p.bundle["prefill_length"] = prefill_length
    folder = stored_artifact(p, f"bundle[{chip}]", "the Genie bundle", run=build)
    if folder is None:
        raise StudioError(f"there is no Genie bundle for {chip} with the project's current "
                          f"settings: build it first with studio bundle {project.path} "
                          f"--target {chip} (or on the Deploy page)")
    return folder / "bundle", json.loads((folder / "result.json").read_text())


def build_bundle(project: Project, target: str | None = None, out: Path | None = None,
                 parts: int | None = None, prefill_length: int | None = None) -> dict[str, Any]:
    """The bundle for ``target`` (built and checked by the bundle stage, or from the store)
    copied to ``out`` (default: the project folder's ``bundles/<chip>``), whole or not at all.
    Returns the stage's result with ``folder``."""
    if out is not None:  # before any work: a folder of other files is not replaced
        check_destination(Path(out), folder=True, marker=BUNDLE_MARKER)
    folder, result = stored_bundle(project, target, parts, prefill_length)
    dest = Path(out) if out else project.folder / "bundles" / result["target"]
    check_output(dest, folder=True, marker=BUNDLE_MARKER)
    atomic_copytree(folder, dest)
    # the project's gates on the binaries that ship (the bundle scored them like validate)
    gates = job_gates(STAGES["bundle"], project.gates, result["target"], result)
    return {**result, "folder": str(dest), "gates": gates,
            "gates_passed": all(g["passed"] for g in gates)}


def genie_generate(project: Project, prompt: str, target: str | None = None,
                   max_new_tokens: int | None = None,
                   on_text: Callable[[str], None] | None = None, build: bool = True,
                   progress: Progress | None = None, raw: bool = False,
                   on_format: Callable[[Any, str], None] | None = None) -> dict[str, Any]:
    """Greedy generation by Genie from the project's bundle on the HTP simulator: the text,
    and Genie's wall-clock figures labelled ``simulated``. Without ``build``, a bundle the
    store does not hold is an error (the playground does not start a build); ``progress``:
    cancellation between pieces of text (Genie is told to abort). The prompt goes to Genie
    through the chat template the bundle ships, rendered as an app renders it (``raw``: as
    written); ``on_format(format, text)`` is told before the first piece."""
    if not prompt.strip():
        raise StudioError("the prompt is empty: give some text")
    folder, result = stored_bundle(project, target, build=build)
    template = None if raw else bundle_template(folder)
    fmt = PromptFormat(template, f"chat template skipped (--raw): {AS_WRITTEN}" if raw else
                       f"the bundle ships no chat template: {AS_WRITTEN}")
    fed = fmt.text(prompt)
    n = max_new_tokens if max_new_tokens is not None else int(project.run["max_new_tokens"])
    stop = None
    if progress is not None:
        def stop() -> bool:
            try:
                progress.check()
            except Cancelled:
                return True
            return False

    with GenieDialog(simulator_folder(folder)) as dialog:
        if on_format is not None:
            on_format(fmt, fed)
        out = dialog.query(fed, n, on_text=on_text, stop=stop)
        load_s = dialog.load_s
    pieces, wall, first = out["pieces"], out["wall_s"], out["first_text_s"]
    rate = (pieces - 1) / (wall - first) if first is not None and pieces > 1 else None
    chip = result["target"]
    return {
        "prompt": prompt, "prompt_text": fed, "prompt_format": fmt.to_json(),
        "text": out["text"], "tokens_out": pieces, "runtime": "genie",
        "stopped": out["stopped"],
        "time_to_first_token_ms": first * 1e3 if first is not None else None,
        "decode_tokens_per_s": rate, "decode_ms_per_token": 1e3 / rate if rate else None,
        "source": "simulated", "device": f"htp-sim:{chip}",
        "device_name": f"Genie · HTP simulator ({chip})",
        "timing_note": "Genie's wall time on the simulator: follows the host CPU, not device "
                       "latency; the prompt goes through "
                       + (f"the AR-{result['prefill_ar']} prefill graph"
                          if result.get("prefill_ar") else "the AR-1 graph one token per pass"),
        "load_s": load_s, "bundle": str(folder),
    }
