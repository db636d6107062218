"""``studio doctor``: what stands between this machine, a project and a device and a run that
works — each check PASS / WARN / FAIL with the fix in one line (the seed's troubleshooting
table, asked before the work instead of after it).

- **machine**: Python, the packages the stages run on, the QNN backend and the SDK build it
  carries, Genie, the window's system libraries, free memory and disk against what the
  project's plan needs (the host memory model of :mod:`studio.core.hostmem`, the disk per
  parameter measured on the Qwen2.5-3B shape);
- **project**: the file, the model family, each part's compiled bytes and KV cache against
  one HTP graph's limit, the context against the model's, dynamic shapes, calibration and
  held-out data present and long enough;
- **device** (``agent:NAME`` or ``adb:SERIAL``): reachable, its QNN SDK build against the
  one the project's binaries were compiled with, its chips against the project's targets,
  library paths on a phone (``ADSP_LIBRARY_PATH``, ``/vendor/lib64`` precedence), free
  memory against the binaries.

Each check is a function of what it reads, so a test can make each one fail for real.
Nothing here imports Qt.
"""

from __future__ import annotations

import ctypes.util
import json
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from studio.core import project as projectfile
from studio.core.artifacts import ArtifactStore
from studio.core.catalog import get_chip
from studio.core.checks import FAIL, PASS, SKIP, WARN, Check
from studio.core.devices import adb_device, agent_device, device
from studio.core.errors import StudioError
from studio.core.hostmem import HEADROOM, available_memory
from studio.core.recipe import htp_refusals, weight_bits
from studio.core.stagegraph import DECLARATIONS, project_value
from studio.core.units import format_bytes
from studio.engine import hf_import, qnn
from studio.engine.checkpoint_check import prompt_length
from studio.engine.devices import backend
from studio.engine.genie import library_path
from studio.engine.onnx_import import open_onnx
from studio.services.deviceplan import draft_table_share, project_plans
from studio.services.devices import device_rows, package_version
from studio.services.history import current_keys
from studio.services.partplan import part_plan
from studio.worker.context import read_text

GIB = 1 << 30
#: one HTP graph's allocation limit: a compile fails past it ("estimated allocation of
#: 2347229 KB, limit is 2097152 KB", measured here)
HTP_GRAPH_LIMIT = 2097152 * 1024
#: the packages the stages run on (missing: FAIL) and the pins the README names
PACKAGES = ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-qnn")
PINS = {"torch": "2.13.0"}


def _gib(n: float) -> str:
    return format_bytes(int(n))


# ---- this machine -----------------------------------------------------------------------------
def check_python(version: tuple[int, int] | None = None) -> Check:
    v = version or sys.version_info[:2]
    text = f"Python {v[0]}.{v[1]}"
    if tuple(v) == (3, 11):
        return Check("machine", "python", PASS, text)
    return Check("machine", "python", WARN, f"{text}; the studio is built and tested on 3.11",
                 "install Python 3.11 and the studio into it (README, first command)")


def check_packages(version_of: Callable[[str], str | None] | None = None) -> list[Check]:
    get = version_of or package_version
    out = []
    for pkg in PACKAGES:
        v = get(pkg)
        if v is None:
            out.append(Check("machine", pkg, FAIL, "not installed",
                             "pip install -e . in the studio's folder (README, first command)"))
        elif pkg in PINS and v.split("+")[0] != PINS[pkg]:
            out.append(Check("machine", pkg, WARN, f"{v}; the studio pins {PINS[pkg]}",
                             f"pip install {pkg}=={PINS[pkg]}"))
        else:
            out.append(Check("machine", pkg, PASS, v))
    return out


def check_qnn() -> Check:
    """The QNN execution provider loads and offers its HTP device; the SDK build it carries
    is what every compile records."""
    try:
        qnn.register()
        v = qnn.versions()
        qnn._ep_devices()
    except (StudioError, ImportError, OSError) as exc:
        return Check("machine", "QNN HTP backend", FAIL, str(exc),
                     "pip install onnxruntime-qnn (README, first command)")
    return Check("machine", "QNN HTP backend", PASS,
                 f"onnxruntime-qnn {v['onnxruntime_qnn']}, QNN SDK build {v['qnn_sdk_build']} "
                 "(an x86 host: the HTP simulator, simulated timings)")


