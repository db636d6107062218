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
from tests.ui.conftest import aloop, make_window, qloop, settings  # noqa: F401 - window fixtures

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
    for c in res["checks"]:  # the same text, or parted where the studio's best two tokens tie
        assert c["identical"], c  # the same binaries: the same text, no near-tie excuse
        assert (c["genie_text"] == c["studio_text"]) == c["identical"]
        assert c["studio_tokens"] == 16
    assert res["context_size"] == 65  # the decode graph's 64 cache slots + the new token
    # prompts go through the AR-16 prefill graph (the export's prompt length), the second
    # one longer than it: two passes
    assert res["prefill_ar"] == 16
    short, long = res["checks"]
    assert short["prompt_tokens"] <= 16 and short["prompt_passes"] == 1
    assert long["prompt_tokens"] > 16 and long["prompt_passes"] == 2
    assert res["studio_passes"] == {"ar16": 3, "ar1": 2 * 16 - 2}
    # what ships: one weight-shared binary (the prefill and decode graphs over one copy of the
    # weights), checked by structure against the separate binaries the simulator executed
    names = {p.name for p in out.iterdir()}
    assert names == {"weight_shared_ar16_ar1_cl65.bin", "genie_config.json",
                     "tokenizer.json", "manifest.json", "README.md"}
    manifest = json.loads((out / "manifest.json").read_text())
    (shared,) = manifest["weight_shared"]
    assert shared["executed"] == "checked by structure only: a device executes it"
    assert shared["structure"]["equal"] and len(shared["graphs"]) == 2
    assert shared["bytes"] < 0.7 * shared["separate_bytes"], shared  # the weights once
    assert set(manifest["executed_binaries"]) == {"prefill_ar16_cl65.bin", "decode_ar1_cl65.bin"}
    assert all(g["executed"] == "executed on the HTP simulator" and not g["shipped"]
               for g in manifest["graphs"])
    print(f"\nweight-shared {shared['bytes']} B against {shared['separate_bytes']} B separate: "
          f"{shared['structure']['summary']}")
    for name, f in manifest["files"].items():
        data = (out / name).read_bytes()
        assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]
    assert manifest["verification"]["identical"] == sum(c["identical"] for c in res["checks"])
    # the figures of what ships: the bundle's own binaries scored against FP32 like validate
    acc = res["accuracy"]
    assert acc["tokens"] == 64 and acc["windows"] == 1  # bundle.score_tokens, one context
    assert acc["kl_divergence"] < 0.05 and acc["top1_agreement"] > 0.85, acc
    assert abs(acc["perplexity"] / acc["fp32_perplexity"] - 1) < 0.1, acc
    assert manifest["verification"]["accuracy_on_these_binaries"] == acc
    print(f"\nbundle accuracy on its own binaries: {acc}")
    # validate's greedy check on the same binaries, and the gates judged on them
    g = acc["greedy"]
    assert g["tokens"] == 8 and 0 <= g["prefix_agreement"] <= g["agreement"] <= 1 and g["text"]
    assert (res["logits_cosine_mean"], res["top1_agreement"]) == (acc["logits_cosine"],
                                                                  acc["top1_agreement"])
    assert res["perplexity_quantized"] == acc["perplexity"]
    assert {r["gate"] for r in res["gates"]} == {"min_logits_cosine", "max_perplexity_increase",
                                                 "min_top1_agreement"}
    assert all(r["stage"] == "bundle" and r["target"] == default_target() for r in res["gates"])
    assert res["gates_passed"] and "the shipped binaries against FP32" in res["summary"]
    assert manifest["qnn_sdk"] == res["qnn_sdk"] and manifest["chip"]["key"] == default_target()
    cfg = json.loads((out / "genie_config.json").read_text())["dialog"]
    assert cfg["engine"]["model"]["binary"]["ctx-bins"] == ["weight_shared_ar16_ar1_cl65.bin"]
    prefill, decode = manifest["graphs"]
    assert (prefill["kind"], prefill["ar"], decode["kind"], decode["ar"]) == (
        "prefill", 16, "decode", 1)
    assert "past_key_0_in" in prefill["inputs"] and "past_key_0_out" in prefill["outputs"]
    assert cfg["context"]["size"] == 65 and cfg["tokenizer"]["path"] == "tokenizer.json"
    for graph in ("prefill", "decode"):  # DLC files for the on-device tools
        d = res["dlc"][graph]
        assert d["file"] == f"dlc/{graph}.dlc" and d["bytes"] > 100_000 and d["entries"]
        assert manifest["dlc"][graph]["bytes"] == d["bytes"]
    assert "not runnable on this host" in manifest["dlc"]["note"]
    metrics = {m["name"]: m for m in res["metrics"]}
    assert metrics["genie_tokens_per_s"]["source"] == "simulated"
    assert metrics["genie_identical_prompts"]["value"] == (
        manifest["verification"]["identical"] / 2)


