"""Generation on a project's deployed model, for ``studio generate`` and the GUI.

The device's backend (``studio/engine/devices``) runs it: the host CPU the FP32 export, an
HTP simulator the compiled context binaries of its chip (``simulated``), an agent either on
its own machine, a phone its chip's compiled context over adb. Prompts longer than the
prefill graph are prefilled in chunks; sampling is seeded; stop strings end the text.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core import archs
from studio.core import perfmodel as pm
from studio.core.artifacts import ArtifactStore
from studio.core.devices import Device, resolve
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_folder
from studio.core.progress import Progress
from studio.core.project import Project
from studio.core.recipe import is_float_scheme
from studio.core.sampling import Sampler, SamplingConfig
from studio.core.stagegraph import STAGES, stage_for_role
from studio.engine.chat_template import prompt_format as fmt
from studio.engine.devices import backend
from studio.engine.kvquant import (
    KV_SCALES_FILE,
    calibrate_kv_scales,
    kv_bytes,
    write_int8_kv_graphs,
)
from studio.engine.llm_runtime import cpu_generator, load_graph_spec, load_tokenizer
from studio.engine.shared_table import TABLE, shared_draft_graphs, target_table
from studio.engine.speculative import DraftModelProposer, PromptLookupProposer, speculative_generate
from studio.engine.vision import image_prompt_ids, image_timing
from studio.services.deviceplan import draft_table_share
from studio.services.history import current_keys
from studio.services.session import Studio


def _artifact(project: Project, label: str, stage_hint: str) -> Path:
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
    """The device ``name`` names for the project (:func:`studio.core.devices.resolve`: a
    kind's shorthand such as ``cpu`` or ``htp-sim``, the first target's, or an id)."""
    return resolve(name, project.targets)


def run_stages(project: Project, stages: list[str], what: str) -> None:
    """Run ``stages`` of ``project`` (a copy with changed settings) through the pipeline: the
    store serves what it holds."""
    s = Studio(project)
    try:
        summary = asyncio.run(s.run_pipeline(stages))
    finally:
        s.close()
    if summary.state != "succeeded":
        if summary.error:  # the failing job's own one-line error says what to do
            raise StudioError(summary.error)
        raise StudioError(f"{what} could not be built ({summary.state}): see studio --batch "
                          f"{project.path} --stages {','.join(stages)}")


def stored_artifact(project: Project, label: str, what: str, run: bool = True) -> Path | None:
    """The stored artifact folder of job ``label`` (``stage`` or ``stage[target]``) for the
    project's current settings, running that stage first when the store lacks it (``run``;
    otherwise None)."""
    stage = label.split("[")[0]
    store = ArtifactStore(project.folder / "artifacts")
    key = current_keys(project, [stage]).get(label)
    art = store.get(key) if key else None
    if art is None and not run:
        return None
    if art is None:
        run_stages(project, [stage], what)
        art = store.get(key) if key else None
    if art is None:
        raise StudioError(f"{what} could not be built: see studio --batch {project.path} "
                          f"--stages {stage}")
    return art.path


def int8_kv_export(project: Project, export_dir: Path) -> Path:
    """The FP32 export with an INT8 KV cache (per-head scales from the project's calibration
    text), made once per export beside the artifacts (written in a temp folder, then moved)."""
    out = project.folder / "kv8" / export_dir.name
    if (out / KV_SCALES_FILE).is_file():
        return out
    spec = load_graph_spec(export_dir)
    text = project.input_path(project.quantization["calibration_text"]).read_text(
        encoding="utf-8", errors="replace")
    ids = load_tokenizer(export_dir)(text).input_ids
    scales = calibrate_kv_scales(cpu_generator(export_dir, spec), ids)
    with atomic_folder(out) as tmp:
        for f in export_dir.iterdir():
            if f.suffix != ".onnx":
                (shutil.copytree if f.is_dir() else shutil.copy2)(f, tmp / f.name)
        write_int8_kv_graphs(export_dir, tmp, scales)  # kv_scales.json last: the marker
    return out


def device_stage(project: Project, dev: Device) -> tuple[str, str]:
    """(stage, job label) of what ``dev`` runs beside the export (:attr:`Device.runs`):
    ``("compile", "compile[CHIP]")`` for an HTP, ``("quantize", "quantize")`` for a kind that
    runs the quantized graphs."""
    stage = stage_for_role(dev.runs, project.model.kind)
    if not stage:
        raise StudioError(f"{dev.name or dev.id} runs the {dev.runs} stage's graphs, which a "
                          f"{project.model.kind} project has none of")
    return stage, f"{stage}[{dev.chip}]" if STAGES[stage].fan_out == "target" else stage


def load_generator(project: Project, dev: Device, kv: str | None = None, registry=None,
                   speculative: bool = False, window: bool = False):
    """(generator, spec, tokenizer) for ``dev``, from its backend; ``kv`` "float" / "int8"
    (None: the project's ``quantization.kv_cache``). A device that runs the export (the host
    CPU) gets an INT8 KV cache from the export's calibrated copy; on a device that runs a
    stage's artifact (:attr:`Device.runs`: a target's compiled context, the quantized graphs)
    an INT8 KV cache is part of the quantized graphs: a project whose recipe says float gets
    that stage (and what it needs) run for a copy that says int8 (cached like any run).
    ``speculative`` / ``window``: the decoding asked for, which the backend refuses when it
    cannot run it."""
    project_kv = project.quantization.get("kv_cache", "float")
    be = backend(dev, registry)
    be.check_generation(speculative, window, kv, project_kv)
    kv = kv or project_kv
    if kv not in ("float", "int8"):
        raise StudioError(f"--kv takes float or int8, not {kv!r}")
    be.check()  # the device is there and set up: say so before looking for its graphs
    export_dir = _artifact(project, "export", "export")
    spec = load_graph_spec(export_dir)
    tok = load_tokenizer(export_dir)
    compiled = None
    if dev.runs == "export":
        export_dir = int8_kv_export(project, export_dir) if kv == "int8" else export_dir
    else:
        if dev.chip and dev.chip not in project.targets:
            raise StudioError(f"{dev.chip} is not a target of this project: add it to targets "
                              "and run the compile stage")
        stage, label = device_stage(project, dev)
        if kv != project_kv:
            project = project.copy()
            project.quantization["kv_cache"] = kv

            key = current_keys(project, [stage]).get(label)
            if key is None or ArtifactStore(project.folder / "artifacts").get(key) is None:
                run_stages(project, [stage], f"the {kv} KV cache graphs")
        compiled = _artifact(project, label, stage)
    fp16 = is_float_scheme(project.quantization.scheme)
    return be.open_generator(export_dir, compiled, spec, fp16), spec, tok


def load_encoder(project: Project, dev: Device, spec: dict[str, Any], registry=None):
    """The vision encoder of a vision-language project on ``dev``, from its backend (the
    export's graph on the host CPU, the target's compiled context on the HTP)."""
    export_dir = _artifact(project, "export", "export")
    compiled = None
    if dev.runs != "export":
        stage, label = device_stage(project, dev)
        compiled = _artifact(project, label, stage)
    fp16 = is_float_scheme(project.quantization.scheme)
    return backend(dev, registry).open_encoder(export_dir, compiled, spec, fp16)


def load_draft(project: Project, draft_ref: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The draft model's CPU generator: the ``draft`` stage's export of ``draft_ref`` (default
    the project's ``model.draft``), run first when the store does not hold it yet, and its
    token table: where the draft may read the target's (``model.draft_embedding``,
    :func:`studio.services.deviceplan.draft_table_share`), its graphs are rewritten to take
    the table as an input (once, beside the artifacts) and fed the target export's own
    array, so the generator holds no table of its own. Returns (generator, the verdict as a
    dict with ``graph_bytes_dropped``, measured on the graphs, where it is shared)."""
    if draft_ref:
        project = project.copy()
        project.model["draft"] = draft_ref
    if not project.model.get("draft"):
        raise StudioError("the project has no draft model: set model.draft (for example "
                          "\"sample:tiny-coder-draft\"), give --draft REF or use --prompt-lookup")
    folder = stored_artifact(project, "draft", "the draft model")
    assert folder is not None
    share = draft_table_share(project)
    assert share is not None
    table = share.to_dict()
    if not share.shareable:
        return cpu_generator(folder, load_graph_spec(folder)), table

    shared = project.folder / "draft-table" / folder.name
    done = shared_draft_graphs(folder, shared)
    table["graph_bytes_dropped"] = done["graph_bytes_dropped"]
    table["head"] = done["head"]
    gen = cpu_generator(shared, load_graph_spec(shared),
                        fixed_feeds={TABLE: target_table(_artifact(project, "export", "export"))})
    return gen, table


