"""Wall-clock timing that is honest on accelerators, and the prefill every method pays.

CUDA kernels run asynchronously: reading the clock without synchronising charges a phase's
GPU work to whichever later phase first waits for the device. :func:`now` synchronises the
device first (a no-op on the CPU).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping

import torch
from transformers import PreTrainedModel

from lorekv.hf.attention import using_sdpa


def now(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` after the work queued on ``device`` (if CUDA) has finished."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class PhaseTimer:
    """Wall-clock seconds of named phases on one device (each read with :func:`now`).

    ``seconds`` starts from ``earlier`` (phases timed before, e.g. by another timer) and a
    phase timed again replaces its earlier figure.
    """

    def __init__(self, device: torch.device | str | None, earlier: Mapping[str, float] | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = dict(earlier or {})

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = now(self.device)
        yield
        self.seconds[name] = now(self.device) - start


@torch.no_grad()
def reference_prefill_seconds(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> float:
    """Seconds of transformers' own prefill of ``input_ids`` (1, n): ``model(ids,
    logits_to_keep=1)`` with SDPA attention and its own cache, the floor every eviction method
    pays: compression costs are reported as ratios to it, measured in the same process. A
    left-padded batch (b, N) is prefilled with its ``attention_mask``. The model's attention
    implementation is restored afterwards."""
    with using_sdpa(model):
        start = now(input_ids.device)
        model(input_ids, attention_mask=attention_mask, logits_to_keep=1)
        return now(input_ids.device) - start
