"""Compression while generating: a cache that stays within its budget as ``generate`` runs.

A :class:`Bound` attached to a :class:`~lorekv.hf.compressed.CompressedCache` (a compressed
prompt, or an empty cache that ``generate`` prefills) follows every model call on it
(:mod:`lorekv.hf.generation`'s hooks): it counts each row's entries per KV head of the evicted
layers, and when a row holds ``budget + buffer`` it compresses that row, prompt and generated
tokens alike, back to the budget with the method's own parts:

- the **sampler** draws its futures from the row's current state (:class:`CacheRollout`): a
  prompt window is the queries of the row's last w fed tokens, recorded as they were fed;
  a sampled future (greedy, temperature, nucleus) continues the row from its last logits,
  as branches of its cache whose tokens never enter it;
- the **scorer** and **aggregator** score every held entry (the row's held entries stand for
  the prompt of a prefill-time compression, in the order they were fed);
- the **policy** (``uniform``: B per KV head, its ``sink`` and ``recent`` protected) keeps B.

Each row is compressed on its own schedule, from its own entries and logits, so a row of a
batch keeps what it would keep alone. A compression reads the host (the rows' entry counts,
checked); a decode step between compressions reads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from lorekv.hf.attention import QueryCapture
from lorekv.hf.cache import PADDING, PositionedCache, PositionedLayer
from lorekv.hf.context import ForwardPass
from lorekv.hf.introspection import attention_modules, evictable_layers
from lorekv.hf.rollout import draw, layer_capture
from lorekv.hf.timing import now
from lorekv.scores import Scores, Selection
from lorekv.token_rules import TokenRule
from lorekv.trajectories import LayerCapture, Step, Trajectories

DECODING_SAMPLERS = ("prompt_window", "greedy", "temperature", "nucleus")
"""Samplers that draw from a generating cache: a window of its recent queries, or futures
decoded from its current state (the others feed text of their own or read the whole prompt)."""

DECODING_POLICIES = ("uniform",)
"""Policies a decoding schedule selects with: B per KV head, so that every head of a row holds
the same count and the rows stay dense."""


UNSCORABLE = ("expected_attention",)
"""Scorers that model the queries' positions (rotary tables), which a generating cache's captures
(positions counted in held entries) do not give."""


class Method(Protocol):
    """What a decoding schedule needs of a pipeline (:class:`lorekv.pipeline.Pipeline`)."""

    sampler: Any
    scorer: Any
    policy: Any

    def score(self, trajectories: Trajectories, candidates: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def check_method(method: Method, buffer: int) -> None:
    """Refuse, naming the part, a method that cannot compress while generating."""
    sampler, policy = method.sampler.config, method.policy.config
    if sampler.name not in DECODING_SAMPLERS:
        raise ValueError(
            f"sampler {sampler.name!r} cannot draw from a generating cache; a decoding schedule takes one of "
            f"{', '.join(DECODING_SAMPLERS)}"
        )
    if getattr(sampler, "window", None) == "all":
        raise ValueError("sampler window 'all' would keep every query of the generation: give an int window")
    if sampler.include_last_prompt_query:
        raise ValueError("sampler include_last_prompt_query: a generating cache has no last prompt query; set it off")
    scorer = method.scorer
    if scorer.needs_query_norms or scorer.config.name in UNSCORABLE:
        raise ValueError(
            f"scorer {scorer.config.name!r} reads what a generating cache does not record (the window queries' "
            "hidden-state norms, rotary tables for the queries' positions)"
        )
    if policy.name not in DECODING_POLICIES:
        raise ValueError(
            f"policy {policy.name!r}: a decoding schedule keeps B entries per KV head (policy 'uniform'), "
            "so that every head of a row holds the same count"
        )
    window = window_of(method)
    if window > buffer:
        raise ValueError(
            f"buffer must be >= the sampler's window ({window}): the window's queries are the last "
            f"{window} fed tokens, all held since the last compression; got buffer={buffer}"
        )
    if policy.sink + policy.recent >= policy.budget:
        raise ValueError(
            f"policy.budget ({policy.budget}) must exceed sink + recent ({policy.sink} + {policy.recent}): "
            "a compression keeps the protected entries and scores the others"
        )


def window_of(method: Method) -> int:
    """w, the recent queries the method's sampler reads (0 for sampled futures)."""
    return int(method.sampler.prefill_window)