def prompt_format(project: Project, raw: bool = False):
    """How the project's prompts become ids (:class:`studio.engine.chat_template.PromptFormat`):
    the chat template the export carries (``model.chat_template``), or as written (``raw``:
    ``studio generate --raw``, the playground's chat template box cleared)."""
    return fmt(_artifact(project, "export", "export") / "tokenizer",
               project.model.chat_template, raw)


def generate(project: Project, prompt: str, device_name: str | None = None,
             max_new_tokens: int | None = None, sampling: SamplingConfig | None = None,
             stop: list[str] | None = None,
             on_text: Callable[[str], None] | None = None,
             speculative: str | None = None, draft_ref: str | None = None,
             k: int = 4, adaptive: bool = True, kv: str | None = None,
             window: int | None = None, progress: Progress | None = None,
             on_pass: Callable[[int, int], None] | None = None,
             registry=None, image: Path | None = None, raw: bool = False,
             on_format: Callable[[Any, str], None] | None = None,
             overlap: bool | None = None) -> dict[str, Any]:
    """Generate after ``prompt`` on a device (``cpu``, ``htp-sim[:CHIP]``, ``agent:NAME[@…]``,
    ``adb:SERIAL[@CHIP]``), run by its backend; the figures carry the device's source label.

    ``speculative``: None (plain decoding), ``"draft"`` (the draft model on the host CPU
    drafts, ``draft_ref`` or the project's ``model.draft``) or ``"lookup"`` (prompt
    lookup); up to ``k`` drafted tokens per target pass, adapted when ``adaptive``. ``kv``:
    the KV cache's kind (float / int8; None: the project's). ``window``: attend to the last
    W tokens through a ring buffer, which lets generation run past the context.
    ``progress``: cancellation between tokens (its check raises Cancelled). ``on_pass(drafted,
    accepted)``: each speculative target pass, as it happens. ``registry``: where agents and
    the QAIRT SDK are found (None: the user's settings). ``image``: a vision-language model's
    picture, run through its vision encoder on the device and placed before the prompt; the
    time to first token then includes the encoder's, shown apart (``image.encoder_ms``).
    The prompt goes in through the checkpoint's chat template (``model.chat_template``; an
    image where the template puts it), or as written with ``raw``: ``prompt_format`` and
    ``prompt_text`` in the result say which, and ``on_format(format, text)`` is told before
    the first token. ``overlap``: the draft model drafts the next window in its own thread
    while the target verifies (None: the project's ``run.speculative_overlap``)."""
    _check_request(prompt, speculative, overlap)
    dev = resolve_device(project, device_name)
    sampling = sampling or SamplingConfig()
    t_load = time.perf_counter()
    gen, spec, tok = load_generator(project, dev, kv, registry, bool(speculative), bool(window))
    if window is not None:
        gen.set_window(window)
        if speculative and window < gen.context_len:
            raise StudioError("speculative decoding verifies over the whole cache: use a "
                              f"window of {gen.context_len} (the context) or none")
    proposer, draft_table = _proposer(project, dev, gen, speculative, draft_ref, sampling)
    encoder = None
    if image is not None and spec.get("vision"):
        if speculative:
            raise StudioError("an image prompt runs plain decoding: leave out --speculative")
        encoder = load_encoder(project, dev, spec, registry)
    load_s = time.perf_counter() - t_load
    n = max_new_tokens if max_new_tokens is not None else int(project.run["max_new_tokens"])
    fmt, ids, image_figures, fed = _prompt_ids(project, raw, spec, tok, gen, prompt, image,
                                               encoder)
    if on_format is not None:  # taken: one line before the text
        on_format(fmt, fed)
    stream = _TextStream(tok, [s for s in (stop or []) if s], on_text)
    if proposer is not None:
        out = _speculative_decode(gen, proposer, ids, n, sampling, spec, stream, k, adaptive,
                                  on_pass, progress,
                                  (bool(project.run["speculative_overlap"])
                                   if overlap is None else overlap) and speculative == "draft")
    else:
        out = gen.generate(ids, n, sampler=Sampler(sampling), eos_id=spec.get("eos_token_id"),
                           stop=stream.stop_fn if stream.stops else None,
                           on_step=stream.step_cb, progress=progress)

    out, timing_note = backend(dev, registry).generation_figures(out, gen)
    result = {
        "prompt": prompt, "prompt_text": fed,
        "prompt_format": fmt.to_json(),
        "prompt_tokens": len(ids), "prompt_chunks": out["prompt_chunks"],
        "tokens": out["tokens"], "text": stream.final_text(out),
        "stopped": out["stopped"], **_timing(out, image_figures),
        "source": dev.source, "device": dev.id, "device_name": dev.name,
        "timing_note": timing_note, "load_s": load_s, "sampling": sampling.to_dict(),
    }
    result["kv_cache"] = _kv_cache_figures(gen, spec)  # None: a remote device keeps it there
    if "speculative" in out:
        result["speculative"] = out["speculative"]
        result["speculative"]["estimated"] = _speculative_estimate(
            project, spec, out["speculative"], speculative, draft_ref)
        result["speculative"]["draft_table"] = draft_table
    return result


