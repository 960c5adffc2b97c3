"""The model side of sampling: prefill once, then produce futures for a sampler.

:class:`BatchRollout` prefills a left-padded batch of prompts in one pass into a
:class:`PositionedCache` (row i's tokens at their own positions 0..n_i-1, the padding stored
masked); each of its :attr:`~BatchRollout.rows` is a :class:`ModelRollout`, which implements
:class:`lorekv.samplers.base.Rollout` for one prompt exactly as if it had been prefilled alone.
Futures are decoded as branches of the prompt cache (M futures in one forward pass per step;
:meth:`BatchRollout.decode`: the M futures of every row, b * M, in one pass), so the prompt's
own cache is never touched by the futures, and their KV is dropped with them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from transformers import PreTrainedModel

from lorekv.hf.attention import QueryCapture, forward
from lorekv.hf.cache import PADDING, PositionedCache, PositionedLayer, gather
from lorekv.hf.introspection import rotary_tables
from lorekv.scores import Selection
from lorekv.token_rules import TokenRule, token_stats
from lorekv.trajectories import Fed, LayerCapture, Step, Trajectories
from lorekv.validation import check_int_at_least


class BatchRollout:
    """A batch of prompts prefilled together, from which every row's futures are drawn.

    The prompts come left-padded, as transformers generates: ``input_ids`` (b, N) with
    ``lengths[i]`` real tokens at the end of row i. One prefill pass serves every row; its
    ``cache`` holds all N columns and ``head_cache`` the first N - 1 (query-aware eviction
    re-feeds each row's last token through the compressed cache), sharing the tensors: the
    prefill's sliding-window layers keep one token more than the window needs, so that both
    can be cut from them.

    Args:
        model: a causal LM prepared with :func:`lorekv.hf.attention.prepare`.
        input_ids: (b, N) the prompts, left-padded.
        lengths: the real token count n_i of each row (N for every row without padding).
        evict_layers: the layers whose queries are captured (the evictable ones).
        prefill_window: capture the last ``prefill_window`` prompt queries during prefill;
            ``"all"`` captures every prompt query (H2O), (b, H, N, d) per layer. Token
            statistics of the window need the prefill's logits at its positions: for an int
            window they are kept ((w+1, V) floats a row); for ``"all"`` they are not, since
            (n, V) logits would dwarf everything else, and :meth:`ModelRollout.prompt_window`
            reports log-prob 0 and entropy 0 for those tokens (the window is one pseudo-future,
            so no aggregator weight depends on them).
        tokenizer: the model's tokenizer, for samplers that feed text of their own (KVzip's
            repeat instruction); None when the caller has none.
        pending: trailing prompt tokens of every row that are not eviction candidates (1 in
            query-aware mode, 0 query-agnostic; default 0), for samplers that evict on their own
            before sampling (LAQ's draft cache).
        stats_window: keep the logits of the last ``stats_window`` prompt positions for token
            statistics even when ``prefill_window`` is ``"all"``, so that one prefill serves
            both H2O's window and an int window (the evaluation grid shares prefills). Default:
            ``prefill_window`` for an int window, none for ``"all"``. ``prompt_window("all")``
            reports zero statistics whatever it is, so its result does not depend on it.
        compile: decode the futures with lorekv's attention kernels compiled
            (:func:`lorekv.hf.attention.forward`'s ``compile``).
        query_norms: record the hidden-state norm of every captured query
            (:attr:`lorekv.trajectories.LayerCapture.query_norms`, for KVzip+); off by default.
        state_maps: what the prefill records of every prompt token's hidden state, by name
            (:attr:`lorekv.hf.attention.QueryCapture.state_maps`; a scorer's
            :attr:`~lorekv.scorers.base.Scorer.state_maps`): each row's features are its
            layers' :attr:`~lorekv.trajectories.LayerCapture.prompt_features`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        lengths: Sequence[int],
        evict_layers: Sequence[int],
        prefill_window: int | Literal["all"] = 0,
        *,
        tokenizer: Any | None = None,
        pending: int = 0,
        stats_window: int | None = None,
        compile: bool = False,
        query_norms: bool = False,
        state_maps: Mapping[str, Callable[[int, torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        b, width = input_ids.shape
        self.lengths = tuple(int(n) for n in lengths)
        if len(self.lengths) != b or not all(1 <= n <= width for n in self.lengths):
            raise ValueError(f"lengths must give each of the {b} rows a length in [1, {width}], got {self.lengths}")
        if not 0 <= pending <= min(self.lengths):
            raise ValueError(f"pending must lie in [0, {min(self.lengths)}] (the shortest prompt), got {pending}")
        if stats_window is None:
            stats_window = 0 if prefill_window == "all" else prefill_window
        check_int_at_least("stats_window", stats_window, 0)
        self.model = model
        self.compile = compile
        self.query_norms = query_norms
        self.input_ids = input_ids
        self.evict_layers = frozenset(evict_layers)
        self.tokenizer = tokenizer
        self.pending = pending
        self.prefill_window = prefill_window
        state_maps = dict(state_maps or {})
        self.capture: QueryCapture | None = None
        if prefill_window != 0 or state_maps:
            last = None if prefill_window == "all" else prefill_window
            self.capture = QueryCapture(self.evict_layers, last=last, hidden_norms=query_norms, state_maps=state_maps)
        self.logits_kept = min(stats_window + 1, width)
        device = input_ids.device
        n = torch.tensor(self.lengths, device=device)
        positions = torch.arange(width, device=device) - (width - n)[:, None]
        positions = positions.masked_fill(positions < 0, PADDING)
        prefill = PositionedCache.for_model(model.config, slack=1)
        logits = forward(
            model,
            input_ids,
            prefill,
            positions,
            capture=self.capture,
            logits_to_keep=self.logits_kept,
            padded=min(self.lengths) < width,
        )
        self.cache = prefill.trimmed(0)
        self.head_cache = prefill.trimmed(1)
        self.logits = logits
        self.rows = tuple(ModelRollout.row_of(self, i) for i in range(b))

    @property
    def attention_mask(self) -> torch.Tensor:
        """(b, N) long: 1 for each row's real tokens, 0 for its left padding."""
        width = self.input_ids.shape[1]
        n = torch.tensor(self.lengths, device=self.input_ids.device)
        return (torch.arange(width, device=n.device) >= (width - n)[:, None]).long()

    def decode(
        self,
        rules: Sequence[TokenRule],
        num_futures: int,
        num_tokens: int,
        *,
        keeps: Sequence[Selection] | None = None,
    ) -> list[Trajectories]:
        """Every row's futures (:meth:`ModelRollout.decode`, row i's tokens chosen by
        ``rules[i]``, ``keeps[i]`` its draft selection) decoded together: b * M rows a step."""
        if len(rules) != len(self.rows) or (keeps is not None and len(keeps) != len(self.rows)):
            raise ValueError(f"rules and keeps must hold one entry per row ({len(self.rows)})")
        if keeps is None:
            source = self.cache
        else:
            source = PositionedCache.stack([row.draft_cache(keep) for row, keep in zip(self.rows, keeps, strict=True)])
        return decode_rows(self.rows, source, rules, num_futures, num_tokens, drafted=keeps is not None)


class ModelRollout:
    """A prefilled prompt from which futures are drawn: one row of a :class:`BatchRollout`.

    ``ModelRollout(model, input_ids, ...)`` prefills a single prompt (1, n) (the arguments are
    :class:`BatchRollout`'s, with ``candidates``: how many leading prompt tokens are eviction
    candidates, n - 1 in query-aware mode and n query-agnostic, default n). ``cache`` holds
    the prompt's n tokens, ``head_cache`` its first n - 1, both batch-1 and free of padding.

    Futures are decoded as branches of ``cache`` (:meth:`PositionedCache.branches`): the M
    futures read the prompt's KV once per step, and only their own tokens are stored per
    future.
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
        query_norms: bool = False,
        state_maps: Mapping[str, Callable[[int, torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        n = input_ids.shape[1]
        candidates = n if candidates is None else candidates
        if not 0 <= candidates <= n:
            raise ValueError(f"candidates must lie in [0, {n}] (the prompt length), got {candidates}")
        batch = BatchRollout(
            model,
            input_ids,
            [n],
            evict_layers,
            prefill_window,
            tokenizer=tokenizer,
            pending=n - candidates,
            stats_window=stats_window,
            compile=compile,
            query_norms=query_norms,
            state_maps=state_maps,
        )
        self.__dict__.update(batch.rows[0].__dict__)

    @classmethod
    def row_of(cls, batch: BatchRollout, index: int) -> ModelRollout:
        """Row ``index`` of ``batch``: its tensors are views of the batch's, its padding left out."""
        self = cls.__new__(cls)
        n = batch.lengths[index]
        self.model = batch.model
        self.compile = batch.compile
        self.query_norms = batch.query_norms
        self.batch = batch
        self.index = index
        self.prompt_ids = batch.input_ids[index : index + 1, batch.input_ids.shape[1] - n :]
        self.prompt_length = n
        self.evict_layers = batch.evict_layers
        self.tokenizer = batch.tokenizer
        self.candidates = n - batch.pending
        window = batch.prefill_window
        self._captured = n if window == "all" else min(window, n)
        self.cache = batch.cache.row(index, n)
        self.head_cache = batch.head_cache.row(index, n - 1)
        self.prompt_logits = batch.logits[index, -min(batch.logits_kept, n) :]
        self.last_logits = batch.logits[index : index + 1, -1]
        return self

    def prompt_features(self, idx: int) -> dict[str, torch.Tensor]:
        """name -> (n, F) the prefill's ``state_maps`` features of this row's prompt tokens at layer ``idx``."""
        capture = self.batch.capture
        if capture is None:
            return {}
        return {name: capture.stacked_states(name, idx)[self.index, -self.prompt_length :] for name in capture.states}

    def positions(self, num_tokens: int) -> torch.Tensor:
        """(T,) the positions n..n+T-1 of a future's tokens, on the model's device."""
        return torch.arange(self.prompt_length, self.prompt_length + num_tokens, device=self.prompt_ids.device)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.last_logits.device).manual_seed(seed)

    def draft_cache(self, keep: Selection) -> PositionedCache:
        """The prompt cache restricted to ``keep`` (a selection among the n prompt tokens of
        every evictable layer), positions preserved."""
        if keep.num_tokens != self.prompt_length or set(keep.layer_indices) != self.evict_layers:
            raise ValueError(
                f"keep must select among the {self.prompt_length} prompt tokens of layers "
                f"{sorted(self.evict_layers)}; got {keep.num_tokens} tokens, layers {list(keep.layer_indices)}"
            )
        return gather(self.cache, keep)

    def decode(
        self, rule: TokenRule, num_futures: int, num_tokens: int, *, keep: Selection | None = None
    ) -> Trajectories:
        source = self.cache if keep is None else self.draft_cache(keep)
        return decode_rows([self], source, [rule], num_futures, num_tokens, drafted=keep is not None)[0]

    def teacher_force(self, token_ids: torch.Tensor, *, stats: bool = True) -> Trajectories:
        if token_ids.dim() != 2 or token_ids.shape[0] < 1 or token_ids.shape[1] < 1:
            raise ValueError(f"token_ids must have shape (M >= 1, T >= 1), got {tuple(token_ids.shape)}")
        vocab = self.last_logits.shape[-1]
        low, high = torch.stack(torch.aminmax(token_ids)).tolist()  # one host read (none if on the host)
        if low < 0 or high >= vocab:
            raise ValueError(f"token_ids must lie in [0, {vocab}) (the model's vocabulary)")
        m, t = token_ids.shape
        token_ids = token_ids.to(self.prompt_ids.device)
        cache = self.cache.branches(m)
        capture = QueryCapture(self.evict_layers, hidden_norms=self.query_norms)
        positions = self.positions(t)
        kept = t if stats else 1
        logits = forward(
            self.model, token_ids, cache, positions, capture=capture, logits_to_keep=kept, compile=self.compile
        )
        if stats:
            before = torch.cat([self.last_logits.expand(m, -1).unsqueeze(1), logits[:, :-1]], dim=1)
            lp, ent = token_stats(before.flatten(0, 1), token_ids.flatten(), validate=False)  # checked above
        else:
            lp = ent = logits.new_zeros(m * t)
        layers = self.layers(
            capture.stacked,
            positions,
            capture,
            lambda idx: (cache.layers[idx].keys, cache.layers[idx].values),
            capture.stacked_norms,
            capture.stacked_lse,
        )
        return Trajectories(token_ids, lp.view(m, t), ent.view(m, t), layers, self.prompt_length)

    def follow(self, script: Sequence[Step], num_futures: int) -> Trajectories:
        """The script's steps fed and drawn one after the other at positions n.., M futures as
        branches of the prompt cache (see :meth:`lorekv.samplers.base.Rollout.follow`)."""
        check_int_at_least("num_futures", num_futures, 1)
        total = sum(len(step) for step in script)
        if total < 1:
            raise ValueError("a script must feed or draw at least one token")
        vocab = self.last_logits.shape[-1]
        for step in script:
            if isinstance(step, Fed):
                fed = step.token_ids
                if fed.dim() != 1 or (fed.numel() and not 0 <= int(fed.min()) <= int(fed.max()) < vocab):
                    raise ValueError(f"fed token_ids must be (k,) ids in [0, {vocab}) (the model's vocabulary)")
            else:
                check_int_at_least("num_tokens", step.num_tokens, 1)
        m, device = num_futures, self.prompt_ids.device
        cache = self.cache.branches(m)
        cache.reserve(m, total)
        capture = QueryCapture(self.evict_layers, hidden_norms=self.query_norms)
        logits = self.last_logits.expand(m, -1)
        position = self.prompt_length
        ids, logprobs, entropies = [], [], []
        for step in script:
            if isinstance(step, Fed):
                k = len(step)
                if k == 0:
                    continue
                tokens = step.token_ids.to(device).view(1, k).repeat(m, 1)
                where = torch.arange(position, position + k, device=device)
                out = forward(self.model, tokens, cache, where, capture=capture, logits_to_keep=k, compile=self.compile)
                before = torch.cat([logits.unsqueeze(1), out[:, :-1]], dim=1)
                lp, ent = token_stats(before.flatten(0, 1), tokens.flatten(), validate=False)  # checked above
                ids.append(tokens), logprobs.append(lp.view(m, k)), entropies.append(ent.view(m, k))
                logits, position = out[:, -1], position + k
                continue
            where = torch.arange(position, position + step.num_tokens, device=device).expand(m, -1)
            drawn = draw(self.model, cache, capture, logits, step.rule, where, compile=self.compile)
            ids.append(drawn[0]), logprobs.append(drawn[1]), entropies.append(drawn[2])
            logits, position = drawn[3], position + step.num_tokens
        layers = self.layers(
            capture.stacked,
            self.positions(total),
            capture,
            lambda idx: (cache.layers[idx].keys, cache.layers[idx].values),
            capture.stacked_norms,
            capture.stacked_lse,
        )
        return Trajectories(
            torch.cat(ids, dim=1), torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1), layers, self.prompt_length
        )

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
        lp, ent = token_stats(predicting, tokens[0, pad:], validate=False)  # the prefill embedded them
        lp = torch.cat([lp.new_zeros(pad), lp]).unsqueeze(0)
        ent = torch.cat([ent.new_zeros(pad), ent]).unsqueeze(0)
        capture, row = self.batch.capture, slice(self.index, self.index + 1)

        def window_queries(idx: int) -> torch.Tensor:
            return capture.stacked(idx)[row, :, -window:]

        def window_norms(idx: int) -> torch.Tensor | None:
            norms = capture.stacked_norms(idx)
            return None if norms is None else norms[row, -window:]

        layers = self.layers(window_queries, torch.arange(n - window, n), capture, None, window_norms)
        return Trajectories(tokens, lp, ent, layers, n)

    def layers(
        self,
        queries: Callable[[int], torch.Tensor],
        query_positions: torch.Tensor,
        capture: QueryCapture,
        responses: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None,
        norms: Callable[[int], torch.Tensor | None],
        lse: Callable[[int], torch.Tensor | None] | None = None,
    ) -> tuple[LayerCapture, ...]:
        """One :class:`LayerCapture` per evictable layer.

        Args:
            queries: layer index -> (M, H, T, d) captured queries.
            query_positions: (T,) their positions.
            capture: where the output projections and scales were recorded.
            responses: layer index -> the futures' own keys and values (M, G, R, d), the entries
                after the prompt (None: no response keys, the prompt-window control).
            norms: layer index -> (M, T) the queries' hidden-state norms, or None.
            lse: layer index -> (M, H, T, 2) the log-sum-exps the queries' pass computed over
                this row's prompt and their own keys, or None (None: not recorded, or over
                another prefix, a draft's).
        """
        return tuple(
            layer_capture(
                idx,
                self.cache.layers[idx],
                queries(idx),
                query_positions,
                None if responses is None else responses(idx),
                capture.o_proj[idx],
                capture.scaling[idx],
                rotary=rotary_tables(self.model, idx),
                query_norms=norms(idx),
                lse=None if lse is None else lse(idx),
                prompt_features=self.prompt_features(idx),
            )
            for idx in sorted(self.evict_layers)
        )


def layer_capture(
    idx: int,
    prompt: PositionedLayer,
    queries: torch.Tensor,
    query_positions: torch.Tensor,
    responses: tuple[torch.Tensor, torch.Tensor] | None,
    o_proj: torch.Tensor,
    scaling: float,
    **optional: Any,
) -> LayerCapture:
    """Layer ``idx``'s :class:`LayerCapture` over a one-row ``prompt`` layer's keys and values:
    ``queries`` (M, H, T, d) at ``query_positions`` (T,), ``responses`` the futures' own keys and
    values (M, G, R, d) (None: none), ``optional`` LayerCapture's optional fields."""
    keys, values = prompt.keys[0], prompt.values[0]
    response_keys, response_values = (keys[None, :, :0], values[None, :, :0]) if responses is None else responses
    return LayerCapture(
        layer_idx=idx,
        queries=queries,
        query_positions=query_positions.to(keys.device),
        prompt_keys=keys,
        prompt_values=values,
        response_keys=response_keys,
        response_values=response_values,
        o_proj=o_proj,
        scaling=scaling,
        **optional,
    )


def decode_rows(
    rows: Sequence[ModelRollout],
    source: PositionedCache,
    rules: Sequence[TokenRule],
    num_futures: int,
    num_tokens: int,
    *,
    drafted: bool = False,
) -> list[Trajectories]:
    """M futures of T tokens for each of P rows, decoded together (P * M rows a step).

    Args:
        rows: the P rows, in the order of ``source``'s rows.
        source: (P rows) the cache the futures continue, read as a shared prefix.
        rules: row p's futures choose their tokens with ``rules[p]`` from its own (M, V) logits,
            so a row's random draws do not depend on the other rows of the batch.
        num_futures: M.
        num_tokens: T.
        drafted: ``source`` is not the rows' prompt caches (a draft selection of them): the
            futures' log-sum-exps are over its keys, not the prompt's, and are not kept.
    """
    check_int_at_least("num_futures", num_futures, 1)
    check_int_at_least("num_tokens", num_tokens, 1)
    m, first = num_futures, rows[0]
    cache = source.branches(m)
    cache.reserve(len(rows) * m, num_tokens)
    capture = QueryCapture(first.evict_layers, hidden_norms=first.query_norms)
    logits = torch.cat([row.last_logits for row in rows]).repeat_interleave(m, dim=0)
    starts = torch.tensor([row.prompt_length for row in rows], device=logits.device).repeat_interleave(m)
    positions = starts[:, None] + torch.arange(num_tokens, device=logits.device)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        return torch.cat([rule(logits[p * m : (p + 1) * m]) for p, rule in enumerate(rules)])

    ids_, lp_, ent_, _ = draw(first.model, cache, capture, logits, choose, positions, compile=first.compile)
    out = []
    for p, row in enumerate(rows):
        span = slice(p * m, (p + 1) * m)
        layers = row.layers(
            lambda idx, span=span: capture.stacked(idx)[span],
            row.positions(num_tokens),
            capture,
            lambda idx, span=span: (cache.layers[idx].keys[span], cache.layers[idx].values[span]),
            lambda idx, span=span: _rows(capture.stacked_norms(idx), span),
            None if drafted else lambda idx, span=span: _rows(capture.stacked_lse(idx), span),
        )
        out.append(Trajectories(ids_[span], lp_[span], ent_[span], layers, row.prompt_length))
    return out


def _rows(values: torch.Tensor | None, span: slice) -> torch.Tensor | None:
    """The rows ``span`` of an optional per-future tensor."""
    return None if values is None else values[span]


def draw(
    model: PreTrainedModel,
    cache: PositionedCache,
    capture: QueryCapture,
    logits: torch.Tensor,
    choose: TokenRule,
    positions: torch.Tensor,
    *,
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode T tokens into ``cache`` for R rows, each chosen by ``choose`` from the rows' (R, V)
    logits (``logits``: those of the first), fed at ``positions`` (R, T) with their queries
    captured. Returns the tokens, their log-probs and entropies, (R, T) each, and the (R, V)
    logits after the last token."""
    ids, logprobs, entropies = [], [], []
    for t in range(positions.shape[1]):
        token = choose(logits)
        lp, ent = token_stats(logits, token, validate=False)
        ids.append(token), logprobs.append(lp), entropies.append(ent)
        step = positions[:, t : t + 1]
        logits = forward(model, token.view(-1, 1), cache, step, capture=capture, compile=compile)[:, -1]
    return torch.stack(ids, 1), torch.stack(logprobs, 1), torch.stack(entropies, 1), logits
