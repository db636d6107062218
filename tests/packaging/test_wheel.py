"""The wheel: built from the checkout's sources, it carries the package's code, every shipped
resource (chip catalog, both sample models, texts, schemas, performance model: the checkout's
top-level ``resources/``, inside the package as ``studio/resources``) and the ``studio``
entry point; installed into a virtualenv it runs from there, not from a checkout.

The full check (a fresh virtualenv that sees no other site-packages, the dependencies from
the index, a sample project run end to end) is ``packaging/check-wheel.sh``; this one installs
the wheel with ``--no-deps`` into a virtualenv that reuses this environment's dependencies, so
it takes seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "resources"


def _env() -> dict[str, str]:
    # nothing points at the checkout: no PYTHONPATH, and the commands run outside it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel): ``python -m build`` (with this environment's setuptools) makes the sdist
    from a copy of the checkout's tracked files and then the wheel from that sdist, so the
    wheel proves the sdist complete; nothing is written into the checkout."""
    src = tmp_path_factory.mktemp("src")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                        str(src)], capture_output=True, text=True, timeout=600, env=_env(),
                       cwd=out)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (sdist,) = out.glob("qstudio-*.tar.gz")
    (whl,) = out.glob("qstudio-*.whl")
    return sdist, whl


@pytest.fixture(scope="module")
def wheel(dists) -> Path:
    return dists[1]


def test_the_sdist_carries_the_sources_examples_and_tests(dists):
    with tarfile.open(dists[0]) as t:
        names = {m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile()}
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in",
                 "examples/tiny-coder/tiny-coder.qstudio", "resources/catalog/chips.toml",
                 "resources/models/tiny-coder/model.safetensors",
                 "packaging/check-wheel.sh", "tests/packaging/test_wheel.py"):
        assert name in names, name
    assert not [n for n in names if ".studio/" in n or n.endswith(".pyc")]


def test_wheel_carries_the_code_the_resources_and_the_entry_point(wheel):
    with zipfile.ZipFile(wheel) as z:
        sizes = {i.filename: i.file_size for i in z.infolist() if not i.is_dir()}
        entry_points = z.read(next(n for n in sizes if n.endswith(".dist-info/entry_points.txt")))
        metadata = z.read(next(n for n in sizes if n.endswith(".dist-info/METADATA"))).decode()
    # every module of the package
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "studio").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules and modules <= set(sizes), sorted(modules - set(sizes))[:10]
    # every shipped resource of the top-level resources/, inside the package as
    # studio/resources/, byte for byte the size it has in the checkout; nothing at the top
    shipped = {f"studio/resources/{p.relative_to(RES).as_posix()}": p.stat().st_size
               for p in RES.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    missing = {name for name in shipped if sizes.get(name) != shipped[name]}
    assert not missing, sorted(missing)
    # and by name, what a project needs to run from an install
    needed = ["catalog/chips.toml", "perf/model.toml", "perf/anchors.toml",
              "data/calibration.py.txt", "data/heldout.py.txt", "data/sentences.txt",
              "data/similarity.json"]
    for model in ("tiny-coder", "tiny-coder-draft"):
        needed += [f"models/{model}/{f}" for f in ("model.safetensors", "tokenizer.json",
                                                    "tokenizer_config.json", "config.json")]
    needed += [p.relative_to(RES).as_posix() for p in (RES / "schemas").glob("*.json")]
    assert len(needed) > 15
    for name in needed:
        assert f"studio/resources/{name}" in sizes, name
    assert sizes["studio/resources/models/tiny-coder/model.safetensors"] > 1_000_000
    templates = RES / "templates"
    if templates.is_dir():
        assert any(n.startswith("studio/resources/templates/") for n in sizes)
    # no tests, run stores or byte code ride along
    assert not [n for n in sizes if n.startswith(("tests/", "resources/", "setup.py"))
                or ".studio/" in n or n.endswith(".pyc")]
    assert b"studio = studio.__main__:main" in entry_points
    assert "Requires-Dist: onnxruntime-qnn" in metadata


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A virtualenv with the wheel installed (``--no-deps``); its dependencies come from this
    environment (the base interpreter's site-packages, and this virtualenv's when the tests
    run in one)."""
    root = tmp_path_factory.mktemp("venv") / "v"
    # without pip of its own (no ensurepip needed): this environment's pip installs into it
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                        str(root)],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    py = root / "bin" / "python"
    if sys.prefix != sys.base_prefix:
        # a venv made from inside a venv sees the base interpreter's packages only
        purelib = json.loads(subprocess.check_output(
            [str(py), "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
            env=_env()))[0]
        (Path(purelib) / "outer-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                        "--no-index", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return root


def test_the_installed_studio_runs_from_the_venv(venv, tmp_path):
    # this environment may hold an editable install of studio (a checkout on a meta-path
    # finder): the venv's own site-packages come first, and the imported studio must be the
    # wheel's copy, resources included
    py = venv / "bin" / "python"
    code = ("import json, studio; from studio.core.resources import resources_dir; "
            "print(json.dumps([studio.__file__, str(resources_dir())]))")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    module, resources = (Path(p).resolve() for p in json.loads(r.stdout))
    assert venv.resolve() in module.parents, module
    assert venv.resolve() in resources.parents and (resources / "catalog" / "chips.toml").is_file()

    studio = venv / "bin" / "studio"
    r = subprocess.run([str(studio), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--batch" in r.stdout and "targets" in r.stdout
    r = subprocess.run([str(studio), "targets"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "snapdragon-8-gen-3" in r.stdout


def test_the_entry_point_is_also_the_stage_worker(venv, tmp_path):
    """``studio --studio-worker`` is the worker a frozen build starts (its sys.executable is
    the app): it answers a job spec over the JSON-lines protocol."""
    config = {"stage": "no-such-stage", "item": "", "settings": {}, "paths": {}, "hashed": {}}
    spec = json.dumps({"job_id": "j1", "config": config, "workdir": str(tmp_path)}) + "\n"
    r = subprocess.run([str(venv / "bin" / "studio"), "--studio-worker"], input=spec,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    (msg,) = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert msg["job_id"] == "j1" and msg["type"] == "error"
    assert "no-such-stage" in msg["message"]


def test_worker_command_in_a_frozen_app(monkeypatch):
    from studio.services.workers import worker_command

    assert worker_command() == [sys.executable, "-m", "studio.worker"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert worker_command() == [sys.executable, "--studio-worker"]


@pytest.mark.slow
def test_the_installed_studio_runs_the_shipped_example(venv, dists, tmp_path):
    """The sdist's example project, run by the venv's studio (its workers are the venv's
    python -m studio.worker): export and quantize find the sample model and the calibration
    text among the installed package's resources."""
    with tarfile.open(dists[0]) as t:
        member = next(m for m in t.getmembers()
                      if m.name.endswith("examples/tiny-coder/tiny-coder.qstudio"))
        (tmp_path / "tiny-coder.qstudio").write_bytes(t.extractfile(member).read())
    r = subprocess.run([str(venv / "bin" / "studio"), "--batch", "tiny-coder.qstudio",
                        "--stages", "export,quantize", "--json"], capture_output=True,
                       text=True, timeout=900, cwd=tmp_path, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["state"] == "succeeded"
    assert {j["stage"] for j in summary["jobs"]} == {"export", "quantize"}
