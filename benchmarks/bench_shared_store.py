"""What does the machine's shared artifact store save a second project?

Each repeat makes two fresh projects of the sample at the test shapes (tiny-coder, prompt 16,
context 64, W8A16) and runs ``studio --batch`` on both, alternating which machine they run
on: one without a shared store (both projects compute every stage: the baseline) and one
with a fresh shared store (the second project takes export, quantize, compile and validate
from the first). Prints the second project's medians and their ratio. Run on demand:

    python benchmarks/bench_shared_store.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from studio.core import project as pf  # noqa: E402
from studio.core.catalog import default_chip_key  # noqa: E402


def _project(folder: Path, name: str) -> Path:
    p = pf.new_project(name, "sample:tiny-coder", [default_chip_key()],
                       export={"prompt_length": 16, "context_length": 64},
                       quantization={"scheme": "W8A16", "weight_granularity": "per_channel",
                                     "calibration_samples": 2})
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.qstudio"
    pf.save(p, path)
    return path


def _batch(path: Path, config: Path) -> tuple[float, int]:
    env = dict(os.environ, QSTUDIO_CONFIG_DIR=str(config))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(path), "--json",
                        "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT)
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    return took, sum(1 for j in json.loads(r.stdout)["jobs"] if j["cached"])


def second_project(shared: bool) -> tuple[float, int]:
    """The second project's wall seconds and cached jobs on a machine with or without a
    shared store (both projects fresh)."""
    with tempfile.TemporaryDirectory(prefix="qstudio-bench-shared-") as tmp:
        root = Path(tmp)
        config = root / "config"
        config.mkdir()
        if shared:
            (config / "settings.toml").write_text(
                f'[artifacts]\nshared_store = "{root / "store"}"\n')
        _batch(_project(root / "a", "a"), config)
        return _batch(_project(root / "b", "b"), config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    cached: dict[bool, int] = {}
    for i in range(args.repeat):
        for shared in ((False, True) if i % 2 == 0 else (True, False)):
            took, n = second_project(shared)
            times[shared].append(took)
            cached[shared] = n
            print(f"repeat {i + 1}: shared store {'on ' if shared else 'off'} {took:6.1f} s "
                  f"({n} job(s) cached)", flush=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"\nthe second project's studio --batch, median of {args.repeat}: without a shared "
          f"store {off:.1f} s ({cached[False]} cached), with one {on:.1f} s ({cached[True]} "
          f"cached): {off / on:.2f}x")


if __name__ == "__main__":
    main()
