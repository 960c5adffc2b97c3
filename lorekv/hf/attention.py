"""The attention function lorekv registers with transformers, and the forward pass around it.

transformers lets a model call a registered attention function with the post-RoPE queries
(B, H, q, d), the keys/values returned by the cache (B, G, K, d) and the module itself. lorekv
registers ``"lorekv"``: outside a lorekv forward pass it is plain SDPA; inside one it masks
by the positions a :class:`~lorekv.hf.cache.PositionedCache` keeps per slot (causality,
sliding windows, padding of ragged heads) and records the queries a capture asks for. This
captures exactly what the model attends with, for every architecture using the interface,
without copying model code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

from lorekv.compiling import compiled
from lorekv.hf.cache import PADDING, PositionedCache
from lorekv.hf.context import ATTENTION_NAME, ForwardPass, active_pass, running
from lorekv.hf.generation import install
from lorekv.hf.introspection import attention_modules


@dataclass
class QueryCapture:
    """Records the post-RoPE queries that chosen layers compute during a forward pass.

    Attributes:
        layers: model layer indices to record.
        last: record only the last ``last`` queries of each pass (None: all of them; 0: none,
            a capture kept for its ``state_maps`` alone).
        queries: layer index -> list of (B, H, q', d) tensors, one per pass.
        o_proj: layer index -> (D, H*d) output projection weight.
        scaling: layer index -> softmax scale of q.k.
        hidden_norms: also record ``norms`` (off by default: a norm per layer and pass that
            only KVzip+ reads).
        norms: layer index -> list of (B, q') tensors (at least float32), one per pass: ||h||, the L2 norm
            of each query's hidden state where it enters the attention module (after the
            layer's input norm), which KVzip+ divides the attention by. Recorded by the
            attention modules' pre-hook (:func:`prepare`).
        lse: layer index -> list of pairs of (B, H, q') tensors, one per pass that attended over a
            shared prompt without a sliding window (a future's pass,
            :func:`shared_prefix_attention`): the log-sum-exps of each query's scaled logits over
            the prompt keys and over the pass's own keys, as the kernel computed them (kept as
            they come: nothing is launched for them inside a decode loop; :meth:`stacked_lse`
            joins them). A scorer that needs a softmax's normaliser reads it instead of
            recomputing every logit (:attr:`lorekv.trajectories.LayerCapture.lse`).
        state_maps: name -> f(layer index, hidden states (B, q, D)) -> (B, q, F): what a scorer
            reads of every token's hidden state where it enters the attention module (after the
            layer's input norm), applied by the attention modules' pre-hook to every token of
            every pass (not only the last ``last``), so that only its F features per token are
            kept (a fitted surrogate's predictions; the states themselves, F = D, when fitting
            one).
        states: name -> layer index -> list of (B, q, F) tensors, one per pass: the maps' outputs.
    """

    layers: frozenset[int]
    last: int | None = None
    queries: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    o_proj: dict[int, torch.Tensor] = field(default_factory=dict)
    scaling: dict[int, float] = field(default_factory=dict)
    hidden_norms: bool = False
    norms: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    lse: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    state_maps: Mapping[str, Callable[[int, torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    states: dict[str, dict[int, list[torch.Tensor]]] = field(default_factory=dict)

    def record(self, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        idx = module.layer_idx
        if idx not in self.layers:
            return
        self.o_proj[idx] = module.o_proj.weight.detach()
        self.scaling[idx] = float(scaling)
        if self.last == 0:
            return
        if self.last is None or query.shape[2] <= self.last:
            q = query.detach()
        else:  # a copy: a view would keep the whole prefill's queries of every layer alive
            q = query[:, :, -self.last :, :].detach().clone()
        self.queries.setdefault(idx, []).append(q)

    def record_states(self, module: torch.nn.Module, hidden_states: torch.Tensor) -> None:
        """Record what is asked of the (B, q, D) hidden states entering layer ``module``'s
        attention: the norms of the captured queries' (``hidden_norms``), every token's
        ``state_maps`` features."""
        idx = module.layer_idx
        if idx not in self.layers:
            return
        h = hidden_states.detach()
        for name, state_map in self.state_maps.items():
            self.states.setdefault(name, {}).setdefault(idx, []).append(state_map(idx, h))
        if not self.hidden_norms or self.last == 0:
            return
        if self.last is not None:
            h = h[:, -self.last :]
        self.norms.setdefault(idx, []).append(
            torch.linalg.vector_norm(h, dim=-1, dtype=torch.promote_types(h.dtype, torch.float32))
        )

    def record_lse(self, module: torch.nn.Module, prompt: torch.Tensor, own: torch.Tensor) -> None:
        """Record the (B, H, q) log-sum-exps of a pass's queries over the prompt and over their own keys."""
        idx = module.layer_idx
        if idx in self.layers and self.last is None:
            self.lse.setdefault(idx, []).append((prompt, own))

    def stacked(self, idx: int) -> torch.Tensor:
        """(B, H, q_total, d) the queries of layer ``idx`` across passes, in order."""
        return torch.cat(self.queries[idx], dim=2)

    def stacked_states(self, name: str, idx: int) -> torch.Tensor:
        """(B, q_total, F) the ``state_maps[name]`` features of layer ``idx``'s tokens across passes."""
        return torch.cat(self.states[name][idx], dim=1)

    def stacked_norms(self, idx: int) -> torch.Tensor | None:
        """(B, q_total) the hidden-state norms of layer ``idx``'s queries across passes; None when
        not asked for, or when a pass ran without the pre-hook (a model not prepared by this
        version of lorekv)."""
        norms = self.norms.get(idx, [])
        if len(norms) != len(self.queries.get(idx, [])):
            return None
        return torch.cat(norms, dim=1)

    def stacked_lse(self, idx: int) -> torch.Tensor | None:
        """(B, H, q_total, 2) (at least float32) the log-sum-exps of layer ``idx``'s queries across
        passes, over the prompt [..., 0] and over their own keys [..., 1]; None unless every pass
        recorded them."""
        passes = self.lse.get(idx, [])
        if len(passes) != len(self.queries.get(idx, [])) or not passes:
            return None
        prompt, own = (torch.cat(part, dim=2) for part in zip(*passes, strict=True))
        lse = torch.stack([prompt, own], dim=-1)
        return lse.to(torch.promote_types(lse.dtype, torch.float32))


def position_mask(key_positions: torch.Tensor, query_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, G, q, K) bool: key slot visible to query, for keys (B, G, K) and queries (B, q) or (q,).

    Visible iff the slot is not padding, its position is <= the query's, and (sliding
    layers) the query is less than ``window`` positions past it. A padding query (position
    -1) sees no key.
    """
    kp = key_positions.unsqueeze(-2)
    qp = query_positions.to(kp.device).view(-1, 1, query_positions.shape[-1], 1)
    visible = (kp != PADDING) & (kp <= qp)
    if window is not None:
        visible &= kp > qp - window
    return visible


def unmask_empty_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (..., q, K) with every row that sees no key opened to all keys: a padding query's
    output is never read, but it must stay finite (a NaN value would poison the keys' weighted
    sums, where a zero weight times NaN is NaN)."""
    return mask | ~mask.any(dim=-1, keepdim=True)


def lorekv_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over a :class:`PositionedCache`; returns (B, q, H, d) like transformers' SDPA."""
    active = active_pass()
    if active is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("lorekv attention does not support attention logit soft-capping")
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("lorekv attention does not support attention sinks (s_aux)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if active.capture is not None:
        active.capture.record(module, query, scaling)
    layer = active.cache.layers[module.layer_idx]
    window = sliding_window if sliding_window is not None else layer.window
    if layer.prefix is not None:
        prefix, positions = layer.prefix, active.key_positions[module.layer_idx]
        cascade = shared_prefix_attention
        if active.compile:  # contiguous: views into reserved room add stride guards, hence recompilations
            cascade = compiled(shared_prefix_attention)
            key, value, positions = key.contiguous(), value.contiguous(), positions.contiguous()
        own_causal = query.shape[2] > 1 and key.shape[2] == query.shape[2] and window is None and not active.padded
        out, lse_p, lse_s = cascade(
            query, key, value, positions, active.query_positions,
            prefix.keys, prefix.values, prefix.positions, prefix.padded, window, scaling, own_causal,
        )  # fmt: skip
        if active.capture is not None and window is None:
            active.capture.record_lse(module, lse_p, lse_s)
        return out.transpose(1, 2).contiguous(), None
    q_len, k_len = query.shape[2], key.shape[2]
    mask, is_causal = None, False
    if q_len > 1 and q_len == k_len and (window is None or q_len <= window) and not layer.padded:
        is_causal = True
    elif q_len > 1 or layer.padded:
        mask = position_mask(active.key_positions[module.layer_idx], active.query_positions, window)
        if active.padded:
            mask = unmask_empty_rows(mask)
    group = query.shape[1] // key.shape[1]
    if mask is not None and group > 1:
        mask = repeat(mask, "b g q k -> b (g r) q k", r=group)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=group > 1
    )
    return out.transpose(1, 2).contiguous(), None


def shared_prefix_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_positions: torch.Tensor,
    query_positions: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    prefix_positions: torch.Tensor,
    prefix_padded: bool,
    window: int | None,
    scaling: float,
    own_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of B branches over P shared prefixes (B/P branches each) and their own tokens,
    each prefix read once.

    Args:
        query: (B, H, q, d) the branches' queries, prefix p's branches at rows p*B/P..(p+1)*B/P-1.
        keys: (B, G, S, d) each branch's own entries.
        values: (B, G, S, d) their values.
        key_positions: (B, G, S) their positions.
        query_positions: (B, q) the queries' positions ((q,): every branch alike).
        prefix_keys: (P, G, K, d) the shared layer, every entry of a row before its branches' queries.
        prefix_values: (P, G, K, d) its values.
        prefix_positions: (P, G, K) its positions.
        prefix_padded: some prefix entries are padding (an evicted cache).
        window: the layer's sliding window (None: full attention).
        scaling: the softmax scale of q . k.
        own_causal: the branches' own entries are exactly this call's tokens, in order, none of
            them padding, and no window: their part is causal attention (q = S).

    Returns:
        The output (B, H, q, d), equal to attention over the concatenation [prefix, own] up to
        rounding, and the log-sum-exps (B, H, q) (at least float32) of the scaled logits over the prefix
        and over the own entries (-inf where a query sees none).

    Cascade (shared-prefix) attention: the B/P * group query heads of each KV head attend to
    their prefix row as one call, each branch's group query heads attend to its own S entries
    as one call per KV head (the entries are not repeated per query head), and the two partial
    results merge exactly through their log-sum-exps:
    o = (e^{lse_p} o_p + e^{lse_s} o_s) / (e^{lse_p} + e^{lse_s}) = o_s + sigmoid(lse_p - lse_s) (o_p - o_s),
    one interpolation. Without it, B branches would hold and read B copies of the prompt's KV
    at every step.
    """
    b, h, q, _ = query.shape
    g, p = keys.shape[1], prefix_keys.shape[0]
    r, m = h // g, b // p
    query_positions = query_positions.reshape(-1, q).expand(b, q)
    prefix_mask = None
    if prefix_padded or window is not None:
        kp = prefix_positions[:, :, None, None, :]  # (P, G, 1, 1, K)
        qp = rearrange(query_positions.to(kp.device), "(p m) q -> p 1 m q 1", p=p)
        prefix_mask = (kp != PADDING) & (kp <= qp)
        if window is not None:
            prefix_mask &= kp > qp - window
        prefix_mask = repeat(prefix_mask, "p g m q k -> p g (m r q) k", r=r)
    folded = rearrange(query, "(p m) (g r) q d -> p g (m r q) d", p=p, g=g)
    out_p, lse_p = partial_attention(folded, prefix_keys, prefix_values, prefix_mask, scaling)
    out_p = rearrange(out_p, "p g (m r q) d -> (p m) (g r) q d", m=m, r=r)
    lse_p = rearrange(lse_p, "p g (m r q) -> (p m) (g r) q", m=m, r=r)

    if own_causal:
        # every own key was fed with these queries, in their order (a teacher-forced future): the
        # own part is plain causal attention, no (q, q) mask built on the CPU; each query head
        # reads its KV head's keys (a copy of the q own keys per query head, small beside a mask)
        own_keys, own_values = (repeat(x, "b g s d -> b (g r) s d", r=r) for x in (keys, values))
        out_s, lse_s = partial_attention(query, own_keys, own_values, None, scaling, causal=True)
    else:
        own_mask = None
        if q > 1 or window is not None:
            own_mask = repeat(position_mask(key_positions, query_positions, window), "b g q s -> b g (r q) s", r=r)
        own_query = rearrange(query, "b (g r) q d -> b g (r q) d", g=g)  # a view at q = 1 (a decode step)
        out_s, lse_s = partial_attention(own_query, keys, values, own_mask, scaling)
        out_s = rearrange(out_s, "b g (r q) d -> b (g r) q d", r=r)
        lse_s = rearrange(lse_s, "b g (r q) -> b (g r) q", r=r)

    dtype = torch.promote_types(query.dtype, torch.float32)
    share_p = torch.sigmoid(lse_p - lse_s).unsqueeze(-1).to(dtype)  # e^{lse_p} / (e^{lse_p} + e^{lse_s})
    return torch.lerp(out_s.to(dtype), out_p.to(dtype), share_p).to(query.dtype), lse_p, lse_s


def partial_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    *,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention and its log-sum-exp, for merging with other partial attentions.

    Args:
        query: (B, H, Q, d).
        keys: (B or 1, H, K, d).
        values: (B or 1, H, K, d).
        mask: (B or 1, H, Q, K) bool, True where a query sees a key; None: every key.
        scaling: the softmax scale of q . k.
        causal: query i sees keys 0..i only (Q = K, no ``mask``): the CPU kernel masks causally
            itself, nothing materialised; the other paths are given the triangle as a mask.

    Returns:
        The output (B, H, Q, d) in the query's dtype and the log-sum-exp of the scaled logits
        (B, H, Q) in float32; a query that sees no key gets output 0 and log-sum-exp -inf.
        A fused PyTorch kernel where :func:`fused_kernel` finds one (CPU: flash; CUDA:
        memory-efficient), else :func:`reference_partial_attention`.
    """
    kernel = fused_kernel(query, keys, values, mask)
    if causal and kernel != "cpu":  # the CPU kernel masks causally itself; the others get the mask
        q, k = query.shape[-2], keys.shape[-2]
        mask, causal = torch.ones(q, k, dtype=torch.bool, device=query.device).tril()[None, None], False
    if kernel is None:
        return reference_partial_attention(query, keys, values, mask, scaling)
    if kernel == "cuda":
        return cuda_partial_attention(query, keys, values, mask, scaling)
    bias = None if mask is None else torch.zeros(mask.shape, dtype=query.dtype).masked_fill(~mask, -torch.inf)
    keys = keys.expand(query.shape[0], -1, -1, -1)
    values = values.expand(query.shape[0], -1, -1, -1)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, keys, values, 0.0, causal, attn_mask=bias, scale=scaling
    )
    if mask is not None:  # the kernel reports 0, not -inf, for a row without keys
        lse = lse.masked_fill(~mask.any(dim=-1), -torch.inf)
    return out, lse


