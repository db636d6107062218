"""studio estimate: the performance model from the command line."""

from __future__ import annotations

import json

import pytest

from studio.core import archs, perfmodel
from tests.cli.conftest import ROOT, studio


def test_estimate_json_from_a_public_config():
    r = studio("estimate", "--config", ROOT / "resources/configs/llama-3.2-1b.json",
               "--chip", "snapdragon-8-elite", "--scheme", "W4A16", "--context", "4096", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["source"] == "estimated" and d["model_version"] == perfmodel.MODEL_VERSION
    assert d["chip"] == "snapdragon-8-elite" and d["scheme"] == "W4A16" and d["context"] == 4096
    assert 20 < d["decode_tokens_per_s"] < 200 and d["prefill_tokens_per_s"] > 100
    assert d["bound"] == "memory" and d["prefill_bound"] == "compute"
    assert d["weight_bytes"] == archs.load_arch("llama-3.2-1b").params // 2
    assert d["kv_bytes_per_token"] == 2 * 16 * 8 * 64 * 2
    assert d["kv_cache_bytes"] == d["kv_bytes_per_token"] * 4096
    assert set(d["layer_traffic_bytes"]) == {*map(str, range(16)), "lm_head"}
    pts = d["roofline"]["points"]
    assert len(pts) == 16 * 5 + 1 and {p["bound"] for p in pts} <= {"memory", "compute"}


def test_estimate_table_a_checkpoint_folder_and_a_part_number(tmp_path):
    (tmp_path / "config.json").write_text(
        (ROOT / "resources/configs/qwen2.5-1.5b.json").read_text())
    r = studio("estimate", "--config", tmp_path, "--chip", "SM8650", "--scheme", "w8a16",
               "--context", "1024", "--prompt-tokens", "128")
    assert r.returncode == 0, r.stderr
    assert "estimated (roofline" in r.stdout and "decode" in r.stdout and "tok/s" in r.stdout
    assert "Snapdragon 8 Gen 3" in r.stdout and "128 prompt tokens" in r.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["--config", "no-such-model", "--chip", "sm8650"], "config no-such-model not found"),
    (["--config", "llama-3.2-1b", "--chip", "snapdragon-9000"], "unknown target"),
    (["--config", "llama-3.2-1b", "--chip", "qcs9100"],
     "cannot estimate for QCS9100: the chip catalog does not know its DDR bandwidth"),
    (["--config", "llama-3.2-1b", "--chip", "sm8650", "--scheme", "W3A5"], "unknown scheme"),
    (["--config", "llama-3.2-1b", "--chip", "sm8650", "--context", "-4"], "context"),
    (["--chip", "sm8650"], "needs --config"),
    (["--config", "{bad}", "--chip", "sm8650"], "not valid JSON"),
    (["--config", "{empty}", "--chip", "sm8650"], "no 'hidden_size'"),
    (["--config", "qwen2.5-3b", "--chip", "sm8650", "--draft-config", "no-such-draft"],
     "config no-such-draft not found"),
    (["--config", "qwen2.5-3b", "--chip", "sm8650", "--draft-config", "{empty}"],
     "the config has no vocab_size"),
    (["--calibration", "--draft-config", "qwen2-0.5b"], "--draft-config goes with --config"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty.json").write_text("{}")
    args = [a.format(bad=tmp_path / "bad.json", empty=tmp_path / "empty.json") for a in args]
    r = studio("estimate", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_calibration_reproduces_the_shipped_figures():
    r = studio("estimate", "--calibration", "--json")
    assert r.returncode == 0, r.stderr
    cal = json.loads(r.stdout)
    _, shipped = perfmodel.load_fit()
    assert cal["params"] == cal["shipped_params"]
    assert cal["decode_mdape"] == shipped["decode_mdape"]
    assert cal["decode_loo_mdape"] == shipped["decode_loo_mdape"]
    assert cal["source"] == "estimated" and cal["anchors_used"] == len(cal["rows"])
    assert any("sa8255p" == s["chip"] and "cannot estimate" in s["reason"]
               for s in cal["skipped"])
    t = studio("estimate", "--calibration")
    assert t.returncode == 0 and "leave-one-out MdAPE" in t.stdout
    assert f"{shipped['decode_mdape']:.2f} %" in t.stdout


def test_estimate_heldout_prints_every_row_with_its_error_and_the_medians():
    r = studio("estimate", "--heldout")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "not fitted to" in out and "Qwen3-8B" in out and "snapdragon-x-elite" in out
    assert "skipped" in out and "the chip catalog has no such chip" in out
    assert "MdAPE" in out and "doubtful" in out
    d = json.loads(studio("estimate", "--heldout", "--json").stdout)
    assert d["source"] == "estimated" and d["clean"]["rows"] >= 90
    assert all(row["source"] for row in d["rows"])
    bad = studio("estimate", "--heldout", "--chip", "snapdragon-8-elite")
    assert bad.returncode == 2 and "--heldout takes no" in bad.stderr


def test_estimate_a_vision_language_model_with_an_image():
    r = studio("estimate", "--config", "qwen2.5-vl-3b", "--chip", "snapdragon-8-elite",
               "--image", "448", "--prompt-tokens", "64")
    assert r.returncode == 0, r.stderr
    assert "1024 patches -> 256 tokens" in r.stdout and "64 prompt + 256 image tokens" in r.stdout
    assert "TTFT" in r.stdout and "vision" in r.stdout and "estimated" in r.stdout
    d = json.loads(studio("estimate", "--config", "qwen2.5-vl-3b", "--chip", "sa8295p",
                          "--image", "448", "--json").stdout)
    assert d["vision"]["encoder_ms"] > 0 and d["source"] == "estimated"
    bad = studio("estimate", "--config", "llama-3.2-1b", "--chip", "snapdragon-8-elite",
                 "--image", "448")
    assert bad.returncode == 2 and "no vision tower" in bad.stderr


def test_a_drafts_token_table_from_the_two_configs():
    """Qwen2.5-3B with Qwen2-0.5B as its draft: one vocabulary, two widths: the draft keeps
    its own table, 0 bytes saved, and the line says why."""
    args = ["estimate", "--config", "qwen2.5-3b", "--chip", "snapdragon-8-gen-3",
            "--draft-config", "qwen2-0.5b"]
    r = studio(*args, "--json")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)["draft_table"]
    assert not t["shareable"] and t["saved_bytes"] == 0 and t["source"] == "estimated"
    assert t["target"] == {"vocab": 151936, "width": 2048}
    assert t["draft"]["vocab"] == 151936 and t["draft"]["width"] == 896
    r = studio(*args)
    assert r.returncode == 0, r.stderr
    assert "draft's token table: its own, not the target's (widths differ: the target's rows " \
           "are 2048 wide, the draft's 896 (vocabulary 151,936 both)" in r.stdout
    assert "0 B saved (estimated)" in r.stdout