def test_the_studio_generates_genies_text_from_the_same_binaries(built):
    """One set of binaries: `studio generate` on the simulator runs the compile stage's
    binaries the bundle ships, fed as Genie feeds them, so its greedy text is Genie's — not
    a second quantized model's."""
    proj, _out, res = built
    for c in res["checks"][1:]:  # the prompt longer than the AR-16 graph: two AR-16 passes
        r = studio("generate", proj, "--prompt", c["prompt"], "--device",
                   f"htp-sim:{default_target()}", "--max-new-tokens", str(c["new_tokens"]),
                   "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout)
        assert got["text"] == c["studio_text"], (got["text"], c)
        assert c["identical"], c  # the same binaries: the same text, no near-tie excuse


def test_the_gates_judge_the_shipped_binaries(built, tmp_path):
    """A gate the bundle's own binaries miss fails `studio bundle` (exit 1) with the figure;
    the gates are not in the bundle's key, so the stored bundle is judged, not rebuilt."""
    proj, _out, res = built
    strict = proj.with_name("strict.qstudio")
    strict.write_text(proj.read_text().replace("[gates]", "[gates]\nmin_top1_agreement = 0.9999"))
    shutil.copytree(proj.with_suffix(".studio"), strict.with_suffix(".studio"))
    r = studio("bundle", strict, "--out", tmp_path / "out")
    assert r.returncode == (0 if res["top1_agreement"] >= 0.9999 else 1), r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if "gate min_top1_agreement" in x)
    assert "on the shipped binaries" in line and ("FAIL" in line) == (r.returncode == 1)
    assert "(simulated; threshold 0.9999)" in line  # the figure says where it comes from
    assert "Genie bundle for" in r.stdout  # from the store: the summary of the stored result


