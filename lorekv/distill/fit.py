"""Fitting a surrogate: per layer, a map from a token's hidden state to its teacher scores.

KVzap (https://arxiv.org/abs/2601.07891; kvpress's ``kvzap/train.py``) predicts the log of each KV
head's KVzip+ score from the hidden state h (D,) entering the attention of the token's layer:

- linear: s(h) = W h + b, W (G, D), ridge regression with an unpenalised intercept (penalty
  alpha ||W||², alpha = 1 as scikit-learn's ``Ridge``), one closed-form solve per layer;
- mlp: s(h) = W₂ GELU(W₁ h + b₁) + b₂ with a hidden width of 512, every layer's map trained at once
  on the mean squared error over layers, heads and tokens (AdamW, learning rate 5e-3 with cosine
  annealing, gradient norm clipped to 1, batches of 512, 15 epochs).

The loss is on whatever target the caller records (log scores for KVzap); the held-out figures
(:func:`held_out_report`) say how well each layer's ranking of tokens is reproduced, which is
what a top-k or threshold policy reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lorekv.scorers.surrogate import SurrogateMap
from lorekv.validation import check_int_at_least


def _check_pairs(states: torch.Tensor, scores: torch.Tensor, layers: Sequence[int]) -> None:
    if states.dim() != 3 or scores.dim() != 3 or states.shape[:2] != scores.shape[:2]:
        raise ValueError(
            f"states (N, L, D) and scores (N, L, G) must hold the same N tokens and L layers, got "
            f"{tuple(states.shape)} and {tuple(scores.shape)}"
        )
    if states.shape[1] != len(layers):
        raise ValueError(f"states hold {states.shape[1]} layers, layers lists {len(layers)}")
    if states.shape[0] < 2:
        raise ValueError(f"fitting needs at least 2 tokens, got {states.shape[0]}")
    if not (torch.isfinite(states).all() and torch.isfinite(scores).all()):
        raise ValueError("states and scores must be finite (take the log of positive scores, not of zeros)")


def _check_non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def ridge(states: torch.Tensor, scores: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, D) W and (G,) b minimising ||X Wᵀ + b - Y||² + alpha ||W||² for X (N, D), Y (N, G):
    with centred X̃ = X - x̄, Ỹ = Y - ȳ, (X̃ᵀX̃ + alpha I) Wᵀ = X̃ᵀỸ and b = ȳ - W x̄ (the
    intercept unpenalised), solved in float64."""
    x, y = states.double(), scores.double()
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - x_mean, y - y_mean
    gram = xc.T @ xc + alpha * torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    weight = torch.linalg.solve(gram, xc.T @ yc).T  # (G, D)
    return weight, y_mean - weight @ x_mean


def fit_linear(
    states: torch.Tensor, scores: torch.Tensor, layers: Sequence[int], *, alpha: float = 1.0
) -> SurrogateMap:
    """KVzap's linear surrogate: one ridge regression per layer (:func:`ridge`).

    Args:
        states: (N, L, D) hidden states of N tokens at each of the L ``layers``.
        scores: (N, L, G) their teacher scores (the target, e.g. log scores) per KV head.
        alpha: the ridge penalty (>= 0; 0 is least squares, which needs N > D).
    """
    _check_pairs(states, scores, layers)
    _check_non_negative("alpha", alpha)
    surrogate = SurrogateMap(layers, states.shape[2], scores.shape[2]).to(states.dtype)
    with torch.no_grad():
        for i, module in enumerate(surrogate.maps):
            weight, bias = ridge(states[:, i], scores[:, i], float(alpha))
            module.weight.copy_(weight)
            module.bias.copy_(bias)
    return surrogate


