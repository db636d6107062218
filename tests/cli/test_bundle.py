"""`studio bundle`: the small sample's Genie bundle for the default chip, built from its
quantized graph and checked by Qualcomm's own Genie runtime (libGenie.so from the installed
onnxruntime-qnn, on the HTP simulator) against the studio's runtime; broken bundles give one
clear line."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from studio.core.errors import StudioError
from tests.cli.conftest import default_target, share_store, studio

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(batch_run, small_project, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundle")
    proj = folder / "b.qstudio"
    proj.write_text(small_project.read_text() + "\n[bundle]\nprompts = 2\nnew_tokens = 16\n")
    share_store(small_project, proj)  # export, quantize and compile come from the cache
    out = folder / "out"
    r = studio("bundle", proj, "--out", out, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return proj, out, json.loads(r.stdout)


def test_genie_gives_the_studios_greedy_text_from_the_bundle(built):
    _proj, out, res = built
    assert res["folder"] == str(out) and res["target"] == default_target()
    assert len(res["checks"]) == 2
    for c in res["checks"]:
        assert c["identical"], c
        assert c["genie_text"] == c["studio_text"] and c["studio_tokens"] == 16
    assert res["context_size"] == 65  # the decode graph's 64 cache slots + the new token
    names = {p.name for p in out.iterdir()}
    assert names == {"decode_ar1_cl65.bin", "genie_config.json", "tokenizer.json",
                     "manifest.json", "README.md"}
    manifest = json.loads((out / "manifest.json").read_text())
    for name, f in manifest["files"].items():
        data = (out / name).read_bytes()
        assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]
    assert manifest["verification"]["identical"] == 2
    assert manifest["qnn_sdk"] == res["qnn_sdk"] and manifest["chip"]["key"] == default_target()
    cfg = json.loads((out / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == ["decode_ar1_cl65.bin"]
    assert cfg["context"]["size"] == 65 and cfg["tokenizer"]["path"] == "tokenizer.json"
    for graph in ("prefill", "decode"):  # DLC files for the on-device tools
        d = res["dlc"][graph]
        assert d["file"] == f"dlc/{graph}.dlc" and d["bytes"] > 100_000 and d["entries"]
        assert manifest["dlc"][graph]["bytes"] == d["bytes"]
    assert "not runnable on this host" in manifest["dlc"]["note"]
    metrics = {m["name"]: m for m in res["metrics"]}
    assert metrics["genie_tokens_per_s"]["source"] == "simulated"
    assert metrics["genie_identical_prompts"]["value"] == 1.0


def test_a_broken_bundle_says_what_is_wrong(built, tmp_path):
    from studio.engine.genie import GenieDialog

    _proj, out, _res = built
    bad = tmp_path / "no-bin"
    shutil.copytree(out, bad)
    (bad / "decode_ar1_cl65.bin").unlink()
    with pytest.raises(StudioError, match="no context binary decode_ar1_cl65.bin"):
        GenieDialog(bad)
    bad = tmp_path / "bad-tokenizer"
    shutil.copytree(out, bad)
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"')
    with pytest.raises(StudioError, match="tokenizer.json cannot be loaded"):
        GenieDialog(bad)
    bad = tmp_path / "wrong-size"
    shutil.copytree(out, bad)
    cfg = json.loads((bad / "genie_config.json").read_text())
    cfg["dialog"]["context"]["size"] = 99
    (bad / "genie_config.json").write_text(json.dumps(cfg))
    with pytest.raises(StudioError) as err:  # Genie's own words
        GenieDialog(bad)
    assert "Genie could not create the dialog" in err.value.message
    assert "max-CL=65" in err.value.message and "\n" not in err.value.message


def test_bad_targets_are_one_line(built):
    proj, _out, _res = built
    r = studio("bundle", proj, "--target", "snapdragon-8-elite")
    assert r.returncode == 2 and "not a target of this project" in r.stderr
    r = studio("bundle", proj, "--target", "nonsense")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_generate_with_the_genie_runtime(built):
    proj, _out, res = built
    first = res["checks"][0]
    r = studio("generate", proj, "--prompt", first["prompt"], "--max-new-tokens", "8",
               "--runtime", "genie", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["runtime"] == "genie" and got["source"] == "simulated"
    assert got["tokens_out"] == 8 and first["studio_text"].startswith(got["text"])
    assert got["time_to_first_token_ms"] > 0 and "not device latency" in got["timing_note"]
    r = studio("generate", proj, "--prompt", "x", "--runtime", "genie", "--temperature", "0.7")
    assert r.returncode == 2 and "leave out --temperature" in r.stderr


def test_a_bundle_split_in_two_gives_the_same_text(built):
    """--parts 2: two context binaries of consecutive blocks, the residual stream handed over
    as the quantized tensor; Genie chains them and gives the unsplit bundle's text."""
    proj, out, res = built
    r = studio("bundle", proj, "--parts", "2", "--out", out.parent / "split", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    split = json.loads(r.stdout)
    assert split["ctx_bins"] == ["decode_ar1_cl65_part1_of_2.bin",
                                 "decode_ar1_cl65_part2_of_2.bin"]
    assert [c["genie_text"] for c in split["checks"]] == [c["genie_text"] for c in res["checks"]]
    assert all(c["identical"] for c in split["checks"])
    manifest = json.loads((out.parent / "split" / "manifest.json").read_text())
    first, second = manifest["graphs"]
    assert first["outputs"][0] == second["inputs"][0] == "hidden_states_after_1"
    assert "input_ids" in first["inputs"] and "logits" in second["outputs"]
    assert first["qnn_graph"] < second["qnn_graph"]  # Genie takes the parts in name order
