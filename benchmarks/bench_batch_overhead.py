"""How much does `studio --batch` add over calling the same stage functions directly?

Runs the export and quantize stages of a small project cold (fresh project folder) both
ways, REPEAT times each, alternating, and prints the medians and their ratio. Run on demand:

    python benchmarks/bench_batch_overhead.py [--repeat 3] [--stages export,quantize]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROJECT = """schema_version = 1
name = "bench"
targets = ["{target}"]
[model]
source = "sample:tiny-coder"
[export]
prompt_length = 16
context_length = 64
[quantization]
calibration_samples = 2
"""


def direct(project_file: Path, stages: list[str]) -> float:
    from studio.core import project as pf
    from studio.core.progress import NullProgress
    from studio.core.stagegraph import plan
    from studio.worker.stages import run_in_process

    p = pf.load(project_file)
    t0 = time.perf_counter()
    done: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as d:
        jobs = plan(p, stages)
        for job in jobs:
            out = Path(d) / job.label
            out.mkdir()
            inputs = {jobs[i].label: done[jobs[i].label] for i in job.deps}
            run_in_process(p, job, inputs, out, NullProgress())
            done[job.label] = out
    return time.perf_counter() - t0


def batch(project_file: Path, stages: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(project_file), "--quiet",
                    "--stages", ",".join(stages)], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stages", default="export,quantize")
    a = ap.parse_args()
    from studio.core.catalog import load_catalog

    target = next(iter(load_catalog()))
    stages = a.stages.split(",")
    times: dict[str, list[float]] = {"direct": [], "batch": []}
    for i in range(a.repeat):
        with tempfile.TemporaryDirectory() as d:
            f = Path(d) / "bench.qstudio"
            f.write_text(PROJECT.format(target=target))
            # alternate the order so that drift on a noisy machine hits both
            order = ("direct", "batch") if i % 2 == 0 else ("batch", "direct")
            for how in order:
                fn = direct if how == "direct" else batch
                if how == "batch":
                    for old in Path(d).glob("*.studio"):
                        import shutil

                        shutil.rmtree(old)
                times[how].append(fn(f, stages))
    md, mb = statistics.median(times["direct"]), statistics.median(times["batch"])
    print(f"stages: {', '.join(stages)}; repeats: {a.repeat}")
    print(f"direct stage calls : median {md:7.2f} s  {[f'{t:.2f}' for t in times['direct']]}")
    print(f"studio --batch     : median {mb:7.2f} s  {[f'{t:.2f}' for t in times['batch']]}")
    print(f"overhead ratio (batch / direct): {mb / md:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
