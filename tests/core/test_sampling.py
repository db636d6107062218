"""Sampling: the filters, seeded draws, and speculative decoding's accept / resample rule
(the emitted tokens follow the target's distribution whatever the draft proposes)."""

import numpy as np
import pytest

from studio.core.errors import StudioError
from studio.core.sampling import Sampler, SamplingConfig, probabilities


def test_greedy_is_argmax_and_one_hot():
    logits = np.array([0.1, 2.0, 2.0, -1.0])
    assert Sampler().pick(logits) == 1
    assert probabilities(logits, SamplingConfig()).tolist() == [0, 1, 0, 0]


def test_temperature_top_k_and_top_p_filters():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    p = probabilities(logits, SamplingConfig(temperature=1.0))
    assert np.allclose(p, [0.5, 0.25, 0.15, 0.1])
    k2 = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert np.allclose(k2, [2 / 3, 1 / 3, 0, 0])
    nucleus = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert np.allclose(nucleus, [0.5 / 0.75, 0.25 / 0.75, 0, 0])  # 0.5 + 0.25 reaches 0.7
    tiny = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.01))
    assert tiny.tolist() == [1, 0, 0, 0]  # the most likely token always stays
    hot = probabilities(logits, SamplingConfig(temperature=100.0))
    assert hot.max() - hot.min() < 0.01


def test_a_seed_repeats_a_generation():
    logits = np.random.default_rng(0).standard_normal(50)
    cfg = SamplingConfig(temperature=0.8, top_k=20, seed=7)
    a = [Sampler(cfg).pick(logits) for _ in range(3)]
    s1, s2 = Sampler(cfg), Sampler(cfg)
    assert [s1.pick(logits) for _ in range(20)] == [s2.pick(logits) for _ in range(20)]
    assert len(set(a)) == 1


@pytest.mark.parametrize("kw, match", [
    ({"temperature": -1}, "temperature"), ({"top_k": -2}, "top-k"), ({"top_p": 0}, "top-p"),
    ({"top_p": 1.5}, "top-p"),
])
def test_bad_settings(kw, match):
    with pytest.raises(StudioError, match=match):
        SamplingConfig(**kw)


def test_rejection_sampling_preserves_the_target_distribution():
    """Draft q proposes, target p verifies: accept with min(1, p/q), else resample from
    norm(max(0, p - q)). The emitted tokens must follow p (chi-square, fixed seed)."""
    p = np.array([0.05, 0.4, 0.3, 0.15, 0.1])  # the target at temperature 1
    q = np.array([0.4, 0.1, 0.1, 0.3, 0.1])  # a poor draft
    s = Sampler(SamplingConfig(temperature=1.0, seed=1234))
    n = 40_000
    counts = np.zeros(len(p))
    accepted = 0
    for _ in range(n):
        t = s.draw(q)
        if s.accept(p, q, t):
            accepted += 1
        else:
            t = s.draw(Sampler.residual(p, q))
        counts[t] += 1
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 13.28  # chi-square, 4 degrees of freedom, p = 0.01
    # plain draft sampling would be far off; acceptance = sum(min(p, q)) = 0.5
    assert float(((q * n - expected) ** 2 / expected).sum()) > 1000
    assert accepted / n == pytest.approx(np.minimum(p, q).sum(), abs=0.01)


def test_greedy_speculation_accepts_exactly_the_argmax():
    s = Sampler()
    p = probabilities(np.array([0.0, 3.0, 1.0]), SamplingConfig())
    assert s.accept(p, p, 1) and not s.accept(p, p, 2)
