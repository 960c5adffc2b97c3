"""Sampler interface: which queries stand for "the future"?

A sampler decides *what* the future is (greedy, sampled, teacher-forced, or the prompt's
own last queries); the model work of producing it is done by a :class:`Rollout`, which the
pipeline implements over a prefilled model. Keeping the two apart lets samplers be tested
without a model and lets the pipeline batch the M futures in one forward pass per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, Protocol

import torch
from pydantic import Field

from lorekv.registry import ComponentConfig, Registry
from lorekv.scores import Selection
from lorekv.token_rules import TokenRule
from lorekv.trajectories import FutureMixture, LayerCapture, Step, Trajectories, cat_optional


class Rollout(Protocol):
    """Model-side services a sampler draws on; all start from the prefilled prompt.

    Attributes:
        prompt_ids: (1, n) the prompt's token ids.
        prompt_length: n, the prompt's token count.
        candidates: how many leading prompt tokens are eviction candidates (n - 1 in
            query-aware mode, where the last one is re-fed; n query-agnostic).
        tokenizer: the model's tokenizer where the caller passed one (``Pipeline.compress(...,
            tokenizer=...)``), else None; only samplers that feed text of their own need it.
    """

    prompt_ids: torch.Tensor
    prompt_length: int
    candidates: int
    tokenizer: Any | None

    def decode(
        self, rule: TokenRule, num_futures: int, num_tokens: int, *, keep: Selection | None = None
    ) -> Trajectories:
        """Extend the prompt M times by T tokens chosen by ``rule``, capturing the queries.

        With ``keep`` (a selection among the n prompt tokens of every evictable layer), the
        futures are decoded from the prompt cache restricted to it, positions preserved (a
        draft cache, as LAQ's); the captured layers still hold the full prompt's keys.
        """
        ...

    def teacher_force(self, token_ids: torch.Tensor, *, stats: bool = True) -> Trajectories:
        """Feed the given (M, T) long continuations after the prompt, capturing the queries.

        ``token_ids`` may arrive on the CPU; the rollout moves it to the model's device.
        ``stats=False`` leaves the tokens' log-probs and entropies at 0 and computes no
        logits beyond the last position (the output head over T positions and a softmax over the
        vocabulary at each: a fifth of a small model's pass), for a caller whose aggregation
        reads none (one pseudo-future).
        """
        ...

    def follow(self, script: Sequence[Step], num_futures: int) -> Trajectories:
        """Extend the prompt M times by a script of fed and drawn steps, capturing the queries.

        The steps come one after the other at positions n, n+1, ..., n+S-1 (S the script's total
        length): a :class:`~lorekv.trajectories.Fed` step's tokens are teacher-forced into every future, a
        :class:`~lorekv.trajectories.Drawn` step's are chosen by its rule from each future's own logits. Every token's
        query is captured, so the result holds (M, S) tokens with their log-probs and entropies
        (a fed token's under the model, as :meth:`teacher_force` gives them), queries
        (M, H, S, d) and response keys (M, G, S, d): a drawn token attends to the fed ones
        before it exactly as the model did. Nothing of the script is a prompt token, so none of
        it is ever an eviction candidate.
        """
        ...

    def prompt_window(self, window: int | Literal["all"]) -> Trajectories:
        """The queries of the last ``window`` prompt tokens (``"all"``: every prompt token), as
        captured during prefill."""
        ...

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the model's device, seeded with ``seed``."""
        ...


class BatchRollout(Protocol):
    """The rollouts of a batch of prompts prefilled together (a left-padded batch).

    Attributes:
        rows: one :class:`Rollout` per prompt, each exactly as if the prompt were alone.
    """

    rows: Sequence[Rollout]

    def decode(
        self,
        rules: Sequence[TokenRule],
        num_futures: int,
        num_tokens: int,
        *,
        keeps: Sequence[Selection] | None = None,
    ) -> list[Trajectories]:
        """Every row's :meth:`Rollout.decode` in one batch of b * M futures a step: row i's
        tokens are chosen by ``rules[i]`` from its own logits, ``keeps[i]`` is its draft."""
        ...


class SamplerConfig(ComponentConfig):
    """Base config of every sampler; its fields are options every sampler offers.

    Attributes:
        include_last_prompt_query: also score with the query of the last prompt token
            (position n-1), placed before each future's own queries. In query-aware use that
            token is re-fed through the compressed cache and its query produces the first
            answer token, so it is the first query to meet the compressed cache; the futures
            (positions n..n+T-1) do not contain it. It sees prompt keys only. The prompt-window
            sampler's window already ends at n-1, so there it changes nothing. Default off.
    """

    include_last_prompt_query: bool = Field(default=False, strict=True)


class Sampler(ABC):
    """Produces the futures whose queries the scorer will use."""

    config: SamplerConfig

    def __init__(self, config: SamplerConfig) -> None:
        self.config = config

    @property
    def prefill_window(self) -> int | Literal["all"]:
        """How many trailing prompt queries the prefill must capture for this sampler.

        1 with ``include_last_prompt_query`` (the query at n-1), else 0; samplers that use
        prompt queries themselves return more (``"all"``: every prompt query).
        """
        return 1 if self.config.include_last_prompt_query else 0

    @abstractmethod
    def future_positions(self, prompt_ids: torch.Tensor, tokenizer: Any | None) -> int:
        """How many positions past the prompt ``prompt_ids`` (1, n) the futures are fed at
        (n .. n + this - 1); 0 for a sampler that feeds nothing. Checked against the model's
        context before any model work, so it must not need the model; a sampler that cannot
        say without something missing (e.g. a tokenizer) raises the error it would raise later."""

    @abstractmethod
    def sample(self, rollout: Rollout) -> Trajectories:
        """Futures (M, T) with the attention of every evictable layer.

        What a sampler implements; the pipeline calls :meth:`futures`, which adds the options
        shared by every sampler.
        """

    def sample_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """:meth:`sample` for every row of ``batch``, each row's futures exactly as alone.

        The default samples row by row; samplers that decode override it to draw every row's
        futures together (:meth:`BatchRollout.decode`), b * M futures a step.
        """
        return [self.sample(row) for row in batch.rows]

    def futures(self, rollout: Rollout) -> Trajectories:
        """:meth:`sample`, then the shared options: with ``include_last_prompt_query`` every
        layer's queries become (M, H, 1+T, d) at positions [n-1, n, ..., n+T-1], the prefill's
        query at n-1 first (see :func:`prepend_last_prompt_query`)."""
        return self._finish(rollout, self.sample(rollout))

    def futures_batch(self, batch: BatchRollout) -> list[Trajectories]:
        """:meth:`futures` of every row of ``batch`` (through :meth:`sample_batch`)."""
        return [self._finish(row, t) for row, t in zip(batch.rows, self.sample_batch(batch), strict=True)]

    def _finish(self, rollout: Rollout, futures: Trajectories) -> Trajectories:
        if isinstance(futures, FutureMixture):  # the mixture sampler's: each part on its own
            return FutureMixture(tuple(self._finish(rollout, part) for part in futures.parts))  # type: ignore[return-value]
        if not self.config.include_last_prompt_query or all(_holds_last(futures.layers)):
            return futures
        return prepend_last_prompt_query(futures, rollout.prompt_window(1))


def _holds_last(layers: Sequence[LayerCapture]) -> list[bool]:
    """Whether each layer already holds the query of the last prompt token (position n-1): one
    host read for every layer."""
    if not layers:
        return []
    device = layers[0].query_positions.device
    held = [(layer.query_positions == layer.prompt_length - 1).any().to(device) for layer in layers]
    return torch.stack(held).tolist()


def prepend_last_prompt_query(futures: Trajectories, last: Trajectories) -> Trajectories:
    """``futures`` with the last prompt query placed before every future's own queries.

    Args:
        futures: M futures; each layer's queries (M, H, T, d) at ``query_positions`` (T,).
        last: the prompt-window capture of width 1: one pseudo-future whose layers hold the
            query (1, H, 1, d) at position n-1.

    Returns:
        The same futures (tokens, log-probs, entropies, response keys unchanged) whose layers
        hold queries (M, H, 1+T, d) at positions [n-1, *query_positions]. A layer that already
        holds position n-1 (the prompt-window control) is left as it is: no query twice.
    """
    n = futures.prompt_length
    by_layer = {layer.layer_idx: layer for layer in last.layers}
    if last.num_futures != 1 or last.prompt_length != n or set(by_layer) != set(futures.layer_indices):
        raise ValueError(
            f"the last prompt query must come as one pseudo-future over the same {n}-token prompt and "
            f"layers {futures.layer_indices}; got {last.num_futures} over {last.prompt_length} tokens, "
            f"layers {last.layer_indices}"
        )
    holds = _holds_last(futures.layers)
    extras = [by_layer[layer.layer_idx] for layer, held in zip(futures.layers, holds, strict=True) if not held]
    for extra in extras:
        if extra.query_positions.shape != (1,):
            raise ValueError(f"expected one query at position {n - 1}, got positions {extra.query_positions.tolist()}")
    if extras:
        device = extras[0].query_positions.device
        got = torch.cat([extra.query_positions.to(device) for extra in extras]).tolist()  # one host read
        if got != [n - 1] * len(extras):
            raise ValueError(f"expected one query at position {n - 1}, got positions {sorted(set(got))}")
    layers = []
    for layer, held in zip(futures.layers, holds, strict=True):
        if held:
            layers.append(layer)
            continue
        extra = by_layer[layer.layer_idx]
        first = extra.queries.to(layer.queries.dtype).expand(layer.num_futures, -1, -1, -1)
        spans = layer.visible_spans
        if spans is not None:  # the last prompt query sees every prompt key and no response key
            row = torch.zeros_like(spans[:1])
            row[0, 0, 1] = n
            spans = torch.cat([row, spans])
        layers.append(
            replace(
                layer,
                queries=torch.cat([first, layer.queries], dim=2),
                query_positions=torch.cat([extra.query_positions.to(layer.query_positions), layer.query_positions]),
                visible_spans=spans,
                query_norms=cat_optional(
                    [
                        None if extra.query_norms is None else extra.query_norms.expand(layer.num_futures, -1),
                        layer.query_norms,
                    ],
                    dim=1,
                ),
                lse=cat_optional(
                    [None if extra.lse is None else extra.lse.expand(layer.num_futures, -1, -1, -1), layer.lse], dim=2
                ),
            )
        )
    return replace(futures, layers=tuple(layers))


def check_futures(trajectories: Trajectories, num_futures: int, num_tokens: int) -> Trajectories:
    """Return ``trajectories`` after checking the rollout produced (num_futures, num_tokens).

    Catches a rollout that silently dropped futures or stopped early (e.g. at EOS), which
    would otherwise change M or T behind the scorer's and aggregator's back.
    """
    got = (trajectories.num_futures, trajectories.num_tokens)
    if got != (num_futures, num_tokens):
        raise ValueError(f"rollout returned futures of shape {got}, expected ({num_futures}, {num_tokens})")
    return trajectories


def required_tokenizer(tokenizer: Any | None, sampler: str) -> Any:
    """``tokenizer``, or the error naming ``sampler`` when the caller passed none."""
    if tokenizer is None:
        raise ValueError(
            f"the {sampler} sampler tokenizes text of its own: pass the model's tokenizer as "
            "tokenizer= to Pipeline.compress / Pipeline.generate"
        )
    return tokenizer


def encode(tokenizer: Any, text: str) -> torch.Tensor:
    """(k,) long: ``text`` tokenized without special tokens added (empty text: no tokens)."""
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    return torch.as_tensor(list(ids), dtype=torch.long)


def assistant_suffix(tokenizer: Any, suffix: str | None) -> str:
    """The text that closes a user turn and opens the model's answer, as kvpress's KVzip does.

    ``suffix`` when given; else the tokenizer's chat template's text after a user message with
    the generation prompt (e.g. ``"<|im_end|>\\n<|im_start|>assistant\\n"``), found by rendering a
    dummy message; else (a base model, no chat template) ``"\\n"``.
    """
    if suffix is not None:
        return suffix
    if not getattr(tokenizer, "chat_template", None):
        return "\n"
    dummy = "dummy context"
    separator = "\n" + "#" * len(dummy)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": dummy + separator}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    return text.split(separator)[-1]


SAMPLERS: Registry[Sampler] = Registry("sampler")
