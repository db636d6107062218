"""The error decoder's table: codes read in every form the tools print them (decimal, hex,
the 64-bit handle's low 16 bits, Genie's status), messages without a code, one entry per
key, docs/errors.md equal to the table, and StudioError decoding what it carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core import errorcodes as ec
from studio.core.errors import StudioError


@pytest.mark.parametrize("text, key", [
    ("Failed to create context from binary with err 0x1388", "QNN 5000"),
    ("<E> Using newer context binary on old SDK", "QNN 5000"),
    ("graphFinalize err=0x1786", "QNN 6022"),
    ("Genie could not create the dialog (status -1): QnnContext err 1002", "QNN 1002"),
    ("GenieDialog_reset failed with Genie_Status_t=-5", "Genie -5"),
    ("Genie refused the bundle's genie_config.json (status -7): parse error", "Genie -7"),
    ("error code 0x10000138c", "QNN 5004"),  # a 64-bit handle: the code is the low 16 bits
    ("QNN_COMMON_ERROR_SYSTEM_COMMUNICATION on graphExecute", "QNN 1007"),
    ("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: "
     "input_ids for the following indices index: 1 Got: 8 Expected: 16", "ORT input shape"),
    ("Required inputs (['attention_mask']) are missing from input feed", "ORT input name"),
    ("dlopen failed: library \"libQnnHtpV75Skel.so\" not found", "FastRPC skel"),
])
def test_codes_and_messages_decode(text, key):
    k = ec.decode(text)
    assert k is not None and k.key == key, (text, k)
    out = ec.explain(text)
    assert out.startswith(text) and f"[{key} " in out and "fix:" in out
    assert ec.explain(out) == out  # never decoded twice


def test_nothing_known_is_left_alone():
    for text in ("took 1002 seconds", "exit code 1", "the prompt is 1004 tokens", ""):
        assert ec.decode(text) is None and ec.explain(text) == text


def test_the_table_is_whole_and_documented():
    keys = [k.key for k in ec.TABLE]
    assert len(keys) == len(set(keys)) >= 40
    for k in ec.TABLE:
        assert k.cause and k.fix and k.source and k.component, k.key
        if k.family == "QNN" and k.code is not None:
            assert k.name.startswith("QNN_"), k.key
    docs = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
    assert docs.read_text() == ec.markdown(), (
        "docs/errors.md is out of date: python -m studio.core.errorcodes > docs/errors.md")


def test_a_studio_error_decodes_the_code_it_carries():
    e = StudioError("QNN HTP session for decode_ctx.onnx on snapdragon-8-gen-3 failed: "
                    "Failed to create context from binary with err 0x138d")
    assert "[QNN 5005 QNN_CONTEXT_ERROR_CREATE_FROM_BINARY:" in e.message
    assert "\n" not in e.message and str(e) == e.message
    plain = StudioError("export.context_length must be larger than export.prompt_length")
    assert plain.message == "export.context_length must be larger than export.prompt_length"
