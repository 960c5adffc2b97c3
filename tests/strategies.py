"""Hypothesis strategies for random captured attention (LayerCapture / Trajectories).

Most examples (about 80%) are drawn in the realistic regime, n 32..48 prompt tokens over
G 2..3 KV heads; the rest cover the edges (n 1..12, one KV head). Other sizes: M 1..3,
group 1..4, T 1..5, d 2..8, D 2..10. The tensors come from a seeded torch generator so that
one example is one draw of a seed.

Two kinds of capture, as the samplers produce them:
- ``"future"``: R = T response keys, query t at position n + t (it sees the whole prompt and
  the response tokens up to and including its own).
- ``"window"``: R = 0 (prompt-window control), T <= n queries at positions n-T .. n-1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from hypothesis import strategies as st

from lorekv.trajectories import LayerCapture, Trajectories

Kind = Literal["future", "window"]


@dataclass(frozen=True)
class CaptureDims:
    """Sizes of one capture: M futures, G KV heads, ``group`` query heads per KV head, T
    queries, n prompt tokens, R response keys, head dim d, hidden size D."""

    futures: int
    kv_heads: int
    group: int
    queries: int
    prompt: int
    response: int
    head_dim: int
    hidden: int

    @property
    def heads(self) -> int:
        return self.kv_heads * self.group


@st.composite
def capture_dims(
    draw: st.DrawFn,
    *,
    kind: Kind | None = None,
    max_futures: int = 3,
    max_kv_heads: int = 3,
    max_group: int = 4,
    min_queries: int = 1,
    max_queries: int = 5,
    max_prompt: int = 48,
) -> CaptureDims:
    """Random sizes; ``kind`` fixes future (R = T) or window (R = 0, T <= n) captures."""
    kind = kind or draw(st.sampled_from(["future", "window"]))
    realistic = max_prompt >= 32 and draw(st.integers(0, 9)) < 8
    low_prompt = min_queries if kind == "window" else 1
    prompt = draw(st.integers(32, max_prompt) if realistic else st.integers(low_prompt, min(max_prompt, 12)))
    queries = draw(st.integers(min_queries, min(max_queries, prompt) if kind == "window" else max_queries))
    return CaptureDims(
        futures=draw(st.integers(1, max_futures)),
        kv_heads=draw(st.integers(2, max_kv_heads) if realistic and max_kv_heads > 1 else st.integers(1, max_kv_heads)),
        group=draw(st.integers(1, max_group)),
        queries=queries,
        prompt=prompt,
        response=queries if kind == "future" else 0,
        head_dim=draw(st.integers(2, 8)),
        hidden=draw(st.integers(2, 10)),
    )


def make_capture(
    dims: CaptureDims,
    seed: int,
    *,
    layer_idx: int = 0,
    query_scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> LayerCapture:
    """A random capture of the given sizes (standard normal tensors, queries times ``query_scale``).

    Query positions follow the capture kind: n + t when R = T > 0, else the last T prompt
    positions.
    """
    gen = torch.Generator().manual_seed(seed)
    m, g, h, t, n, r = dims.futures, dims.kv_heads, dims.heads, dims.queries, dims.prompt, dims.response
    d, big_d = dims.head_dim, dims.hidden

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    start = n if r > 0 else n - t
    return LayerCapture(
        layer_idx=layer_idx,
        queries=(normal(m, h, t, d) * query_scale).to(dtype),
        query_positions=torch.arange(start, start + t),
        prompt_keys=normal(g, n, d),
        prompt_values=normal(g, n, d),
        response_keys=normal(m, g, r, d),
        response_values=normal(m, g, r, d),
        o_proj=normal(big_d, h * d),
        scaling=d**-0.5,
        rotary=rope_tables(d) if d % 2 == 0 else None,  # RoPE pairs coordinates: no tables for an odd d
        query_norms=(torch.rand(m, t, generator=gen) * 2 + 0.5).to(dtype),  # drawn last: the rest as before
    )


def rope_tables(head_dim: int, base: float = 10000.0):
    """Positions (P,) -> (cos, sin) (P, d) float32: the standard rotary tables (Llama's, half-split),
    for captures built by hand (:attr:`LayerCapture.rotary`)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

    def tables(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None] * inv_freq.to(positions.device)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    return tables


@st.composite
def layer_captures(
    draw: st.DrawFn, *, kind: Kind | None = None, dtype: torch.dtype = torch.float32, **dims_kwargs: int
) -> LayerCapture:
    """A random :class:`LayerCapture` (see :func:`capture_dims` for the size bounds)."""
    dims = draw(capture_dims(kind=kind, **dims_kwargs))
    seed = draw(st.integers(0, 2**31 - 1))
    query_scale = draw(st.sampled_from([0.5, 1.0, 2.0]))
    return make_capture(dims, seed, query_scale=query_scale, dtype=dtype)


def make_trajectories(layers: tuple[LayerCapture, ...], seed: int = 0) -> Trajectories:
    """Wrap captures sharing M, T and n into :class:`Trajectories` with random token statistics."""
    gen = torch.Generator().manual_seed(seed)
    first = layers[0]
    m, t = first.num_futures, first.queries.shape[2]
    return Trajectories(
        token_ids=torch.randint(0, 100, (m, t), generator=gen),
        logprobs=-torch.rand(m, t, generator=gen) * 5,
        entropies=torch.rand(m, t, generator=gen) * 3,
        layers=layers,
        prompt_length=first.prompt_length,
    )


@st.composite
def trajectories(draw: st.DrawFn, *, kind: Kind | None = None, max_layers: int = 3, **dims_kwargs: int) -> Trajectories:
    """Random :class:`Trajectories` of 1..``max_layers`` layers with the same sizes.

    Layers differ in their tensors and may differ in head dim and hidden size; M, T, n, R,
    G and the group size are shared (the scores of all layers stack to (M, L, G, n)).
    """
    dims = draw(capture_dims(kind=kind, **dims_kwargs))
    num_layers = draw(st.integers(1, max_layers))
    seed = draw(st.integers(0, 2**31 - 1))
    layers = []
    for idx in range(num_layers):
        layer_dims = replace(dims, head_dim=draw(st.integers(2, 8)), hidden=draw(st.integers(2, 10)))
        layers.append(make_capture(layer_dims, seed + idx, layer_idx=2 * idx))
    return make_trajectories(tuple(layers), seed)