def fit_mlp(
    states: torch.Tensor,
    scores: torch.Tensor,
    layers: Sequence[int],
    *,
    hidden_dim: int = 512,
    epochs: int = 15,
    lr: float = 5e-3,
    batch_size: int = 512,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> SurrogateMap:
    """KVzap's MLP surrogate, every layer's map trained at once on the mean squared error.

    AdamW (``weight_decay``, torch's default 0.01 as KVzap's), learning rate ``lr`` with cosine
    annealing over ``epochs``, gradient norm clipped to 1, shuffled batches of ``batch_size``
    tokens drawn with ``seed`` (the same seed, the same map). Shapes as :func:`fit_linear`.
    """
    _check_pairs(states, scores, layers)
    for name, value in (("hidden_dim", hidden_dim), ("epochs", epochs), ("batch_size", batch_size)):
        check_int_at_least(name, value, 1)
    _check_non_negative("lr", lr)
    _check_non_negative("weight_decay", weight_decay)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        surrogate = SurrogateMap(layers, states.shape[2], scores.shape[2], hidden_dim).to(states.dtype)
    optimizer = torch.optim.AdamW(surrogate.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    n = states.shape[0]
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            batch = order[start : start + batch_size]
            loss = torch.nn.functional.mse_loss(surrogate.all_layers(states[batch]), scores[batch].to(states.dtype))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(surrogate.parameters(), 1.0)
            optimizer.step()
        schedule.step()
    return surrogate.eval().requires_grad_(False)


@dataclass(frozen=True)
class LayerFit:
    """How one layer's predictions match its held-out teacher scores.

    Attributes:
        layer: the model layer.
        mse: mean squared error over tokens and heads.
        r2: 1 - mse / the targets' variance (per head, averaged over heads).
        spearman: the rank correlation over tokens between predicted and teacher scores, per
            head, averaged over heads (what a top-k or threshold policy reads).
    """

    layer: int
    mse: float
    r2: float
    spearman: float


@dataclass(frozen=True)
class FitReport:
    """Held-out figures of a surrogate: one :class:`LayerFit` per layer, on ``tokens`` tokens."""

    tokens: int
    layers: tuple[LayerFit, ...]

    def mean(self, field: str) -> float:
        """The mean over layers of ``field`` (``"mse"``, ``"r2"`` or ``"spearman"``)."""
        return sum(getattr(fit, field) for fit in self.layers) / len(self.layers)


def ranks(values: torch.Tensor) -> torch.Tensor:
    """(N, G) float64 the rank of each value within its column, ties given their mean rank."""
    n = values.shape[0]
    order = values.argsort(dim=0, stable=True)
    ordinal = torch.empty_like(order, dtype=torch.float64).scatter_(
        0, order, torch.arange(n, dtype=torch.float64).unsqueeze(1).expand_as(order).contiguous()
    )
    out = torch.empty_like(ordinal)
    for g in range(values.shape[1]):  # ties: the mean of their ordinal ranks
        _, inverse, counts = torch.unique(values[:, g], return_inverse=True, return_counts=True)
        sums = torch.zeros(counts.shape[0], dtype=torch.float64).index_add_(0, inverse, ordinal[:, g])
        out[:, g] = (sums / counts)[inverse]
    return out


def held_out_report(surrogate: SurrogateMap, states: torch.Tensor, scores: torch.Tensor) -> FitReport:
    """How ``surrogate`` predicts ``scores`` (N, L, G) from ``states`` (N, L, D) on tokens it was
    not fitted on (:class:`FitReport`); layers in the surrogate's order."""
    _check_pairs(states, scores, surrogate.layers)
    with torch.no_grad():
        predicted = surrogate.all_layers(states).double()
    target = scores.double()
    fits = []
    for i, layer in enumerate(surrogate.layers):
        p, y = predicted[:, i], target[:, i]
        mse = (p - y).pow(2).mean()
        variance = y.var(dim=0, unbiased=False).clamp_min(torch.finfo(torch.float64).tiny)
        r2 = (1 - (p - y).pow(2).mean(dim=0) / variance).mean()
        rp, ry = ranks(p), ranks(y)
        rp, ry = rp - rp.mean(dim=0), ry - ry.mean(dim=0)
        denominator = (rp.pow(2).sum(dim=0) * ry.pow(2).sum(dim=0)).sqrt()
        spearman = torch.where(denominator > 0, (rp * ry).sum(dim=0) / denominator, torch.zeros_like(denominator))
        fits.append(LayerFit(layer, float(mse), float(r2), float(spearman.mean())))
    return FitReport(states.shape[0], tuple(fits))
