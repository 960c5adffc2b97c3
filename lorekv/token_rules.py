"""Next-token rules: pure functions from logits to token ids, plus the per-token statistics.

Every rule takes next-token logits of shape (M, V) — one row per future — and returns the
chosen ids, shape (M,) long, on the logits' device. Probabilities are always computed in
float32 whatever the logits' dtype, so a bf16 model samples from the same distribution as
an fp32 one up to the logits themselves. Random rules draw only from the ``generator``
they are given, which makes futures reproducible from a seed.

The samplers bind the parameters (``lambda logits: temperature(logits, t, g)``) and hand the
resulting :data:`TokenRule` to the rollout. This module is a contract shared by the samplers
and the transformers binding, so it imports neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from lorekv.validation import check_in_range

TokenRule = Callable[[torch.Tensor], torch.Tensor]
"""Maps next-token logits (M, V) to chosen token ids (M,)."""


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape (M, V) with V >= 1, got {tuple(logits.shape)}")


def _check_temperature(temperature: float) -> None:
    check_in_range("temperature", temperature, 0.0, math.inf, low_open=True, high_open=True)


Draws = Literal["independent", "stratified"]
"""How the M futures' draws relate: independently, or stratified (:func:`stratified_uniforms`)."""


def _check_draws(draws: str) -> None:
    if draws not in get_args(Draws):
        raise ValueError(f"draws must be one of {', '.join(get_args(Draws))}, got {draws!r}")


def _scaled_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(M, V) float32 softmax(logits / temperature)."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def stratified_uniforms(m: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """(M,) float32 uniforms, one in each stratum [j/M, (j+1)/M), the strata dealt to the rows
    by a random permutation.

    Each row's uniform is marginally U(0, 1), so a token drawn from it by the inverse CDF is an
    exact draw from its distribution; together the M rows cover [0, 1) evenly. Fresh at every
    decoding step, this is Latin hypercube sampling over the T steps (McKay, Beckman and Conover,
    1979): each future is an exact sample from the model, so the mean over futures stays
    unbiased, while the M futures of one prompt spread over the first token's distribution
    instead of clustering on its mode, which lowers the estimate's variance across seeds.
    """
    strata = torch.randperm(m, generator=generator, device=device).float()
    jitter = torch.rand(m, generator=generator, device=device)
    return (strata + jitter) / m


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(M,) long: row m's token is the one whose slice of [0, 1) holds ``uniforms[m]`` when the
    row's (unnormalised, non-negative) probabilities ``probs`` (M, V) are laid out from the most
    to the least likely (ties in index order). A token of probability 0 is never chosen, even
    where rounding puts a uniform at the top of the cumulative sum."""
    ranked, order = probs.float().sort(dim=-1, descending=True, stable=True)
    cdf = ranked.cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniforms.float().unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    rank = torch.searchsorted(cdf, target, right=True)
    return order.gather(-1, rank).squeeze(-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | None, draws: Draws = "independent") -> torch.Tensor:
    """(M,) one id per row of the (M, V) probabilities ``probs``."""
    if draws == "stratified":
        return inverse_cdf(probs, stratified_uniforms(probs.shape[0], generator, probs.device))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """(M,) long: the most likely token of each row of ``logits`` (M, V).

    Ties go to the lowest index, so the rule is deterministic.
    """
    _check_logits(logits)
    return logits.argmax(dim=-1)


def temperature(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None, draws: Draws = "independent"
) -> torch.Tensor:
    """(M,) long: one draw per row from softmax(logits / temperature), logits (M, V).

    This is the model's own sampling distribution at ``temperature`` 1, which is what makes
    the mean over futures a plain Monte Carlo estimate of the expected future importance.
    ``draws="stratified"`` draws the rows from :func:`stratified_uniforms` (each row still an
    exact draw) instead of independently.

    Raises:
        ValueError: ``temperature`` not a finite number > 0, ``draws`` not one of
            ``independent``/``stratified``, or ``logits`` not (M, V >= 1).
    """
    _check_temperature(temperature)
    _check_draws(draws)
    _check_logits(logits)
    return _draw(_scaled_probs(logits, temperature), generator, draws)


def nucleus(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    draws: Draws = "independent",
) -> torch.Tensor:
    """(M,) long: top-p (nucleus) sampling from softmax(logits / temperature), logits (M, V).

    Per row, the nucleus is the smallest set of most likely tokens whose total probability
    is at least ``top_p``; the most likely token is always in it (ties are broken towards the
    lower index). Its probabilities are renormalised and one token is drawn. ``top_p == 1``
    takes exactly the path of :func:`temperature`, so with the same generator state both
    return the same ids; ``draws`` is as in :func:`temperature`.

    Raises:
        ValueError: ``temperature`` not a finite number > 0, ``top_p`` outside (0, 1],
            ``draws`` not one of ``independent``/``stratified``, or ``logits`` not (M, V >= 1).
    """
    _check_temperature(temperature)
    check_in_range("top_p", top_p, 0.0, 1.0, low_open=True)
    _check_draws(draws)
    _check_logits(logits)
    probs = _scaled_probs(logits, temperature)
    if top_p >= 1.0:
        return _draw(probs, generator, draws)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = F.pad(sorted_probs.cumsum(dim=-1)[:, :-1], (1, 0))
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, mass_before < top_p)
    kept = probs.masked_fill(~keep, 0.0)
    return _draw(kept / kept.sum(dim=-1, keepdim=True), generator, draws)


def token_stats(
    logits: torch.Tensor, token_ids: torch.Tensor, *, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of the chosen tokens and entropy of the distribution, at temperature 1.

    Args:
        logits: (M, V) next-token logits.
        token_ids: (M,) the tokens chosen from them.
        validate: check shapes and the id range. The range check reads the ids on the host,
            so decode loops, whose ids come from a :data:`TokenRule`, pass False.

    Returns:
        ``(logprobs, entropies)``, both (M,) float32: ``log_softmax(logits)[m, token_ids[m]]``
        and ``-sum_v p_v log p_v`` in nats (clamped to [0, log V] against rounding). These fill
        :attr:`Trajectories.logprobs` and :attr:`Trajectories.entropies` for the aggregators.
        They are the model's own statistics, independent of the sampling temperature or top-p.

    Raises:
        ValueError: wrong shapes, or an id outside [0, V).
    """
    if validate:
        _check_token_ids(logits, token_ids)
    v = logits.shape[-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    logprobs = logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    entropies = (-plogp.sum(dim=-1)).clamp(min=0.0, max=math.log(v))
    return logprobs, entropies


def _check_token_ids(logits: torch.Tensor, token_ids: torch.Tensor) -> None:
    _check_logits(logits)
    m, v = logits.shape
    if token_ids.shape != (m,):
        raise ValueError(f"token_ids must have shape ({m},), got {tuple(token_ids.shape)}")
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got {token_ids.dtype}")
    if m > 0 and (token_ids.min() < 0 or token_ids.max() >= v):
        raise ValueError(f"token_ids must lie in [0, {v}), got values in [{token_ids.min()}, {token_ids.max()}]")
