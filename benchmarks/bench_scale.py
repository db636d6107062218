"""How far does export → quantize → compile scale on this machine?

For each model size, builds a random-weight Qwen2 checkpoint from an architecture config
(sizes only, nothing is downloaded: ``Qwen2Config`` + ``Qwen2ForCausalLM`` with random
init, ``save_pretrained``, plus the shipped tiny-coder ``tokenizer.json``), writes a
project file for it (W8A16 unless ``--scheme``, 2 calibration samples, short prompt/context, one target) and
runs ``plan(project, ["compile"])`` job by job through ``run_in_process`` — the stage
functions with the pipeline's own frozen config — each job in a fresh subprocess. Per
stage it prints the wall time, the peak RSS of that subprocess (``wait4``'s
``ru_maxrss``), the size of what the stage wrote, and the host's load average, against
the parameter count; then where it stops (time, memory or a hard error) and why.

A stage that runs past ``--stage-timeout`` (15 min by default), or that would leave the
host with less than ``--min-free-gb`` of available memory, is stopped and reported as
not fitting; by default the larger sizes are then skipped (``--go-on`` runs them anyway).

    python benchmarks/bench_scale.py [--sizes l4-h256,l8-h512,l12-h768,qwen2-0.5b]
        [--max-params 600e6] [--prompt 16] [--context 64] [--target snapdragon-8-gen-3]
        [--parts N|auto [--max-part-mb MB]] [--until export|quantize|compile|validate|bundle]
        [--stage-timeout 900] [--min-free-gb 1.5] [--separate-binary] [--go-on]
        [--keep] [--workdir DIR [--resume]] [--json results.json]

The checkpoint and the export stay until the last stage: the compile stage exports the
AR-N prefill graph of the deployable binaries from the checkpoint and calibrates it on the
export's FP32 graphs, validate and the bundle score against the export (the 8 B shape: 16 GB
+ 32 GB on disk beside its compiled parts). Without ``--keep`` the size's folder goes once
it is done. With ``--until bundle`` the bundle's bytes, each part's check and the device
memory plan are printed, and the plan kept in ``device-plan.txt``. ``--workdir DIR
--resume`` goes on from an interrupted run either way (finished stages are kept, a stage
in flight keeps its finished parts).

Run it alone on the machine (``nice -n 10`` if others share it): the timings follow host
load, which each row records.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# ---- the sizes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie: bool = True
    rope_theta: float = 10000.0
    max_positions: int = 4096
    note: str = ""
    family: str = "qwen2"  # qwen2 (q/k/v biases) or llama (none)

    def parameters(self) -> int:
        """Parameter count of the Qwen2 model (q/k/v have biases; tied head counted once)."""
        head_dim = self.hidden // self.heads
        bias = self.family == "qwen2"
        q = self.hidden * self.hidden + (self.hidden if bias else 0)
        kv = 2 * (self.hidden * self.kv_heads * head_dim + (self.kv_heads * head_dim if bias else 0))
        o = self.hidden * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        norms = 2 * self.hidden
        per_layer = q + kv + o + mlp + norms
        emb = self.vocab * self.hidden
        return emb * (1 if self.tie else 2) + self.layers * per_layer + self.hidden

    def config_kwargs(self) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.max_positions,
            "tie_word_embeddings": self.tie,
            "rope_theta": self.rope_theta,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "eos_token_id": 0,
            "pad_token_id": 1,
            "bos_token_id": None,
        }


SIZES: dict[str, Size] = {s.name: s for s in (
    Size("l4-h256", 4, 256, 4, 2, 688, 2048, note="the tiny-coder sample's shape"),
    Size("llama-l4-h256", 4, 256, 4, 2, 688, 2048, tie=False, family="llama",
         note="a tiny Llama (untied head): the 8 B shape's flow in a minute"),
    Size("l8-h512", 8, 512, 8, 2, 1408, 32000),
    Size("l12-h768", 12, 768, 12, 2, 2048, 32000),
    Size("l16-h1024", 16, 1024, 16, 2, 2816, 151936),
    Size("qwen2-0.5b", 24, 896, 14, 2, 4864, 151936, rope_theta=1000000.0,
         max_positions=32768, note="Qwen/Qwen2-0.5B's config"),
    Size("qwen2-1.5b", 28, 1536, 12, 2, 8960, 151936, rope_theta=1000000.0,
         max_positions=32768, note="Qwen/Qwen2-1.5B's config"),
    Size("qwen2.5-3b", 36, 2048, 16, 2, 11008, 151936, rope_theta=1000000.0,
         max_positions=32768, note="Qwen/Qwen2.5-3B's config (the seeds' model)"),
    Size("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, tie=False, rope_theta=500000.0,
         max_positions=131072, family="llama", note="meta-llama/Llama-3.1-8B's shape"),
    # two blocks of the 3 B / 8 B shapes: with --parts 2 their parts are the full model's
    # largest (the embedding + its first block, its last block + the head), so the peak of
    # a stage over them is the full model's (a stage holds one part at a time) in minutes
    Size("qwen2.5-3b-2l", 2, 2048, 16, 2, 11008, 151936, rope_theta=1000000.0,
         max_positions=32768, note="the 3 B shape's first and last parts"),
    Size("llama3.1-8b-2l", 2, 4096, 32, 8, 14336, 128256, tie=False, rope_theta=500000.0,
         max_positions=131072, family="llama", note="the 8 B shape's first and last parts"),
)}
DEFAULT_SIZES = ("l4-h256", "l8-h512", "l12-h768", "qwen2-0.5b")
TOKENIZER_VOCAB = 2048  # the sample tokenizer's vocabulary: the model's must not be smaller

PROJECT = """schema_version = 1
name = "{name}"
targets = ["{target}"]

