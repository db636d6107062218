"""studio generate on the small project's real batch run: host CPU and the HTP simulator."""

import json

import pytest

from tests.cli.conftest import studio

pytestmark = pytest.mark.slow

LONG = ("def parse_config(path):\n    with open(path) as f:\n        data = json.load(f)\n"
        "    return {k: v for k, v in data.items() if not k.startswith('_')}\n\ndef main(")


def _gen(project, *args) -> dict:
    r = studio("generate", project, *args, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_cpu_generation_json_chunks_and_seeded_sampling(batch_run, small_project):
    greedy = _gen(small_project, "--prompt", "def __init__(self", "--max-new-tokens", "6")
    assert greedy["source"] == "measured" and greedy["device"] == "cpu"
    assert len(greedy["tokens"]) == 6 and greedy["stopped"] == "max_new_tokens"
    assert greedy["time_to_first_token_ms"] > 0 and greedy["decode_tokens_per_s"] > 0
    assert greedy["prompt_chunks"] == 1 and greedy["sampling"]["temperature"] == 0.0

    long = _gen(small_project, "--prompt", LONG, "--max-new-tokens", "4")
    assert long["prompt_tokens"] > 16  # longer than the prefill graph (P = 16)
    assert long["prompt_chunks"] >= 2 and len(long["tokens"]) == 4

    args = ["--prompt", "def add(a, b):", "--max-new-tokens", "8", "--temperature", "0.9",
            "--top-k", "20", "--top-p", "0.95"]
    a = _gen(small_project, *args, "--seed", "7")
    b = _gen(small_project, *args, "--seed", "7")
    assert a["tokens"] == b["tokens"]  # a seed makes sampling repeatable
    others = [_gen(small_project, *args, "--seed", str(s))["tokens"] for s in (1, 2, 3)]
    assert any(t != a["tokens"] for t in others)  # and different seeds sample differently


def test_htp_simulator_generation_is_labelled_simulated_and_stops(batch_run, small_project):
    cpu = _gen(small_project, "--prompt", "def __init__(self", "--max-new-tokens", "6")
    sim = _gen(small_project, "--prompt", "def __init__(self", "--max-new-tokens", "6",
               "--device", "htp-sim")
    assert sim["source"] == "simulated" and sim["device"].startswith("htp-sim:")
    assert len(sim["tokens"]) == 6
    # W8A16 on the simulator agrees with FP32 on the first greedy tokens of this prompt
    assert sim["tokens"][:2] == cpu["tokens"][:2]

    stop = cpu["text"][2:4]
    if stop.strip():
        s = _gen(small_project, "--prompt", "def __init__(self", "--max-new-tokens", "6",
                 "--stop", stop)
        assert s["stopped"] == "stop" and stop not in s["text"]


def test_bad_generate_input_exits_2(batch_run, small_project, tmp_path):
    r = studio("generate", small_project, "--prompt", "   ")
    assert r.returncode == 2 and "prompt is empty" in r.stderr
    r = studio("generate", small_project, "--prompt", "x", "--device", "htp-sim:nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    fresh = tmp_path / "fresh.qstudio"
    fresh.write_text(small_project.read_text())
    r = studio("generate", fresh, "--prompt", "def f(")
    assert r.returncode == 2 and "--stages export" in r.stderr


def test_speculative_generation_matches_greedy_and_reports_acceptance(batch_run, small_project):
    args = ["--prompt", "def __init__(self", "--max-new-tokens", "24"]
    plain = _gen(small_project, *args)
    look = _gen(small_project, *args, "--prompt-lookup")
    draft = _gen(small_project, *args, "--speculative", "--draft", "sample:tiny-coder-draft",
                 "--k", "3")
    for out in (look, draft):
        assert out["tokens"] == plain["tokens"]  # greedy: identical text
        sp = out["speculative"]
        assert sp["target_passes"] <= 23 and sp["tokens_per_target_pass"] >= 1
        assert set(sp["time_split_s"]) == {"draft", "verify", "host"}
        assert out["source"] == "measured"
    assert look["speculative"]["proposer"] == "prompt-lookup"
    assert draft["speculative"]["proposer"] == "draft-model" and draft["speculative"]["k"] == 3
    assert draft["speculative"]["tokens_per_target_pass"] > 1.5  # the draft mostly agrees
    # the shipped draft reads the target's token table (equal values): its graphs hold none
    table = draft["speculative"]["draft_table"]
    assert table["shareable"] and table["values"] == "equal"
    assert table["saved_bytes"] == 2048 * 256 * 4 and table["source"] == "estimated"
    assert table["graph_bytes_dropped"] == 2 * 2 * 2048 * 256 * 4  # table + tied head, 2 graphs
    assert look["speculative"]["draft_table"] is None
    r = studio("generate", small_project, "--prompt", "def f(", "--max-new-tokens", "4",
               "--speculative", "--draft", "sample:tiny-coder-draft")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "draft's token table: the target's (vocabulary 2,048 and width 256 match, values " \
           "equal): 2.0 MiB saved on the host CPU" in r.stderr

    r = studio("generate", small_project, *args, "--speculative")
    assert r.returncode == 2 and "no draft model" in r.stderr
    # on the simulator the deployable binaries' AR-N prefill graph verifies the proposals:
    # the same greedy text as the simulator's one token at a time
    sim = ["--device", "htp-sim", "--max-new-tokens", "8"]
    plain_sim = _gen(small_project, *args, *sim)
    look_sim = _gen(small_project, *args, *sim, "--prompt-lookup")
    assert look_sim["tokens"] == plain_sim["tokens"] and look_sim["source"] == "simulated"
    assert look_sim["speculative"]["target_passes"] <= len(plain_sim["tokens"])
    # overlapped drafting: the draft drafts the next window while the simulator verifies
    over = _gen(small_project, *args, *sim, "--speculative", "--draft",
                "sample:tiny-coder-draft", "--overlap")
    assert over["tokens"] == plain_sim["tokens"] and over["speculative"]["overlap"]
    assert set(over["speculative"]["waiting_s"]) == {"target", "draft"}
    r = studio("generate", small_project, *args, "--prompt-lookup", "--overlap")
    assert r.returncode == 2 and "needs a draft model" in r.stderr


def test_int8_kv_and_window_on_cpu_and_the_simulator(batch_run, small_project):
    args = ["--prompt", "def __init__(self", "--max-new-tokens", "8"]
    plain = _gen(small_project, *args)
    kv8 = _gen(small_project, *args, "--kv", "int8")
    assert plain["kv_cache"]["dtype"] == "float32" and kv8["kv_cache"]["dtype"] == "uint8"
    for out in (plain, kv8):
        assert out["kv_cache"]["bytes_measured"] == out["kv_cache"]["bytes_by_formula"]
    assert kv8["kv_cache"]["bytes_measured"] * 4 == plain["kv_cache"]["bytes_measured"]
    assert kv8["tokens"][:4] == plain["tokens"][:4]
    # a window lets generation run past the context (C = 64 for the small project)
    far = _gen(small_project, "--prompt", "class A:", "--max-new-tokens", "90",
               "--window", "48")
    assert far["kv_cache"]["window"] == 48
    if far["stopped"] != "eos":
        assert len(far["tokens"]) == 90
    r = studio("generate", small_project, "--prompt", "x", "--window", "65")
    assert r.returncode == 2 and "window must be 1..64" in r.stderr
    # the simulator: the quantize and compile stages run for an INT8 KV copy of the recipe
    sim = _gen(small_project, *args, "--device", "htp-sim", "--kv", "int8")
    assert sim["kv_cache"]["dtype"] == "uint8" and sim["source"] == "simulated"
    assert sim["tokens"][:2] == plain["tokens"][:2]
