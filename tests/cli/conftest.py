import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import link_file

ROOT = Path(__file__).resolve().parents[2]

SMALL = """schema_version = 1
name = "small"
targets = ["{target}"]

[model]
source = "sample:tiny-coder"

[export]
prompt_length = 16
context_length = 64

[quantization]
scheme = "W8A16"
weight_granularity = "per_channel"
calibration_samples = 2

[validation]
heldout_tokens = 96
greedy_tokens = 8
greedy_prompts = 2

[gates]
min_logits_cosine = 0.99
max_perplexity_increase = 0.05

[run]
prompt = "def __init__(self"
max_new_tokens = 8
"""


def default_target() -> str:
    from studio.core.catalog import default_chip_key

    return default_chip_key()


def studio(*args, cwd=None, timeout=900, env=None):
    env = dict(env or os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "studio.cli", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


# The small project itself (``small_project``) and its one end-to-end batch run
# (``batch_run``) are session fixtures of tests/conftest.py, beside the other shared artifacts.


def share_store(src: Path, dest: Path, stages: set[str] | None = None) -> None:
    """Start project ``dest`` from a copy of project ``src``'s artifact store (not its run
    history): stages whose keys match come from the cache. ``stages``: copy only the
    artifacts of these stages (e.g. ``{"export"}``, so that a test about quantize still
    runs it)."""
    import shutil

    objects = src.with_suffix(".studio") / "artifacts" / "objects"
    dest_objects = dest.with_suffix(".studio") / "artifacts" / "objects"
    for meta in objects.glob("*/*/artifact.json"):
        if stages is not None and json.loads(meta.read_text()).get("stage") not in stages:
            continue
        folder = meta.parent
        target = dest_objects / folder.parent.name / folder.name
        if not target.exists():  # linked: stored artifacts are never written in place
            shutil.copytree(folder, target, copy_function=link_file)


def record_run(store, settings: dict | None, metrics: list, state: str = "succeeded") -> int:
    """Record one finished run in a real run history the way the pipeline does: the settings
    it ran with, a validate job and that job's metrics (``studio.core.metrics.Metric``)."""
    run = store.create_run({"stages": ["validate"], "settings": settings})
    job = store.add_job(run, "validate", metrics[0].target if metrics else "")
    store.update_job(job, state=state, progress=1.0)
    if metrics:
        store.add_metrics(job, metrics)
    store.finish_run(run, state)
    return run
