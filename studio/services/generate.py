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
from studio.core.progress import Progress
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
    """``cpu`` / ``host-cpu``, ``htp-sim`` (the first target), ``htp-sim:CHIP`` or
    ``adb:SERIAL[@CHIP]`` (the chip: the project's only target when not named)."""
    if not name or name in ("cpu", "host-cpu"):
        return device("cpu")
    if name == "htp-sim":
        return device(f"htp-sim:{project.targets[0]}")
    return device(name, list(project.targets))


def _run_stages(project: Project, stages: list[str], what: str) -> None:
    """Run ``stages`` of ``project`` (a copy with changed settings) through the pipeline: the
    store serves what it holds."""
    import asyncio

    from studio.services.session import Studio

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
    from studio.services.history import current_keys

    stage = label.split("[")[0]
    store = ArtifactStore(project.folder / "artifacts")
    key = current_keys(project, [stage]).get(label)
    art = store.get(key) if key else None
    if art is None and not run:
        return None
    if art is None:
        _run_stages(project, [stage], what)
        art = store.get(key) if key else None
    if art is None:
        raise StudioError(f"{what} could not be built: see studio --batch {project.path} "
                          f"--stages {stage}")
    return art.path


def int8_kv_export(project: Project, export_dir: Path) -> Path:
    """The FP32 export with an INT8 KV cache (per-head scales from the project's calibration
    text), made once per export beside the artifacts (written in a temp folder, then moved)."""
    import shutil

    from studio.core.fsutil import atomic_folder
    from studio.engine.kvquant import KV_SCALES_FILE, calibrate_kv_scales, write_int8_kv_graphs
    from studio.worker.stages import _cpu_generator, _spec, _tokenizer

    out = project.folder / "kv8" / export_dir.name
    if (out / KV_SCALES_FILE).is_file():
        return out
    spec = _spec(export_dir)
    text = project.input_path(project.quantization["calibration_text"]).read_text(
        encoding="utf-8", errors="replace")
    ids = _tokenizer(export_dir)(text).input_ids
    scales = calibrate_kv_scales(_cpu_generator(export_dir, spec), ids)
    with atomic_folder(out) as tmp:
        for f in export_dir.iterdir():
            if f.suffix != ".onnx":
                (shutil.copytree if f.is_dir() else shutil.copy2)(f, tmp / f.name)
        write_int8_kv_graphs(export_dir, tmp, scales)  # kv_scales.json last: the marker
    return out


def load_generator(project: Project, dev: Device, kv: str | None = None):
    """(generator, spec, tokenizer) for ``dev``; ``kv`` "float" / "int8" (None: the
    project's ``quantization.kv_cache``). On the HTP an INT8 KV cache is part of the
    quantized graphs: a project whose recipe says float gets its quantize and compile
    stages run for a copy that says int8 (cached like any run)."""
    from studio.worker.stages import _cpu_generator, _htp_generator, _spec, _tokenizer

    kv = kv or project.quantization.get("kv_cache", "float")
    if kv not in ("float", "int8"):
        raise StudioError(f"--kv takes float or int8, not {kv!r}")
    export_dir = _artifact(project, "export", "export")
    spec = _spec(export_dir)
    tok = _tokenizer(export_dir)
    if dev.kind == "host-cpu":
        graphs = int8_kv_export(project, export_dir) if kv == "int8" else export_dir
        return _cpu_generator(graphs, spec), spec, tok
    from studio.core.catalog import get_chip

    chip = get_chip(dev.chip)
    if chip.key not in project.targets:
        raise StudioError(f"{chip.key} is not a target of this project: add it to targets "
                          "and run the compile stage")
    if dev.kind == "adb":
        if kv != project.quantization.get("kv_cache", "float"):
            raise StudioError("a phone runs the project's own compiled graphs: leave out --kv "
                              "for adb devices")
        from studio.worker.stages import adb_generator, adb_phone

        adb_phone(dev)  # no SDK set: say so before looking for the compiled graphs
        gen, _pre, _dec = adb_generator(_artifact(project, f"compile[{chip.key}]", "compile"),
                                        dev, spec)
        return gen, spec, tok
    if kv != project.quantization.get("kv_cache", "float"):
        project = project.copy()
        project.quantization["kv_cache"] = kv
        from studio.services.history import current_keys

        key = current_keys(project, ["compile"]).get(f"compile[{chip.key}]")
        if key is None or ArtifactStore(project.folder / "artifacts").get(key) is None:
            _run_stages(project, ["compile"], f"the {kv} KV cache graphs")
    cdir = _artifact(project, f"compile[{chip.key}]", "compile")
    fp16 = project.quantization["scheme"] == "FP16"
    return _htp_generator(cdir, chip, spec, fp16), spec, tok