def check_genie() -> Check:
    try:
        p = library_path()
    except StudioError as exc:
        return Check("machine", "Genie", WARN, f"{exc}: bundles are built but not run here",
                     "install an onnxruntime-qnn that ships libGenie.so")
    return Check("machine", "Genie", PASS, f"{p.name} in {p.parent.name}")


def check_gui_libraries(find: Callable[[str], str | None] | None = None) -> Check:
    """The window's Qt platform plugin needs libxcb-cursor on Linux (the suite installs it;
    a machine that ran only the first README command may not have it)."""
    if platform.system() != "Linux":
        return Check("machine", "window libraries", SKIP, "not Linux")

    lookup = find or ctypes.util.find_library
    missing = [lib for lib in ("xcb-cursor", "EGL", "xkbcommon") if not lookup(lib)]
    if missing:
        return Check("machine", "window libraries", WARN,
                     "missing " + ", ".join(f"lib{m}" for m in missing)
                     + ": the window (studio FILE) will not start; batch work is unaffected",
                     "sudo bash packaging/install-system-deps.sh")
    return Check("machine", "window libraries", PASS, "libxcb-cursor, libEGL, libxkbcommon")


def check_memory(need: dict[str, int], available: int | None = None) -> Check:
    """Free memory now against the largest predicted stage peak of the project's plan."""
    free = available_memory() if available is None else int(available)
    if not need:
        return Check("machine", "memory", PASS, f"{_gib(free)} free (no plan to compare)")
    stage, peak = max(need.items(), key=lambda kv: kv[1])
    text = (f"{_gib(free)} free; the plan's largest stage, {stage}, is predicted to peak at "
            f"{_gib(peak)} (estimated)")
    if peak > free - HEADROOM:
        return Check("machine", "memory", FAIL, text,
                     "export in more parts (export.parts / export.max_part_mb) or free memory")
    if peak > 0.8 * free:
        return Check("machine", "memory", WARN, text + ": little to spare",
                     "close other programs before the run, or export in more parts")
    return Check("machine", "memory", PASS, text)


def check_disk(folder: Path, need: int | None, free: int | None = None) -> Check:
    where = folder if folder.exists() else next(
        (p for p in folder.parents if p.exists()), Path("/"))
    have = shutil.disk_usage(where).free if free is None else int(free)
    if not need:
        return Check("machine", "disk", PASS, f"{_gib(have)} free at {where}")
    text = (f"{_gib(have)} free at {where}; the project's artifacts take about {_gib(need)} "
            "(estimated)")
    if need > have:
        return Check("machine", "disk", FAIL, text,
                     "free disk space, or move the project to a larger disk")
    if need > 0.8 * have:
        return Check("machine", "disk", WARN, text + ": little to spare", "free disk space")
    return Check("machine", "disk", PASS, text)


# ---- the project ------------------------------------------------------------------------------
def _text_tokens(project, key: str, model: Path) -> tuple[Path, int]:
    path = project.input_path(project_value(project, key))
    text = read_text(path, key.split(".", 1)[1].replace("_", " "))
    return path, prompt_length(model, text)


def check_family(project) -> tuple[Check, Any]:
    kind = project.model["kind"]
    if kind != "causal-lm":
        return Check("project", "model", PASS, f"{kind} project"), None

    try:
        info = hf_import.open_checkpoint(project.input_path(project.model["source"]))
    except StudioError as exc:
        return Check("project", "model", FAIL, str(exc),
                     "point model.source at a supported Hugging Face checkpoint (studio new "
                     "--checkpoint)"), None
    return Check("project", "model", PASS,
                 f"{info.family} ({info.architecture}), {info.parameters / 1e6:,.1f} M "
                 f"parameters, {info.num_layers} blocks"), info


