"""The `studio` command with no arguments opens the desktop app (studio/__main__.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_studio_without_arguments_shows_the_window(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QSTUDIO_EXIT_AFTER_SHOW="1",
               XDG_CONFIG_HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "studio"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "shown" in r.stdout


def test_studio_with_a_project_file_opens_it_in_the_window(tmp_path):
    project = ROOT / "examples" / "tiny-coder" / "tiny-coder.qstudio"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QSTUDIO_EXIT_AFTER_SHOW="1",
               XDG_CONFIG_HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "studio", str(project)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    shown = next(ln for ln in r.stdout.splitlines() if ln.startswith("shown"))
    assert "tiny-coder" in shown  # the window's title names the opened project


def test_studio_with_arguments_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "studio", "targets"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "snapdragon-8-gen-3" in r.stdout


def test_studio_without_a_display_says_what_to_do():
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    r = subprocess.run([sys.executable, "-m", "studio"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("error: no display")