class Bound:
    """A generating cache's schedule and its bookkeeping (see the module docstring).

    Attributes:
        method: the pipeline whose parts compress (policy ``uniform``).
        buffer: entries per KV head a row may hold above the budget before it is compressed.
        layers: the evicted layers (the model's full-attention ones).
        held: entries each row holds per KV head of every evicted layer (host bookkeeping).
        fed: real tokens each row was fed since the schedule was attached.
        peak: the most entries per KV head each row held at the end of a model call.
        compressions: how many times each row was compressed.
        seconds: wall-clock seconds spent compressing (all rows).
        slots: layer -> (b, G, K, S) what the scorer's ``state_maps`` (S of them, a surrogate's
            predictions) made of the hidden state of the token each slot holds, per KV head,
            aligned with the layer's slots: recorded as each token is fed, kept with its entry.
    """

    def __init__(self, model: PreTrainedModel, method: Method, buffer: int, held: Sequence[int]) -> None:
        check_method(method, buffer)
        self.model = model
        self.method = method
        self.buffer = buffer
        self.budget = int(method.policy.config.budget)
        self.window = window_of(method)
        self.layers = tuple(evictable_layers(model))
        modules = attention_modules(model)
        self.o_proj = {idx: modules[idx].o_proj.weight.detach() for idx in self.layers}
        self.scaling = {idx: float(modules[idx].scaling) for idx in self.layers}
        self.held = [int(h) for h in held]
        self.fed = [0] * len(self.held)
        self.peak = list(self.held)
        self.compressions = [0] * len(self.held)
        self.seconds = 0.0
        self.queries: dict[int, torch.Tensor] = {}
        self.tokens: torch.Tensor | None = None
        self.real: torch.Tensor | None = None
        self.state_maps = dict(method.scorer.state_maps)
        self.slots: dict[int, torch.Tensor] = {}

    def copy(self) -> Bound:
        """The same schedule and state for a fork of the cache (the recorded queries shared, read-only)."""
        out = Bound.__new__(Bound)
        out.__dict__.update(self.__dict__)
        out.held, out.fed, out.peak = list(self.held), list(self.fed), list(self.peak)
        out.compressions, out.queries, out.slots = list(self.compressions), dict(self.queries), dict(self.slots)
        return out

    def rows(self, indices: Sequence[int]) -> Bound:
        """The state of rows ``indices`` only (a cache's :meth:`~CompressedCache.rows`)."""
        out = self.copy()
        out.held = [self.held[i] for i in indices]
        out.fed = [self.fed[i] for i in indices]
        out.peak = [self.peak[i] for i in indices]
        out.compressions = [self.compressions[i] for i in indices]
        index = torch.tensor(list(indices))
        out.queries = {idx: q[index.to(q.device)] for idx, q in self.queries.items()}
        out.tokens = None if self.tokens is None else self.tokens[index.to(self.tokens.device)]
        out.real = None if self.real is None else self.real[index.to(self.real.device)]
        out.slots = {idx: f[index.to(f.device)] for idx, f in self.slots.items()}
        return out

    def room(self) -> int:
        """Entries per KV head every row may still take before the fullest is compressed."""
        return max(self.budget + self.buffer - max(self.held), 0)

    def capture(self) -> QueryCapture | None:
        """What a model call on the cache records: the queries of its last w tokens and the
        ``state_maps`` of every token (None: nothing)."""
        if self.window == 0 and not self.state_maps:
            return None
        return QueryCapture(frozenset(self.layers), last=self.window, state_maps=self.state_maps)

    def before_pass(self, tokens: torch.Tensor | None) -> None:
        """Keep the ids of the last w tokens fed (``tokens`` (b, q); None when fed as embeddings)."""
        if self.window == 0:
            return
        if tokens is None or tokens.dim() != 2:
            raise ValueError(
                "a decoding schedule whose sampler reads a window keeps the ids of the tokens fed: feed input_ids, "
                "not inputs_embeds"
            )
        tokens = tokens[:, -self.window :]
        self.tokens = tokens if self.tokens is None else torch.cat([self.tokens, tokens], 1)[:, -self.window :]

    def after_pass(self, cache: Any, current: ForwardPass, logits: torch.Tensor, real: Sequence[int]) -> None:
        """A model call on ``cache`` fed ``real[r]`` tokens to row r and ended with ``logits``
        (b, q, V): record its window, then compress every row that reached ``budget + buffer``."""
        if current.capture is not None and self.window:
            real_columns = current.query_positions[:, -self.window :] != PADDING
            self.real = (
                real_columns if self.real is None else torch.cat([self.real, real_columns], 1)[:, -self.window :]
            )
            for idx in self.layers:
                new = current.capture.queries[idx][0]
                old = self.queries.get(idx)
                self.queries[idx] = new if old is None else torch.cat([old, new], 2)[:, :, -self.window :]
        if current.capture is not None and self.state_maps:
            for idx in self.layers:
                maps = [current.capture.states[name][idx][0] for name in self.state_maps]  # (b, q, G) each
                new = torch.stack(maps, dim=-1).transpose(1, 2)  # (b, G, q, S)
                old = self.slots.get(idx)
                self.slots[idx] = new if old is None else torch.cat([old, new], 2)
        for r, count in enumerate(real):
            self.held[r] += count
            self.fed[r] += count
            self.peak[r] = max(self.peak[r], self.held[r])
        due = [r for r in range(len(self.held)) if self.held[r] >= self.budget + self.buffer]
        due = [r for r in due if self.fed[r] >= self.window]
        if due and self.window and current.padded:  # a padded pass may leave padding among the last w columns
            complete = self.real.all(1).tolist()
            due = [r for r in due if complete[r]]
        if due:
            start = now(logits.device)
            with torch.no_grad():
                self.compress(cache, due, logits[:, -1].float().clone())
            self.seconds += now(logits.device) - start
        elif not cache.layers[self.layers[0]].reserved:  # a prompt prefilled whole: room up to the bound
            cache.reserve(len(self.held), self.room())

    def compress(self, cache: PositionedCache, rows: Sequence[int], last_logits: torch.Tensor) -> None:
        """Compress ``rows`` of ``cache`` to the budget and store every row densely again."""
        if held_counts(cache, self.layers, len(self.held)) != self.held:
            raise RuntimeError(
                f"the cache holds other entry counts than its schedule counted ({self.held}): it was fed outside "
                "its model's hooks (lorekv.hf.forward)"
            )
        entries = {
            idx: [real_entries(cache.layers[idx], self.slots.get(idx), r, self.held[r]) for r in range(len(self.held))]
            for idx in self.layers
        }
        starts = cache.row_positions.tolist()
        for r in rows:
            own = {idx: entries[idx][r] for idx in self.layers}
            rollout = CacheRollout(self, cache, r, own, last_logits[r : r + 1], int(starts[r]))
            futures = self.method.sampler.futures(rollout)
            scores, _ = self.method.score(futures, self.held[r])
            selection = self.method.policy.select(Scores(scores, self.layers))
            for i, idx in enumerate(self.layers):
                entries[idx][r] = kept_entries(entries[idx][r], selection, i)
        for idx in self.layers:
            slots = store_rows(cache.layers[idx], entries[idx], self.budget + self.buffer)
            if slots is not None:
                self.slots[idx] = slots
        for r in rows:
            self.held[r] = self.budget
            self.compressions[r] += 1