def _speculative_decode(gen, proposer, ids: list[int], n: int, sampling: SamplingConfig,
                        spec: dict[str, Any], stream: _TextStream, k: int, adaptive: bool,
                        on_pass: Callable[[int, int], None] | None,
                        progress: Progress | None, overlap: bool) -> dict[str, Any]:
    return speculative_generate(gen, proposer, ids, n, sampler=Sampler(sampling), k=k,
                                adaptive=adaptive, eos_id=spec.get("eos_token_id"),
                                stop=stream.stop_fn if stream.stops else None,
                                on_step=stream.step_cb, on_pass=on_pass, progress=progress,
                                overlap=overlap)


def _check_request(prompt: str, speculative: str | None, overlap: bool | None) -> None:
    if not prompt.strip():
        raise StudioError("the prompt is empty: give some text")
    if speculative not in (None, "draft", "lookup"):
        raise StudioError(f"speculative must be draft or lookup, not {speculative!r}")
    if overlap and speculative != "draft":
        raise StudioError("overlapped drafting needs a draft model (prompt lookup drafts "
                          "without one, at no cost): drop --overlap or give --draft")


def _proposer(project: Project, dev: Device, gen, speculative: str | None,
              draft_ref: str | None, sampling: SamplingConfig) -> tuple[Any, Any]:
    """What drafts for speculative decoding (None: plain decoding), and the draft's token
    table (the target's or its own, and why; None without a draft model)."""
    proposer: Any = None
    draft_table = None  # the draft's token table: the target's or its own, and why
    if speculative:
        if not gen.verify_len:
            raise StudioError(
                "speculative decoding needs a verify graph, which only the host CPU's export "
                "has so far: use --device cpu" if dev.runs != "export" else
                "this export has no verify graph: re-run the export stage")
        if speculative == "lookup":
            proposer = PromptLookupProposer()
        else:
            draft_gen, draft_table = load_draft(project, draft_ref)
            proposer = DraftModelProposer(draft_gen, sampling)
    return proposer, draft_table


