"""`studio bundle` of a project with a draft model: the bundle carries the draft for the
app's CPU (its ONNX graphs reading the target's token table, the table once, a manifest
entry saying how to run it beside the target's binaries, and what this wheel's Genie can
and cannot do with a draft), checked on the HTP simulator against plain greedy decoding;
the shipped files run as the manifest says on real ONNX Runtime give plain greedy's tokens."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests.cli.conftest import share_store, studio

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(batch_run, small_project, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle-draft")
    proj = folder / "d.qstudio"
    text = small_project.read_text().replace(
        'source = "sample:tiny-coder"\n',
        'source = "sample:tiny-coder"\ndraft = "sample:tiny-coder-draft"\n')
    assert 'draft = "sample:tiny-coder-draft"' in text
    proj.write_text(text + "\n[bundle]\nprompts = 2\nnew_tokens = 16\n")
    share_store(small_project, proj)  # export, quantize and compile come from the cache
    out = folder / "out"
    r = studio("bundle", proj, "--out", out, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return proj, out, json.loads(r.stdout)


def test_the_bundle_carries_the_draft_for_the_cpu_with_the_targets_table(built):
    _proj, out, res = built
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["draft"]
    assert entry["model"] == "sample:tiny-coder-draft" and res["draft"]["model"] == entry["model"]
    assert entry["files"] == ["draft/decode.onnx", "draft/embed_tokens.f32",
                              "draft/graph.json", "draft/prefill.onnx"]
    for name in entry["files"]:  # every file listed with its SHA-256, like the rest
        data = (out / name).read_bytes()
        f = manifest["files"][name]
        assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]
    table = entry["token_table"]
    assert table["shareable"] and table["values"] == "equal"
    assert table["input"] == "model.embed_tokens.weight" and table["shape"] == [2048, 256]
    assert (out / table["file"]).stat().st_size == 2048 * 256 * 4 == table["saved_bytes"]
    import onnx

    for g in ("prefill", "decode"):  # the graphs hold no table: they read the file's
        m = onnx.load(str(out / "draft" / f"{g}.onnx"))
        assert not [i.name for i in m.graph.initializer if 2048 in i.dims]
        assert table["input"] in entry["graphs"][g]["inputs"]
    # how the app runs it, and what Genie here cannot do, said plainly
    assert any(s.startswith("verify: the target's AR-16 prefill binary") for s in
               entry["how_to_run"])
    genie = entry["genie"]
    assert "libQnnGenAiTransformer.so: cannot open shared object file" in \
        genie["cpu_draft_engine"]
    assert "spd dialog" in genie["spd_dialog"] and "Not shipped" in genie["spd_dialog"]
    assert not (out / "genie_config_spd.json").exists()
    readme = (out / "README.md").read_text()
    assert "## Speculative decoding: the draft on the CPU" in readme
    assert "libQnnGenAiTransformer.so" in readme
    # checked on the simulator: the draft from these files, the target's binaries verifying
    check = entry["check"]
    assert check["prompts"] == 2 and check["tokens"] == 32
    for row in check["by_prompt"]:  # the same tokens, or parted at a near tie
        assert row["identical"] or (row["gap_there"] is not None and row["gap_there"] < 1e-2)
    assert check["tokens_per_target_pass"] > 1.0
    metrics = {m["name"]: m for m in res["metrics"]}
    assert metrics["bundle_draft_identical_prompts"]["source"] == "simulated"
    assert metrics["bundle_draft_tokens_per_pass"]["value"] == check["tokens_per_target_pass"]
    assert "the draft sample:tiny-coder-draft for the app's CPU" in res["summary"]
    print(f"\ndraft in the bundle: {check['identical']}/{check['prompts']} prompts identical, "
          f"{check['tokens_per_target_pass']:.2f} tokens per target pass")


def test_the_shipped_draft_run_as_the_manifest_says_gives_plain_greedy(built):
    """The app's side on real ONNX Runtime: the draft's two graphs from the bundle, fed the
    table file as the manifest names it, propose; the target (its FP32 export on the CPU)
    verifies; greedy output is the target's plain greedy output."""
    import onnxruntime as ort

    from studio.core import project as pf
    from studio.engine.llm_runtime import StaticKVGenerator, cpu_generator, load_graph_spec
    from studio.engine.shared_table import target_table
    from studio.engine.speculative import DraftModelProposer, speculative_generate
    from studio.services.generate import stored_artifact

    proj, out, _res = built
    entry = json.loads((out / "manifest.json").read_text())["draft"]
    t = entry["token_table"]
    table = np.fromfile(out / t["file"], dtype="<f4").reshape(t["shape"])
    export = stored_artifact(pf.load(proj), "export", "the export", run=False)
    assert np.array_equal(table, target_table(export))  # the target's table, as shipped
    spec = json.loads((out / "draft" / "graph.json").read_text())

    def session(g):
        return ort.InferenceSession(str(out / "draft" / f"{g}.onnx"),
                                    providers=["CPUExecutionProvider"])

    draft = StaticKVGenerator(session("prefill"), session("decode"), spec,
                              fixed_feeds={t["input"]: table})
    target = cpu_generator(export, load_graph_spec(export))
    for prompt in ([5, 77, 301, 22, 9], [40, 41, 42, 43, 44, 45, 46, 47]):
        plain = target.generate(prompt, 32)["tokens"]
        got = speculative_generate(target, DraftModelProposer(draft), prompt, 32, k=4)
        assert got["tokens"] == plain
        assert got["speculative"]["tokens_per_target_pass"] > 1.0
