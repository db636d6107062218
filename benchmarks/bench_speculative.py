"""Overlapped against sequential speculative decoding, on the host CPU and on the HTP simulator.

The shipped sample (tiny-coder, W8A16, a 256-token cache) and its shipped draft on the host
CPU: for each target device (``cpu``: the FP32 export under ONNX Runtime, ``htp-sim``: the
compiled binaries on the HTP simulator), plain greedy decoding, the draft's windows checked
sequentially (draft, then verify, then draft) and overlapped (the draft drafts the next
window in its own thread while the target verifies), 5 held-out prompts x 200 new tokens
each, in one run. Prints per mode the median tokens per second, the overlapped / sequential
ratio (per prompt, then the median), and the time split summed over the prompts (of each
prompt's median run): each side busy, both busy, each waiting. The modes run interleaved,
``--repeats`` times each per prompt. The greedy tokens of every run must be equal. Plain
decoding's rate is ``studio generate``'s (the median decode step), the speculative modes'
the whole decode's (tokens come in groups).

Then an estimate for the project's chip: the target's verify pass from the performance
model (``estimated``), the draft's time per token from this host's measured rate times
``--cpu-scale`` (an assumption, stated in the output: this host's CPU model is not named,
so no published ratio to a phone's CPU applies; 1.0 takes the phone's big core as fast as
one host core).

    python benchmarks/bench_speculative.py [--tokens 200] [--prompts 5] [--k 4]
        [--repeats 3] [--cpu-scale 1.0] [--workdir DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("plain", "sequential", "overlapped")


def build(work: Path, context: int) -> Path:
    """The example project with a longer cache, exported, quantized and compiled."""
    text = (ROOT / "examples" / "tiny-coder" / "tiny-coder.qstudio").read_text()
    text = text.replace("context_length = 128", f"context_length = {context}")
    text = text.split("# The seed's grid")[0]  # no sweeps
    f = work / "spec.qstudio"
    f.write_text(text)
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(f), "--stages",
                        "compile"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the batch run failed:\n{r.stderr[-2000:]}")
    return f


def prompts(project, count: int, length: int = 24) -> list[str]:
    """``count`` prompts of about ``length`` tokens from places spread over the held-out
    text (whole lines, so that they read as code)."""
    from studio.core.samples import data_path

    lines = [ln for ln in data_path("heldout").read_text().splitlines() if ln.strip()]
    out = []
    for i in range(count):
        start = (i + 1) * len(lines) // (count + 2)
        out.append("\n".join(lines[start:start + 3]) + "\n")
    return out


def run(project, device: str, mode: str, prompt: str, tokens: int, k: int) -> dict[str, Any]:
    from studio.services.generate import generate

    return generate(project, prompt, device, tokens,
                    speculative=None if mode == "plain" else "draft", k=k,
                    overlap=mode == "overlapped" if mode != "plain" else None)


def rate(out: dict[str, Any]) -> float:
    """Tokens per second after the first: the whole decode's for the speculative modes, the
    median step's for plain decoding (what studio generate reports)."""
    return float(out["decode_tokens_per_s"])