[model]
source = "{source}"

[export]
prompt_length = {prompt}
context_length = {context}
parts = {parts}
max_part_mb = {max_part_mb}

[quantization]
scheme = "{scheme}"
weight_granularity = "per_channel"
weight_rounding = "{rounding}"
rounding_samples = {rounding_samples}
embedding = "{embedding}"
calibration_text = "sample:calibration"
calibration_samples = 2

[validation]
heldout_tokens = {heldout}
device_tokens = {device_tokens}

[bundle]
prompts = 2
new_tokens = {bundle_tokens}

[pipeline]
stages = ["export", "quantize", "compile"]
"""


# ---- child processes: one step each -----------------------------------------------------------
class _PrintProgress:
    """Progress lines with the time since the stage started, flushed as they come."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.last = ""

    def _say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:8.1f} s] {text}", flush=True)

    def update(self, fraction: float, message: str = "") -> None:
        if message and message != self.last:
            self.last = message
            self._say(f"{fraction:5.1%} {message}")

    def log(self, message: str) -> None:
        self._say(f"log: {message}")

    def check(self) -> None:
        pass


def _vm_hwm_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _emit(payload: dict[str, Any]) -> None:
    payload["vm_hwm_kib"] = _vm_hwm_kib()
    print("RESULT " + json.dumps(payload, default=str), flush=True)


