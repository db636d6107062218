"""The demo file (``core.demo``): what it accepts, its defaults, and one-line errors for bad
input; where a project's demo file lives and which project a demo file belongs to."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core import demo
from studio.core.errors import StudioError

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_demo_file_parses_and_names_its_project():
    path = ROOT / "examples" / "tiny-coder" / "tiny-coder.demo.toml"
    spec = demo.load(path)
    assert spec.path == path
    assert spec.scenes == demo.DEFAULT_SCENES
    assert spec.device == "cpu" and spec.run is None and spec.run_label == "latest"
    assert spec.prompts and all(p.strip() for p in spec.prompts)
    assert spec.target == "snapdragon-8-gen-3"
    assert demo.project_path_for(path, spec) == path.with_name("tiny-coder.qstudio")
    assert demo.demo_path_for(path.with_name("tiny-coder.qstudio")) == path


def test_defaults_and_accepted_forms():
    spec = demo.parse("")
    assert spec == demo.default_spec()
    assert spec.scenes == tuple(demo.SCENES) and spec.max_new_tokens == 48
    spec = demo.parse('device = "htp-sim:snapdragon-8-gen-3"\nrun = 3\nprompts = "def f("\n'
                      'scenes = ["accuracy", "generate"]\nproject = "../p.qstudio"\n')
    assert spec.device == "htp-sim:snapdragon-8-gen-3" and spec.run == 3
    assert spec.prompts == ("def f(",) and spec.scenes == ("accuracy", "generate")
    assert demo.project_path_for(Path("/x/d/a.demo.toml"), spec) == Path("/x/d/../p.qstudio")
    assert demo.parse('run = "2"').run == 2
    assert demo.parse('device = "htp-sim"').device == "htp-sim"
    assert demo.parse('device = "agent:lab@htp-sim:snapdragon-8-gen-3"').device.startswith(
        "agent:lab")


@pytest.mark.parametrize("text, words", [
    ('scenes = ["generate", "fireworks"]', ["unknown scene 'fireworks'", "waterfall"]),
    ("scenes = []", ["scenes is empty"]),
    ('device = "gpu"', ["device", "unknown device 'gpu'"]),
    ('device = "htp-sim:snapdragon-9000"', ["device", "snapdragon-9000"]),
    ('run = "newest"', ["run must be \"latest\" or a run number"]),
    ("run = 0", ["run must be"]),
    ("max_new_tokens = 0", ["max_new_tokens must be a whole number from 1 to 4096"]),
    ('prompts = ["ok", "  "]', ["prompt 2 is empty"]),
    ('target = "nope"', ["target:"]),
    ('colour = "red"', ["unknown key 'colour'"]),
    ("scenes = [", ["not valid TOML"]),
])
def test_bad_input_is_one_line_saying_what_to_do(text, words):
    with pytest.raises(StudioError) as e:
        demo.parse(text, "demo file x.demo.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("demo file x.demo.toml")
    for w in words:
        assert w in msg, msg


def test_a_missing_demo_file_says_so(tmp_path):
    with pytest.raises(StudioError, match="no demo file"):
        demo.load(tmp_path / "nope.demo.toml")


def test_the_live_device_against_the_project_targets():
    targets = ["snapdragon-8-gen-3", "snapdragon-8-elite"]
    assert demo.resolve_device("htp-sim", targets) == "htp-sim:snapdragon-8-gen-3"
    assert demo.resolve_device("cpu", targets) == "cpu"
    assert demo.resolve_device("htp-sim:snapdragon-8-elite", targets) == \
        "htp-sim:snapdragon-8-elite"
    with pytest.raises(StudioError, match="not a target of the project"):
        demo.resolve_device("htp-sim:snapdragon-8-gen-2", targets)
    with pytest.raises(StudioError, match="no target chip"):
        demo.resolve_device("htp-sim", [])
