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

# ---- the session's shared artifacts -----------------------------------------------------------
# Artifact keys hash the stage, its settings, its inputs' keys and the studio's code, never a
# project's name or folder: projects with the same settings share every key. So each expensive
# artifact of the small sample project is computed once per test run, by the fixtures below,
# and a test that needs it starts from a copy of that store (``share_store``) instead of
# computing it again. A test that uses one of these fixtures runs a stage (or reads what one
# stored) and is in the slow tier (``pytest_collection_modifyitems`` below marks it).
SHARED_ARTIFACT_FIXTURES = frozenset({
    "sample_export", "batch_run", "layerdiff_run", "sensitivity_run", "exported_template",
    "compiled_template",
})


def pytest_collection_modifyitems(config, items):
    """A test that uses a shared-artifact fixture needs a real stage run (the export at
    least, usually the HTP simulator): it belongs to the slow tier whether or not its file
    says so, so ``-m "not slow"`` never starts a batch."""
    slow = pytest.mark.slow
    for item in items:
        if SHARED_ARTIFACT_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(slow)


def run_batch(path: Path, *args: str) -> tuple[dict, float]:
    """``studio --batch PATH ARGS --json`` in a subprocess (as a user runs it), which must
    succeed: (its JSON, seconds)."""
    import json
    import subprocess
    import time

    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "studio.cli", "--batch", str(path), *args,
                        "--json"], capture_output=True, text=True, timeout=1800, cwd=ROOT,
                       env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout), time.perf_counter() - t0


@pytest.fixture(scope="session")
def sample_export(tmp_path_factory) -> Path:
    """The small sample project (``tests.cli.conftest.SMALL``: prompt 16, context 64) after
    ``studio --batch FILE --stages export``: the one FP32 export of the session. Every small
    sample project of the suite (the CLI's, the engine's, the window's) has this export key;
    their fixtures start from a copy of this store's export."""
    from tests.cli.conftest import SMALL, default_target

    f = tmp_path_factory.mktemp("sample-export") / "sample.qstudio"
    f.write_text(SMALL.format(target=default_target()).replace('name = "small"',
                                                               'name = "sample"'))
    summary, _ = run_batch(f, "--stages", "export")
    assert [j["stage"] for j in summary["jobs"]] == ["export"], summary["jobs"]
    return f


@pytest.fixture(scope="session")
def small_project(tmp_path_factory) -> Path:
    """The CLI tests' small sample project (``tests.cli.conftest.SMALL``)."""
    from tests.cli.conftest import SMALL, default_target

    f = tmp_path_factory.mktemp("small") / "small.qstudio"
    f.write_text(SMALL.format(target=default_target()))
    return f


@pytest.fixture(scope="session")
def batch_run(small_project, sample_export):
    """One end-to-end batch run of the small project (every default stage on the real
    quantizer and the real HTP simulator), shared by the CLI tests, and the session's store
    of the quantized graph, its compile for the default chip and its profile: the export
    comes from the session's one export (``sample_export``), every later stage is computed
    here. (the finished process, its JSON)."""
    import json

    from tests.cli.conftest import share_store, studio

    share_store(sample_export, small_project, stages={"export"})
    r = studio("--batch", small_project, "--json")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return r, json.loads(r.stdout)


@pytest.fixture(scope="session")
def layerdiff_run(tmp_path_factory, batch_run, small_project) -> tuple[Path, dict, float]:
    """One small sample project after ``studio --batch FILE --stages layerdiff`` (2 windows,
    module outputs), shared by the engine and window tests, which only read it (or copy it).
    Its export, quantize and compile are the batch run's (same settings, same keys): only the
    layer diff is computed. (project file, the batch's JSON, seconds)."""
    from tests.cli.conftest import share_store

    path = small_sample_project(tmp_path_factory.mktemp("layerdiff"), "layerdiff",
                                layerdiff={"windows": 2, "tensors": "modules"})
    share_store(small_project, path, stages={"export", "quantize", "compile"})
    summary, seconds = run_batch(path, "--stages", "layerdiff")
    return path, summary, seconds


@pytest.fixture(scope="session")
def sensitivity_run(tmp_path_factory, sample_export) -> tuple[Path, dict, float]:
    """One small sample project at W8A8 (96 held-out tokens for the sensitivity stage) after
    ``studio --batch FILE --stages sensitivity`` (the session's export from the cache, then
    the real sensitivity stage), shared by the engine, CLI and window tests: they read its
    stored artifacts or start from a copy of its artifact store (``share_store``) with the
    same settings, so the stage runs once per test run instead of once per test file.
    (project file, the batch's JSON, seconds)."""
    from tests.cli.conftest import share_store

    path = small_sample_project(tmp_path_factory.mktemp("sensitivity"), "sensitivity",
                                quantization={"scheme": "W8A8"},
                                sensitivity={"heldout_tokens": 96})
    share_store(sample_export, path, stages={"export"})
    summary, seconds = run_batch(path, "--stages", "sensitivity")
    return path, summary, seconds
