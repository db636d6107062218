"""Generation through the device agent on loopback vs the same run locally.

A sample project (tiny-coder, P=16, C=128) is exported; a real agent (`studio agent serve`)
starts on an ephemeral 127.0.0.1 port; then a 64-token greedy generation runs on the host CPU
locally and through the agent (files already uploaded: the steady state), alternating, and
the medians of the wall times give the overhead ratio (aim <= 1.2). Source: measured.

    python benchmarks/bench_agent.py [--repeats 7] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args()
    from studio.services.generate import generate, generate_remote
    from studio.services.projects import NewProjectSpec, create_project
    from studio.services.registry import Registry

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        studio = create_project(NewProjectSpec(
            path=tmp / "bench.qstudio", source_kind="sample", source="tiny-coder",
            prompt_length=16, context_length=128, calibration_samples=2, name="bench"))
        try:
            summary = asyncio.run(studio.run_pipeline(["export"]))
        finally:
            studio.close()
        if summary.state != "succeeded":
            print(f"export failed: {summary.state}")
            return 1
        project = studio.project
        (tmp / "token").write_text("bench-token")
        proc = subprocess.Popen([sys.executable, "-m", "studio.cli", "agent", "serve", "--port",
                                 "0", "--token-file", str(tmp / "token"), "--store",
                                 str(tmp / "store")], stdout=subprocess.PIPE, text=True)
        try:
            url = proc.stdout.readline().split("listening on ")[1].strip()
            reg = Registry(tmp / "cfg")
            reg.add("loop", url, "bench-token")
            prompt = "def __init__(self"
            n = a.new_tokens
            t0 = time.perf_counter()
            generate_remote(project, prompt, "agent:loop", 2, registry=reg)  # upload + warm-up
            first = time.perf_counter() - t0
            generate(project, prompt, "cpu", 2)
            local, remote, same = [], [], True
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                lo = generate(project, prompt, "cpu", n)
                local.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                re_ = generate_remote(project, prompt, "agent:loop", n, registry=reg)
                remote.append(time.perf_counter() - t0)
                same = same and lo["tokens"] == re_["tokens"]
        finally:
            proc.terminate()
            proc.wait(20)
    ml, mr = statistics.median(local), statistics.median(remote)
    print(f"{n}-token greedy generation, tiny-coder FP32 on the host CPU, median of "
          f"{a.repeats} (measured)")
    print(f"  first call through the agent (uploads the export, loads it): {first:.2f} s")
    print(f"  local        {ml * 1e3:8.1f} ms  (load + prefill + decode, in this process)")
    print(f"  agent (loop) {mr * 1e3:8.1f} ms  (HTTP, the agent loads the model per job)")
    print(f"  overhead ratio agent / local: {mr / ml:.2f}x (aim <= 1.2); same tokens: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