def fused_kernel(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> Literal["cpu", "cuda"] | None:
    """Which fused log-sum-exp kernel :func:`partial_attention` runs on these inputs (None: the reference).

    Args:
        query: (B, H, Q, d).
        keys: (B or 1, H, K, d).
        values: (B or 1, H, K, d).
        mask: (B or 1, H, Q, K) bool or None.

    On CUDA the memory-efficient kernel is taken exactly when PyTorch's own SDPA front end would
    take it (:func:`torch.backends.cuda.can_use_efficient_attention`: dtype, head dim alignment,
    hardware, ``enable_mem_efficient_sdp``), so unsupported inputs fall back here, up front,
    and an error the kernel raises on supported ones (out of memory among them) is not hidden.
    The mask plays no part: the bias :func:`cuda_partial_attention` builds from it always meets
    the kernel's terms (query dtype, unit last stride, 16-aligned rows).
    """
    if keys.shape[-2] == 0:
        return None
    if query.device.type == "cpu":
        return "cpu"
    if query.device.type != "cuda":
        return None
    b = query.shape[0]
    params = torch.backends.cuda.SDPAParams(
        query, keys.expand(b, -1, -1, -1), values.expand(b, -1, -1, -1), None, 0.0, False, False
    )
    return "cuda" if torch.backends.cuda.can_use_efficient_attention(params) else None


def cuda_partial_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`partial_attention` through PyTorch's memory-efficient CUDA kernel (shapes as there).

    The kernel wants an additive bias in the query's dtype whose rows start at multiples of 16
    elements (as PyTorch's SDPA front end, the bias is allocated padded and a view of width K
    passed), and returns the log-sum-exp padded along the queries (to a multiple of 32 on CUDA).
    A row that sees no key is set to output 0 and log-sum-exp -inf whatever the kernel made of it.
    """
    b, h, q, _ = query.shape
    k = keys.shape[-2]
    keys = keys.expand(b, -1, -1, -1)
    values = values.expand(b, -1, -1, -1)
    bias = None
    if mask is not None:
        padded = torch.zeros((*mask.shape[:-1], -(-k // 16) * 16), dtype=query.dtype, device=query.device)
        bias = padded[..., :k].masked_fill_(~mask, -torch.inf).expand(b, h, q, k)
    out, lse = efficient_attention(query, keys, values, bias, scaling)
    lse = lse[..., :q]
    if mask is not None:
        seen = mask.any(dim=-1).expand(b, h, q)
        out = out.masked_fill(~seen.unsqueeze(-1), 0.0)
        lse = lse.masked_fill(~seen, -torch.inf)
    return out, lse


def efficient_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's memory-efficient attention op: output (B, H, Q, d) and float32 log-sum-exp (B, H, >= Q).

    Args:
        query: (B, H, Q, d).
        keys: (B, H, K, d).
        values: (B, H, K, d).
        bias: (B, H, Q, K) additive, in the query's dtype, rows 16-aligned; None: no bias.
        scaling: the softmax scale of q . k.
    """
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, keys, values, bias, True, 0.0, False, scale=scaling
    )
    return out, lse


