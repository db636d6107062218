"""Cold start of the desktop app: process start → main window shown.

Runs ``python -m studio`` (what the ``studio`` command runs with no arguments) in fresh
subprocesses with ``QSTUDIO_EXIT_AFTER_SHOW=1`` (the app prints ``shown`` once its window is
on screen, then quits) and takes the median of 5; the same for the same window opening a
sample project. Prints both with the ratio to ``python -c "import PySide6.QtWidgets"``
measured in the same run. Target: ≤ 2.5 s. Exit status 1 when the target is missed.

    python benchmarks/bench_gui_start.py [--runs 5] [--platform offscreen]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 2.5


def _time_until_shown(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    shown = None
    for line in proc.stdout:
        if line.startswith("shown"):
            shown = time.perf_counter() - t0
            break
    proc.wait(timeout=60)
    if shown is None:
        raise RuntimeError(f"{' '.join(cmd)} exited ({proc.returncode}) without showing a window")
    return shown


def _time_to_exit(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - t0


def _sample_project(folder: Path) -> Path:
    code = (
        "import sys; from pathlib import Path; from studio.ui.standalone import sample_project;"
        "print(sample_project(Path(sys.argv[1]), 'bench'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    return Path(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--platform",
        default=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
        help="Qt platform plugin (offscreen, or xcb under Xvfb)",
    )
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="qstudio-bench-"))
    env = dict(
        os.environ,
        QT_QPA_PLATFORM=args.platform,
        QSTUDIO_EXIT_AFTER_SHOW="1",
        QSTUDIO_CONFIG_DIR=str(tmp / "config"),
        PYTHONDONTWRITEBYTECODE="0",
    )
    py = sys.executable
    baseline_cmd = [py, "-c", "import PySide6.QtWidgets"]
    app_cmd = [py, "-m", "studio"]
    project = _sample_project(tmp)
    _time_until_shown(app_cmd, env)  # compile .pyc files once; not counted
    base, app, with_project = [], [], []
    for _ in range(args.runs):
        base.append(_time_to_exit(baseline_cmd, env))
        app.append(_time_until_shown(app_cmd, env))
        with_project.append(_time_until_shown([*app_cmd, str(project)], env))
    b, a, p = (statistics.median(x) for x in (base, app, with_project))
    print(f"platform {args.platform}, {args.runs} runs each, medians:")
    print(f"  python -c 'import PySide6.QtWidgets'        {b:6.3f} s")
    print(f"  studio (no project) → window shown          {a:6.3f} s   ratio {a / b:4.1f}×")
    print(f"  studio with the sample project → shown      {p:6.3f} s   ratio {p / b:4.1f}×")
    print(
        f"  runs: app {[round(x, 3) for x in app]}, with project "
        f"{[round(x, 3) for x in with_project]}"
    )
    ok = max(a, p) <= TARGET_S
    print(f"target ≤ {TARGET_S} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