def _prompt_ids(project: Project, raw: bool, spec: dict[str, Any], tok, gen, prompt: str,
                image: Path | None, encoder) -> tuple[Any, list[int], Any, str]:
    """The prompt through the project's prompt format (an image's rows from the encoder
    where it puts them): the format, the ids, the image's figures and the text fed;
    refused where the cache cannot hold it."""
    fmt = prompt_format(project, raw)
    vl = bool(spec.get("vision"))
    with_image = image is not None and vl
    ids, image_figures = image_prompt_ids(
        spec, fmt.ids(tok, prompt, image=with_image, vision=vl), image, encoder, gen)
    fed = fmt.text(prompt, image=with_image)
    C = int(spec["context_length"])
    if len(ids) >= C:
        raise StudioError(f"the prompt is {len(ids)} tokens"
                          + (" (through the chat template)" if fmt.applied else "")
                          + f" but the KV cache holds {C}: shorten it or re-export with a "
                          "longer export.context_length")
    return fmt, ids, image_figures, fed


class _TextStream:
    """The new tokens as text: streamed to ``on_text`` as they arrive, checked against the
    stop strings, cut at the first one at the end."""

    def __init__(self, tok, stops: list[str], on_text: Callable[[str], None] | None) -> None:
        self.tok, self.stops, self.on_text = tok, stops, on_text
        self.got: list[int] = []
        self.shown = ""

    def step_cb(self, _i: int, token: int) -> None:  # streams the text as tokens arrive
        self.got.append(token)
        if self.on_text is not None:
            text = self.tok.decode(self.got)
            self.on_text(text[len(self.shown):])
            self.shown = text

    def stop_fn(self, tokens: list[int]) -> bool:
        return any(s in self.tok.decode(tokens) for s in self.stops)

    def final_text(self, out: dict[str, Any]) -> str:
        text = self.tok.decode(out["tokens"])
        if out["stopped"] == "stop":
            cut = min(text.find(s) for s in self.stops if s in text)
            text = text[:cut]
        return text


