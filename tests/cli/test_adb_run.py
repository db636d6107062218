"""Phones over adb, end to end through the CLI: `studio generate --device adb:SERIAL` and the
run / profile stages on `run.devices = ["adb:SERIAL"]`. No phone can be attached here, so a
stand-in adb and QAIRT SDK (tests/engine/fake_phone.py) carry the files and run the pushed
context binary on the HTP simulator: the numerics are real, the transport is not — the adb
path stays unverified on hardware."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.cli.conftest import default_target, studio
from tests.conftest import copy_store
from tests.engine import fake_phone

pytestmark = pytest.mark.slow
SERIAL = "R5CW1234ABC"


@pytest.fixture(scope="module")
def phone(batch_run, small_project, tmp_path_factory):
    from studio.core.catalog import get_chip

    chip = get_chip(default_target())
    objects = small_project.with_suffix(".studio") / "artifacts" / "objects"
    # the compiled contexts a phone may be sent (not the weight-shared ones: the simulator
    # standing in for the phone cannot load those)
    contexts = sorted({p.parent for p in objects.rglob("*_ctx.onnx")
                       if not p.parent.name.startswith("shared_")})
    assert contexts
    tmp = tmp_path_factory.mktemp("phone")
    env = dict(os.environ, **fake_phone.install(tmp, contexts, chip.key, chip.htp_arch),
               QSTUDIO_CONFIG_DIR=str(tmp / "cfg"))
    return env, tmp


def test_generation_on_the_phone_equals_the_simulator(phone, small_project):
    env, tmp = phone
    r = studio("devices", "sdk", env=env)
    assert r.returncode == 0 and "(from QNN_SDK_ROOT)" in r.stdout
    rows = {d["id"]: d for d in json.loads(studio("devices", "list", "--json", env=env).stdout)}
    assert "unverified on hardware" in rows[f"adb:{SERIAL}"]["status"]

    args = ["generate", small_project, "--prompt", "def __init__(self", "--max-new-tokens", "4",
            "--json"]
    local = json.loads(studio(*args, "--device", "htp-sim").stdout)
    r = studio(*args, "--device", f"adb:{SERIAL}", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["tokens"] == local["tokens"]
    assert got["source"] == "measured" and got["device"] == f"adb:{SERIAL}@{default_target()}"
    assert "unverified on hardware" in got["timing_note"]
    assert got["decode_ms_per_token"] > 0 and got["time_to_first_token_ms"] > 0
    log = (tmp / "phone" / "adb.log").read_text()
    assert "qnn-net-run --backend libQnnHtp.so --retrieve_context ctx-" in log
    assert log.count("push") >= 5  # qnn-net-run, the libraries, both contexts, the inputs

    # a phone with another SoC, a missing SDK, an unknown serial: one line each, exit 2
    r = studio(*args, "--device", f"adb:{SERIAL}", env=dict(env, FAKE_PHONE_SOC="SM8750"))
    assert r.returncode == 2 and "is a Snapdragon 8 Elite" in r.stderr, r.stderr
    no_sdk = {k: v for k, v in env.items() if k != "QNN_SDK_ROOT"}
    r = studio(*args, "--device", f"adb:{SERIAL}", env=no_sdk)
    assert r.returncode == 2 and "no QAIRT SDK folder is set" in r.stderr, r.stderr
    r = studio(*args, "--device", "adb:OTHER1", env=env)
    assert r.returncode == 2 and "adb sees no phone OTHER1" in r.stderr, r.stderr


def test_run_and_profile_stages_on_the_phone(phone, small_project, tmp_path):
    env, _tmp = phone
    proj = tmp_path / "phone.qstudio"
    text = re.sub(r"(?m)^max_new_tokens = \d+$", "max_new_tokens = 2",
                  small_project.read_text().replace(
                      "[run]\n", f'[run]\ndevices = ["adb:{SERIAL}"]\n', 1))
    # every step on the phone is one qnn-net-run (a process that loads the context binary):
    # two tokens and one profiled step keep the test short
    proj.write_text(text + "\n[profile]\nrepeats = 1\n")
    copy_store(small_project.with_suffix(".studio"), proj.with_suffix(".studio"))
    r = studio("--batch", proj, "--stages", "run,profile", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = {(j["stage"], j["target"]): j for j in json.loads(r.stdout)["jobs"]}
    dev = f"adb:{SERIAL}@{default_target()}"
    run, prof = jobs[("run", dev)], jobs[("profile", dev)]
    assert run["state"] == prof["state"] == "succeeded"
    assert "(measured," in run["summary"] and "(measured," in prof["summary"]
    r = studio("profile", "show", proj, "--target", dev, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["source"] == "measured" and shown["ops"]
