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


def test_studio_without_the_windows_system_libraries_names_them(monkeypatch, capsys):
    """On an X11 desktop without libxcb-cursor (a fresh machine after the README's first
    command), one line names the missing package and the script that installs it; Qt's own
    abort is not reached."""
    from studio.ui import app

    real = app._loadable
    assert real("libxcb-cursor.so.0")  # this machine has it (the suite's system deps)
    monkeypatch.setattr(app, "_loadable", lambda so: so != "libxcb-cursor.so.0" and real(so))
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    assert app.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "libxcb-cursor0" in err
    assert "bash packaging/install-system-deps.sh" in err
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # offscreen needs no X11 library
    assert app._missing_window_libraries() == []