def load_draft(project: Project, draft_ref: str | None = None):
    """The draft model's CPU generator: the ``draft`` stage's export of ``draft_ref`` (default
    the project's ``model.draft``), run first when the store does not hold it yet."""
    from studio.engine.llm_export import load_spec
    from studio.worker.stages import _cpu_generator

    if draft_ref:
        project = project.copy()
        project.model["draft"] = draft_ref
    if not project.model.get("draft"):
        raise StudioError("the project has no draft model: set model.draft (for example "
                          "\"sample:tiny-coder-draft\"), give --draft REF or use --prompt-lookup")
    folder = stored_artifact(project, "draft", "the draft model")
    assert folder is not None
    return _cpu_generator(folder, load_spec(folder))


def generate(project: Project, prompt: str, device_name: str | None = None,
             max_new_tokens: int | None = None, sampling: SamplingConfig | None = None,
             stop: list[str] | None = None,
             on_text: Callable[[str], None] | None = None,
             speculative: str | None = None, draft_ref: str | None = None,
             k: int = 4, adaptive: bool = True, kv: str | None = None,
             window: int | None = None, progress: Progress | None = None,
             on_pass: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Generate after ``prompt`` on a device; the figures carry the device's source label.

    ``speculative``: None (plain decoding), ``"draft"`` (the draft model on the host CPU
    drafts, ``draft_ref`` or the project's ``model.draft``) or ``"lookup"`` (prompt
    lookup); up to ``k`` drafted tokens per target pass, adapted when ``adaptive``. ``kv``:
    the KV cache's kind (float / int8; None: the project's). ``window``: attend to the last
    W tokens through a ring buffer, which lets generation run past the context.
    ``progress``: cancellation between tokens (its check raises Cancelled). ``on_pass(drafted,
    accepted)``: each speculative target pass, as it happens."""
    if not prompt.strip():
        raise StudioError("the prompt is empty: give some text")
    if speculative not in (None, "draft", "lookup"):
        raise StudioError(f"speculative must be draft or lookup, not {speculative!r}")
    if device_name and device_name.startswith("agent:"):
        if speculative or kv or window:
            raise StudioError("a remote agent runs plain decoding so far: leave out "
                              "--speculative, --kv and --window for agent devices")
        return generate_remote(project, prompt, device_name, max_new_tokens, sampling, stop,
                               on_text, progress)
    dev = resolve_device(project, device_name)
    if dev.kind == "adb" and (speculative or window):
        raise StudioError("a phone over adb runs plain decoding: leave out --speculative and "
                          "--window for adb devices")
    sampling = sampling or SamplingConfig()
    t_load = time.perf_counter()
    gen, spec, tok = load_generator(project, dev, kv)
    if window is not None:
        gen.set_window(window)
        if speculative and window < gen.context_len:
            raise StudioError("speculative decoding verifies over the whole cache: use a "
                              f"window of {gen.context_len} (the context) or none")
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
                                   stop=stop_fn if stops else None, on_step=step_cb,
                                   on_pass=on_pass, progress=progress)
    else:
        out = gen.generate(ids, n, sampler=Sampler(sampling), eos_id=spec.get("eos_token_id"),
                           stop=stop_fn if stops else None, on_step=step_cb, progress=progress)
    timing_note = dev.timing_note
    if dev.kind == "adb":
        from studio.worker.stages import adb_timings

        timed = adb_timings(out, gen.prefill_session, gen.decode_session)
        if timed is None:  # round trips are not the graph's latency: no figures then
            out = {**out, "ttft_s": None, "step_s": []}
            timing_note = ("no device times: the SDK has no qnn-profile-viewer to read "
                           "qnn-net-run's profiling logs (adb round trips are not latency)")
        else:
            out = {**timed, "ttft_s": timed["prefill_s"]}
            timing_note += "; time to first token is the prefill's execute time"
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
        "time_to_first_token_ms": out["ttft_s"] * 1e3 if out["ttft_s"] is not None else None,
        "decode_ms_per_token": med * 1e3 if med else None,
        "decode_tokens_per_s": 1.0 / med if med else None,
        "source": dev.source, "device": dev.id, "device_name": dev.name,
        "timing_note": timing_note, "load_s": load_s, "sampling": sampling.to_dict(),
    }
    from studio.engine.kvquant import kv_bytes

    bits = int(gen.cache[0][0].dtype.itemsize * 8)
    result["kv_cache"] = {
        "dtype": str(gen.cache[0][0].dtype), "bits": bits,
        "bytes_by_formula": kv_bytes(spec, bits),
        "bytes_measured": int(sum(a.nbytes for pair in gen.cache for a in pair)),
        "window": gen.ring_window,
    }
    if "speculative" in out:
        result["speculative"] = out["speculative"]
        result["speculative"]["estimated"] = _speculative_estimate(
            project, spec, out["speculative"], speculative, draft_ref)
    return result


def generate_remote(project: Project, prompt: str, device_name: str,
                    max_new_tokens: int | None = None, sampling: SamplingConfig | None = None,
                    stop: list[str] | None = None,
                    on_text: Callable[[str], None] | None = None,
                    progress: Progress | None = None, registry=None) -> dict[str, Any]:
    """Generate on a registered agent: its host CPU runs the FP32 export, an HTP backend the
    target's compiled context; the files go up by content hash (once), the tokens stream back,
    and the figures carry the source label the agent gives its backend."""
    import json

    from studio.core.catalog import get_chip
    from studio.services.registry import Registry, parse_device_id
    from studio.worker.stages import _spec, _tokenizer

    name, backend = parse_device_id(device_name)
    reg = registry or Registry()
    client = reg.client(name)
    t_load = time.perf_counter()
    info = client.info()
    backends = {b["id"]: b for b in info.get("backends", [])}
    if backend not in backends:
        raise StudioError(f"agent {name!r} has no backend {backend!r}; it has "
                          f"{', '.join(backends) or 'none'}")
    b = backends[backend]
    export_dir = _artifact(project, "export", "export")
    spec = _spec(export_dir)
    tok = _tokenizer(export_dir)
    sdk = None
    if backend == "cpu":
        names = [n for n in ("prefill.onnx", "decode.onnx", "graph.json")
                 if (export_dir / n).is_file()]
        model = client.upload_folder(export_dir, names)
    else:
        chip = get_chip(b["chip"])
        if chip.key not in project.targets:
            raise StudioError(f"{chip.key} is not a target of this project: add it to targets "
                              "and run the compile stage")
        cdir = _artifact(project, f"compile[{chip.key}]", "compile")
        sdk = json.loads((cdir / "result.json").read_text()).get("sdk_version")
        names = [p.name for p in sorted(cdir.iterdir())
                 if p.is_file() and (p.name.endswith((".onnx", ".bin")) or p.name == "graph.json")]
        model = client.upload_folder(cdir, names)
    load_s = time.perf_counter() - t_load
    sampling = sampling or SamplingConfig()
    n = max_new_tokens if max_new_tokens is not None else int(project.run["max_new_tokens"])
    ids = tok(prompt).input_ids
    stops = [x for x in (stop or []) if x]
    got: list[int] = []
    shown = [""]
    stopped = [False]

    def on_token(_i: int, token: int) -> None:
        got.append(token)
        text = tok.decode(got)
        if on_text is not None:
            on_text(text[len(shown[0]):])
        shown[0] = text
        if stops and any(x in text for x in stops):
            stopped[0] = True

    def should_stop() -> bool:
        if progress is not None:
            progress.check()
        return stopped[0]

    eos = spec.get("eos_token_ids") or ([spec["eos_token_id"]]
                                        if spec.get("eos_token_id") is not None else [])
    try:
        out = client.generate(model, backend, ids, n, sampling.to_dict(), eos, sdk,
                              on_token=on_token, should_stop=should_stop)
        state = out["stopped"]
    except StudioError as exc:
        if not (stopped[0] and "cancelled" in exc.message):
            raise
        out = {"tokens": got, "ttft_s": 0.0, "step_s": [], "prompt_chunks": 0,
               "source": b["source"]}
        state = "stop"
    text = tok.decode(out["tokens"])
    if state == "stop" and stops:
        cuts = [text.find(x) for x in stops if x in text]
        text = text[:min(cuts)] if cuts else text
    steps = out.get("step_s") or []
    med = statistics.median(steps) if steps else None
    source = str(out.get("source") or b["source"])
    return {
        "prompt": prompt, "prompt_tokens": len(ids), "prompt_chunks": out.get("prompt_chunks"),
        "tokens": out["tokens"], "text": text, "stopped": state,
        "time_to_first_token_ms": float(out.get("ttft_s") or 0.0) * 1e3,
        "decode_ms_per_token": med * 1e3 if med else None,
        "decode_tokens_per_s": 1.0 / med if med else None,
        "source": source, "device": f"agent:{name}@{backend}",
        "device_name": f"{backend} on agent {name} ({info['machine'].get('name')})",
        "timing_note": ("timed on the agent's machine" + (
            "; simulator time: follows the agent's CPU, not device latency"
            if source == "simulated" else "")),
        "load_s": load_s, "sampling": sampling.to_dict(),
        "kv_cache": None,
    }


def _speculative_estimate(project: Project, spec: dict[str, Any], stats: dict[str, Any],
                          mode: str | None, draft_ref: str | None) -> dict[str, Any] | None:
    """What the measured tokens per pass would give on the project's first target chip,
    where a decode step's time is the performance model's (``estimated``)."""
    import json

    from studio.core import perfmodel as pm

    try:
        cfg = json.loads((project.input_path(project.model["source"]) / "config.json")
                         .read_text())
        arch = pm.Arch.from_config(cfg)
        draft = None
        if mode == "draft":
            ref = draft_ref or project.model.get("draft")
            draft = pm.Arch.from_config(json.loads(
                (project.input_path(ref) / "config.json").read_text())) if ref else None
        scheme = project.quantization["scheme"]
        sch = pm.get_scheme(scheme)
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
