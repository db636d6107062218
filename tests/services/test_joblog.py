"""A job's log as a user reads it: the libraries' chatter told from the studio's lines (the
lines below are as a real run's history stored them), progress messages as timed lines."""

from __future__ import annotations

from studio.services import joblog

# stored by real jobs of a project in two parts (quantize, bundle) on this machine
NOISE = [
    "quantizer: The original model opset version is 17, which does not support 16-bit integer "
    "quantization natively. Please update the model to opset >= 21. Automatically update the "
    "model to opset 21. Please verify the quantized model.",
    " # LIBNATIVE: No alternate configuration present in libnative_tls.conf or from "
    "LIBNATIVE_CONFIG environment variable - using default thread-local behavior.",
    "\x1b[1;31m2026-12-05 06:24:16.907700254 [E:onnxruntime:, qnn_execution_provider.cc:3672 "
    "CreateHtpPowerConfigId] Failed to create HTP power config id.\x1b[m",
    "2026-12-05 06:24:16.907700254 [W:onnxruntime:, graph.cc:1234 Foo] Removing initializer",
    "",
]
STUDIO = [
    "ONNX vs transformers over 64 positions in 2 parts: max |diff| 1.62e-05 (tolerance "
    "0.0166), top-1 agreement 1.0000",
    "part 1/2 (blocks 0-1): quantized vs FP32 output cosine prefill_output_cosine 1.0000",
    "[   12.3 s]  45% part 1/2: position 16/128",
    # an ONNX Runtime error that is not the simulator's power notice stays readable
    "\x1b[1;31m2026-12-05 06:24:17.1 [E:onnxruntime:, inference_session.cc:12 Run] Non-zero "
    "status code returned while running Gather node\x1b[m",
]


def test_library_chatter_is_noise_and_the_studios_lines_are_not():
    for line in NOISE:
        assert joblog.is_noise(line), line
    for line in STUDIO:
        assert not joblog.is_noise(line), line
    assert joblog.readable(NOISE + STUDIO) == STUDIO
    assert joblog.plain(NOISE[2]).startswith("2026-12-05") and "\x1b" not in joblog.plain(
        NOISE[2])


def test_progress_lines_are_timed_and_recognised():
    line = joblog.progress_line(12.34, 0.45, "part 1/2: position 16/128")
    assert line == "[   12.3 s]  45% part 1/2: position 16/128"
    assert joblog.is_progress(line) and not joblog.is_noise(line)
    assert joblog.progress_line(3.0, None, "starting") == "[    3.0 s] starting"
    assert not joblog.is_progress(STUDIO[0])
