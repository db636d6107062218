"""Sweep throughput: the seed's 8-point grid on the sample, points per minute, on the local
process pool and on a local Ray cluster, with 1 and 2 workers each.

Every configuration starts from an empty project folder (export included: it is computed
once per sweep and shared by the 8 points), so each one does the same work: 1 export, 8
quantize, 8 compile, 8 validate (validation shortened to 32 held-out tokens and 2 greedy
tokens, as in the tests). The baseline is the local pool with 1 worker, measured in the same
run; ratios are against it. Source: measured (wall time of ``studio sweep``). The jobs run
on the HTP simulator and the host CPU, so the figures follow how many cores the host has
and what else it runs.

    python benchmarks/bench_sweep.py [--configs local:1,local:2,ray:1,ray:2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "examples" / "tiny-coder" / "tiny-coder.qstudio"


def _project(folder: Path) -> Path:
    text = PROJECT.read_text().replace("heldout_tokens = 256", "heldout_tokens = 32").replace(
        "greedy_tokens = 16", "greedy_tokens = 2")
    f = folder / "bench.qstudio"
    f.write_text(text)
    return f


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(executor: str, workers: int, folder: Path) -> dict:
    f = _project(folder)
    cmd = [sys.executable, "-m", "studio.cli", "--quiet", "sweep", str(f), "--workers",
           str(workers), "--json"]
    ray_bin = Path(sys.executable).with_name("ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    if executor == "ray":
        port = _port()
        subprocess.run([str(ray_bin), "start", "--head", f"--port={port}",
                        f"--num-cpus={workers}", "--include-dashboard=false",
                        "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                       check=True, capture_output=True, env=env)
        cmd += ["--executor", "ray", "--ray-address", f"127.0.0.1:{port}"]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    finally:
        wall = time.perf_counter() - t0
        if executor == "ray":
            subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True)
    if r.returncode not in (0, 1):
        raise SystemExit(f"{executor}:{workers} failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout)
    return {"config": f"{executor}:{workers}", "wall_s": wall,
            "points": len(out["points"]), "points_per_minute": len(out["points"]) / wall * 60,
            "computed": out["run"]["jobs"]["by_stage"],
            "accuracy": {p["id"]: p["accuracy"]["value"] for p in out["points"]}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="local:1,local:2,ray:1,ray:2")
    a = ap.parse_args()
    rows = []
    for cfg in a.configs.split(","):
        executor, workers = cfg.split(":")
        folder = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
        try:
            rows.append(run(executor, int(workers), folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        r = rows[-1]
        print(f"{r['config']:<8} {r['wall_s']:7.1f} s  {r['points_per_minute']:5.2f} points/min"
              f"  ({', '.join(f'{k} {v}' for k, v in r['computed'].items())})", flush=True)
    base = rows[0]
    print(f"\nbaseline {base['config']} ({os.cpu_count()} cores here)")
    for r in rows:
        same = r["accuracy"] == base["accuracy"]
        print(f"{r['config']:<8} {r['points_per_minute'] / base['points_per_minute']:5.2f}x "
              f"the baseline's points/min; metrics {'identical' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
