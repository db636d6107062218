"""The QNN EP's graph names predicted from the model file's path: equal to the names the
real EP gives (the sample compiled under several file names), so the compile stage picks a
part's file name by prediction and compiles it once."""

from __future__ import annotations

import shutil

import onnx
import pytest

from studio.engine import qnn_names


def test_names_the_ep_gave_the_8b_parts():
    """Names read from the context models the EP compiled for the 8 B benchmark's parts."""
    assert qnn_names.murmur3_x86_128(b"") == (0, 0, 0, 0)
    for path, name in (
            ("/tmp/bench/w8b/llama3.1-8b/compile/genie/prefill_1/prefill_2.onnx",
             "16675745807897599714"),
            ("/tmp/bench/w8b/llama3.1-8b/compile/genie/prefill_2/prefill_1.onnx",
             "18384932991400754531")):
        assert qnn_names.graph_name(path) == f"{qnn_names.QNN_PREFIX}{name}_1_0"


@pytest.mark.slow
def test_the_predicted_name_is_the_compiled_one(tmp_path):
    from studio.core.catalog import default_chip_key
    from studio.engine import qnn
    from tests.engine.tiny_onnx import float_model, quantize_w8a16

    model = quantize_w8a16(float_model(tmp_path / "f32.onnx"), tmp_path / "w8a16.onnx")
    for stem in ("part_a", "prefill_7"):
        src = tmp_path / f"{stem}.onnx"
        shutil.copy(model, src)
        comp = qnn.compile_context(src, tmp_path / stem / "m_ctx.onnx", default_chip_key(),
                                   embed=False)
        name = onnx.load(comp["ctx_path"], load_external_data=False).graph.node[0].name
        assert name == qnn_names.graph_name(src)


def test_the_staged_part_folders_give_names_in_the_order_genie_takes():
    """The compile stage stages a split model's graphs in folders whose predicted graph names
    sort part after part for prefill and decode both, so no part compiles twice (at 8 B a
    recompile is some ten minutes a part): checked for 2 to 24 parts."""
    from pathlib import Path

    from studio.engine.deploy import ordered_folders
    from studio.engine.qnn_names import in_order

    staging = Path("/srv/project/artifacts/compile/genie-staging")
    for n in (2, 9, 24):
        parts = [f"part{i + 1}_of_{n}" for i in range(n)]
        folders = ordered_folders(staging, parts, ("prefill", "decode"), candidates=1024)
        assert [f.name.split("_n")[0] for f in folders] == parts
        for graph in ("prefill", "decode"):
            names = [qnn_names.graph_name(f / f"{graph}.onnx") for f in folders]
            assert all(in_order(names[i], names[i - 1] if i else "") for i in range(n))


def test_a_name_s_place_follows_the_order_genie_takes_not_the_hash_s_size():
    """The 8 B run's weight-shared binaries were chosen by the smallest hash: part 3 took
    ``91189191780931875`` (a small number that sorts near the end) and part 4
    ``992746286751077157``, which left part 5 no name among 4096 that sorts after both. The
    place of a name is where it sorts: chosen by it, the weight-shared names of 9 (and 24)
    parts fit, each part's two graphs after the previous part's."""
    from pathlib import Path

    from studio.engine.qnn_names import QNN_PREFIX, in_order, pick, place

    def name(h: str) -> str:
        return f"{QNN_PREFIX}{h}_1_0"

    assert place(name("91189191780931875")) > place(name("1232919843801097146"))
    assert (place(name("91189191780931875")) > place(name("879890296059832734"))) == (
        name("91189191780931875") > name("879890296059832734"))
    folder = Path("/srv/project/artifacts/compile/genie")
    for parts in (9, 24):
        after = {16: "", 1: ""}
        for i in range(parts):
            def paths(salt: int, i: int = i) -> dict[int, Path]:
                return {16: folder / f"shared_{i + 1}" / "src" / f"prefill_s{salt}.onnx",
                        1: folder / f"shared_{i + 1}" / "src" / f"decode_s{salt}.onnx"}

            salt = pick(paths, after, candidates=1024)
            assert salt is not None, (parts, i)
            names = {ar: qnn_names.graph_name(p) for ar, p in paths(salt).items()}
            assert all(in_order(names[ar], after[ar]) for ar in names)
            after = names