def reference_partial_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`partial_attention` in plain float32 operations (any device)."""
    logits = torch.matmul(query.float(), keys.float().transpose(-1, -2)) * scaling
    if mask is not None:
        logits = logits.masked_fill(~mask, -torch.inf)
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.matmul(weights, values.float()).to(query.dtype), lse


def register() -> None:
    """Register ``"lorekv"`` with transformers (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, lorekv_attention)
    if ATTENTION_NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def prepare(model: PreTrainedModel) -> PreTrainedModel:
    """Switch ``model`` to the lorekv attention function and let it continue compressed caches in
    ``model.generate`` (:func:`lorekv.hf.generation.install`); idempotent."""
    register()
    if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)
    install(model)
    for module in attention_modules(model).values():
        if not getattr(module, _STATE_HOOK, False):
            module.register_forward_pre_hook(_record_states, with_kwargs=True)
            setattr(module, _STATE_HOOK, True)
    return model


_STATE_HOOK = "_lorekv_state_hook"


def _record_states(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Attention pre-hook: the capture in flight records what it asks of the hidden states entering it."""
    current = active_pass()
    if current is None or current.capture is None:
        return
    capture = current.capture
    if not capture.hidden_norms and not capture.state_maps:
        return
    hidden_states = kwargs.get("hidden_states", args[0] if args else None)
    if isinstance(hidden_states, torch.Tensor):
        capture.record_states(module, hidden_states)


@contextlib.contextmanager
def using_sdpa(model: PreTrainedModel) -> Iterator[PreTrainedModel]:
    """``model`` with transformers' own SDPA attention for the block (the baseline lorekv is
    measured against); its attention implementation is restored after."""
    previous = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous or ATTENTION_NAME)


@functools.cache
def cache_argument(model_type: type) -> str:
    """The name of ``model_type.forward``'s argument taking the cache, and of the output field
    returning it (transformers renamed ``past_key_values`` to ``cache`` within 5.x)."""
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.no_grad()
def forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: PositionedCache,
    positions: torch.Tensor,
    *,
    capture: QueryCapture | None = None,
    logits_to_keep: int = 1,
    padded: bool = False,
    compile: bool = False,
) -> torch.Tensor:
    """Run ``input_ids`` (B, q) at ``positions`` (q,) or (B, q) through ``model``, appending to ``cache``.

    Returns the logits (B, logits_to_keep, V) in float32. ``model`` must have been through
    :func:`prepare`. ``padded``: some positions are :data:`~lorekv.hf.cache.PADDING` (a
    left-padded batch), stored masked. ``compile``: run lorekv's own attention kernels (the
    branches' cascade attention) through ``torch.compile``.
    """
    batch, q_len = input_ids.shape
    positions = positions.to(input_ids.device).view(-1, q_len).expand(batch, q_len)
    with running(ForwardPass(cache, positions, capture, padded=padded, compile=compile)):
        out = model(
            input_ids=input_ids,
            position_ids=positions.clamp(min=0),
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{cache_argument(type(model)): cache},
        )
    return out.logits.float()
