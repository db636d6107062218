import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Bytecode is cached for the suite even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1, as on the CI machine): the suite starts some 500 Python
# processes of the studio (its command line, stage workers), each of which would compile the
# studio's modules from source again (0.2-0.35 s of CPU each, measured), and each pytest
# worker would rewrite every test module's asserts again. The caches go to the checkout's
# __pycache__ folders (ignored by git, never in the wheel, not part of an artifact key).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False
# offline, and no telemetry store of ONNX Runtime's in the home, as every entry point does
from studio.core import thirdparty  # noqa: E402

thirdparty.settle()
# the device registry of the tests, never the user's (tests that add agents set their own)
if "QSTUDIO_CONFIG_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["QSTUDIO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="qstudio-test-config-")
    atexit.register(shutil.rmtree, os.environ["QSTUDIO_CONFIG_DIR"], True)

# the suite split over workers (pytest -n 2) on two cores: one thread per ONNX Runtime
# session and per torch op, as if each worker had a core of its own (studio.engine.threads)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("QSTUDIO_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

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


def copy_store(src: Path, dest: Path, ignore=None) -> None:
    """Copy a project's ``.studio`` folder (``src``) to ``dest`` with its stored artifacts
    hard-linked, not copied: artifacts are never written in place (a stage writes a new
    folder and renames it), so a link is as good as a copy, and the session's shared
    project holds hundreds of MB by the end of the suite. The run history and the rest are
    copied."""
    import shutil

    def link_or_copy(a: str, b: str) -> None:
        if "objects" in Path(a).parts:
            link_file(a, b)
        else:
            shutil.copy2(a, b)

    shutil.copytree(src, dest, copy_function=link_or_copy, ignore=ignore)


def link_file(a: str, b: str) -> None:
    """``b`` as a hard link to ``a`` (a copy where the file system has none): for stored
    artifacts, which are never written in place."""
    import shutil

    try:
        os.link(a, b)
    except OSError:
        shutil.copy2(a, b)


