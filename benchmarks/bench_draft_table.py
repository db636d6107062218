"""Host memory of the draft's CPU generator: its own token table against the target's.

Exports the sample target and its shipped draft (prompt 16, context 64, FP32) and, in a fresh
process per run, measures the resident memory the draft's generator adds (its prefill and
decode sessions, after one prefill and one step): ``own``, the draft's graphs as exported
(the table and its tied head's copy in each graph); ``shared``, the graphs rewritten to read
the token table as an input (:mod:`studio.engine.shared_table`, rewritten once by the parent
process: a child only loads them) fed the target export's array, which the process holds in
both cases. Prints the median of
``--repeats`` runs per mode (MiB, ``measured`` on this host) and the verdict's estimate.

    python benchmarks/bench_draft_table.py [--repeats 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mode: str, target: Path, draft: Path, shared: Path) -> None:
    import numpy  # noqa: F401 - loaded before the baseline, as the session's libraries
    import onnxruntime  # noqa: F401

    from studio.engine.llm_runtime import cpu_generator, load_graph_spec
    from studio.engine.shared_table import TABLE, target_table

    table = target_table(target)  # the target's array: held in both modes
    gc.collect()
    base = rss()
    if mode == "own":
        gen = cpu_generator(draft, load_graph_spec(draft))
    else:
        gen = cpu_generator(shared, load_graph_spec(shared), fixed_feeds={TABLE: table})
    gen.prefill([5, 9, 33])
    gen.step(7, 3)
    gc.collect()
    print(rss() - base)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], *map(Path, a.child[1:]))
        return 0
    from studio.core.samples import sample_path
    from studio.engine.llm_export import export_llm
    from studio.engine.shared_table import checkpoint_share, shared_draft_graphs

    work = a.workdir or Path(tempfile.mkdtemp(prefix="bench-draft-table-"))
    dirs = {name: work / name for name in ("target", "draft")}
    for name, folder in dirs.items():
        if not (folder / "graph.json").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            export_llm(sample_path("tiny-coder" if name == "target" else "tiny-coder-draft"),
                       folder, 16, 64, verify_len=0 if name == "draft" else 5)
    share = checkpoint_share(sample_path("tiny-coder"), sample_path("tiny-coder-draft"))
    done = shared_draft_graphs(dirs["draft"], work / "shared")
    got: dict[str, list[float]] = {"own": [], "shared": []}
    for _ in range(a.repeats):
        for mode in got:
            r = subprocess.run([sys.executable, __file__, "--child", mode, str(dirs["target"]),
                                str(dirs["draft"]), str(work / "shared")], cwd=ROOT,
                               capture_output=True, text=True, check=True)
            got[mode].append(int(r.stdout.strip().splitlines()[-1]) / 2**20)
    print(f"{share.line()}; the rewritten graphs hold "
          f"{done['graph_bytes_dropped'] / 2**20:.1f} MiB less (measured on the files)")
    for mode, values in got.items():
        print(f"draft generator, {mode} table: +{statistics.median(values):.1f} MiB resident "
              f"(measured, median of {len(values)}: {', '.join(f'{v:.1f}' for v in values)})")
    if a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