Entries = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]
"""One row's entries of one layer: keys and values (1, G, c, d), positions (1, G, c), and the
slots' ``state_maps`` features (1, G, c, S) when the scorer has any."""


def real_entries(layer: PositionedLayer, slots: torch.Tensor | None, row: int, count: int) -> Entries:
    """Row ``row``'s ``count`` real entries per KV head of ``layer`` (each head holds ``count``:
    :func:`held_counts`), in the order they were fed."""
    positions = layer.positions[row]
    real = positions != PADDING
    g, k = real.shape
    rows = slice(row, row + 1)
    entries = (layer.keys[rows], layer.values[rows], positions.unsqueeze(0), None if slots is None else slots[rows])
    if count == k:
        return entries
    return _take(entries, real.nonzero()[:, 1].view(g, count))


def _take(entries: Entries, index: torch.Tensor) -> Entries:
    """Slots ``index`` (G, c) of one row's entries."""

    def along_slots(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.gather(2, index.view(1, *index.shape, 1).expand(1, -1, -1, tensor.shape[-1]))

    keys, values, positions, slots = entries
    kept_slots = None if slots is None else along_slots(slots)
    return along_slots(keys), along_slots(values), positions.gather(2, index.unsqueeze(0)), kept_slots


def kept_entries(entries: Entries, selection: Selection, layer: int) -> Entries:
    """The entries a selection keeps in evicted layer ``layer`` (every head keeps the same count)."""
    index, _ = selection.padded(layer)
    return _take(entries, index.to(entries[0].device))


def store_rows(layer: PositionedLayer, rows: Sequence[Entries], capacity: int) -> torch.Tensor | None:
    """Store every row's entries in ``layer``, left-padded to the longest, with room for
    ``capacity`` entries per KV head (so that appends until the next compression copy nothing);
    return the rows' slot features stored alike (None without any)."""
    width = max(entry[0].shape[2] for entry in rows)
    pads = [width - entry[0].shape[2] for entry in rows]

    def stacked(part: int, value: float = 0.0) -> torch.Tensor:
        tensors = [entry[part] for entry in rows]
        last = 1 if tensors[0].dim() == 3 else 2  # positions (1, G, c); the others (1, G, c, F)
        return torch.cat(
            [F.pad(t, (0, 0) * (last - 1) + (pad, 0), value=value) for t, pad in zip(tensors, pads, strict=True)]
        )

    layer.set(stacked(0), stacked(1), stacked(2, PADDING), padded=any(pads))
    if capacity > width:
        layer.reserve(len(rows), capacity - width)
    return None if rows[0][3] is None else stacked(3)


class CacheRollout:
    """One row of a generating cache as a sampler's :class:`~lorekv.samplers.base.Rollout`.

    Its "prompt" is the row's c held entries of every evicted layer, in the order they were
    fed (the captures' prompt keys, (G, c, d)); a capture's query positions count in that order
    (a window query sees the entries fed before it; a future's query sees all c), while the
    futures themselves are fed at the row's real positions. Every entry is a candidate.
    """

    def __init__(
        self,
        bound: Bound,
        cache: PositionedCache,
        row: int,
        entries: dict[int, Entries],
        last_logits: torch.Tensor,
        start: int,
    ) -> None:
        self.bound = bound
        self.model = bound.model
        self.row = row
        self.entries = entries
        self.last_logits = last_logits
        c = bound.held[row]
        self.prompt_length = self.candidates = c
        self.tokenizer = None
        self.start = start
        self.prompt_ids = torch.zeros(1, c, dtype=torch.long, device=last_logits.device)
        self.cache = PositionedCache([layer.window for layer in cache.layers])
        for idx, (src, dst) in enumerate(zip(cache.layers, self.cache.layers, strict=True)):
            if idx in entries:
                dst.set(*entries[idx][:3])
            elif src.is_initialized:
                rows = slice(row, row + 1)
                dst.set(src.keys[rows], src.values[rows], src.positions[rows], padded=src.padded)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.last_logits.device).manual_seed(seed)

    def prompt_window(self, window: int | Literal["all"]) -> Trajectories:
        """The queries of the row's last ``window`` fed tokens (one pseudo-future; their token
        statistics are not recorded, reported as 0: its weight is 1 whatever they are)."""
        if window == "all" or not 1 <= window <= self.bound.window:
            raise ValueError(f"window must lie in [1, {self.bound.window}] (the queries recorded), got {window}")
        c, row = self.prompt_length, slice(self.row, self.row + 1)
        zeros = self.last_logits.new_zeros(1, window)
        return Trajectories(
            self.bound.tokens[row, -window:],
            zeros,
            zeros,
            self.layers(lambda idx: self.bound.queries[idx][row, :, -window:], torch.arange(c - window, c), None, None),
            c,
        )

    def decode(
        self, rule: TokenRule, num_futures: int, num_tokens: int, *, keep: Selection | None = None
    ) -> Trajectories:
        """M futures of T tokens continuing the row from its last logits, as branches of its cache."""
        if keep is not None:
            raise ValueError("a generating cache draws no futures from a draft selection (LAQ's)")
        m, device = num_futures, self.last_logits.device
        cache = self.cache.branches(m)
        cache.reserve(m, num_tokens)
        capture = QueryCapture(frozenset(self.bound.layers))
        where = torch.arange(self.start, self.start + num_tokens, device=device).expand(m, -1)
        ids, lp, ent, _ = draw(self.model, cache, capture, self.last_logits.expand(m, -1), rule, where)
        c = self.prompt_length
        layers = self.layers(
            capture.stacked,
            torch.arange(c, c + num_tokens),
            lambda idx: (cache.layers[idx].keys, cache.layers[idx].values),
            capture.stacked_lse,
        )
        return Trajectories(ids, lp, ent, layers, c)

    def teacher_force(self, token_ids: torch.Tensor, *, stats: bool = True) -> Trajectories:
        raise ValueError("a decoding schedule's sampler decodes futures or reads a window; it feeds no given tokens")

    def follow(self, script: Sequence[Step], num_futures: int) -> Trajectories:
        raise ValueError("a decoding schedule's sampler decodes futures or reads a window; it follows no script")

    def layers(
        self,
        queries: Callable[[int], torch.Tensor],
        query_positions: torch.Tensor,
        responses: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None,
        lse: Callable[[int], torch.Tensor | None] | None,
    ) -> tuple[LayerCapture, ...]:
        return tuple(
            layer_capture(
                idx,
                self.cache.layers[idx],
                queries(idx),
                query_positions,
                None if responses is None else responses(idx),
                self.bound.o_proj[idx],
                self.bound.scaling[idx],
                lse=None if lse is None else lse(idx),
                prompt_features=self.features(idx),
            )
            for idx in self.bound.layers
        )

    def features(self, idx: int) -> dict[str, torch.Tensor]:
        """name -> (c, G) each held entry's ``state_maps`` feature for its own KV head."""
        slots = self.entries[idx][3]
        if slots is None:
            return {}
        return {name: slots[0, :, :, s].transpose(0, 1) for s, name in enumerate(self.bound.state_maps)}


def held_counts(cache: PositionedCache, layers: Sequence[int], batch: int) -> list[int]:
    """The entries each row holds per KV head of the evicted ``layers`` (one host read).

    Raises:
        ValueError: a row's evicted layers or heads hold different counts (a prompt compressed
            with a policy that gives them different budgets).
    """
    if not cache.layers[layers[0]].is_initialized:
        return [0] * batch
    counts = torch.stack([(cache.layers[idx].positions != PADDING).sum(-1) for idx in layers]).cpu()  # (L, b, G)
    out = []
    for row in range(counts.shape[1]):
        held = counts[:, row]
        if not bool((held == held[0, 0]).all()):
            raise ValueError(
                f"row {row} holds {sorted(set(held.flatten().tolist()))} entries across the evicted layers' KV heads: "
                "a decoding schedule continues caches whose heads hold equal counts (a prompt compressed with "
                "policy 'uniform', or not compressed)"
            )
        out.append(int(held[0, 0]))
    return out
