"""Demo mode headless (``services.demo``) on the CLI tests' finished batch run: the scenes'
figures with their sources and recordings, the live generation on the host CPU, and
``studio demo`` refusing bad input with one line and exit 2 before any window opens."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from studio.core.errors import StudioError
from studio.services import demo as demosvc

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
RECORDED = re.compile(r"^recorded: run (\d+), (.+), (\d{4}-\d\d-\d\d \d\d:\d\d)")


def studio_demo(*args, env=None):
    env = dict(env or os.environ)
    env.pop("QT_QPA_PLATFORM", None)  # a refusal comes before any window, display or not
    env.pop("DISPLAY", None)
    return subprocess.run([sys.executable, "-m", "studio", "demo", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


def test_scenes_of_a_finished_run_carry_sources_and_recordings(batch_run, small_project):
    from studio.services.history import runs_with_results

    d = demosvc.open_demo(small_project)
    try:
        # the newest run with results (other tests add runs to the shared project)
        assert d.run is not None and d.jobs is not None
        assert d.run.id == runs_with_results(d.jobs)[0]
        assert d.device == "cpu" and d.live_source == "measured"
        assert d.target in d.project.targets and d.prompts == [d.project.run["prompt"]]
        scenes = {s.kind: s for s in demosvc.build_scenes(d)}
        assert list(scenes) == list(d.spec.scenes)

        gen = scenes["generate"]
        assert not gen.empty and gen.extra["source"] == "measured"
        speeds = {f.where: f for f in gen.figures if f.name == "decode speed"}
        assert set(speeds) >= {"host CPU"} and any("HTP simulator" in w for w in speeds)
        for where, f in speeds.items():
            m = RECORDED.match(f.recorded)
            # the demo's run, or for a device it did not cover, the newest earlier run that did
            assert m and int(m.group(1)) <= d.run.id and m.group(2) == where, f.recorded
            assert f.source == ("simulated" if "simulator" in where else "measured")
            assert f.value and f.value > 0

        acc = scenes["accuracy"]
        by = {f.name: f for f in acc.figures}
        assert by["perplexity, FP32"].source == "measured"
        assert by["perplexity, FP32"].where == "host CPU"
        assert by["perplexity, quantized"].source == "simulated"
        assert "HTP simulator" in by["perplexity, quantized"].where
        assert RECORDED.match(acc.recorded) and acc.rows  # the project's gates, evaluated
        assert all(isinstance(g["passed"], bool) for g in acc.rows)

        prof = scenes["profile"]
        assert prof.rows and prof.extra["source"] == "simulated" and prof.extra["ops"] > 0
        assert abs(sum(r["share"] for r in prof.rows) - 1.0) < 1e-6
        assert "not the phone's time" in prof.note

        mem = scenes["memory"]
        assert [r["name"] for r in mem.rows][:3] == ["graph weights, FP32",
                                                    "graph weights, W8A16",
                                                    "KV cache, graph I/O"]
        assert all(r["source"] == "estimated" and r["bytes"] > 0 for r in mem.rows)
        assert mem.rows[1]["bytes"] < mem.rows[0]["bytes"]  # 8-bit weights below FP32

        bundle = scenes["bundle"]
        chip = bundle.rows[0]
        assert chip["chip"] == d.target and chip["compiled"] and chip["sdk"]
        assert RECORDED.match(chip["recorded"])
        assert "studio bundle" in bundle.note  # none built by the batch run

        wf = scenes["waterfall"]
        assert wf.empty and "--stages waterfall" in wf.empty  # not a default stage

        short = dataclasses.replace(d, spec=dataclasses.replace(d.spec, max_new_tokens=4))
        out = demosvc.live_generate(short, "def __init__(self")
        assert out["source"] == "measured" and out["device"] == "cpu"
        assert 1 <= len(out["tokens"]) <= 4 and out["time_to_first_token_ms"] > 0
    finally:
        d.close()


def test_a_demo_file_picks_device_run_and_scenes(batch_run, small_project, tmp_path):
    _r, summary = batch_run
    f = small_project.with_name(small_project.stem + ".demo.toml")
    f.write_text(f'device = "htp-sim"\nrun = {summary["run_id"]}\n'
                 'scenes = ["accuracy", "generate"]\nprompts = ["class A:"]\n')
    try:
        d = demosvc.open_demo(small_project)
        try:
            assert d.demo_file == f and d.spec.scenes == ("accuracy", "generate")
            assert d.device == f"htp-sim:{d.project.targets[0]}"
            assert d.live_source == "simulated" and d.live_note == demosvc.SIMULATOR_NOTE
            assert d.prompts == ["class A:"]
        finally:
            d.close()
        # the demo file by itself finds its project beside it
        d = demosvc.open_demo(f)
        d.close()
        assert d.project.path == small_project.resolve() or d.project.path == small_project
        f.write_text("run = 9999\n")
        with pytest.raises(StudioError, match=r"run 9999 is not in .*history"):
            demosvc.open_demo(small_project)
    finally:
        f.unlink()


def test_studio_demo_refuses_bad_input_in_one_line(batch_run, small_project, tmp_path):
    cases = []
    cases.append((studio_demo(tmp_path / "missing.qstudio"), "no project file"))
    cases.append((studio_demo(tmp_path / "x.txt"), "neither a project"))
    bad = tmp_path / "bad.demo.toml"
    bad.write_text(f'project = "{small_project}"\nscenes = ["generate", "fireworks"]\n')
    cases.append((studio_demo(bad), "unknown scene 'fireworks'"))
    bad.write_text(f'project = "{small_project}"\ndevice = "gpu"\n')
    cases.append((studio_demo(bad), "unknown device 'gpu'"))
    bad.write_text(f'project = "{small_project}"\nrun = 4242\n')
    cases.append((studio_demo(bad), "run 4242 is not in"))
    cases.append((studio_demo(small_project, "--scene", "9"), "the demo has 6 scenes"))
    orphan = tmp_path / "orphan.demo.toml"
    orphan.write_text("")
    cases.append((studio_demo(orphan), "does not exist"))
    for r, words in cases:
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_studio_demo_opens_the_stage(batch_run, small_project):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QSTUDIO_EXIT_AFTER_SHOW="1")
    r = subprocess.run([sys.executable, "-m", "studio", "demo", str(small_project), "--scene",
                        "accuracy", "--windowed"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("shown QStudio demo — small on "), r.stdout
