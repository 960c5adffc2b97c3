"""Fidelity of a bounded generation to the full cache, along the full cache's own output.

Small models cannot reason, so a long output is measured against the model itself: the full
cache generates greedily, and every decoding schedule is teacher-forced along that output in
lockstep with it (each step feeds the full cache's token to every cache). At each step t:

- KL_t = KL(p_full ‖ p_bounded) of the two next-token distributions (nats), and
- agree_t = 1 when both pick the same top-1 token.

The first t where they disagree is the length of the prefix a greedy generation from the
bounded cache shares with the full one: up to it both caches were fed the same tokens (a
schedule's compressions depend only on what it was fed and on its seeds), so a free greedy
run would have produced exactly the full cache's tokens until there.

Cost is measured in the same loop: each cache's own steps (its compressions included) are
timed one after the other at every position, so their ratio to the full cache's steps compares
the same tokens on the same machine state; the bytes are the most each cache allocated.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lorekv.hf import cache_bytes, full_cache, prepare

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class Track:
    """One cache's record along the full cache's output.

    Attributes:
        kl: (T,) KL(p_full ‖ p_cache) at each step, nats (0 for the full cache itself).
        agree: (T,) bool, same top-1 token as the full cache.
        seconds: wall-clock seconds of this cache's model calls, the prompt's pass and every step,
            compressions included.
        peak_bytes: the most key/value bytes the cache allocated at the end of a step.
        compressions: times the schedule compressed (0 for the full cache).
        compress_seconds: the part of ``seconds`` spent compressing.
    """

    kl: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    seconds: float = 0.0
    peak_bytes: int = 0
    compressions: int = 0
    compress_seconds: float = 0.0

    @property
    def identical_prefix(self) -> int:
        """Tokens a greedy run from this cache shares with the full cache's before the first divergence."""
        for t, same in enumerate(self.agree):
            if not same:
                return t
        return len(self.agree)

    def to_dict(self) -> dict:
        return {
            "kl": self.kl,
            "agree": self.agree,
            "seconds": self.seconds,
            "peak_bytes": self.peak_bytes,
            "compressions": self.compressions,
            "compress_seconds": self.compress_seconds,
            "identical_prefix": self.identical_prefix,
        }


@torch.no_grad()
def follow_full_output(
    model: PreTrainedModel,
    prompt_ids: torch.Tensor,
    schedules: Mapping[str, object],
    max_new_tokens: int,
) -> tuple[torch.Tensor, Track, dict[str, Track]]:
    """The full cache's greedy output of ``max_new_tokens`` tokens after ``prompt_ids`` (1, n), and
    each schedule (:class:`lorekv.schedule.DecodingSchedule`, by name) teacher-forced along it.

    Returns the output (1, T), the full cache's track (its time and bytes) and each schedule's.
    """
    prepare(model)
    full = full_cache(model)
    caches = {name: schedule.cache(model) for name, schedule in schedules.items()}
    tracks = {name: Track() for name in schedules}
    base = Track()

    def step(ids: torch.Tensor, cache: object, track: Track, **options: object) -> torch.Tensor:
        """(1, V) float32 next-token logits after feeding ``ids`` to ``cache``, timed into ``track``."""
        start = time.perf_counter()
        logits = model(ids, cache=cache, use_cache=True, **options).logits[:, -1].float()
        track.seconds += time.perf_counter() - start
        return logits

    out = step(prompt_ids, full, base)
    ones = torch.ones_like(prompt_ids)
    logits = {name: step(prompt_ids, cache, tracks[name], attention_mask=ones) for name, cache in caches.items()}
    tokens = []
    for t in range(max_new_tokens):
        reference = torch.log_softmax(out, dim=-1)
        token = out.argmax(-1, keepdim=True)
        tokens.append(token)
        for name, track in tracks.items():
            track.kl.append(float((reference.exp() * (reference - torch.log_softmax(logits[name], dim=-1))).sum()))
            track.agree.append(bool(logits[name].argmax(-1) == token[:, 0]))
        base.kl.append(0.0)
        base.agree.append(True)
        if t == max_new_tokens - 1:
            break
        out = step(token, full, base)
        base.peak_bytes = max(base.peak_bytes, cache_bytes(full))
        for name, cache in caches.items():
            logits[name] = step(token, cache, tracks[name])
            tracks[name].peak_bytes = max(tracks[name].peak_bytes, cache.allocated_bytes())
    for name, cache in caches.items():
        tracks[name].compressions = cache.bound.compressions[0]
        tracks[name].compress_seconds = cache.bound.seconds
    return torch.cat(tokens, 1), base, tracks
