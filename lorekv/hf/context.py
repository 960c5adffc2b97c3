"""The forward pass in flight: the one channel between :func:`lorekv.hf.attention.forward` and
the code transformers calls inside it (the cache's ``update`` and the attention function).

transformers gives neither the cache nor the attention function the positions lorekv feeds
tokens at, so :func:`~lorekv.hf.attention.forward` publishes them here for the duration of
one model call: the cache reads the query positions to stamp its new slots and writes back
the key positions it returns; the attention function reads both to build its mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lorekv.hf.attention import QueryCapture
    from lorekv.hf.cache import PositionedCache

ATTENTION_NAME = "lorekv"
"""The name lorekv's attention function is registered under (``model.set_attn_implementation``)."""


@dataclass
class ForwardPass:
    """One model call through lorekv.

    Attributes:
        cache: the cache the call appends to.
        query_positions: (B, q) long, on the model's device: the positions of the fed tokens,
            row by row (a left-padded batch places each row's tokens at 0..n_i-1);
            :data:`~lorekv.hf.cache.PADDING` marks a padding token, which is stored masked.
        capture: records queries during the call (None: nothing recorded).
        key_positions: layer index -> (B, G, K) positions of the keys that layer's cache
            returned to its attention in this call (filled by the cache).
        padded: some fed tokens may be padding (the layers they are appended to become padded:
            attention then masks by position instead of taking the causal fast path).
        compile: use the ``torch.compile``'d attention kernels.
        owner: who opened the pass with :func:`enter` (the model whose hooks did), None for
            :func:`running`.
        token: the context-variable token :func:`leave` restores.
    """

    cache: PositionedCache
    query_positions: torch.Tensor
    capture: QueryCapture | None = None
    key_positions: dict[int, torch.Tensor] = field(default_factory=dict)
    padded: bool = False
    compile: bool = False
    owner: Any = None
    token: Any = None


_ACTIVE: ContextVar[ForwardPass | None] = ContextVar("lorekv_forward_pass", default=None)


def active_pass() -> ForwardPass | None:
    """The lorekv forward pass in flight, if any."""
    return _ACTIVE.get()


@contextmanager
def running(forward_pass: ForwardPass) -> Iterator[ForwardPass]:
    """Make ``forward_pass`` the active one for the duration of the block."""
    token = _ACTIVE.set(forward_pass)
    try:
        yield forward_pass
    finally:
        _ACTIVE.reset(token)


def enter(forward_pass: ForwardPass) -> None:
    """Make ``forward_pass`` the active one until :func:`leave` (for hooks, which cannot hold a
    ``with`` block open across a call)."""
    forward_pass.token = _ACTIVE.set(forward_pass)


def leave(forward_pass: ForwardPass) -> None:
    """End ``forward_pass``, opened by :func:`enter`."""
    _ACTIVE.reset(forward_pass.token)
    forward_pass.token = None
