"""The adb path without a phone (none can be attached here): device and property parsing on
text in the formats adb documents, the SDK files qnn-net-run needs, the command lines of a
run, reading qnn-net-run's raw outputs, and the context binary taken out of a real compiled
context model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.engine.devices import adb_phone as adb

# `adb devices -l` as adb prints it (format from the Android platform-tools documentation)
DEVICES = """\
* daemon not running; starting now at tcp:5037
* daemon started successfully
List of devices attached
R5CW1234ABC            device usb:1-1 product:dm1qxxx model:SM_S911B device:dm1q transport_id:2
emulator-5554          offline transport_id:3
0123456789ABCDEF       unauthorized usb:1-2 transport_id:4

"""

GETPROP = """\
[ro.board.platform]: [kalama]
[ro.product.model]: [SM-S911B]
[ro.soc.manufacturer]: [QTI]
[ro.soc.model]: [SM8550]
"""


def test_devices_and_properties_are_parsed():
    devs = adb.parse_devices(DEVICES)
    assert [(d.serial, d.state) for d in devs] == [
        ("R5CW1234ABC", "device"), ("emulator-5554", "offline"),
        ("0123456789ABCDEF", "unauthorized")]
    assert devs[0].ready and devs[0].model == "SM_S911B" and not devs[2].ready
    props = adb.parse_getprop(GETPROP)
    assert props["ro.soc.model"] == "SM8550"
    assert adb.chip_of(props).key == "snapdragon-8-gen-2"
    with pytest.raises(StudioError, match="SM1234 is not in the chip catalog"):
        adb.chip_of({"ro.soc.model": "SM1234"})
    with pytest.raises(StudioError, match="no ro.soc.model"):
        adb.chip_of({})


def _sdk(root: Path, arch: int) -> Path:
    for rel in ("bin/aarch64-android/qnn-net-run", "lib/aarch64-android/libQnnHtp.so",
                "lib/aarch64-android/libQnnSystem.so",
                f"lib/aarch64-android/libQnnHtpV{arch}Stub.so",
                f"lib/hexagon-v{arch}/unsigned/libQnnHtpV{arch}Skel.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    return root


def test_sdk_files_and_the_command_lines_of_a_run(tmp_path):
    sdk = _sdk(tmp_path / "qairt", 75)
    files = adb.sdk_files(sdk, 75)
    assert set(files) == {"qnn-net-run", "libQnnHtp.so", "libQnnSystem.so",
                          "libQnnHtpV75Stub.so", "libQnnHtpV75Skel.so"}
    (sdk / "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so").unlink()
    with pytest.raises(StudioError, match="no libQnnHtpV75Skel.so"):
        adb.sdk_files(sdk, 75)

    local = {"qnn-net-run": Path("/sdk/qnn-net-run"), "decode.bin": Path("/p/decode.bin")}
    cmds = adb.run_commands("R5CW1234ABC", "job1", "decode.bin", "inputs.txt", local)
    remote = "/data/local/tmp/qstudio/job1"
    assert cmds[0] == ["adb", "-s", "R5CW1234ABC", "shell", "mkdir", "-p", remote]
    assert cmds[1] == ["adb", "-s", "R5CW1234ABC", "push", "/sdk/qnn-net-run",
                       f"{remote}/qnn-net-run"]
    run = cmds[3][-1]
    assert run.startswith(f"cd {remote} && ")
    for part in ("--backend libQnnHtp.so", "--retrieve_context decode.bin",
                 "--input_list inputs.txt", "--output_dir output", "--profiling_level basic",
                 f"ADSP_LIBRARY_PATH={remote}"):
        assert part in run
    assert cmds[-1] == ["adb", "-s", "R5CW1234ABC", "pull", f"{remote}/output"]
    with pytest.raises(StudioError, match="bad adb serial"):
        adb.run_commands("x; rm -rf /", "j", "c.bin", "i.txt", {})
    # the project's htp.performance_mode becomes qnn-net-run's --perf_profile (unverified on
    # a phone here: the command line is what the QAIRT documentation gives)
    line = adb.net_run_command(remote, "c.bin", "i.txt", perf_profile="burst")
    assert line.endswith("--profiling_level basic --perf_profile burst")
    assert "--perf_profile" not in adb.net_run_command(remote, "c.bin", "i.txt")
    with pytest.raises(StudioError, match="bad performance mode"):
        adb.net_run_command(remote, "c.bin", "i.txt", perf_profile="burst; rm -rf /")


def test_raw_outputs_are_read_with_the_graph_types(tmp_path):
    out = tmp_path / "output" / "Result_0"
    out.mkdir(parents=True)
    logits = np.arange(12, dtype=np.float32).reshape(1, 1, 12)
    logits.tofile(out / "logits.raw")
    np.arange(4, dtype=np.uint16).tofile(out / "present_key_0.raw")
    got = adb.read_outputs(tmp_path / "output", {"logits": ("float32", [1, 1, 12]),
                                                 "present_key_0": ("uint16", [1, 1, 2, 2])})
    assert np.array_equal(got["logits"], logits) and got["present_key_0"].shape == (1, 1, 2, 2)
    with pytest.raises(StudioError, match="has 12 values"):
        adb.read_outputs(tmp_path / "output", {"logits": ("float32", [1, 2, 12])})
    with pytest.raises(StudioError, match="no output 'x'"):
        adb.read_outputs(tmp_path / "output", {"x": ("float32", [1])})


def test_the_context_binary_comes_out_of_a_compiled_model(tmp_path):
    from studio.core.catalog import default_chip_key
    from studio.engine import qnn
    from tests.engine.tiny_onnx import float_model, quantize_w8a16

    model = quantize_w8a16(float_model(tmp_path / "f32.onnx"), tmp_path / "w8a16.onnx")
    chip = default_chip_key()
    ext = qnn.compile_context(model, tmp_path / "a" / "m_ctx.onnx", chip, embed=False)
    emb = qnn.compile_context(model, tmp_path / "b" / "m_ctx.onnx", chip, embed=True)
    b_ext = adb.context_binary(Path(ext["ctx_path"]))
    assert b_ext == Path(ext["bin_files"][0]).read_bytes() and len(b_ext) > 1000
    b_emb = adb.context_binary(Path(emb["ctx_path"]))
    assert len(b_emb) > 1000
    with pytest.raises(StudioError, match="no EPContext node"):
        adb.context_binary(model)