def check_parts(project, info, plan) -> list[Check]:
    """Each part's compiled weights and its blocks' KV cache against one HTP graph's limit,
    and the context against the model's."""
    out = []
    C = int(project.export["context_length"])
    if info.max_positions and C > info.max_positions:
        out.append(Check("project", "context length", FAIL,
                         f"export.context_length {C} is past the model's "
                         f"{info.max_positions} positions",
                         f"set export.context_length to at most {info.max_positions}"))
    else:
        out.append(Check("project", "context length", PASS,
                         f"{C} of the model's {info.max_positions:,} positions"))
    scheme = project.quantization["scheme"]
    bits = weight_bits(scheme)
    kv_bits = 8 if project.quantization["kv_cache"] == "int8" else 16
    per_layer_kv = info.kv_cache_bytes(C, kv_bits / 8) / max(1, info.num_layers)
    worst = None
    for p in plan.parts:
        blocks = p["blocks"][1] - p["blocks"][0] + 1
        total = -(-p["parameters"] * bits // 8) + int(per_layer_kv * blocks)
        if worst is None or total > worst[1]:
            worst = (p, total)
    assert worst is not None
    p, total = worst
    n = len(plan.parts)
    text = (f"{n} part{'s' if n != 1 else ''}; the largest, {p['name']} (blocks "
            f"{p['blocks'][0]}–{p['blocks'][1]}), holds {_gib(total)} of {scheme} weights and "
            f"KV cache at context {C} (estimated); one HTP graph allocates at most "
            f"{_gib(HTP_GRAPH_LIMIT)} (measured)")
    if total > HTP_GRAPH_LIMIT:
        out.append(Check("project", "parts vs the HTP graph limit", FAIL, text,
                         "export in more parts (export.parts = \"auto\", a smaller "
                         "export.max_part_mb) or lower export.context_length"))
    elif total > 0.9 * HTP_GRAPH_LIMIT:
        out.append(Check("project", "parts vs the HTP graph limit", WARN, text
                         + ": little room for activations", "export in one more part"))
    else:
        out.append(Check("project", "parts vs the HTP graph limit", PASS, text))
    return out


def check_device_plan(project) -> list[Check]:
    """Per target: what the NPU maps for the bundle (:mod:`studio.services.deviceplan`)
    against the chip's limits — FAIL naming the part count or scheme that would fit, WARN
    where the catalog does not know the limits."""
    try:
        plans = project_plans(project)
    except StudioError as exc:
        return [Check("project", "device memory plan", FAIL, str(exc),
                      "change export.parts / export.max_part_mb")]
    out = []
    for plan in plans or []:
        name = f"device memory plan ({plan.chip})"
        if plan.fits is None:
            out.append(Check("project", name, WARN, plan.summary(),
                             f"validate on a {plan.chip_name} device: the catalog does not "
                             "know its NPU's memory limits"))
        elif plan.fits:
            out.append(Check("project", name, PASS, plan.summary()))
        elif plan.suggestion:
            out.append(Check("project", name, FAIL, plan.summary(),
                             f"set {plan.suggestion_settings}"))
        else:
            out.append(Check("project", name, FAIL, plan.summary(),
                             "lower export.context_length, set quantization.kv_cache = "
                             "\"int8\" or take a smaller model"))
    return out


def check_texts(project, model: Path) -> list[Check]:
    """Calibration and held-out text present, readable, and long enough for what the
    recipe asks of them."""
    P = int(project.export["prompt_length"])
    scored = int(project.validation["heldout_tokens"])
    out = []
    # (key, tokens it must have, tokens it should have, what they are for, the setting to lower)
    for key, must, should, what, lower in (
            ("quantization.calibration_text",
             int(project.quantization["calibration_samples"]) * P,
             int(project.quantization["calibration_samples"]) * P,
             f"{project.quantization['calibration_samples']} calibration windows of {P}",
             "quantization.calibration_samples"),
            ("validation.heldout_text", P + 1, max(P + 1, scored),
             f"validation scores {scored} (one window of {P} and a next token at least)",
             "validation.heldout_tokens")):
        try:
            path, n = _text_tokens(project, key, model)
        except StudioError as exc:
            out.append(Check("project", key, FAIL, str(exc), f"set {key} to a UTF-8 text file"))
            continue
        text = f"{path.name}: {n:,} tokens; {what} take {should:,}"
        if n < must:
            out.append(Check("project", key, FAIL, text, f"give a longer text, or lower {lower}"))
        elif n < should:
            out.append(Check("project", key, WARN, text + f": only {n:,} are scored",
                             f"give a longer text, or lower {lower}"))
        else:
            out.append(Check("project", key, PASS, text))
    return out


def check_graph_inputs(project) -> list[Check]:
    """An ONNX graph project: fixed shapes for every input, and calibration samples."""
    out = []
    src = project.input_path(project.model["source"])
    try:
        model = open_onnx(src, check=False)
    except StudioError as exc:
        return [Check("project", "graph", FAIL, str(exc), "export the model to ONNX again")]
    given = dict(project.graph["shapes"] or {})
    inits = {i.name for i in model.graph.initializer}
    dynamic = [i.name for i in model.graph.input if i.name not in inits and i.name not in given
               and any(not d.HasField("dim_value") or d.dim_value <= 0
                       for d in i.type.tensor_type.shape.dim)]
    if dynamic:
        out.append(Check("project", "dynamic shapes", FAIL,
                         f"input(s) {', '.join(dynamic)} have no fixed shape: the HTP compiles "
                         "one shape", "give each one (studio new --onnx M --shape "
                         "NAME=1,3,224,224) or export with fixed lengths"))
    else:
        out.append(Check("project", "dynamic shapes", PASS, "every input has a fixed shape"))
    cal = project.graph["calibration"]
    if not cal:
        out.append(Check("project", "graph.calibration", FAIL, "no calibration samples",
                         "give a .npz with one array per input (studio new --calibration)"))
    elif not project.input_path(cal).is_file():
        out.append(Check("project", "graph.calibration", FAIL, f"no such file {cal}",
                         "give a .npz with one array per input"))
    else:
        out.append(Check("project", "graph.calibration", PASS, str(cal)))
    return out


def check_htp_options(project) -> Check:
    """The recipe's [htp] options against each target chip: a VTCM budget over the chip's,
    FP16 relaxation on a chip without FP16 (the compile would refuse them)."""
    h = project.htp
    bad = [why for key in project.targets for why in htp_refusals(h, get_chip(key))]
    if bad:
        return Check("project", "HTP options", FAIL, "; ".join(bad),
                     "lower htp.vtcm_mb (0: each chip's whole VTCM) or turn the option off "
                     "for these targets")
    opts = [f"{k} = {v}" for k, v in h.items() if v != type(h).default(k)]
    return Check("project", "HTP options", PASS,
                 ", ".join(opts) if opts else "the compiler's defaults")


def check_draft_table(project) -> list[Check]:
    """With a draft model: whether it reads the target's token table on the host CPU and the
    bytes that saves (:func:`studio.services.deviceplan.draft_table_share`) — WARN where
    the two could share one table but the draft's values differ."""
    try:
        share = draft_table_share(project)
    except StudioError as exc:
        return [Check("project", "draft's token table", WARN, str(exc), "")]
    if share is None:
        return []
    if share.values == "differ":
        return [Check("project", "draft's token table", WARN, share.line(),
                      "distil the draft with the target's table frozen (python -m "
                      "studio.samples.train --reuse-target does for the sample), or set "
                      "model.draft_embedding = \"target\" if it was distilled on it")]
    return [Check("project", "draft's token table", PASS, share.line())]


def disk_per_parameter(project) -> float:
    """The disk a causal-LM project's artifacts take per parameter: what each stage declares
    (:attr:`StageDecl.disk_per_parameter`, per target for a stage over targets), for the
    stages a run makes (an optional stage where the pipeline asks for it)."""
    per = 0.0
    for d in DECLARATIONS:
        if not d.disk_per_parameter or project.model["kind"] not in d.kinds:
            continue
        if d.optional and d.name not in project.pipeline["stages"]:
            continue
        per_target = d.fan_out == "target" and not d.disk_once
        per += d.disk_per_parameter * (len(project.targets) if per_target else 1)
    return per


def project_checks(project) -> tuple[list[Check], dict[str, int], int | None]:
    """The project's checks, the predicted stage peaks of its plan and the disk its
    artifacts take (estimated)."""
    out: list[Check] = []
    fam, info = check_family(project)
    out.append(fam)
    out.append(check_htp_options(project))
    peaks: dict[str, int] = {}
    disk = None
    if project.model["kind"] == "onnx-graph":
        out += check_graph_inputs(project)
    if info is not None:
        try:
            plan = part_plan(project)
        except StudioError as exc:
            out.append(Check("project", "parts", FAIL, str(exc),
                             "change export.parts / export.max_part_mb"))
            plan = None
        if plan is not None:
            out += check_parts(project, info, plan)
            out += check_device_plan(project)
            out += check_draft_table(project)
            peaks = {k: v for k, v in plan.peaks.items() if v}
            params = sum(p["parameters"] for p in plan.parts)
            disk = int(params * disk_per_parameter(project))
        out += check_texts(project, project.input_path(project.model["source"]))
    return out, peaks, disk


# ---- a device ---------------------------------------------------------------------------------
def compiled_sdk(project) -> tuple[str | None, str]:
    """The QNN SDK build of the project's compiled binaries for its current settings, and
    where it was read ("compiled" or "this machine's backend", the build a compile here
    records)."""
    if project is not None and project.path is not None:
        try:
            keys = current_keys(project, ["compile"])
        except StudioError:
            keys = {}
        store = ArtifactStore(project.folder / "artifacts")
        for label, key in keys.items():
            art = store.get(key) if label.startswith("compile") else None
            if art is not None:
                try:
                    sdk = json.loads((art.path / "result.json").read_text()).get("sdk_version")
                except (OSError, ValueError):
                    sdk = None
                if sdk:
                    return sdk, f"the project's compiled binaries ({label})"
    try:
        return qnn.versions().get("qnn_sdk_build"), "this machine's compiler (nothing " \
                                                   "compiled yet)"
    except (StudioError, ImportError, OSError):
        return None, "nowhere"


def agent_checks(name: str, project=None, registry=None,
                 sdk: tuple[str | None, str] | None = None) -> list[Check]:
    """An agent's checks (its backend's ``doctor_checks``) against the SDK build of the
    project's binaries (``sdk``: that build and where it was read; default: read now)."""
    return backend(agent_device(f"agent:{name}"), registry).doctor_checks(
        project, sdk or compiled_sdk(project))


def adb_checks(serial: str, project=None, registry=None) -> list[Check]:
    """A phone's checks (its backend's ``doctor_checks``); its chip is the project's one
    target."""
    dev = adb_device(f"adb:{serial}", list(project.targets) if project is not None else None)
    return backend(dev, registry).doctor_checks(project, compiled_sdk(project))


def device_choices() -> list[tuple[str, str]]:
    """(label, device id) of the devices the doctor can check: those of the kinds whose
    devices are other machines (the registry's agents, the phones adb lists; call it off the
    UI thread: adb may be slow)."""
    return [(r["label"], r["id"]) for r in device_rows(elsewhere=True) if not r.get("note")]


def device_checks(device_id: str, project=None) -> list[Check]:
    try:
        dev = device(device_id, list(project.targets) if project is not None else None)
    except StudioError as exc:
        return [Check("device", device_id, FAIL, str(exc),
                      "name agent:NAME or adb:SERIAL (studio devices list)")]

    return backend(dev).doctor_checks(project, compiled_sdk(project))


# ---- all of it ---------------------------------------------------------------------------------
def doctor(project_file: Path | None = None, device_id: str | None = None,
           on_check: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in the order machine, project, device; ``on_check`` sees each as it is
    made (the CLI prints as it goes, the window fills its table)."""
    out: list[Check] = []

    def add(cs: list[Check] | Check) -> None:
        for c in cs if isinstance(cs, list) else [cs]:
            out.append(c)
            if on_check is not None:
                on_check(c)

    add(check_python())
    add(check_packages())
    add(check_qnn())
    add(check_genie())
    add(check_gui_libraries())
    project = None
    peaks: dict[str, int] = {}
    disk = None
    pchecks: list[Check] = []
    if project_file is not None:
        try:
            project = projectfile.load(Path(project_file))
        except StudioError as exc:
            pchecks = [Check("project", "project file", FAIL, str(exc),
                             "fix the file, or make a new one with studio new")]
        else:
            pchecks = [Check("project", "project file", PASS, f"{project.name} "
                             f"({Path(project_file).name})")]
            more, peaks, disk = project_checks(project)
            pchecks += more
    add(check_memory(peaks))
    add(check_disk(project.folder if project is not None else Path.cwd(), disk))
    add(pchecks)
    if device_id:
        add(device_checks(device_id, project))
    return out


def verdict(checks: list[Check]) -> str:
    n = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    return f"{n[FAIL]} failed, {n[WARN]} warning(s), {n[PASS]} passed"
