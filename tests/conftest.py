import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the device registry of the tests, never the user's (tests that add agents set their own)
if "QSTUDIO_CONFIG_DIR" not in os.environ:
    import tempfile

    os.environ["QSTUDIO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="qstudio-test-config-")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def small_sample_project(folder: Path, name: str, **sections) -> Path:
    """A project file for the shipped tiny-coder at the small test shapes (prompt 16, context
    64, 2 calibration samples, W8A16 per channel, the catalog's default chip), made with the
    studio's own ``new_project``; ``sections`` replace or extend those tables
    (``quantization={"scheme": "W8A8"}`` keeps the other quantization defaults)."""
    from studio.core import project as pf
    from studio.core.catalog import default_chip_key

    tables: dict = {
        "export": {"prompt_length": 16, "context_length": 64},
        "quantization": {"scheme": "W8A16", "weight_granularity": "per_channel",
                         "calibration_samples": 2},
    }
    for key, value in sections.items():
        tables[key] = {**tables.get(key, {}), **value}
    p = pf.new_project(name, "sample:tiny-coder", [default_chip_key()], **tables)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.qstudio"
    pf.save(p, path)
    return path


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def layerdiff_run(tmp_path_factory) -> tuple[Path, dict, float]:
    """One small sample project after ``studio --batch FILE --stages layerdiff`` (2 windows,
    module outputs), shared by the engine and window tests, which only read it (or copy it):
    (project file, the batch's JSON, seconds)."""
    import json
    import subprocess
    import time

    path = small_sample_project(tmp_path_factory.mktemp("layerdiff"), "layerdiff",
                                layerdiff={"windows": 2, "tensors": "modules"})
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(path), "--stages",
                        "layerdiff", "--json"], capture_output=True, text=True, timeout=1800,
                       cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return path, json.loads(r.stdout), time.perf_counter() - t0


@pytest.fixture(scope="session")
def sensitivity_run(tmp_path_factory) -> tuple[Path, dict, float]:
    """One small sample project at W8A8 (96 held-out tokens for the sensitivity stage) after
    ``studio --batch FILE --stages sensitivity`` (its export, then the real sensitivity
    stage), shared by the engine, CLI and window tests: they read its stored artifacts or
    start from a copy of its artifact store (``tests.cli.conftest.share_store``) with the
    same settings, so the stage comes from the cache instead of running once per test file.
    (project file, the batch's JSON, seconds)."""
    import json
    import subprocess
    import time

    path = small_sample_project(tmp_path_factory.mktemp("sensitivity"), "sensitivity",
                                quantization={"scheme": "W8A8"},
                                sensitivity={"heldout_tokens": 96})
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(path), "--stages",
                        "sensitivity", "--json"], capture_output=True, text=True, timeout=1800,
                       cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return path, json.loads(r.stdout), time.perf_counter() - t0
