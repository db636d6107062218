"""Speculative decoding on the real sample model and its shipped draft (ONNX Runtime CPU):
the verify graph against teacher forcing, greedy output identical to plain greedy, and the
rejection-sampling rule keeping the target's distribution (an exact chi-square test)."""

import numpy as np
import pytest
from scipy import stats

from studio.core.errors import StudioError
from studio.core.sampling import Sampler, SamplingConfig, probabilities
from studio.engine.speculative import (
    DraftModelProposer,
    PromptLookupProposer,
    speculative_generate,
)

pytestmark = pytest.mark.slow


def _gen(graphs, verify=True):
    from studio.engine.llm_runtime import StaticKVGenerator, make_cpu_session

    out, spec = graphs
    v = out / "verify.onnx"
    return StaticKVGenerator(make_cpu_session(out / "prefill.onnx"),
                             make_cpu_session(out / "decode.onnx"), spec,
                             make_cpu_session(v) if verify and v.is_file() else None)


@pytest.fixture(scope="module")
def target(tiny_coder_graphs):
    return _gen(tiny_coder_graphs)


@pytest.fixture(scope="module")
def draft(tiny_coder_draft_graphs):
    return _gen(tiny_coder_draft_graphs, verify=False)


@pytest.fixture(scope="module")
def prompts(sample_model_dir, sample_data_dir):
    """Three held-out prompts of 24 tokens from different places of the held-out text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(sample_model_dir))
    ids = tok((sample_data_dir / "heldout.py.txt").read_text()).input_ids
    return [ids[s:s + 24] for s in (200, 1500, 4000)]


def test_verify_graph_matches_teacher_forcing_and_pads(target, prompts):
    ids = prompts[0] + prompts[1]  # 48 tokens: prefill 32 + verify chunks
    ref = target.teacher_forced_logits(ids)
    target.reset()
    last, passes = target.prefill_prompt(ids[:44])
    assert passes == 1 + 3  # 32 through prefill, then 5 + 5 + 2
    assert np.abs(last - ref[43]).max() < 1e-3
    rows = target.verify(ids[44:47], 44)  # 3 of N = 5 tokens: two padding rows
    assert rows.shape[0] == 3
    assert np.abs(rows - ref[44:47]).max() < 1e-3


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_greedy_speculative_output_is_plain_greedy(target, draft, prompts, kind):
    passes = tokens = 0
    for prompt in prompts:
        plain = target.generate(prompt, 96)
        proposer = DraftModelProposer(draft) if kind == "draft" else PromptLookupProposer()
        spec = speculative_generate(target, proposer, prompt, 96, k=4)
        assert spec["tokens"] == plain["tokens"]  # ≥ 90 tokens, token for token
        assert len(spec["tokens"]) == 96
        s = spec["speculative"]
        assert s["target_passes"] < 95 and 0 <= s["acceptance_rate"] <= 1
        passes += s["target_passes"]
        tokens += len(spec["tokens"]) - 1
        split = s["time_split_s"]
        assert split["verify"] > 0 and split["host"] >= 0
    if kind == "draft":  # the draft agrees with its target most of the time
        assert tokens / passes >= 2.0
    else:
        assert tokens / passes > 1.0


def test_fixed_k_and_long_context_end(target, prompts):
    out = speculative_generate(target, PromptLookupProposer(), prompts[2], 200, k=3,
                               adaptive=False)
    assert out["stopped"] == "context_full"
    assert len(prompts[2]) + len(out["tokens"]) - 1 == target.context_len
    assert out["speculative"]["k"] == 3 and not out["speculative"]["adaptive"]


def test_rejection_sampling_keeps_the_target_distribution(target, draft, prompts):
    """At temperature 1 (top-k 4), the pair (t1, t2) — t1 drawn plainly after prefill, t2
    the first position the draft proposes for — follows p(t1) p(t2 | t1) of the target."""
    cfg = SamplingConfig(temperature=1.0, top_k=4, seed=1234)
    prompt = prompts[1]
    sampler = Sampler(cfg)
    draft_cfg = SamplingConfig(temperature=1.0, top_k=4, seed=99)
    proposer = DraftModelProposer(draft, draft_cfg)
    counts: dict[tuple[int, int], int] = {}
    runs = 800
    rejected = 0
    for _ in range(runs):
        out = speculative_generate(target, proposer, prompt, 2, sampler=sampler, k=1,
                                   adaptive=False)
        pair = (out["tokens"][0], out["tokens"][1])
        counts[pair] = counts.get(pair, 0) + 1
        rejected += out["speculative"]["accepted_tokens"] == 0
    assert rejected > 10  # the draft's distribution differs: the resampling path ran
    # the exact distribution of the pair from the target itself
    target.reset()
    p1 = probabilities(target.prefill_prompt(prompt)[0], cfg)
    expected: dict[tuple[int, int], float] = {}
    for t1 in np.flatnonzero(p1):
        target.reset()
        last = target.teacher_forced_logits(prompt + [int(t1)])[-1]
        p2 = probabilities(last, cfg)
        for t2 in np.flatnonzero(p2):
            expected[(int(t1), int(t2))] = p1[t1] * p2[t2]
    assert set(counts) <= set(expected)
    cells = sorted(expected)
    obs = np.array([counts.get(c, 0) for c in cells], dtype=float)
    exp = np.array([expected[c] for c in cells]) * runs
    assert exp.sum() == pytest.approx(runs)
    _, pvalue = stats.chisquare(obs, exp)
    assert pvalue > 0.01, (pvalue, list(zip(cells, obs, exp.round(1), strict=True)))


# ---- overlapped drafting: the draft drafts the next window while the target verifies ----------
@pytest.fixture(scope="module")
def long_pair(tmp_path_factory, sample_model_dir):
    """The sample and its shipped draft exported with a 256-token cache (200 new tokens after
    a 24-token prompt)."""
    from studio.engine.llm_export import export_llm

    t = tmp_path_factory.mktemp("spec-target-256")
    d = tmp_path_factory.mktemp("spec-draft-256")
    target = _gen((t, export_llm(sample_model_dir, t, 32, 256)))
    draft = _gen((d, export_llm(sample_model_dir.parent / "tiny-coder-draft", d, 32, 256,
                                verify_len=0)), verify=False)
    return target, draft


@pytest.fixture(scope="module")
def five_prompts(sample_model_dir, sample_data_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(sample_model_dir))
    ids = tok((sample_data_dir / "heldout.py.txt").read_text()).input_ids
    return [ids[s:s + 24] for s in (200, 1500, 2700, 4000, 5200)]


def test_overlapped_greedy_is_plain_greedy_over_long_generations(long_pair, five_prompts):
    target, draft = long_pair
    ahead = both = 0.0
    for prompt in five_prompts:
        plain = target.generate(prompt, 200)["tokens"]
        out = speculative_generate(target, DraftModelProposer(draft), prompt, 200, k=4,
                                   overlap=True)
        assert out["tokens"] == plain and len(plain) == 200
        s = out["speculative"]
        assert s["overlap"] and s["target_passes"] < 120
        ahead += s["ahead"]["used"]
        both += s["busy_s"]["both"]
        split = s["busy_s"]["draft"] + s["busy_s"]["target"] - s["busy_s"]["both"]
        assert split <= out["wall_s"] + 1e-6 and s["waiting_s"]["draft"] >= 0
    assert ahead > 0 and both > 0  # windows were drafted during verify passes and taken


class WrongAt:
    """The draft with its choice made wrong where its cache position is in ``bad``: the
    target rejects there (the rest of the draft is the draft's)."""

    def __init__(self, gen, bad):
        self.gen, self.bad = gen, set(bad)
        self.context_len = gen.context_len

    def reset(self):
        self.gen.reset()

    def prefill_prompt(self, ids, progress=None):
        return self.gen.prefill_prompt(ids, progress)

    def step(self, token, pos):
        logits = np.array(self.gen.step(token, pos), dtype=np.float32, copy=True)
        if pos in self.bad:
            top = int(np.argmax(logits))
            logits[(top + 1) % logits.shape[-1]] = logits[top] + 1.0
        return logits


@pytest.mark.parametrize("where", ["early", "late", "every", "each-window-position"])
def test_forced_rejections_roll_both_caches_back(long_pair, five_prompts, where):
    """Rejections forced at the first drafted positions, the last ones, every one, and at
    each position of a window in turn (k = 4 fixed: a window is the target's token and 4
    drafts; the wrong position moves by one every 40 positions): overlapped drafting (and,
    with every draft wrong, sequential drafting) gives plain greedy's tokens over 200 new
    tokens."""
    target, draft = long_pair
    bad = {"early": range(24, 28), "late": range(190, 224), "every": range(256)}.get(
        where) or [p for p in range(256) if p % 5 == (p // 40) % 5]
    prompt = five_prompts[where == "late"]
    plain = target.generate(prompt, 200)["tokens"]
    # (the sequential path rolls back the same way: checked once, with every draft wrong)
    for overlap in (True, False) if where == "every" else (True,):
        out = speculative_generate(target, DraftModelProposer(WrongAt(draft, bad)),
                                   prompt, 200, k=4, adaptive=False, overlap=overlap)
        assert out["tokens"] == plain, (where, overlap)
        if where == "every":  # (a wrong token is now and then the target's own)
            assert out["speculative"]["acceptance_rate"] < 0.15


def test_overlap_needs_a_draft_model(target, prompts):
    with pytest.raises(StudioError, match="overlapped drafting needs a draft model"):
        speculative_generate(target, PromptLookupProposer(), prompts[0], 8, overlap=True)