def estimate(project, outs: dict[str, list[dict[str, Any]]], k: int, cpu_scale: float,
             context: int) -> dict[str, Any]:
    """Per token on the chip: sequential (k drafts, then a verify pass) and overlapped (the
    verify pass, plus the drafting that did not fit beside it, plus the windows drafted after
    a rejection), at the measured acceptance; the verify pass from the performance model,
    the draft's per-token time from this host's, times ``cpu_scale``."""
    from studio.core import archs
    from studio.core import perfmodel as pm
    from studio.core.samples import sample_path

    arch = archs.Arch.from_config(json.loads((sample_path("tiny-coder") / "config.json")
                                          .read_text()))
    chip = project.targets[0]
    scheme = archs.get_scheme(project.quantization["scheme"])
    plain = pm.pass_seconds(arch, chip, scheme, context, 1)
    verify = pm.pass_seconds(arch, chip, scheme, context, k + 1)
    seq = [o["speculative"] for o in outs["sequential"]]
    ovl = [o["speculative"] for o in outs["overlapped"]]
    drafted = sum(s["drafted_tokens"] for s in seq)
    t_draft = sum(s["busy_s"]["draft"] for s in seq) / max(drafted, 1) * cpu_scale
    passes = sum(s["target_passes"] for s in seq)
    per_pass_drafts = drafted / max(passes, 1)
    tpp = statistics.median(s["tokens_per_target_pass"] for s in seq)
    taken = sum(s["ahead"]["used"] > 0 for s in ovl)
    o_passes = sum(s["target_passes"] for s in ovl)
    o_used = sum(s["ahead"]["used"] for s in ovl)
    # the share of a pass's drafts that came from the draft ahead (the rest drafted after)
    ahead_share = min(1.0, o_used / max(sum(s["drafted_tokens"] for s in ovl), 1))
    seq_pass = verify + per_pass_drafts * t_draft
    ahead_time = (per_pass_drafts + 1) * t_draft  # the guess of the target's token + a window
    ovl_pass = (verify + max(0.0, ahead_time - verify) * ahead_share
                + per_pass_drafts * t_draft * (1 - ahead_share))
    return {"chip": chip, "scheme": scheme.name, "source": "estimated",
            "plain_tokens_per_s": 1 / plain, "verify_pass_ms": verify * 1e3,
            "draft_ms_per_token": t_draft * 1e3, "cpu_scale": cpu_scale,
            "tokens_per_target_pass": tpp, "ahead_share": ahead_share,
            "sequential_tokens_per_s": tpp / seq_pass, "overlapped_tokens_per_s": tpp / ovl_pass,
            "prompts_with_a_window_taken": taken, "overlapped_passes": o_passes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each mode per prompt, interleaved; the median run counts")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--cpu-scale", type=float, default=1.0,
                    help="the phone CPU's time per draft token over this host's (assumed)")
    ap.add_argument("--devices", default="cpu,htp-sim")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-spec-"))
    work.mkdir(parents=True, exist_ok=True)
    from studio.core import project as pf

    f = work / "spec.qstudio"
    if not f.is_file():
        print(f"building the sample with a {a.context}-token cache in {work} …", flush=True)
        f = build(work, a.context)
    project = pf.load(f)
    texts = prompts(project, a.prompts)
    report: dict[str, Any] = {"tokens": a.tokens, "prompts": len(texts), "k": a.k,
                              "devices": {}}
    for device in a.devices.split(","):
        outs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        run(project, device, "overlapped", texts[0], 8, a.k)  # warm-up: sessions loaded
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        for text in texts:
            tries: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for _ in range(a.repeats):  # the modes interleaved: the same load for each
                for mode in MODES:
                    tries[mode].append(run(project, device, mode, text, a.tokens, a.k))
            for mode in MODES:  # the run of the median rate stands for the prompt
                ranked = sorted(tries[mode], key=rate)
                outs[mode].append(ranked[len(ranked) // 2])
                rates[mode].append(rate(ranked[len(ranked) // 2]))
            same = {tuple(o["tokens"]) for m in MODES for o in tries[m]}
            if len(same) != 1:
                raise SystemExit(f"{device}: the modes' tokens differ on a prompt")
        source = outs["plain"][0].get("source", "measured")
        ratios = [o / s for o, s in zip(rates["overlapped"], rates["sequential"], strict=True)]
        print(f"\n== target on {device} ({source}; the draft on the host CPU), "
              f"{len(texts)} prompts x {a.tokens} tokens, k <= {a.k}; tokens equal in "
              "every mode")
        print(f"{'mode':<12} {'tok/s (median)':>15} {'draft busy s':>13} {'target busy s':>14} "
              f"{'both busy s':>12} {'target waits s':>15} {'draft waits s':>14}")
        for m in MODES:
            if m == "plain":
                print(f"{m:<12} {statistics.median(rates[m]):>15.1f}")
                continue
            sp = [o["speculative"] for o in outs[m]]
            tot = {k2: sum(s["busy_s"][k2] for s in sp) for k2 in ("draft", "target", "both")}
            wt = {k2: sum(s["waiting_s"][k2] for s in sp) for k2 in ("target", "draft")}
            print(f"{m:<12} {statistics.median(rates[m]):>15.1f} {tot['draft']:>13.2f} "
                  f"{tot['target']:>14.2f} {tot['both']:>12.2f} {wt['target']:>15.2f} "
                  f"{wt['draft']:>14.2f}")
        tpp = statistics.median(o["speculative"]["tokens_per_target_pass"]
                                for o in outs["overlapped"])
        print(f"overlapped / sequential: {statistics.median(ratios):.2f}x (median of "
              f"{', '.join(f'{r:.2f}' for r in ratios)}); {tpp:.2f} tokens per target pass")
        entry = {"source": source, "rates": rates, "overlapped_over_sequential": ratios,
                 "speculative": {m: [o["speculative"] for o in outs[m]]
                                 for m in MODES[1:]}}
        if device == "cpu":
            est = estimate(project, outs, a.k, a.cpu_scale, a.context)
            entry["estimate"] = est
            print(f"\nestimated on {est['chip']} ({est['scheme']}, performance model): "
                  f"verify pass {est['verify_pass_ms']:.2f} ms; the draft "
                  f"{est['draft_ms_per_token']:.2f} ms a token on the phone's CPU (assumed: "
                  f"this host's measured rate x {a.cpu_scale}; the host's CPU model is not "
                  "named, so no published ratio applies) -> plain "
                  f"{est['plain_tokens_per_s']:.0f}, sequential "
                  f"{est['sequential_tokens_per_s']:.0f}, overlapped "
                  f"{est['overlapped_tokens_per_s']:.0f} tok/s ("
                  f"{est['overlapped_tokens_per_s'] / est['sequential_tokens_per_s']:.2f}x)")
        report["devices"][device] = entry
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=str))
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
