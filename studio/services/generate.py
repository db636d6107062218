"""Generation on a project's deployed model, for ``studio generate`` and the GUI.

The host CPU runs the FP32 export; an HTP simulator device runs the compiled context
binaries of its chip (``simulated``). Prompts longer than the prefill graph are prefilled
in chunks; sampling is seeded; stop strings end the text.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core.artifacts import ArtifactStore
from studio.core.devices import Device, device
from studio.core.errors import StudioError
from studio.core.project import Project
from studio.core.sampling import Sampler, SamplingConfig


def _artifact(project: Project, label: str, stage_hint: str) -> Path:
    from studio.services.history import current_keys

    if project.path is None:
        raise StudioError("save the project to a file first: its results live in its folder")
    stage = label.split("[")[0]
    key = current_keys(project, [stage]).get(label)
    art = ArtifactStore(project.folder / "artifacts").get(key) if key else None
    if art is None:
        raise StudioError(f"no {stage} result for the current settings: run studio --batch "
                          f"{project.path} --stages {stage_hint}")
    return art.path


def resolve_device(project: Project, name: str | None) -> Device:
    """``cpu`` / ``host-cpu``, ``htp-sim`` (the first target) or ``htp-sim:CHIP``."""
    if not name or name in ("cpu", "host-cpu"):
        return device("cpu")
    if name == "htp-sim":
        return device(f"htp-sim:{project.targets[0]}")
    return device(name)


def load_generator(project: Project, dev: Device):
    """(generator, spec, tokenizer) for ``dev``."""
    from studio.worker.stages import _cpu_generator, _htp_generator, _spec, _tokenizer

    export_dir = _artifact(project, "export", "export")
    spec = _spec(export_dir)
    tok = _tokenizer(export_dir)
    if dev.kind == "host-cpu":
        return _cpu_generator(export_dir, spec), spec, tok
    from studio.core.catalog import get_chip

    chip = get_chip(dev.chip)
    if chip.key not in project.targets:
        raise StudioError(f"{chip.key} is not a target of this project: add it to targets "
                          "and run the compile stage")
    cdir = _artifact(project, f"compile[{chip.key}]", "compile")
    fp16 = project.quantization["scheme"] == "FP16"
    return _htp_generator(cdir, chip, spec, fp16), spec, tok


def load_draft(project: Project, draft_ref: str | None = None):
    """The draft model's CPU generator: the ``draft`` stage's export of ``draft_ref`` (default
    the project's ``model.draft``), run first when the store does not hold it yet."""
    from studio.engine.llm_export import load_spec
    from studio.services.history import current_keys
    from studio.worker.stages import _cpu_generator

    if draft_ref:
        project = project.copy()
        project.model["draft"] = draft_ref
    if not project.model.get("draft"):
        raise StudioError("the project has no draft model: set model.draft (for example "
                          "\"sample:tiny-coder-draft\"), give --draft REF or use --prompt-lookup")
    key = current_keys(project, ["draft"]).get("draft")
    store = ArtifactStore(project.folder / "artifacts")
    art = store.get(key) if key else None
    if art is None:
        import asyncio

        from studio.services.session import Studio

        s = Studio(project)
        try:
            summary = asyncio.run(s.run_pipeline(["draft"]))
        finally:
            s.close()
        art = store.get(key) if key else None
        if art is None:
            raise StudioError(f"the draft model could not be exported ({summary.state}): see "
                              f"studio --batch {project.path} --stages draft")
    return _cpu_generator(art.path, load_spec(art.path))


def generate(project: Project, prompt: str, device_name: str | None = None,
             max_new_tokens: int | None = None, sampling: SamplingConfig | None = None,
             stop: list[str] | None = None,
             on_text: Callable[[str], None] | None = None,
             speculative: str | None = None, draft_ref: str | None = None,
             k: int = 4, adaptive: bool = True) -> dict[str, Any]:
    """Generate after ``prompt`` on a device; the figures carry the device's source label.

    ``speculative``: None (plain decoding), ``"draft"`` (the draft model on the host CPU
    drafts, ``draft_ref`` or the project's ``model.draft``) or ``"lookup"`` (prompt
    lookup); up to ``k`` drafted tokens per target pass, adapted when ``adaptive``."""
    if not prompt.strip():
        raise StudioError("the prompt is empty: give some text")
    if speculative not in (None, "draft", "lookup"):
        raise StudioError(f"speculative must be draft or lookup, not {speculative!r}")
    dev = resolve_device(project, device_name)
    sampling = sampling or SamplingConfig()
    t_load = time.perf_counter()
    gen, spec, tok = load_generator(project, dev)
    proposer = None
    if speculative:
        from studio.engine.speculative import DraftModelProposer, PromptLookupProposer

        if not gen.verify_len:
            raise StudioError(
                "speculative decoding needs a verify graph, which only the host CPU's export "
                "has so far: use --device cpu" if dev.kind != "host-cpu" else
                "this export has no verify graph: re-run the export stage")
        proposer = (PromptLookupProposer() if speculative == "lookup"
                    else DraftModelProposer(load_draft(project, draft_ref), sampling))
    load_s = time.perf_counter() - t_load
    n = max_new_tokens if max_new_tokens is not None else int(project.run["max_new_tokens"])
    ids = tok(prompt).input_ids
    C = int(spec["context_length"])
    if len(ids) >= C:
        raise StudioError(f"the prompt is {len(ids)} tokens but the KV cache holds {C}: shorten "
                          "it or re-export with a longer export.context_length")
    stops = [s for s in (stop or []) if s]
    got: list[int] = []
    shown = [""]

    def step_cb(_i: int, token: int) -> None:  # streams the text as tokens arrive
        got.append(token)
        if on_text is not None:
            text = tok.decode(got)
            on_text(text[len(shown[0]):])
            shown[0] = text

    def stop_fn(tokens: list[int]) -> bool:
        return any(s in tok.decode(tokens) for s in stops)

    if proposer is not None:
        from studio.engine.speculative import speculative_generate

        out = speculative_generate(gen, proposer, ids, n, sampler=Sampler(sampling), k=k,
                                   adaptive=adaptive, eos_id=spec.get("eos_token_id"),
                                   stop=stop_fn if stops else None, on_step=step_cb)
    else:
        out = gen.generate(ids, n, sampler=Sampler(sampling), eos_id=spec.get("eos_token_id"),
                           stop=stop_fn if stops else None, on_step=step_cb)
    text = tok.decode(out["tokens"])
    if out["stopped"] == "stop":
        cut = min(text.find(s) for s in stops if s in text)
        text = text[:cut]
    steps = out["step_s"]
    med = statistics.median(steps) if steps else None
    decoded = len(out["tokens"]) - 1
    if "wall_s" in out:  # speculative: tokens come in groups; the rate over the whole decode
        med = out["wall_s"] / decoded if decoded > 0 else None
    result = {
        "prompt": prompt, "prompt_tokens": len(ids), "prompt_chunks": out["prompt_chunks"],
        "tokens": out["tokens"], "text": text, "stopped": out["stopped"],
        "time_to_first_token_ms": out["ttft_s"] * 1e3,
        "decode_ms_per_token": med * 1e3 if med else None,
        "decode_tokens_per_s": 1.0 / med if med else None,
        "source": dev.source, "device": dev.id, "device_name": dev.name,
        "timing_note": dev.timing_note, "load_s": load_s, "sampling": sampling.to_dict(),
    }
    if "speculative" in out:
        result["speculative"] = out["speculative"]
    return result
