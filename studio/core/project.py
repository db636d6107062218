"""The ``.qstudio`` project file: TOML, human-diffable, versioned, validated, saved atomically.

A project file sits next to its project folder ``<stem>.studio/`` (artifacts, run history,
reports). Paths inside the file are relative to the file's folder; ``sample:NAME`` names a
model or text shipped with the studio.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.core.devices import PROJECT_KINDS, check_kinds
from studio.core.errors import StudioError
from studio.core.fsutil import atomic_write_text
from studio.core.layerdiff import check_settings as check_layerdiff
from studio.core.recipe import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_CALIBRATION_SAMPLES,
    DEFAULT_GATES,
    DEFAULT_GRANULARITY,
    DEFAULT_SCHEME,
    PRECISIONS,
    check_recipe,
)
from studio.core.stagegraph import DEFAULT_STAGES, MODEL_KINDS, default_stages, kind_stages
from studio.core.stagegraph import STAGE_NAMES as STAGES

SCHEMA_VERSION = 1

# Each section: key -> (type, default). ``None`` default means required.
_SECTIONS: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    # kind: "causal-lm" (a checkpoint), "encoder" (a sentence encoder's PyTorch weights) or
    # "onnx-graph" (any ONNX file); each kind runs its own declared stages
    "model": {"source": (str, None), "draft": (str, ""), "kind": (str, "causal-lm")},
    "export": {"prompt_length": (int, 32), "context_length": (int, 128)},
    "quantization": {
        "scheme": (str, DEFAULT_SCHEME),
        "weight_granularity": (str, DEFAULT_GRANULARITY),
        "calibration_text": (str, "sample:calibration"),
        "calibration_samples": (int, DEFAULT_CALIBRATION_SAMPLES),
        "calibration_method": (str, DEFAULT_CALIBRATION_METHOD),
        "block_size": (int, DEFAULT_BLOCK_SIZE),
        "kv_cache": (str, "float"),
        "overrides": (dict, {}),
        "placement": (str, "strict"),
    },
    "validation": {
        "heldout_text": (str, "sample:heldout"),
        "heldout_tokens": (int, 256),
        "greedy_tokens": (int, 16),
    },
    "gates": {key: ((int, float), value) for key, value in DEFAULT_GATES.items()},
    "run": {
        "prompt": (str, "def __init__(self"),
        "max_new_tokens": (int, 16),
        "devices": (list, list(PROJECT_KINDS)),
    },
    "pipeline": {"stages": (list, list(DEFAULT_STAGES))},
    # pruning by ablation: the blocks whose removal costs the least perplexity are dropped
    "pruning": {"drop_blocks": (int, 1)},
    # the optimization waterfall: the attention window (0: half the context), the speculative
    # k, and the tokens generated per timing
    "waterfall": {"window": (int, 0), "k": (int, 4), "new_tokens": (int, 48)},
    # the Genie bundle's check: Genie's greedy text against the studio's on ``prompts``
    # held-out prompts, up to ``new_tokens`` each (fewer when the context is shorter); the
    # decode graph goes into ``parts`` context binaries of consecutive blocks (0: as many as
    # keep each within ``max_context_mb``); prompts go through an AR-N prefill graph of
    # ``prefill_length`` tokens per pass (0: the export's prompt length; 1: none, one token
    # per pass through the decode graph)
    "bundle": {"new_tokens": (int, 96), "prompts": (int, 3), "parts": (int, 0),
               "max_context_mb": (int, 1536), "prefill_length": (int, 0)},
    # per-layer precision sensitivity: held-out tokens scored per variant, the precision a
    # layer is raised to ("auto": INT16 over W8A8, FP16 over W8A16) and lowered to ("": none)
    "sensitivity": {
        "heldout_tokens": (int, 128),
        "high": (str, "auto"),
        "low": (str, "INT4"),
        # a chip whose HTP simulator scores the top ``confirm_top`` entries of the raise
        # ranking again ("": host figures only)
        "confirm_on_htp": (str, ""),
        "confirm_top": (int, 3),
    },
    # auto mixed precision: the target ("perplexity": within max_perplexity_change of FP32,
    # either way; "cosine": mean logits cosine vs FP32 at least min_logits_cosine)
    "autoprecision": {
        "metric": (str, "perplexity"),
        "max_perplexity_change": ((int, float), 0.02),
        "min_logits_cosine": ((int, float), 0.999),
    },
    # the layer-wise diff (FP32 vs host QDQ vs HTP, tensor by tensor, on the prefill graph):
    # how many held-out windows of P tokens, and which tensors ("blocks": the residual
    # stream between blocks; "modules": and every module's output; "all": every tensor)
    "layerdiff": {
        "windows": (int, 2),
        "tensors": (str, "modules"),
    },
    # the profiler: how many times one decode step is profiled (the simulator's figures
    # follow host load: the median and spread of the repeats are kept)
    "profile": {
        "repeats": (int, 5),
    },
    # encoders and ONNX graphs: the static input shapes (name -> dims, for inputs with
    # symbolic dims), the encoder's sequence length, calibration and validation samples
    # (.npz / .npy; "" for an encoder: its text through the tokenizer; "" validation: the last
    # calibration samples) and how many timed inferences the run stage takes
    "graph": {
        "shapes": (dict, {}),
        "seq_len": (int, 128),
        "calibration": (str, ""),
        "validation": (str, ""),
        "repeats": (int, 5),
    },
}
_TOP = {"schema_version", "name", "targets", "sweeps", *_SECTIONS}


@dataclass
class Project:
    """The validated content of a project file, plus where it lives."""

    name: str
    model: dict[str, Any]
    export: dict[str, Any]
    quantization: dict[str, Any]
    validation: dict[str, Any]
    gates: dict[str, Any]
    run: dict[str, Any]
    pipeline: dict[str, Any]
    targets: list[str] = field(default_factory=list)
    sensitivity: dict[str, Any] = field(default_factory=lambda: _defaults("sensitivity"))
    autoprecision: dict[str, Any] = field(default_factory=lambda: _defaults("autoprecision"))
    layerdiff: dict[str, Any] = field(default_factory=lambda: _defaults("layerdiff"))
    profile: dict[str, Any] = field(default_factory=lambda: _defaults("profile"))
    pruning: dict[str, Any] = field(default_factory=lambda: _defaults("pruning"))
    waterfall: dict[str, Any] = field(default_factory=lambda: _defaults("waterfall"))
    bundle: dict[str, Any] = field(default_factory=lambda: _defaults("bundle"))
    graph: dict[str, Any] = field(default_factory=lambda: _defaults("graph"))
    # recipe sweeps ([[sweeps]] tables, validated by studio.core.sweep.parse_spec)
    sweeps: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None

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
            from studio.core import samples

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
        for section in _SECTIONS:
            d[section] = copy.deepcopy(getattr(self, section))
        if not d["model"].get("draft"):
            d["model"].pop("draft", None)  # no draft model: leave the key out of the file
        d["targets"] = list(self.targets)
        if self.sweeps:
            d["sweeps"] = copy.deepcopy(self.sweeps)
        return d

    def copy(self) -> Project:
        p = from_dict(self.to_dict())
        p.path = self.path
        return p


def _defaults(section: str) -> dict[str, Any]:
    return {k: copy.deepcopy(default) for k, (_, default) in _SECTIONS[section].items()}


def _check_sensitivity(p: Project) -> None:
    s, a = p.sensitivity, p.autoprecision
    if s["heldout_tokens"] < 16:
        raise StudioError("sensitivity.heldout_tokens must be at least 16")
    if s["high"] not in ("auto", *PRECISIONS):
        raise StudioError(
            f"sensitivity.high = {s['high']!r} is not one of auto, {', '.join(PRECISIONS)}"
        )
    if s["low"] not in ("", *PRECISIONS):
        raise StudioError(
            f"sensitivity.low = {s['low']!r} is not one of {', '.join(PRECISIONS)} "
            "(or \"\" to skip lowering)"
        )
    if not 1 <= s["confirm_top"] <= 64:
        raise StudioError(
            "sensitivity.confirm_top must be between 1 and 64 (entries of the ranking scored "
            "again on the HTP simulator)"
        )
    if s["confirm_on_htp"]:
        from studio.core.catalog import load_catalog

        chips = list(load_catalog())
        if s["confirm_on_htp"] not in chips:
            raise StudioError(
                f"sensitivity.confirm_on_htp = {s['confirm_on_htp']!r} is not a known chip "
                f"({', '.join(chips)}; \"\" for host figures only)"
            )
    if a["metric"] not in ("perplexity", "cosine"):
        raise StudioError(
            f"autoprecision.metric = {a['metric']!r}: use \"perplexity\" or \"cosine\""
        )
    if a["max_perplexity_change"] < 0:
        raise StudioError("autoprecision.max_perplexity_change must be 0 or more (0.02 = 2 %)")
    if not 0.0 < a["min_logits_cosine"] <= 1.0:
        raise StudioError("autoprecision.min_logits_cosine must be above 0 and at most 1")


def _fmt_allowed(keys) -> str:
    return ", ".join(sorted(keys))


def _check_type(where: str, key: str, value: Any, typ) -> None:
    names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
    if isinstance(value, bool) and typ in (int, (int, float)):
        raise StudioError(f"{where}.{key} must be a {names}, not {value!r}")
    if not isinstance(value, typ):
        raise StudioError(f"{where}.{key} must be a {names}, not {type(value).__name__} {value!r}")


def _validate(p: Project) -> None:
    if not p.name.strip():
        raise StudioError("name must not be empty")
    if not p.model["source"]:
        raise StudioError("model.source is required: a checkpoint folder or sample:tiny-coder")
    e = p.export
    if e["prompt_length"] < 1:
        raise StudioError("export.prompt_length must be at least 1")
    if e["context_length"] <= e["prompt_length"]:
        raise StudioError(
            f"export.context_length ({e['context_length']}) must be larger than "
            f"export.prompt_length ({e['prompt_length']})"
        )
    if e["context_length"] > 4096:
        raise StudioError("export.context_length must be at most 4096")
    check_recipe(p.quantization)
    _check_sensitivity(p)
    w = p.waterfall
    if w["window"] < 0 or w["k"] < 1 or w["k"] > 16 or w["new_tokens"] < 2:
        raise StudioError("waterfall: window must be >= 0 (0: half the context), k 1..16 and "
                          "new_tokens at least 2")
    b = p.bundle
    if b["new_tokens"] < 1 or not 1 <= b["prompts"] <= 8 or b["parts"] < 0 or (
            b["max_context_mb"] < 16) or b["prefill_length"] < 0:
        raise StudioError("bundle: new_tokens must be at least 1, prompts 1..8, parts >= 0 "
                          "(0: by max_context_mb), max_context_mb at least 16 and "
                          "prefill_length >= 0 (0: the prompt length, 1: no prefill graph)")
    if p.pruning["drop_blocks"] < 1:
        raise StudioError("pruning.drop_blocks must be at least 1 (the blocks the pruned "
                          "checkpoint leaves out)")
    check_layerdiff(p.layerdiff["windows"], p.layerdiff["tensors"])
    if not 1 <= p.profile["repeats"] <= 50:
        raise StudioError(
            f"profile.repeats = {p.profile['repeats']} must be between 1 and 50 (each repeat "
            "profiles one decode step on the simulator; 5 gives a median and a spread)"
        )
    for key, val in p.gates.items():
        if not 0.0 <= float(val) <= 1.0 and key != "max_perplexity_increase":
            raise StudioError(f"gates.{key} must be between 0 and 1, not {val}")
    if p.validation["heldout_tokens"] < 16:
        raise StudioError("validation.heldout_tokens must be at least 16")
    C = e["context_length"]
    for key, value in (("run.max_new_tokens", p.run["max_new_tokens"]),
                       ("validation.greedy_tokens", p.validation["greedy_tokens"])):
        if value < 1:
            raise StudioError(f"{key} must be at least 1, not {value}")
        if value > C - 1:
            raise StudioError(
                f"{key} = {value} is more than the exported context allows (at most "
                f"{C - 1} after a one-token prompt, export.context_length = {C}): lower it "
                "or raise export.context_length"
            )
    if not p.run["prompt"].strip():
        raise StudioError("run.prompt is empty: give the text generation starts from")
    check_kinds(p.run["devices"])
    if not p.pipeline["stages"]:
        raise StudioError("pipeline.stages is empty: name the stages to run, e.g. "
                          + ", ".join(f'"{s}"' for s in STAGES))
    kind = p.model["kind"]
    for st in p.pipeline["stages"]:
        if st not in STAGES:
            raise StudioError(f"pipeline.stages: unknown stage {st!r}; known: {', '.join(STAGES)}")
        if st not in kind_stages(kind):
            raise StudioError(
                f"pipeline.stages: {st!r} is not a stage of a {kind} project (model.kind); its "
                f"stages: {', '.join(kind_stages(kind))}")
    _check_graph(p)
    from studio.core.catalog import get_chip

    if not p.targets:
        raise StudioError("targets is empty: name at least one chip (see studio targets)")
    for t in p.targets:
        get_chip(t)  # raises a StudioError naming the known targets


def _check_graph(p: Project) -> None:
    g, kind, src = p.graph, p.model["kind"], p.model["source"]
    if kind == "onnx-graph" and not src.lower().endswith(".onnx"):
        raise StudioError(f"model.source {src!r} is not an .onnx file, which an onnx-graph "
                          "project needs (model.kind)")
    if kind != "onnx-graph" and src.lower().endswith(".onnx"):
        raise StudioError(f"model.source {src!r} is an ONNX file: set model.kind = "
                          "\"onnx-graph\" (or leave model.kind out)")
    for name, dims in g["shapes"].items():
        if not (isinstance(dims, list) and dims and all(isinstance(d, int) and d > 0
                                                         for d in dims)):
            raise StudioError(f"graph.shapes.{name} must be a list of positive integers, "
                              f"e.g. [1, 3, 32, 32], not {dims!r}")
    if not 2 <= g["seq_len"] <= 512:
        raise StudioError(f"graph.seq_len = {g['seq_len']} must be between 2 and 512")
    if kind != "causal-lm" and p.quantization["scheme"] == "FP16":
        raise StudioError("quantization.scheme FP16 is for causal LMs here; quantize the graph "
                          "(W8A16 or W8A8)")
    if not 1 <= g["repeats"] <= 1000:
        raise StudioError(f"graph.repeats = {g['repeats']} must be between 1 and 1000")


def from_dict(data: dict[str, Any], where: str = "project") -> Project:
    unknown = set(data) - _TOP
    if unknown:
        raise StudioError(
            f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {_fmt_allowed(_TOP)})"
        )
    sections: dict[str, dict[str, Any]] = {}
    for section, spec in _SECTIONS.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise StudioError(f"[{section}] must be a table")
        bad = set(raw) - set(spec)
        if bad:
            raise StudioError(
                f"unknown key {sorted(bad)[0]!r} in [{section}] (allowed: {_fmt_allowed(spec)})"
            )
        out: dict[str, Any] = {}
        for key, (typ, default) in spec.items():
            if key in raw:
                _check_type(section, key, raw[key], typ)
                out[key] = copy.deepcopy(raw[key])
            elif default is None:
                raise StudioError(f"[{section}] needs the key {key!r}")
            else:
                out[key] = copy.deepcopy(default)
        sections[section] = out
    _kind_defaults(data, sections)
    name = data.get("name", "")
    if not isinstance(name, str):
        raise StudioError("name must be a string")
    if "targets" in data:
        targets = data["targets"]
    else:
        from studio.core.catalog import default_chip_key

        targets = [default_chip_key()]
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise StudioError("targets must be a list of chip names (see studio targets)")
    p = Project(
        name=name or "untitled", targets=list(targets), model=sections["model"],
        export=sections["export"], quantization=sections["quantization"],
        validation=sections["validation"], gates=sections["gates"], run=sections["run"],
        pipeline=sections["pipeline"], sensitivity=sections["sensitivity"],
        autoprecision=sections["autoprecision"], layerdiff=sections["layerdiff"],
        profile=sections["profile"], pruning=sections["pruning"],
        waterfall=sections["waterfall"], bundle=sections["bundle"], graph=sections["graph"],
    )
    _validate(p)
    p.sweeps = _sweeps(data.get("sweeps", []), p)
    return p


def _sweeps(raw: Any, p: Project) -> list[dict[str, Any]]:
    from studio.core.sweep import parse_spec

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
        from studio.core.samples import SAMPLES

        s = SAMPLES.get(source.split(":", 1)[1])
        if s is not None and s.kind == "sentence-encoder":
            return "encoder"
    return "causal-lm"


def _kind_defaults(data: dict[str, Any], sections: dict[str, dict[str, Any]]) -> None:
    """The defaults that depend on the model's kind, where the file leaves them out."""
    model = sections["model"]
    if "kind" not in data.get("model", {}):
        model["kind"] = infer_kind(model["source"])
    kind = model["kind"]
    if kind not in MODEL_KINDS:
        raise StudioError(f"model.kind {kind!r} is not one of {', '.join(MODEL_KINDS)}")
    if "stages" not in data.get("pipeline", {}):
        sections["pipeline"]["stages"] = list(default_stages(kind))
    if kind == "encoder":  # a sentence a sample: more of them than an LLM's windows
        given = data.get("quantization", {})
        if "calibration_text" not in given:
            sections["quantization"]["calibration_text"] = "sample:sentences"
        if "calibration_samples" not in given:
            sections["quantization"]["calibration_samples"] = ENCODER_CALIBRATION_SAMPLES


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
def load(path: Path) -> Project:
    path = Path(path)
    if not path.exists():
        raise StudioError(f"project file {path} does not exist")
    if path.is_dir():
        raise StudioError(f"{path} is a folder, not a .qstudio project file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise StudioError(f"{path} is not a text file: is it really a .qstudio project?") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudioError(f"{path.name} is not valid TOML ({exc}): fix the file") from None
    try:
        p = from_dict(migrate(data), where=path.name)
    except StudioError as exc:
        raise StudioError(f"{path.name}: {exc.message}") from None
    p.path = path.resolve()
    return p


def dumps(project: Project) -> str:
    import tomli_w

    return tomli_w.dumps(project.to_dict())


def save(project: Project, path: Path | None = None) -> Path:
    target = Path(path) if path else project.path
    if target is None:
        raise StudioError("the project has no file yet: choose where to save it")
    from studio.core.fsutil import check_writable_dir

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
