"""The model side of sampling: prefill once, then produce futures for a sampler.

:class:`ModelRollout` implements :class:`lorekv.samplers.base.Rollout` over a transformers
causal LM. The prompt is prefilled once into a :class:`PositionedCache`; every future is
decoded from a batched view of that cache (M futures in one forward pass per step), so the
prompt's own cache is never touched by the futures, and their KV is dropped with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from lorekv.hf.attention import QueryCapture, forward
from lorekv.hf.cache import PositionedCache, gather
from lorekv.scores import Selection
from lorekv.token_rules import TokenRule, token_stats
from lorekv.trajectories import LayerCapture, Trajectories
from lorekv.validation import check_int_at_least


class ModelRollout:
    """A prefilled prompt from which futures are drawn.

    The prompt is prefilled in one pass. ``cache`` holds all n tokens; ``head_cache``, the
    cache as it stood after n-1 tokens (query-aware eviction re-feeds the last prompt token
    through the compressed cache), shares its tensors: the prefill's sliding-window layers
    keep one token more than the window needs, so that both can be cut from them.

    Futures are decoded as branches of ``cache`` (:meth:`PositionedCache.branches`): the M
    futures read the prompt's KV once per step, and only their own tokens are stored per
    future.

    Args:
        model: a causal LM prepared with :func:`lorekv.hf.attention.prepare`.
        input_ids: (1, n) the prompt.
        evict_layers: the layers whose queries are captured (the evictable ones).
        prefill_window: capture the last ``prefill_window`` prompt queries during prefill;
            ``"all"`` captures every prompt query (H2O), (1, H, n, d) per layer. Token
            statistics of the window need the prefill's logits at its positions: for an int
            window they are kept ((w+1, V) floats); for ``"all"`` they are not, since (n, V)
            logits would dwarf everything else, and :meth:`prompt_window` reports log-prob 0
            and entropy 0 for those tokens (the window is one pseudo-future, so no aggregator
            weight depends on them).
        tokenizer: the model's tokenizer, for samplers that feed text of their own (KVzip's
            repeat instruction); None when the caller has none.
        candidates: how many leading prompt tokens are eviction candidates (n - 1 in
            query-aware mode, n query-agnostic; default n), for samplers that evict on their
            own before sampling (LAQ's draft cache).
        stats_window: keep the logits of the last ``stats_window`` prompt positions for token
            statistics even when ``prefill_window`` is ``"all"``, so that one prefill serves
            both H2O's window and an int window (the evaluation grid shares prefills). Default:
            ``prefill_window`` for an int window, none for ``"all"``. ``prompt_window("all")``
            reports zero statistics whatever it is, so its result does not depend on it.
        compile: decode the futures with lorekv's attention kernels compiled
            (:func:`lorekv.hf.attention.forward`'s ``compile``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        evict_layers: Sequence[int],
        prefill_window: int | Literal["all"] = 0,
        *,
        tokenizer: Any | None = None,
        candidates: int | None = None,
        stats_window: int | None = None,
        compile: bool = False,
    ) -> None:
        self.model = model
        self.compile = compile
        self.prompt_ids = input_ids
        self.prompt_length = input_ids.shape[1]
        self.evict_layers = frozenset(evict_layers)
        self.tokenizer = tokenizer
        n = self.prompt_length
        self.candidates = n if candidates is None else candidates
        if not 0 <= self.candidates <= n:
            raise ValueError(f"candidates must lie in [0, {n}] (the prompt length), got {self.candidates}")
        if prefill_window == "all":
            self._captured = n
            self._prefill_capture = QueryCapture(self.evict_layers, last=None)
        else:
            self._captured = min(prefill_window, n)
            self._prefill_capture = QueryCapture(self.evict_layers, last=prefill_window) if prefill_window > 0 else None
        if stats_window is None:
            stats_window = 0 if prefill_window == "all" else prefill_window
        check_int_at_least("stats_window", stats_window, 0)
        keep = min(stats_window + 1, n)
        prefill = PositionedCache.for_model(model.config, slack=1)
        positions = torch.arange(n, device=input_ids.device)
        logits = forward(model, input_ids, prefill, positions, capture=self._prefill_capture, logits_to_keep=keep)
        self.cache = prefill.below(n)
        self.head_cache = prefill.below(n - 1)
        self.prompt_logits = logits[0]
        self.last_logits = logits[:, -1]

    def _positions(self, num_tokens: int) -> torch.Tensor:
        """(T,) the positions n..n+T-1 of a future's tokens, on the model's device."""
        return torch.arange(self.prompt_length, self.prompt_length + num_tokens, device=self.prompt_ids.device)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.last_logits.device).manual_seed(seed)

    def decode(
        self, rule: TokenRule, num_futures: int, num_tokens: int, *, keep: Selection | None = None
    ) -> Trajectories:
        check_int_at_least("num_futures", num_futures, 1)
        check_int_at_least("num_tokens", num_tokens, 1)
        if keep is None:
            source = self.cache
        else:
            if keep.num_tokens != self.prompt_length or set(keep.layer_indices) != self.evict_layers:
                raise ValueError(
                    f"keep must select among the {self.prompt_length} prompt tokens of layers "
                    f"{sorted(self.evict_layers)}; got {keep.num_tokens} tokens, layers {list(keep.layer_indices)}"
                )
            source = gather(self.cache, keep, limit=self.prompt_length)
        cache = source.branches(num_futures)
        cache.reserve(num_futures, num_tokens)
        capture = QueryCapture(self.evict_layers)
        logits = self.last_logits.expand(num_futures, -1)
        positions = self._positions(num_tokens)
        ids, logprobs, entropies = [], [], []
        for t in range(num_tokens):
            token = rule(logits)
            lp, ent = token_stats(logits, token, validate=False)
            ids.append(token), logprobs.append(lp), entropies.append(ent)
            step = positions[t : t + 1]
            logits = forward(self.model, token.view(-1, 1), cache, step, capture=capture, compile=self.compile)[:, -1]
        return self._trajectories(
            torch.stack(ids, 1), torch.stack(logprobs, 1), torch.stack(entropies, 1), capture, cache
        )

    def teacher_force(self, token_ids: torch.Tensor) -> Trajectories:
        if token_ids.dim() != 2 or token_ids.shape[0] < 1 or token_ids.shape[1] < 1:
            raise ValueError(f"token_ids must have shape (M >= 1, T >= 1), got {tuple(token_ids.shape)}")
        vocab = self.last_logits.shape[-1]
        if int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab:
            raise ValueError(f"token_ids must lie in [0, {vocab}) (the model's vocabulary)")
        m, t = token_ids.shape
        token_ids = token_ids.to(self.prompt_ids.device)
        cache = self.cache.branches(m)
        capture = QueryCapture(self.evict_layers)
        positions = self._positions(t)
        logits = forward(
            self.model, token_ids, cache, positions, capture=capture, logits_to_keep=t, compile=self.compile
        )
        before = torch.cat([self.last_logits.expand(m, -1).unsqueeze(1), logits[:, :-1]], dim=1)
        lp, ent = token_stats(before.flatten(0, 1), token_ids.flatten())
        return self._trajectories(token_ids, lp.view(m, t), ent.view(m, t), capture, cache)

    def prompt_window(self, window: int | Literal["all"]) -> Trajectories:
        n, captured = self.prompt_length, self._captured
        every = window == "all"
        if every:
            window = n
        if not 1 <= window <= captured:
            raise ValueError(
                f"window must lie in [1, {captured}] (the prefill captured "
                f"{captured} queries of a {n}-token prompt), got {window}"
            )
        kept = self.prompt_logits.shape[0]
        if not every and kept <= window and kept < n:
            raise ValueError(
                f"window {window}: the prefill kept the logits of the last {kept} prompt positions only "
                f"(stats_window={kept - 1}); their token statistics need {window + 1}"
            )
        tokens = self.prompt_ids[:, n - window :]
        predicting = self.prompt_logits[:0] if every else self.prompt_logits[-window - 1 : -1]
        pad = window - predicting.shape[0]  # the prompt's first token has no logits predicting it
        lp, ent = token_stats(predicting, tokens[0, pad:])
        lp = torch.cat([lp.new_zeros(pad), lp]).unsqueeze(0)
        ent = torch.cat([ent.new_zeros(pad), ent]).unsqueeze(0)
        capture = self._prefill_capture

        def window_queries(idx: int) -> torch.Tensor:
            return capture.stacked(idx)[:, :, -window:]

        layers = self._layers(window_queries, torch.arange(n - window, n), capture, None)
        return Trajectories(tokens, lp, ent, layers, n)

    def _trajectories(
        self,
        token_ids: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor,
        capture: QueryCapture,
        cache: PositionedCache,
    ) -> Trajectories:
        n, t = self.prompt_length, token_ids.shape[1]
        layers = self._layers(capture.stacked, self._positions(t), capture, cache)
        return Trajectories(token_ids, logprobs, entropies, layers, n)

    def _layers(
        self,
        queries: Callable[[int], torch.Tensor],
        query_positions: torch.Tensor,
        capture: QueryCapture,
        futures: PositionedCache | None,
    ) -> tuple[LayerCapture, ...]:
        """One :class:`LayerCapture` per evictable layer.

        Args:
            queries: layer index -> (M, H, T, d) captured queries.
            query_positions: (T,) their positions.
            capture: where the output projections and scales were recorded.
            futures: the futures' cache, branches of the prompt's whose own entries are the
                response keys/values (None: no response keys, the prompt-window control).
        """
        n = self.prompt_length
        layers = []
        for idx in sorted(self.evict_layers):
            prompt = self.cache.layers[idx]
            source = prompt if futures is None else futures.layers[idx]
            layers.append(
                LayerCapture(
                    layer_idx=idx,
                    queries=queries(idx),
                    query_positions=query_positions.to(prompt.keys.device),
                    prompt_keys=prompt.keys[0],
                    prompt_values=prompt.values[0],
                    response_keys=source.keys[:, :, n:] if futures is None else source.keys,
                    response_values=source.values[:, :, n:] if futures is None else source.values,
                    o_proj=capture.o_proj[idx],
                    scaling=capture.scaling[idx],
                )
            )
        return tuple(layers)
