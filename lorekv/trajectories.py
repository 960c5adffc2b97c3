"""What a sampler hands to a scorer: the futures and the attention they were computed with.

Shapes use: M futures, T response tokens per future (or prompt-window queries; a layer holds
T+1 queries when the sampler's ``include_last_prompt_query`` puts the query at n-1 first), H query
heads, G KV heads (H = G * group), n prompt tokens, R response keys (R = T for sampled or
teacher-forced futures, 0 for the prompt-window control), d head dim, D hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from lorekv.token_rules import TokenRule
from lorekv.validation import check_shape


@dataclass(frozen=True)
class LayerCapture:
    """One attention layer as the futures' queries saw it.

    Query ``t`` sits at position ``query_positions[t]`` and attends to every key whose
    position is ``<=`` its own. Prompt keys have positions ``0..n-1``; response keys of a
    future have positions ``n..n+R-1``. Keys are post-RoPE, exactly as the kernel saw them.
    A sampler whose queries see something else than this causal prefix (KVzip's chunked
    reconstruction: each chunk's queries see the sinks, their chunk and their own keys) gives
    ``visible_spans`` instead; every scorer reads visibility through :meth:`visible`.

    Attributes:
        layer_idx: index of the layer in the model.
        queries: (M, H, T, d) post-RoPE query states (T may exceed the futures' token count by
            one: the last prompt query, see ``SamplerConfig.include_last_prompt_query``).
        query_positions: (T,) long, absolute positions of the queries.
        prompt_keys: (G, n, d) keys of the prompt (shared by all futures).
        prompt_values: (G, n, d) values of the prompt.
        response_keys: (M, G, R, d) keys of each future's own tokens.
        response_values: (M, G, R, d) values of each future's own tokens.
        o_proj: (D, H*d) output projection weight; columns ``h*d:(h+1)*d`` are W_o^h.
        scaling: softmax scale applied to q.k (1/sqrt(d) for most models).
        visible_spans: optional (T, S, 2) long: query t sees exactly the keys (indices along
            :meth:`keys`, prompt keys 0..n-1 then response keys n..n+R-1) in the union of the
            S half-open ranges ``[visible_spans[t, s, 0], visible_spans[t, s, 1])`` (an empty
            range, lo >= hi, adds nothing). None (the default): causal by position. Compact,
            O(T * S), and sliceable by query, so a scorer that processes queries in chunks only
            ever materialises a chunk's rows of the (T, n+R) mask.
        rotary: positions (P,) long -> (cos, sin), each (P, d) float32: the layer's own rotary
            position embedding (RoPE) tables, query q at position p being stored as
            ``q * cos[p] + rotate_half(q) * sin[p]``; None when not known (a capture built by
            hand). Scorers that model future positions (Expected Attention) need it.
        query_norms: optional (M, T) ||h|| (at least float32), the L2 norm of each query's hidden state
            where it enters the attention module (after the layer's input norm); None when not
            recorded. KVzip+'s normalisation divides a query's attention by it.
        lse: optional (M, H, T, 2) (at least float32), the log-sum-exp of each query's scaled logits as its
            forward pass computed them: over the prompt keys [..., 0] and over the future's own
            keys [..., 1] (-inf where it saw none); None when not recorded. The softmax
            normaliser of the attention a scorer recomputes, so that it need not form every
            logit again (a reconstruction's own keys are as many as the prompt's). Recorded
            only by passes that follow the whole prompt (futures, a reconstruction: every
            query after every prompt key). The prompt part is read only where the queries see
            the prompt causally (``visible_spans`` None: then all of it), the own part wherever
            they see their own keys causally (the pass's rule); code that changes which keys a
            query sees, or its response keys, sets it to None.
        prompt_features: name -> (n, F) what the prefill recorded of each prompt token's hidden
            state entering this layer's attention, by the map of that name (a scorer's
            :attr:`~lorekv.scorers.base.Scorer.state_maps`, e.g. a fitted surrogate's
            predictions); empty when nothing was asked.
    """

    layer_idx: int
    queries: torch.Tensor
    query_positions: torch.Tensor
    prompt_keys: torch.Tensor
    prompt_values: torch.Tensor
    response_keys: torch.Tensor
    response_values: torch.Tensor
    o_proj: torch.Tensor
    scaling: float
    visible_spans: torch.Tensor | None = None
    rotary: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    query_norms: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    prompt_features: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m, h, t, d = self.queries.shape
        g, n, _ = self.prompt_keys.shape
        if g == 0 or h % g != 0:
            raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({g})")
        check_shape("query_positions", self.query_positions, (t,))
        check_shape("prompt_keys", self.prompt_keys, (g, n, d))
        check_shape("prompt_values", self.prompt_values, (g, n, d))
        r = self.response_keys.shape[2] if self.response_keys.dim() == 4 else -1
        check_shape("response_keys", self.response_keys, (m, g, r, d))
        check_shape("response_values", self.response_values, (m, g, r, d))
        check_shape("o_proj", self.o_proj, (None, h * d))
        if self.visible_spans is not None:
            check_shape("visible_spans", self.visible_spans, (t, None, 2))
        if self.query_norms is not None:
            check_shape("query_norms", self.query_norms, (m, t))
        if self.lse is not None:
            check_shape("lse", self.lse, (m, h, t, 2))
        for name, features in self.prompt_features.items():
            check_shape(f"prompt_features[{name!r}]", features, (n, None))

    @property
    def num_futures(self) -> int:
        return self.queries.shape[0]

    @property
    def num_heads(self) -> int:
        return self.queries.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.prompt_keys.shape[0]

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def prompt_length(self) -> int:
        return self.prompt_keys.shape[1]

    @property
    def num_keys(self) -> int:
        """n + R: the keys a future's queries may attend to."""
        return self.prompt_length + self.response_keys.shape[2]

    def keys(self) -> torch.Tensor:
        """(M, G, n+R, d) every key a future's queries may attend to."""
        prompt = self.prompt_keys.unsqueeze(0).expand(self.num_futures, -1, -1, -1)
        return torch.cat([prompt, self.response_keys], dim=2)

    def values(self) -> torch.Tensor:
        """(M, G, n+R, d) the values matching :meth:`keys`."""
        prompt = self.prompt_values.unsqueeze(0).expand(self.num_futures, -1, -1, -1)
        return torch.cat([prompt, self.response_values], dim=2)

    def visible(self) -> torch.Tensor:
        """(T, n+R) bool: query t may attend to key j (causality by position, or ``visible_spans``)."""
        n, r = self.prompt_length, self.response_keys.shape[2]
        key_positions = torch.arange(n + r, device=self.query_positions.device)
        if self.visible_spans is None:
            return key_positions.unsqueeze(0) <= self.query_positions.unsqueeze(1)
        # each range adds 1 at its start and takes it back at its end: key j is visible where the
        # running sum is positive (one pass over (T, n+R), not one per range)
        spans = self.visible_spans.to(key_positions.device).clamp(0, n + r)
        lo, hi = spans[..., 0], spans[..., 1]  # (T, S)
        step = (lo < hi).to(torch.int32)
        edges = torch.zeros(spans.shape[0], n + r + 1, dtype=torch.int32, device=key_positions.device)
        edges.scatter_add_(1, lo, step).scatter_add_(1, hi, -step)
        return edges[:, : n + r].cumsum(dim=1) > 0

    def visible_prompt_keys(self) -> torch.Tensor:
        """(c,) long, ascending: the prompt keys (0..n-1) that some query sees; every one without
        ``visible_spans``. A reconstruction's chunk of queries sees the sinks and its chunk: the
        scorers then form logits on these columns only. Their number is data-dependent: one small
        device read on an accelerator."""
        n = self.prompt_length
        device = self.prompt_keys.device
        if self.visible_spans is None:
            return torch.arange(n, device=device)
        spans = self.visible_spans.reshape(-1, 2).clamp(0, n).to(device)
        lo, hi = spans[:, 0], spans[:, 1]
        step = (lo < hi).to(torch.int32)  # every range adds 1 at its start and takes it back at its end
        edges = torch.zeros(n + 1, dtype=torch.int32, device=device)
        edges.scatter_add_(0, lo, step).scatter_add_(0, hi, -step)
        return (edges[:n].cumsum(0) > 0).nonzero().squeeze(1)

    def visible_at(self, keys: torch.Tensor) -> torch.Tensor:
        """(T, k) bool: query t sees key ``keys[c]`` (indices along :meth:`keys`), as :meth:`visible`
        says, formed for these k keys only."""
        keys = keys.to(self.query_positions.device)
        if self.visible_spans is None:
            return keys.unsqueeze(0) <= self.query_positions.unsqueeze(1)
        spans = self.visible_spans.to(keys.device)
        lo, hi = spans[..., :1], spans[..., 1:]  # (T, S, 1)
        return ((lo <= keys) & (keys < hi)).any(dim=1)

    def future_slice(self, start: int, stop: int) -> LayerCapture:
        """The same layer holding only futures ``start:stop`` (their queries and response keys)."""
        return replace(
            self,
            queries=self.queries[start:stop],
            response_keys=self.response_keys[start:stop],
            response_values=self.response_values[start:stop],
            query_norms=None if self.query_norms is None else self.query_norms[start:stop],
            lse=None if self.lse is None else self.lse[start:stop],
        )

    def to(self, dtype: torch.dtype) -> LayerCapture:
        """The same layer with its queries, keys and values in ``dtype``: the captures of a bf16
        run rescored in float64, or an edge case built in float64 and cast. ``o_proj`` (the
        model's weight, D x H*d: 64 MiB in float32 per layer of an 8B model) stays as it is; the
        scorers that read it cast it themselves. :attr:`lse` is kept when it holds the precision of
        ``dtype``'s scoring (at least float32) and dropped otherwise: a float32 pass rescored in
        float64 recomputes its normalisers rather than inherit the pass's rounding."""
        keep = self.lse is not None and self.lse.dtype == torch.promote_types(dtype, torch.float32)
        return replace(
            self,
            queries=self.queries.to(dtype),
            prompt_keys=self.prompt_keys.to(dtype),
            prompt_values=self.prompt_values.to(dtype),
            response_keys=self.response_keys.to(dtype),
            response_values=self.response_values.to(dtype),
            lse=self.lse if keep else None,
        )

    def query_slice(self, start: int, stop: int) -> LayerCapture:
        """The same layer holding only queries ``start:stop`` (and their rows of ``visible_spans``)."""
        spans = None if self.visible_spans is None else self.visible_spans[start:stop]
        return replace(
            self,
            queries=self.queries[:, :, start:stop],
            query_positions=self.query_positions[start:stop],
            visible_spans=spans,
            query_norms=None if self.query_norms is None else self.query_norms[:, start:stop],
            lse=None if self.lse is None else self.lse[:, :, start:stop],
        )


@dataclass(frozen=True)
class Trajectories:
    """M futures of T tokens each, with the attention of every evictable layer.

    Attributes:
        token_ids: (M, T) the futures' tokens (for the prompt-window control: the window's
            prompt tokens).
        logprobs: (M, T) log-probability of each token under the model at temperature 1.
        entropies: (M, T) entropy (nats) of the model's next-token distribution there.
        layers: one :class:`LayerCapture` per evictable layer, in model order.
        prompt_length: n, the number of prompt tokens (the eviction candidates are a prefix
            of them).
    """

    token_ids: torch.Tensor
    logprobs: torch.Tensor
    entropies: torch.Tensor
    layers: tuple[LayerCapture, ...]
    prompt_length: int

    def __post_init__(self) -> None:
        if self.token_ids.dim() != 2 or self.token_ids.shape[0] < 1:
            raise ValueError(f"token_ids must have shape (M >= 1, T), got {tuple(self.token_ids.shape)}")
        check_shape("logprobs", self.logprobs, tuple(self.token_ids.shape))
        check_shape("entropies", self.entropies, tuple(self.token_ids.shape))
        for layer in self.layers:
            if layer.num_futures != self.num_futures or layer.prompt_length != self.prompt_length:
                raise ValueError(
                    f"layer {layer.layer_idx} holds {layer.num_futures} futures over {layer.prompt_length} "
                    f"prompt tokens; expected {self.num_futures} over {self.prompt_length}"
                )

    @property
    def num_futures(self) -> int:
        return self.token_ids.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[1]

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(layer.layer_idx for layer in self.layers)


def cat_optional(parts: Sequence[torch.Tensor | None], dim: int) -> torch.Tensor | None:
    """The parts' optional per-query tensors (``query_norms``, ``lse``) concatenated along ``dim``,
    or None when any part lacks theirs (a score that needs them then refuses the whole capture,
    one that can recompute them does)."""
    if any(part is None for part in parts):
        return None
    return torch.cat(list(parts), dim=dim)  # type: ignore[arg-type]


def concat_futures(parts: Sequence[Trajectories]) -> Trajectories:
    """The futures of ``parts`` as one :class:`Trajectories` of M = sum_i M_i futures, in order.

    For causal futures of one shape drawn from one prefilled prompt in several rounds (the same
    T and query positions); the prompt's keys and values are the first part's.
    Futures of different shapes stay apart in a :class:`FutureMixture` instead.
    """
    first = parts[0]
    for part in parts[1:]:
        same = part.num_tokens == first.num_tokens and part.layer_indices == first.layer_indices
        same = same and all(
            a.query_positions.equal(b.query_positions)
            and a.response_keys.shape[2:] == b.response_keys.shape[2:]
            and a.visible_spans is None
            and b.visible_spans is None
            for a, b in zip(first.layers, part.layers, strict=True)
        )
        if not same or part.prompt_length != first.prompt_length:
            raise ValueError("concat_futures needs causal parts of one shape (tokens, layers, query positions, prompt)")
    layers = tuple(
        replace(
            layer,
            queries=torch.cat([p.layers[i].queries for p in parts]),
            response_keys=torch.cat([p.layers[i].response_keys for p in parts]),
            response_values=torch.cat([p.layers[i].response_values for p in parts]),
            query_norms=cat_optional([p.layers[i].query_norms for p in parts], dim=0),
            lse=cat_optional([p.layers[i].lse for p in parts], dim=0),
        )
        for i, layer in enumerate(first.layers)
    )
    return Trajectories(
        token_ids=torch.cat([p.token_ids for p in parts]),
        logprobs=torch.cat([p.logprobs for p in parts]),
        entropies=torch.cat([p.entropies for p in parts]),
        layers=layers,
        prompt_length=first.prompt_length,
    )


@dataclass(frozen=True)
class FutureMixture:
    """Futures of several samplers side by side: the M = sum_i M_i futures of the parts, in order.

    The parts keep their own shapes (token counts T_i, response keys R_i, visibility), so each
    is scored as it stands (``Scorer.score`` scores every part and concatenates the per-future
    scores along M) and no future's queries are padded. The aggregators read the token
    statistics only through each future's mean over its tokens; :attr:`logprobs` and
    :attr:`entropies` are therefore (M, max_i T_i), each future's row right-padded with its own
    mean, which leaves every future's mean (and so every aggregator's weights) exactly as its
    part gave it.

    Attributes:
        parts: the samplers' futures, each over the same prompt and layers.
    """

    parts: tuple[Trajectories, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a future mixture needs at least one part")
        first = self.parts[0]
        for part in self.parts[1:]:
            if part.prompt_length != first.prompt_length or part.layer_indices != first.layer_indices:
                raise ValueError(
                    f"the parts of a future mixture must share one prompt and layers; got {part.prompt_length} "
                    f"tokens, layers {part.layer_indices} against {first.prompt_length}, {first.layer_indices}"
                )

    @property
    def num_futures(self) -> int:
        """M, the futures of every part."""
        return sum(part.num_futures for part in self.parts)

    @property
    def prompt_length(self) -> int:
        return self.parts[0].prompt_length

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return self.parts[0].layer_indices

    @property
    def logprobs(self) -> torch.Tensor:
        """(M, max T_i) every future's token log-probs, padded with the future's own mean."""
        return _padded_with_mean([part.logprobs for part in self.parts])

    @property
    def entropies(self) -> torch.Tensor:
        """(M, max T_i) every future's token entropies, padded with the future's own mean."""
        return _padded_with_mean([part.entropies for part in self.parts])


def _padded_with_mean(rows: list[torch.Tensor]) -> torch.Tensor:
    """(sum M_i, max T_i) the (M_i, T_i) blocks stacked, each row right-padded with its mean."""
    width = max(block.shape[1] for block in rows)
    device = rows[0].device
    out = []
    for block in rows:
        block = block.to(device)
        pad = width - block.shape[1]
        if pad:
            mean = block.mean(dim=1, keepdim=True) if block.shape[1] else block.new_zeros(block.shape[0], 1)
            block = torch.cat([block, mean.expand(-1, pad)], dim=1)
        out.append(block)
    return torch.cat(out)


@dataclass(frozen=True)
class Fed:
    """A step of a :meth:`Rollout.follow` script: tokens teacher-forced into every future.

    Attributes:
        token_ids: (k,) long, the same k tokens fed to each of the M futures (k = 0: nothing).
    """

    token_ids: torch.Tensor

    def __len__(self) -> int:
        return int(self.token_ids.numel())


@dataclass(frozen=True)
class Drawn:
    """A step of a :meth:`Rollout.follow` script: ``num_tokens`` tokens each future draws itself.

    Attributes:
        rule: chooses each step's (M,) tokens from the futures' own (M, V) logits.
        num_tokens: how many tokens (>= 1).
    """

    rule: TokenRule
    num_tokens: int

    def __len__(self) -> int:
        return self.num_tokens


Step = Fed | Drawn
"""One step of a script: fed (teacher-forced) or drawn (decoded) tokens."""