def built_once(tmp_path_factory, name: str, dest: Path, build) -> dict:
    """Build a shared artifact once per test run, even with the suite split over workers
    (``pytest -n 2``): ``build(folder)`` fills ``folder`` and returns a JSON-able result.
    Without workers it builds in ``dest``. With workers, the first to come builds in a
    folder all workers share (under a file lock: the others wait for it), and every worker
    copies that folder into its own ``dest``, so each has a private copy of the projects and
    stores, as if it had built them itself. Returns the result."""
    import json
    import shutil

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        dest.mkdir(parents=True, exist_ok=True)
        return build(dest)
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / "built-once"
    root.mkdir(exist_ok=True)
    shared, done = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            result = build(shared)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps({"result": result}))
            os.replace(tmp, done)
    shutil.copytree(shared, dest, dirs_exist_ok=True)
    return json.loads(done.read_text())["result"]


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
    says so, so ``-m "not slow"`` never starts a batch. (The order the files go to the
    workers is xdist's: the files with the most tests first. An order by measured duration,
    longest first, was tried and measured slower on 2 cores: 988 s against 903 s, the two
    heaviest files of each kind then running side by side.)"""
    slow = pytest.mark.slow
    for item in items:
        if SHARED_ARTIFACT_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(slow)


def pytest_collection_finish(session):
    """What the collection imported (the studio, the test modules and what they import at
    the top) is moved out of the garbage collector's reach: it lives as long as the worker
    does, and each full collection walked it again. Measured with ``gc.callbacks`` over the
    whole suite, the two workers' collector time went from 59.5 to 48.1 CPU-s (of some 480);
    most of what is left is torch and transformers, which the tests import later."""
    import gc

    if os.environ.get("PYTEST_XDIST_WORKER"):
        _import_the_heavy_libraries()
    gc.collect()
    gc.freeze()


def _import_the_heavy_libraries() -> None:
    """In a worker of a split run (which imports them anyway: the engine's tests export and
    quantize, the window's run the pipeline), torch, transformers with each family's modeling
    module, ONNX and ONNX Runtime's quantizer are imported before the freeze above, so that
    their some 400,000 objects, which live as long as the worker, are not walked again by
    every full collection: the window tests' teardown (``tests/ui/conftest.py: _dispose``)
    collects after each window, which took about 0.26 s with these libraries unfrozen and
    some 50 s of the suite's CPU in all. A single-process run of a few files does not pay
    the imports up front."""
    import importlib

    import onnx  # noqa: F401
    import onnxruntime.quantization  # noqa: F401
    import torch  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    from studio.core.families import FAMILIES

    for model_type in FAMILIES:
        importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


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

    def build(folder: Path) -> None:
        f = folder / "sample.qstudio"
        f.write_text(SMALL.format(target=default_target()).replace('name = "small"',
                                                                   'name = "sample"'))
        summary, _ = run_batch(f, "--stages", "export")
        assert [j["stage"] for j in summary["jobs"]] == ["export"], summary["jobs"]

    dest = tmp_path_factory.mktemp("sample-export")
    built_once(tmp_path_factory, "sample-export", dest, build)
    return dest / "sample.qstudio"


@pytest.fixture(scope="session")
def small_project(tmp_path_factory) -> Path:
    """The CLI tests' small sample project (``tests.cli.conftest.SMALL``)."""
    from tests.cli.conftest import SMALL, default_target

    f = tmp_path_factory.mktemp("small") / "small.qstudio"
    f.write_text(SMALL.format(target=default_target()))
    return f


@pytest.fixture(scope="session")
def batch_run(small_project, sample_export, tmp_path_factory):
    """One end-to-end batch run of the small project (every default stage on the real
    quantizer and the real HTP simulator), shared by the CLI tests, and the session's store
    of the quantized graph, its compile for the default chip and its profile: the export
    comes from the session's one export (``sample_export``), every later stage is computed
    here. (the finished process, its JSON)."""
    import json
    import shutil
    import subprocess

    from tests.cli.conftest import share_store, studio

    def build(folder: Path) -> dict:
        f = folder / small_project.name
        if f != small_project:
            shutil.copy2(small_project, f)
        share_store(sample_export, f, stages={"export"})
        r = studio("--batch", f, "--json")
        assert r.returncode in (0, 1), r.stderr[-3000:]
        return {"args": [str(a) for a in r.args], "returncode": r.returncode,
                "stdout": r.stdout, "stderr": r.stderr}

    got = built_once(tmp_path_factory, "batch-run", small_project.parent, build)
    r = subprocess.CompletedProcess(got["args"], got["returncode"], got["stdout"],
                                    got["stderr"])
    return r, json.loads(r.stdout)


@pytest.fixture(scope="session")
def layerdiff_run(tmp_path_factory, batch_run, small_project) -> tuple[Path, dict, float]:
    """One small sample project after ``studio --batch FILE --stages layerdiff`` (2 windows,
    module outputs), shared by the engine and window tests, which only read it (or copy it).
    Its export, quantize and compile are the batch run's (same settings, same keys): only the
    layer diff is computed. (project file, the batch's JSON, seconds)."""
    from tests.cli.conftest import share_store

    def build(folder: Path) -> dict:
        path = small_sample_project(folder, "layerdiff",
                                    layerdiff={"windows": 2, "tensors": "modules"})
        share_store(small_project, path, stages={"export", "quantize", "compile"})
        summary, seconds = run_batch(path, "--stages", "layerdiff")
        return {"summary": summary, "seconds": seconds}

    dest = tmp_path_factory.mktemp("layerdiff")
    got = built_once(tmp_path_factory, "layerdiff", dest, build)
    return dest / "layerdiff.qstudio", got["summary"], got["seconds"]


@pytest.fixture(scope="session")
def sensitivity_run(tmp_path_factory, sample_export) -> tuple[Path, dict, float]:
    """One small sample project at W8A8 (96 held-out tokens for the sensitivity stage) after
    ``studio --batch FILE --stages sensitivity`` (the session's export from the cache, then
    the real sensitivity stage), shared by the engine, CLI and window tests: they read its
    stored artifacts or start from a copy of its artifact store (``share_store``) with the
    same settings, so the stage runs once per test run instead of once per test file.
    (project file, the batch's JSON, seconds)."""
    from tests.cli.conftest import share_store

    def build(folder: Path) -> dict:
        path = small_sample_project(folder, "sensitivity", quantization={"scheme": "W8A8"},
                                    sensitivity={"heldout_tokens": 96})
        share_store(sample_export, path, stages={"export"})
        summary, seconds = run_batch(path, "--stages", "sensitivity")
        return {"summary": summary, "seconds": seconds}

    dest = tmp_path_factory.mktemp("sensitivity")
    got = built_once(tmp_path_factory, "sensitivity", dest, build)
    return dest / "sensitivity.qstudio", got["summary"], got["seconds"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``QSTUDIO_TEST_TIMELINE=FILE``: each test's start and end (setup to teardown) on
    its worker, one JSON line per test in ``FILE.<worker>``, to see how a suite split over
    workers spends its time (who waits on a shared fixture, which file ends last)."""
    import json
    import time

    out = os.environ.get("QSTUDIO_TEST_TIMELINE")
    start = time.time()
    yield
    if out:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{out}.{worker}", "a") as f:
            f.write(json.dumps({"test": item.nodeid, "start": start, "end": time.time()}) + "\n")