def child_build(size_name: str, out: Path) -> None:
    """Random-weight bfloat16 checkpoint of one size, written a tensor at a time (the model
    is built on the meta device for its names and shapes; no tensor of the whole model is
    ever in memory), with the sample tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from studio.core.samples import sample_path

    size = SIZES[size_name]
    config = (LlamaConfig if size.family == "llama" else Qwen2Config)(**size.config_kwargs())
    config.torch_dtype = "bfloat16"
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    if size.tie:
        shapes.pop("lm_head.weight", None)
    params = sum(int(torch.Size(s).numel()) for s in shapes.values())
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2 * int(torch.Size(shape).numel())
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    gen = torch.Generator().manual_seed(0)
    std = float(getattr(config, "initializer_range", 0.02))
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape in shapes.items():
            rows = shape[0]
            step = max(1, (1 << 24) // max(1, int(torch.Size(shape[1:]).numel())))
            for a in range(0, rows, step):  # at most 16 M values in memory at once
                part = (rows if len(shape) == 1 else min(step, rows - a),) + tuple(shape[1:])
                if name.endswith("norm.weight"):
                    t = torch.ones(part)
                elif len(shape) == 1:
                    t = torch.zeros(part)
                else:
                    t = torch.randn(part, generator=gen) * std
                f.write(t.to(torch.bfloat16).view(torch.int16).numpy().tobytes())
                if len(shape) == 1:
                    break
    config.save_pretrained(str(out))
    tok = sample_path("tiny-coder")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tok / name).is_file():
            shutil.copy2(tok / name, out / name)
    _emit({"parameters": params, "expected": size.parameters()})


def child_stage(project_file: Path, index: int, out: Path, inputs: dict[str, str],
                until: str = "compile") -> None:
    """Job ``index`` of ``plan(project, [until])`` through ``run_in_process``."""
    from studio.core import project as pf
    from studio.core.stagegraph import plan
    from studio.worker.stages import run_in_process

    p = pf.load(project_file)
    job = plan(p, [until])[index]
    out.mkdir(parents=True, exist_ok=True)
    result = run_in_process(p, job, {k: Path(v) for k, v in inputs.items()}, out,
                            _PrintProgress())
    keep = {k: result[k] for k in ("summary", "sizes", "placement", "sdk_version") if k in result}
    if job.stage == "compile":
        from studio.engine.qnn import read_context_info

        keep["contexts"] = {}
        for ctx_file in sorted(out.rglob("*_ctx.onnx")):  # one per graph (and part)
            info = read_context_info(ctx_file)
            keep["contexts"][str(ctx_file.relative_to(out))] = {
                "embed": info["embed"], "bin_files": info["bin_files"],
                "bytes": sum(f.stat().st_size for f in ctx_file.parent.glob(
                    ctx_file.name.replace("_ctx.onnx", "_ctx*")))}
    _emit(keep)


def child_separate(quant_dir: Path, out: Path, target: str) -> None:
    """The compile stage's context binaries again, written beside the model (embed=False)."""
    from studio.engine import qnn

    out.mkdir(parents=True, exist_ok=True)
    res = {}
    progress = _PrintProgress()
    for g in ("prefill", "decode"):
        progress.update(0, f"compiling {g} with a separate context binary")
        r = qnn.compile_context(quant_dir / f"{g}.onnx", out / f"{g}_ctx.onnx", target,
                                embed=False)
        res[g] = {"seconds": r["seconds"], "size_bytes": r["size_bytes"],
                  "bin_bytes": sum(os.path.getsize(b) for b in r["bin_files"]),
                  "ctx_onnx_bytes": os.path.getsize(r["ctx_path"])}
    _emit({"contexts": res})


def child_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench_scale.py _child")
    ap.add_argument("what", choices=("build", "stage", "separate"))
    ap.add_argument("--size")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--project", type=Path)
    ap.add_argument("--index", type=int)
    ap.add_argument("--inputs", default="{}")
    ap.add_argument("--target")
    ap.add_argument("--until", default="compile")
    a = ap.parse_args(argv)
    try:
        if a.what == "build":
            child_build(a.size, a.out)
        elif a.what == "stage":
            child_stage(a.project, a.index, a.out, json.loads(a.inputs), a.until)
        else:
            child_separate(a.out.parent / "quantize", a.out, a.target)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which goes on
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"ERROR {type(exc).__name__}: {first}"[:600], flush=True)
        return 1
    return 0


