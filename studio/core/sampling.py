"""Token sampling: greedy, temperature, top-k, top-p (nucleus), seeded — and the
accept / resample rule of speculative decoding that keeps the target's distribution.

Pure numpy. ``temperature == 0`` is greedy (argmax, ties to the lowest id, as numpy's
argmax). Filtering follows the usual order: temperature, then top-k, then top-p over the
remaining probabilities (the smallest set whose mass reaches ``top_p``, always keeping the
most likely token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio.core.errors import StudioError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise StudioError(f"temperature must be >= 0 (0 is greedy), not {self.temperature}")
        if self.top_k < 0:
            raise StudioError(f"top-k must be >= 0 (0 keeps every token), not {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise StudioError(f"top-p must be in (0, 1], not {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "seed": self.seed, "greedy": self.greedy}


def probabilities(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The distribution ``cfg`` samples from (float64, sums to 1). Greedy: one-hot."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    out = np.zeros_like(x)
    if cfg.greedy:
        out[int(np.argmax(x))] = 1.0
        return out
    z = x / cfg.temperature
    keep = np.ones(len(z), dtype=bool)
    if cfg.top_k and cfg.top_k < len(z):
        kth = np.partition(z, -cfg.top_k)[-cfg.top_k]
        keep &= z >= kth
    z = np.where(keep, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if cfg.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, cfg.top_p, side="left")) + 1
        drop = order[cut:]
        p[drop] = 0.0
        p /= p.sum()
    return p


class Sampler:
    """Draws tokens for one generation (its own seeded random stream)."""

    def __init__(self, cfg: SamplingConfig | None = None):
        self.cfg = cfg or SamplingConfig()
        self.rng = np.random.default_rng(self.cfg.seed)

    def pick(self, logits: np.ndarray) -> int:
        if self.cfg.greedy:
            return int(np.argmax(np.asarray(logits).reshape(-1)))
        p = probabilities(logits, self.cfg)
        return int(self.rng.choice(len(p), p=p))

    def draw(self, p: np.ndarray) -> int:
        """A token from an explicit distribution ``p``."""
        return int(self.rng.choice(len(p), p=p))

    def accept(self, p_target: np.ndarray, q_draft: np.ndarray, token: int) -> bool:
        """Speculative decoding's test for a drafted ``token``: accept with probability
        min(1, p(token) / q(token)). Greedy targets accept exactly the argmax."""
        if self.cfg.greedy:
            return bool(p_target[token] == 1.0)
        q = float(q_draft[token])
        if q <= 0:
            return False
        return bool(self.rng.random() < min(1.0, float(p_target[token]) / q))

    @staticmethod
    def residual(p_target: np.ndarray, q_draft: np.ndarray) -> np.ndarray:
        """The distribution to resample from after a rejection: norm(max(0, p - q)) — with
        the acceptance test, the emitted token follows ``p_target`` exactly."""
        r = np.maximum(np.asarray(p_target, np.float64) - np.asarray(q_draft, np.float64), 0)
        s = r.sum()
        return r / s if s > 0 else np.asarray(p_target, np.float64)