def _timing(out: dict[str, Any], image_figures) -> dict[str, Any]:
    """The time to the first token (an image's encoder included) and the decode rate."""
    steps = out["step_s"]
    med = statistics.median(steps) if steps else None
    decoded = len(out["tokens"]) - 1
    if "wall_s" in out:  # speculative: tokens come in groups; the rate over the whole decode
        med = out["wall_s"] / decoded if decoded > 0 else None
    ttft = out["ttft_s"] * 1e3 if out["ttft_s"] is not None else None
    if image_figures is not None and ttft is not None:
        # the encoder ran before the prefill: its time is the first token's too

        ttft = image_timing(image_figures, out, out["ttft_s"])["time_to_first_token_ms"]
    return {"time_to_first_token_ms": ttft, "image": image_figures,
            "decode_ms_per_token": med * 1e3 if med else None,
            "decode_tokens_per_s": 1.0 / med if med else None}


def _kv_cache_figures(gen, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The KV cache the host holds: its type and bytes, by formula and measured (None: a
    remote device keeps its cache there)."""
    if gen.cache is None:
        return None

    bits = int(gen.cache[0][0].dtype.itemsize * 8)
    return {
        "dtype": str(gen.cache[0][0].dtype), "bits": bits,
        "bytes_by_formula": kv_bytes(spec, bits),
        "bytes_measured": int(sum(a.nbytes for pair in gen.cache for a in pair)),
        "window": gen.ring_window,
    }


def generate_remote(project: Project, prompt: str, device_name: str,
                    max_new_tokens: int | None = None, sampling: SamplingConfig | None = None,
                    stop: list[str] | None = None,
                    on_text: Callable[[str], None] | None = None,
                    progress: Progress | None = None, registry=None) -> dict[str, Any]:
    """Generate on a registered agent (``agent:NAME[@BACKEND]``): :func:`generate` with
    plain decoding, the agent's devices found in ``registry``."""
    return generate(project, prompt, device_name, max_new_tokens, sampling, stop, on_text,
                    progress=progress, registry=registry)


def _speculative_estimate(project: Project, spec: dict[str, Any], stats: dict[str, Any],
                          mode: str | None, draft_ref: str | None) -> dict[str, Any] | None:
    """What the measured tokens per pass would give on the project's first target chip,
    where a decode step's time is the performance model's (``estimated``)."""
    try:
        cfg = json.loads((project.input_path(project.model["source"]) / "config.json")
                         .read_text())
        arch = archs.Arch.from_config(cfg)
        draft = None
        if mode == "draft":
            ref = draft_ref or project.model.get("draft")
            draft = archs.Arch.from_config(json.loads(
                (project.input_path(ref) / "config.json").read_text())) if ref else None
        scheme = project.quantization["scheme"]
        sch = archs.get_scheme(scheme)
        if project.quantization.get("kv_cache") == "int8":
            sch = pm.with_kv_bits(sch, 8)
        chip = project.targets[0]
        est = pm.speculative_estimate(arch, chip, sch, int(spec["context_length"]),
                                      stats["tokens_per_target_pass"], int(stats["k"]),
                                      draft=draft)
    except (StudioError, OSError, ValueError, KeyError):
        return None
    est.update({"chip": chip, "scheme": sch.name,
                "note": "decode and verify passes timed by the performance model; the drafts' "
                        "acceptance is the one measured here"})
    return est