# ---- the parent: measuring children ------------------------------------------------------------
@dataclass
class Step:
    size: str
    params: int
    stage: str
    status: str = "ok"  # ok | timeout | memory | error | skipped
    wall_s: float = 0.0
    peak_rss_kib: int = 0
    peak_anon_kib: int = 0  # sampled every 0.2 s: the anonymous part of the peak
    predicted_rss_kib: int = 0
    out_bytes: int = 0
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    min_avail_kib: int = 0
    detail: str = ""
    files: dict[str, int] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (progress message, s)
    # (progress message, peak RSS KiB, peak anonymous KiB) while that message was the last
    phase_peaks: list[tuple[str, int, int]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    log: str = ""


def _meminfo_kib(key: str = "MemAvailable") -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _rss_kib(pid: int, key: str = "VmRSS") -> int:
    """Resident memory of a process and its descendants (KiB), 0 if gone; ``key="RssAnon"``:
    only its anonymous pages (what the OOM killer counts: not the weight files ONNX Runtime
    maps, which the kernel can drop and read again)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    total += int(line.split()[1])
            for t in Path(f"/proc/{p}/task").iterdir():
                kids = (t / "children").read_text().split()
                todo += [int(k) for k in kids]
        except (OSError, ValueError):
            continue
    return total


def _files(folder: Path) -> dict[str, int]:
    if not folder.exists():
        return {}
    return {str(f.relative_to(folder)): f.stat().st_size
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _tail(path: Path, n: int = 6) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def _phases(lines: list[str], total: float) -> list[tuple[str, float]]:
    """(message, seconds) of each progress message of a child's log, longest first."""
    marks = []
    for ln in lines:
        if ln.startswith("[") and "] " in ln and " log: " not in ln:
            t, _, rest = ln[1:].partition(" s] ")
            try:
                marks.append((float(t), rest.strip().split(" ", 1)[-1]))
            except ValueError:
                continue
    out = [(m, (marks[i + 1][0] if i + 1 < len(marks) else total) - t)
           for i, (t, m) in enumerate(marks)]
    return sorted(out, key=lambda x: -x[1])


def measure(step: Step, argv: list[str], out: Path, log: Path, timeout: float,
            min_free_kib: int) -> Step:
    """Run one child, wait for it with wait4 (peak RSS), and stop it past the time limit or
    when the host's available memory falls below ``min_free_kib``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    if log.exists():  # an earlier attempt's log (--resume): keep it beside
        log.rename(log.with_name(f"{log.stem}.{int(log.stat().st_mtime)}.log"))
    step.load_start = os.getloadavg()
    step.log = str(log)
    step.min_avail_kib = _meminfo_kib()
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_child", *argv],
                                stdout=f, stderr=subprocess.STDOUT, cwd=str(out.parent),
                                env=env, start_new_session=True)
    stopped = ""
    status, usage = 0, None
    last_poll = 0.0
    reader = open(log, errors="replace")  # noqa: SIM115 - read as the child writes
    phase, pending = "(starting)", ""
    peaks: dict[str, list[int]] = {}
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        pending += reader.read()
        *lines_now, pending = pending.split("\n")
        for ln in lines_now:
            if ln.startswith("[") and "] " in ln and " log: " not in ln:
                phase = ln.partition(" s] ")[2].strip().split(" ", 1)[-1]
        anon = _rss_kib(proc.pid, "RssAnon")
        rss = _rss_kib(proc.pid)
        seen = peaks.setdefault(phase, [0, 0])
        seen[0], seen[1] = max(seen[0], rss), max(seen[1], anon)
        step.peak_anon_kib = max(step.peak_anon_kib, anon)
        now = time.perf_counter()
        if now - last_poll >= 1.0:
            last_poll = now
            avail = _meminfo_kib()
            step.min_avail_kib = min(step.min_avail_kib, avail)
            if not stopped and now - t0 > timeout:
                stopped = "timeout"
            elif not stopped and avail < min_free_kib:
                rss = _rss_kib(proc.pid)
                stopped = "memory"
                step.detail = (f"host memory available fell to {avail / 2**20:.2f} GiB "
                               f"(stage RSS {rss / 2**20:.2f} GiB)")
            if stopped:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own process group
        time.sleep(0.2)
    reader.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    step.wall_s = time.perf_counter() - t0
    step.phase_peaks = sorted(((m, r, an) for m, (r, an) in peaks.items()),
                              key=lambda x: -x[1])
    step.load_end = os.getloadavg()
    step.peak_rss_kib = usage.ru_maxrss if usage else 0
    step.files = _files(out)
    step.out_bytes = sum(step.files.values())
    lines = _tail(log, 400)
    result_line = next((ln for ln in reversed(lines) if ln.startswith("RESULT ")), None)
    if result_line:
        step.result = json.loads(result_line[len("RESULT "):])
    step.phases = _phases(lines, step.wall_s)
    if stopped == "timeout":
        step.status = "timeout"
        progress = [ln for ln in lines if ln.startswith("[")]
        step.detail = (f"stopped after {timeout:.0f} s; last progress: "
                       + (progress[-1] if progress else "(none)"))
    elif stopped == "memory":
        step.status = "memory"
    elif proc.returncode != 0:
        err = next((ln for ln in reversed(lines) if ln.startswith("ERROR ")), None)
        step.status = "error"
        if err:
            step.detail = err[len("ERROR "):]
        elif proc.returncode < 0:
            step.detail = f"killed by signal {-proc.returncode} (out of memory?)"
        else:
            step.detail = f"exit status {proc.returncode}: " + " | ".join(lines[-3:])
    return step


# ---- report ------------------------------------------------------------------------------------
def _predicted_peak(stage: str, export_dir: Path, parameters: int) -> int | None:
    """The studio's own prediction of ``stage``'s peak RSS (``studio.core.hostmem``), from
    the export's part plan (one part: the whole model)."""
    from studio.core.hostmem import predicted_peak
    from studio.engine.llm_parts import exported_part_sizes

    try:
        spec = json.loads((export_dir / "graph.json").read_text())
    except (OSError, ValueError):
        return None
    sizes = [s for s in exported_part_sizes(export_dir, spec) if s] or [parameters]
    head = int(spec.get("vocab_size") or 0) * int(spec.get("hidden_size") or 0)
    return predicted_peak(stage, sizes, head)


def report_bundle(out: Path, plan_text: list[str]) -> None:
    """The bundle's bytes (what ships, weight-shared or not), each part's check, and the
    project's device memory plan for its target against the NPU's limits."""
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    files = manifest["files"]
    shared = manifest.get("weight_shared") or []
    print(f"\n   bundle: {len(files)} files, {sum(f['bytes'] for f in files.values()) / 1e9:.2f} "
          "GB; context binaries "
          + ", ".join(f"{n} {f['bytes'] / 1e9:.2f} GB" for n, f in files.items()
                      if n.endswith(".bin")))
    for r in shared:
        print(f"   {r['file']}: {r['bytes'] / 1e9:.2f} GB weight-shared against "
              f"{r['separate_bytes'] / 1e9:.2f} GB separate; {r['structure']['summary']}")
    v = manifest["verification"]
    if v.get("by_part"):
        for k, c in enumerate(v["by_part"]):
            print(f"   prompt {k + 1}: " + "; ".join(
                f"part {p['part']} loaded alone" + (
                    f", hand-off against FP32 cosine {p.get('handoff_cosine_to_fp32', 0):.4f}"
                    f" (raw {p['handoff_range'][0]}..{p['handoff_range'][1]})"
                    if "handoff_finite" in p else
                    f", last part's tokens = FP32's {p['top1_same_as_fp32']}/{p['tokens']}")
                for p in c["parts"]))
    else:
        print(f"   Genie: {v['identical']}/{v['prompts']} prompts identical to the studio's")
    for line in plan_text:
        print(f"   {line}")


def _gib(kib: int) -> str:
    return f"{kib / 2**20:6.2f}"


def _mb(n: int) -> str:
    return f"{n / 1e6:9.1f}"


def _header() -> str:
    return (f"{'size':<11} {'params':>8} {'stage':<26} {'status':<7} {'wall s':>8} "
            f"{'peak RSS GiB':>12} {'anon GiB':>8} {'output MB':>9}  {'load 1m start→end':<18} files")


def print_table(steps: list[Step], header: bool = True, phases: bool = False) -> None:
    if header:
        print(_header())
        print("-" * len(_header()))
    for s in steps:
        big = sorted(s.files.items(), key=lambda kv: -kv[1])[:3]
        files = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in big if not k.endswith(".json"))
        load = f"{s.load_start[0]:.2f} → {s.load_end[0]:.2f}"
        print(f"{s.size:<11} {s.params / 1e6:7.1f}M {s.stage:<26} {s.status:<7} "
              f"{s.wall_s:8.1f} {_gib(s.peak_rss_kib):>12} {_gib(s.peak_anon_kib):>8} {_mb(s.out_bytes)}  {load:<18} {files}")
        if s.detail:
            print(f"{'':<21} ↳ {s.detail}")
        if phases and s.phases:
            top = [f"{m} {t:.1f} s" for m, t in s.phases[:4] if t >= 1.0]
            if top:
                print(f"{'':<21} ↳ longest phases: " + "; ".join(top))
            high = [f"{m} {r / 2**20:.2f} GiB (anon {an / 2**20:.2f})"
                    for m, r, an in s.phase_peaks[:4]]
            if high:
                print(f"{'':<21} ↳ highest resident set while: " + "; ".join(high))
        sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                    help=f"comma-separated, from {', '.join(SIZES)}")
    ap.add_argument("--max-params", type=float, default=None,
                    help="skip sizes with more parameters than this (e.g. 2e8)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--target", default="snapdragon-8-gen-3")
    ap.add_argument("--parts", default="1",
                    help="export.parts: a number of parts or auto (one part in memory at a time)")
    ap.add_argument("--max-part-mb", type=int, default=1500,
                    help="export.max_part_mb: the 8-bit weight budget of a part, for --parts auto")
    ap.add_argument("--until", default="compile",
                    choices=("export", "quantize", "compile", "validate", "bundle"),
                    help="the last stage to run (validate and bundle: after compile; the "
                         "checkpoint is kept until the compile stage has read it)")
    ap.add_argument("--heldout", type=int, default=128,
                    help="validation.heldout_tokens: held-out tokens scored on the host")
    ap.add_argument("--bundle-tokens", type=int, default=16,
                    help="bundle.new_tokens: greedy tokens per prompt of the bundle's check")
    ap.add_argument("--device-tokens", type=int, default=16,
                    help="validation.device_tokens: the first of them scored on the simulator")
    ap.add_argument("--scheme", default="W8A16", help="the recipe's scheme (W8A16, W4A16, ...)")
    ap.add_argument("--rounding", default="nearest",
                    help="quantization.weight_rounding (nearest, seqmse, adaround, gptq, "
                         "seqmse_gptq)")
    ap.add_argument("--embedding", default="auto", choices=("auto", "INT8"),
                    help="quantization.embedding: the token table at the activations' width "
                         "(auto) or at 8 bits")
    ap.add_argument("--rounding-samples", type=int, default=2,
                    help="quantization.rounding_samples (windows the rounding fits layers on)")
    ap.add_argument("--stage-timeout", type=float, default=900.0, help="seconds per stage")
    ap.add_argument("--min-free-gb", type=float, default=1.5,
                    help="stop a stage when the host's available memory falls below this")
    ap.add_argument("--separate-binary", action="store_true",
                    help="also compile both graphs with the context binary beside the model "
                         "(embed=False) to compare with the compile stage's embedded one")
    ap.add_argument("--go-on", action="store_true",
                    help="after a size fails, still run the larger ones")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work folder (checkpoints and every stage's output)")
    ap.add_argument("--resume", action="store_true",
                    help="with the --workdir of an earlier run: reuse the checkpoints and the "
                         "stage outputs that finished there, and run only what is missing")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to build (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    a = ap.parse_args()
    if a.resume and a.workdir is None:
        ap.error("--resume needs the --workdir of an earlier run")

    names = [s.strip() for s in a.sizes.split(",") if s.strip()]
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        ap.error(f"unknown size(s) {', '.join(unknown)}; known: {', '.join(SIZES)}")
    sizes = sorted((SIZES[n] for n in names), key=lambda s: s.parameters())
    for s in sizes:
        if s.vocab < TOKENIZER_VOCAB:
            ap.error(f"{s.name}: vocab_size {s.vocab} < the sample tokenizer's {TOKENIZER_VOCAB}")

    from studio.core import project as pf
    from studio.core.stagegraph import plan

    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {work}; prompt {a.prompt}, context {a.context}, {a.scheme} "
          f"({a.rounding} rounding), "
          f"2 calibration samples, target {a.target}; stage limit {a.stage_timeout:.0f} s; "
          f"{os.cpu_count()} CPUs, {_meminfo_kib('MemTotal') / 2**20:.1f} GiB RAM "
          f"({_meminfo_kib() / 2**20:.1f} GiB available), load {os.getloadavg()[0]:.2f}",
          flush=True)
    min_free = int(a.min_free_gb * 2**20)
    steps: list[Step] = []
    stop: str = ""
    try:
        for size in sizes:
            n = size.parameters()
            if a.max_params is not None and n > a.max_params:
                steps.append(Step(size.name, n, "(all)", "skipped",
                                  detail=f"{n:,} parameters > --max-params {a.max_params:,.0f}"))
                continue
            if stop and not a.go_on:
                steps.append(Step(size.name, n, "(all)", "skipped",
                                  detail="a smaller size did not fit (use --go-on to try)"))
                continue
            d = work / size.name
            if d.exists() and not a.resume:
                shutil.rmtree(d)
            d.mkdir(exist_ok=True)
            print(f"\n== {size.name}: {size.layers} layers, hidden {size.hidden}, heads "
                  f"{size.heads}/{size.kv_heads}, intermediate {size.intermediate}, vocab "
                  f"{size.vocab}, {n:,} parameters", flush=True)
            print(_header())
            ckpt = d / "checkpoint"
            if a.resume and (ckpt / "config.json").is_file():
                steps.append(Step(size.name, n, "build checkpoint", "reused",
                                  detail=f"kept from an earlier run in {ckpt}"))
            else:
                shutil.rmtree(ckpt, ignore_errors=True)
                ckpt.mkdir()
                step = measure(Step(size.name, n, "build checkpoint"),
                               ["build", "--size", size.name, "--out", str(ckpt)], ckpt,
                               d / "build.log", a.stage_timeout, min_free)
                steps.append(step)
                if step.status != "ok":
                    print_table([step], header=False, phases=True)
                    stop = f"{size.name}: building the checkpoint: {step.status} ({step.detail})"
                    continue
                if step.result.get("parameters") not in (None, n):
                    print(f"   (the model has {step.result['parameters']:,} parameters, the "
                          f"formula said {n:,})")
            print_table(steps[-1:], header=False, phases=True)
            project_file = d / f"{size.name}.qstudio"
            project_file.write_text(PROJECT.format(
                name=size.name, target=a.target, source=str(ckpt), prompt=a.prompt,
                context=a.context, parts=a.parts if a.parts.isdigit() else f'"{a.parts}"',
                max_part_mb=a.max_part_mb, scheme=a.scheme, rounding=a.rounding,
                rounding_samples=a.rounding_samples, embedding=a.embedding, heldout=a.heldout,
                device_tokens=a.device_tokens, bundle_tokens=a.bundle_tokens))
            jobs = plan(pf.load(project_file), [a.until])
            plan_text: list[str] = []
            if a.until == "bundle" and ckpt.is_dir():  # the plan reads the checkpoint's layout
                from studio.services.deviceplan import plan_lines

                plan_text = plan_lines(pf.load(project_file))
                (d / "device-plan.txt").write_text("\n".join(plan_text) + "\n")
            elif (d / "device-plan.txt").is_file():
                plan_text = (d / "device-plan.txt").read_text().splitlines()
            done: dict[str, str] = {}
            failed = False
            # without --keep, a stage's input goes once the next stage is done: a resumed run
            # counts a stage whose output was removed that way as done
            gone = {"export": "quantize/result.json", "quantize": "compile/result.json"}
            for i, job in enumerate(jobs):
                out = d / job.stage
                inputs = {jobs[k].label: done[jobs[k].label] for k in job.deps}
                if a.resume and ((out / "result.json").is_file()
                                 or (job.stage in gone and (d / gone[job.stage]).is_file())):
                    steps.append(Step(size.name, n, job.label, "reused",
                                      detail=f"kept from an earlier run in {out}"))
                    print_table(steps[-1:], header=False)
                    done[job.label] = str(out)
                    continue
                if not a.resume:  # what a failed attempt left (resumed: its finished parts)
                    shutil.rmtree(out, ignore_errors=True)
                step = measure(Step(size.name, n, job.label),
                               ["stage", "--project", str(project_file), "--index", str(i),
                                "--out", str(out), "--inputs", json.dumps(inputs),
                                "--until", a.until],
                               out, d / f"{job.stage}.log", a.stage_timeout, min_free)
                pred = _predicted_peak(job.stage, d / "export", n)
                if pred and step.status == "ok" and step.peak_rss_kib:
                    step.predicted_rss_kib = pred // 1024
                    step.detail = ((step.detail + "; ") if step.detail else "") + (
                        f"predicted peak {pred / 2**30:.2f} GiB "
                        f"({pred / 1024 / step.peak_rss_kib - 1:+.0%} against the measured)")
                if job.stage == "compile" and step.status == "ok":
                    ctx = step.result.get("contexts", {})
                    emb = {g: c.get("embed") for g, c in ctx.items()}
                    step.detail = f"embedded context binary: {emb}"
                steps.append(step)
                print_table([step], header=False, phases=True)
                if step.status != "ok":
                    stop = f"{size.name}: {job.label}: {step.status} ({step.detail})"
                    failed = True
                    break
                done[job.label] = str(out)
                if a.keep:
                    continue
                # the checkpoint and the export stay: the compile stage exports the AR-N
                # prefill graph from the checkpoint (the export's FP32 graphs calibrate it),
                # validate and the bundle score against the export, the bundle's device plan
                # reads the checkpoint's layout
            if a.until == "bundle" and not failed:
                report_bundle(d / "bundle", plan_text)
            if a.separate_binary and not failed:
                out = d / "compile-separate"
                step = measure(Step(size.name, n, "compile (embed=False)"),
                               ["separate", "--out", str(out), "--target", a.target],
                               out, d / "compile-separate.log", a.stage_timeout, min_free)
                steps.append(step)
                print_table([step], header=False, phases=True)
            if not a.keep:
                shutil.rmtree(d, ignore_errors=True)
    finally:
        print("\n== results")
        print_table(steps, phases=True)
        print()
        if stop:
            print(f"stops at: {stop}")
        else:
            print("every size asked for fitted (raise the sizes to find where it stops)")
        if a.json:
            a.json.write_text(json.dumps([asdict(s) for s in steps], indent=1, default=str))
        if a.keep:
            print(f"kept: {work}")
        elif a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if not stop else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        raise SystemExit(child_main(sys.argv[2:]))
    raise SystemExit(main())
