"""The device memory plan's arithmetic on the shipped configs' real layouts: what each part
and binary maps against the catalog's NPU limits, the part count that fits, the precision
named when no part count does, the export's "auto" count from the tighter limit, and the
bundle's one-line refusal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from studio.core.archs import load_arch
from studio.core.catalog import get_chip, load_catalog
from studio.core.deviceplan import (
    Dims,
    Inputs,
    activation_bytes,
    check_bundle_fits,
    device_part_count,
    device_plan,
    kv_dtype,
    layout_of_arch,
    smallest_fitting,
    what_fits,
)
from studio.core.errors import StudioError
from studio.core.parts import plan_parts

GEN3 = get_chip("snapdragon-8-gen-3")
ELITE = get_chip("snapdragon-8-elite")


def model(name: str):
    arch = load_arch(name)
    return layout_of_arch(arch), Dims.of(arch)


def inputs(scheme: str, parts: int = 1, context: int = 4096, sharing: bool = False):
    return Inputs(scheme, parts, context, 128, kv="uint16", weight_sharing=sharing,
                  graph_io="quantized")


def test_the_catalog_gives_each_npu_limit_a_source_or_says_unknown():
    for chip in load_catalog().values():
        for value, source in ((chip.npu_va_bytes, chip.npu_va_source),
                              (chip.npu_context_bytes, chip.npu_context_source)):
            assert source.strip(), chip.key
            if value is None:
                assert chip.htp_arch in (68, 69), chip.key  # no public report for v68 / v69
    assert GEN3.npu_va_bytes == 3891 << 20  # about 3.8 GiB, from the notes
    assert "[VA]" in GEN3.npu_va_source and "estimated" in GEN3.npu_context_source
    assert get_chip("snapdragon-888").npu_va_bytes is None


def test_kv_element_width_follows_the_settings():
    assert kv_dtype("float", "float") == "float32"
    assert kv_dtype("quantized", "float") == "uint16"
    assert kv_dtype("float", "int8") == "uint8" == kv_dtype("quantized", "int8")


def test_llama_3_1_8b_rows_add_up():
    layout, dims = model("llama-3.1-8b")
    plan = device_plan(layout, dims, GEN3, inputs("W8A16", parts=9))
    weights = [r for r in plan.rows if r.kind == "weights"]
    # without weight sharing each part's prefill and decode binaries hold their own copy
    assert len(weights) == 18 and {r.binary for r in weights} == {
        f"part{k}_of_9/{g}" for k in range(1, 10) for g in ("prefill", "decode")}
    # 8-bit weights; the embedding table (a Gather's data) at the activations' 16 bits
    assert sum(r.bytes for r in weights) == 2 * (sum(_part_params(layout, 9))
                                                 + layout.embedding)
    first = next(r for r in weights if r.binary == "part1_of_9/decode")
    assert "embedding table at 16 bits" in first.detail
    kv = sum(r.bytes for r in plan.rows if r.kind == "kv")
    assert kv == 2 * 32 * 8 * 128 * 4096 * 2  # K and V, 32 blocks, 8 KV heads, uint16: 512 MiB
    assert all(r.source == "estimated" for r in plan.rows)
    assert plan.total == sum(plan.part_mappings().values())
    # the 1.05 GB table alone passes the 1 GiB binary estimate: the table at 8 bits fits
    assert plan.fits is False and plan.suggestion == "the embedding table at 8 bits in 9 parts"
    plan = device_plan(layout, dims, GEN3, replace(inputs("W8A16", parts=9), embedding="INT8"))
    assert plan.fits is True and plan.suggestion == ""
    assert sum(r.bytes for r in plan.rows if r.kind == "weights") == 2 * sum(
        _part_params(layout, 9))
    shared = device_plan(layout, dims, GEN3, replace(inputs("W8A16", parts=9, sharing=True),
                                                     embedding="INT8"))
    assert len([r for r in shared.rows if r.kind == "weights"]) == 9
    assert shared.total < plan.total


def _part_params(layout, n):
    return [p.parameters for p in plan_parts(layout, n)]


@pytest.mark.parametrize("chip", [GEN3, ELITE], ids=lambda c: c.key)
def test_llama_3_1_8b_needs_fewer_parts_at_w4a16(chip):
    layout, dims = model("llama-3.1-8b")
    int8 = replace(inputs("W8A16"), embedding="INT8")
    whole = device_plan(layout, dims, chip, int8)
    assert whole.fits is False and whole.suggestion == "9 parts"
    assert "over" in " ".join(whole.over())
    # AI Hub: NUM_SPLITS = 5 (its binaries hold no 16-bit table); the quantizer's 16-bit
    # table (1.05 GB) fits no part count, the 8-bit one 6
    assert smallest_fitting(layout, dims, chip, inputs("W4A16")) is None
    assert smallest_fitting(layout, dims, chip, replace(inputs("W4A16"),
                                                        embedding="INT8")) == 6
    assert what_fits(layout, dims, chip, inputs("W4A16")) == \
        "the embedding table at 8 bits in 6 parts"


def test_llama_2_7b_several_parts_at_w8a16_fewer_at_w4a16():
    layout, dims = model("llama-2-7b")
    w8 = smallest_fitting(layout, dims, GEN3, inputs("W8A16", context=1024))
    w4 = smallest_fitting(layout, dims, GEN3, inputs("W4A16", context=1024))
    assert (w8, w4) == (9, 5)  # the embedding table at 16 bits
    i8 = replace(inputs("W4A16", context=1024), embedding="INT8")
    # AI Hub ships Llama-2-7B at W4A16 as 4 parts x 2 graphs = 8 binaries
    assert smallest_fitting(layout, dims, GEN3, i8) == 4
    plan = device_plan(layout, dims, GEN3, replace(i8, parts=4))
    assert plan.fits and len(plan.binaries()) == 8


def test_a_model_that_fits_no_part_count_is_told_a_narrower_scheme():
    layout, dims = model("llama-3.1-8b")
    # a chip whose binaries take 700 MiB: the first part's embedding table (16 bits: 1.05 GB;
    # 8 bits: 525 MB) and one block (218 MB at 8 bits, 109 MB at 4) fit at W4A16 with the
    # 8-bit table only
    i = replace(inputs("W8A16", context=4096), prefill_length=1)
    tight = replace(GEN3, npu_context_mib=700)
    assert smallest_fitting(layout, dims, tight, i) is None
    assert what_fits(layout, dims, tight, i).startswith(
        "W4A16 with the embedding table at 8 bits in ")
    plan = device_plan(layout, dims, tight, i)
    with pytest.raises(StudioError) as e:
        check_bundle_fits(plan)
    line = str(e.value)
    assert "\n" not in line and "W4A16 with the embedding table at 8 bits in " in line
    assert 'set quantization.scheme = "W4A16", quantization.embedding = "INT8", export.parts' \
        in line
    # an 8-bit table asked for already: only the scheme is named
    assert what_fits(layout, dims, tight, replace(i, embedding="INT8")).startswith("W4A16 in ")


def test_the_refusal_names_the_part_count():
    layout, dims = model("llama-3.2-3b")
    plan = device_plan(layout, dims, GEN3, inputs("W8A16", context=2048))
    with pytest.raises(StudioError, match=r"does not fit Snapdragon 8 Gen 3's NPU .*"
                                          r"6 parts would fit \(set export.parts = 6\)"):
        check_bundle_fits(plan)
    check_bundle_fits(device_plan(layout, dims, GEN3, inputs("W8A16", parts=6, context=2048)))


def test_a_chip_without_known_limits_is_not_judged():
    layout, dims = model("llama-3.1-8b")
    plan = device_plan(layout, dims, get_chip("snapdragon-888"), inputs("W8A16"))
    assert plan.fits is None and "unknown" in plan.summary()
    check_bundle_fits(plan)  # cannot say: no refusal


def test_activation_estimate_grows_with_the_tokens_and_context():
    _, dims = model("llama-3.1-8b")
    decode = activation_bytes(dims, 1, 4096, 2)
    prefill = activation_bytes(dims, 128, 4096, 2)
    assert prefill == (2 * 32 * 128 * 4096 + 4 * 128 * 4096) * 2  # scores + softmax win
    assert decode < prefill


def test_auto_parts_take_the_tighter_of_host_and_device():
    layout, dims = model("llama-3.1-8b")
    device = device_part_count(layout, dims, [GEN3], 128, 4096)
    host = len(plan_parts(layout, "auto", 8, 1_500_000_000))
    assert host == 6 and device == 9
    assert len(plan_parts(layout, "auto", 8, 1_500_000_000, at_least=device)) == 9
    # a small host budget is the tighter one
    assert len(plan_parts(layout, "auto", 8, 800_000_000, at_least=device)) == \
        len(plan_parts(layout, "auto", 8, 800_000_000)) > 9
    # no target knows its limit: the host decides alone
    assert device_part_count(layout, dims, [get_chip("snapdragon-888")], 128, 4096) is None


def test_small_models_fit_whole():
    layout, dims = model("qwen2.5-1.5b")
    # the 233 M-entry table at 16 bits (467 MB) and the rest at 4 bits pass 1 GiB: 2 parts,
    # or one with the table at 8 bits
    plan = device_plan(layout, dims, ELITE, inputs("W4A16", context=2048))
    assert not plan.fits and plan.suggestion == "2 parts"
    plan = device_plan(layout, dims, ELITE, replace(inputs("W4A16", context=2048),
                                                    embedding="INT8"))
    assert plan.fits and plan.inputs.parts == 1
    layout, dims = model("qwen2-0.5b")
    assert device_plan(layout, dims, ELITE, inputs("W4A16", context=2048)).fits