def test_a_broken_bundle_says_what_is_wrong(built, tmp_path):
    from studio.engine.genie import GenieDialog

    proj, _out, _res = built
    # the separate binaries the simulator loads (the weight-shared one that ships cannot be)
    out = next(proj.with_suffix(".studio").glob("artifacts/objects/*/*/simulator"))
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
    # a key this Genie does not know: Genie's status, decoded (docs/errors.md)
    cfg["dialog"]["context"]["size"] = 65
    cfg["dialog"]["no-such-key"] = 1
    (bad / "genie_config.json").write_text(json.dumps(cfg))
    with pytest.raises(StudioError) as err:
        GenieDialog(bad)
    msg = err.value.message
    assert "(status -8)" in msg and "additional property 'no-such-key'" in msg
    assert "[Genie -8 GENIE_STATUS_ERROR_JSON_SCHEMA:" in msg and "\n" not in msg


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
    assert got["tokens_out"] == 8 and first["genie_text"].startswith(got["text"])
    assert got["time_to_first_token_ms"] > 0 and "not device latency" in got["timing_note"]
    # past the context: Genie's warning (status 4) ends the text there, as the studio's own
    # runtime does — not an error (it was one: "Genie's query failed (status 4)")
    r = studio("generate", proj, "--prompt", first["prompt"], "--max-new-tokens", "200",
               "--runtime", "genie", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    assert got["stopped"] == "context" and 0 < got["tokens_out"] < 200
    r = studio("generate", proj, "--prompt", "x", "--runtime", "genie", "--temperature", "0.7")
    assert r.returncode == 2 and "leave out --temperature" in r.stderr


def test_a_bundle_ships_the_compile_stages_parts_only(built):
    """The bundle copies the binaries validate ran: another part count is refused before any
    work, in one line saying where parts are chosen."""
    proj, out, _res = built
    r = studio("bundle", proj, "--parts", "2", "--out", out.parent / "split", "--json")
    assert r.returncode == 2 and "set export.parts = 2" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1 and not (out.parent / "split").exists()


def test_the_deploy_page_and_the_playground_run_the_bundle(built, make_window, qtbot):  # noqa: F811
    """The window: the Deploy page shows the bundle's files and Genie's check; the LLM
    playground runs Genie on the bundle (greedy, simulated) and Stop ends a Genie query."""
    proj, _out, res = built
    win = make_window()
    assert win.open_project(proj)
    page = win.show_page("Deploy")
    qtbot.waitUntil(lambda: page.checks.rowCount() == 2, timeout=30_000)
    files = [page.files.item(r, 0).text() for r in range(page.files.rowCount())]
    # the latest bundle job (the split one, when that test ran first)
    assert {f.split(".")[0] for f in files if f.endswith(".bin")} == {
        "weight_shared_ar16_ar1_cl65"}
    assert all(page.checks.item(r, 2).text().split(" ")[0] in ("identical", "near")
               for r in range(2))
    assert page.checks.item(1, 1).text().endswith("(2 passes)")
    assert "AR-16 prefill graph" in page.note.text() and page.open_btn.isEnabled()
    page.format.setCurrentText("DLC files")
    assert {page.files.item(r, 0).text() for r in range(page.files.rowCount())} == {
        "dlc/prefill.dlc", "dlc/decode.dlc"}

    llm = win.show_page("LLM")
    llm.tabs.setCurrentWidget(llm.playground)
    pg = llm.playground
    pg.runtime.setCurrentIndex(pg.runtime.findData("genie"))
    assert str(pg.device.currentData()).startswith("htp-sim:") and not pg.kv.isEnabled()
    first = res["checks"][0]
    pg.prompt.setPlainText(first["prompt"])
    pg.max_new.setValue(8)
    pg.go.click()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert pg.last["runtime"] == "genie" and pg.last["source"] == "simulated", pg.stats.text()
    assert pg.last["tokens_out"] == 8 and first["genie_text"].startswith(pg.last["text"])
    assert pg.output.toPlainText() == first["prompt"] + pg.last["text"]
    assert "Genie: 8 tokens" in pg.stats.text() and pg.badge.source == "simulated"
    pg.max_new.setValue(40)
    pg.go.click()
    qtbot.waitUntil(lambda: len(pg.output.toPlainText()) > len(first["prompt"]),
                    timeout=120_000)
    pg.cancel()
    qtbot.waitUntil(lambda: not pg.is_running(), timeout=120_000)
    assert "stopped" in pg.stats.text() and pg.go.isEnabled()


def test_a_parting_at_a_near_tie_is_told_from_a_real_difference():
    from transformers import PreTrainedTokenizerFast

    from studio.core.samples import sample_path
    from studio.engine.bundle import GENIE_TIE_GAP, parting

    tok = PreTrainedTokenizerFast.from_pretrained(str(sample_path("tiny-coder")))
    ref = tok("def area(radius):\n    return 3.14 * radius").input_ids
    alt = tok(" width").input_ids[0]
    genie = tok.decode(ref[:3]) + tok.decode([alt]) + " and more"
    ups = [(0, 1.0)] * len(ref)
    ups[3] = (alt, GENIE_TIE_GAP / 5)  # Genie took the studio's close second
    assert parting(genie, ref, ups, tok) == {"token": 3, "gap": GENIE_TIE_GAP / 5,
                                              "near_tie": True}
    ups[3] = (alt, 1.5)  # a clear winner: a real difference
    assert not parting(genie, ref, ups, tok)["near_tie"]
    ups[3] = (ref[0], GENIE_TIE_GAP / 5)  # close, but Genie took neither of the two
    assert not parting(genie, ref, ups, tok)["near_tie"]


def test_the_bundle_takes_its_kv_cache_as_integers_by_default(built):
    """Quantized graph I/O is the default (``htp.graph_io = "quantized"``): the bundle's AR-16
    and AR-1 graphs take and give the KV cache as uint16 with one encoding per tensor, written
    in the manifest for an app and said in the README; Genie ran them and gave the studio's
    greedy text, and the shipped binaries passed the gates against FP32 (checked above on the
    same bundle)."""
    _proj, out, res = built
    assert res["gates_passed"], res["gates"]
    manifest = json.loads((out / "manifest.json").read_text())
    kv = manifest["kv_cache"]
    assert kv["dtype"] == "uint16"
    (enc,) = kv["encodings"]  # one part: one encoding per cache tensor
    assert set(enc) == {f"{t}_{i}" for i in range(4) for t in ("key", "value")}
    assert all(e["dtype"] == "uint16" and e["scale"] > 0 for e in enc.values())
    assert "as uint16 integers" in (out / "README.md").read_text()


def test_dlc_files_are_written_where_the_setting_and_the_size_say():
    """``bundle.dlc``: on writes them, off does not, auto writes them up to 2 GiB of
    quantized graph weights (the sample's kilobytes: yes; the 8 B shape's 4 GB: no)."""
    from studio.core.settings import DLC_AUTO_BYTES, Bundle
    from studio.engine.bundle import dlc_wanted

    assert Bundle.default("dlc") == "auto" and DLC_AUTO_BYTES == 2 << 30
    assert dlc_wanted("auto", 10 << 20) and not dlc_wanted("auto", 4 << 30)
    assert dlc_wanted("on", 4 << 30) and not dlc_wanted("off", 10 << 20)
