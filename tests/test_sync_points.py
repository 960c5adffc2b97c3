"""Host synchronisations in ``Pipeline.compress`` do not grow with layers, futures, tokens or prompt length.

On an accelerator every sync point (see :mod:`sync_points`) stalls the host until the queued
kernels have run; one per layer, future step or token would serialise the compression. The
tests count them on the CPU per phase (input checks, prefill, sampling, scoring, selection,
stats) for LORE-KV (mean and reliability aggregators), SnapKV, CriticalKV and KVzip on tiny
Llama and hybrid Gemma 3 models, at several numbers of layers L, futures M, future tokens T
(SnapKV/CriticalKV: the window) and prompt lengths n, and require the same syncs, at the same
places, at every size.

The syncs that remain, each once per compression (per row where said) whatever L, M, T, n:

- input: ``check_token_ids`` reads the ids' min and max (one read: the range check must
  raise before any model work); with an ``attention_mask``, one copy of the mask to the host
  (row lengths, left-padding check). KVzip: one ``.cpu()`` of the prompt ids to tokenize its
  repeat inputs (``future_positions``, checked against the context).
- prefill: ``BatchRollout`` copies the row lengths (host ints) to the device to build the
  positions (a blocking host-to-device copy syncs the stream).
- sampling: ``decode_rows`` copies the rows' start positions to the device (same reason).
  KVzip: its ``.cpu()`` of the prompt ids again.
- scoring: none in the scorers. The log-prob and reliability aggregators read once whether the
  futures' log-probs and entropies are finite (one read for both).
- selection: ``check_scores`` reads whether the scores are finite (an error must name bad
  scores before they pick tokens); ``selection_from_mask`` reads the kept count of each
  (layer, head) and runs ``nonzero``: a :class:`~lorekv.scores.Selection` holds ragged index
  lists whose lengths the host needs (per-head budgets differ); one read each for all layers.
- stats (per row): the future weights' ``tolist`` (stats are Python floats), the bytes kept
  and held (one read each for all layers, none when no layer is padded), the
  ``attention_mask`` rebuilt on the device from the host lengths (a copy) and read back by
  ``CompressedCache`` (a ``tolist``); ``Selection.counts().tolist()`` reads a tensor built on
  the host (no device sync, counted by the CPU counter all the same).

Known syncs that grow (:data:`KNOWN`) are asserted to grow exactly as explained.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from sync_points import SyncCounter, pipeline_phases
from tiny_models import CharTokenizer, random_ids, tiny_gemma3, tiny_llama
from torch.profiler import ProfilerActivity, profile

from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scorers.projected_loo import ProjectedLOOScorer

Size = tuple[int, int, int, int]
"""(L layers, M futures, T future tokens or window, n prompt tokens)."""

BASE: Size = (2, 2, 2, 40)
SIZES: tuple[Size, ...] = (BASE, (4, 2, 2, 40), (2, 4, 2, 40), (2, 2, 4, 40), (2, 2, 2, 80), (4, 4, 4, 80))
BUDGET = 12


def _lore(m: int, t: int, **changes: Any) -> Pipeline:
    return Pipeline.from_config(preset("lore_kv", BUDGET, num_futures=m, num_tokens=t).override(changes))


METHODS: dict[str, Callable[[int, int], Pipeline]] = {
    "lore_kv": lambda m, t: _lore(m, t),
    "lore_kv_reliability": lambda m, t: _lore(m, t, **{"aggregator.name": "reliability"}),
    "lore_kv_last_query": lambda m, t: _lore(m, t, **{"sampler.include_last_prompt_query": True}),
    "snapkv": lambda m, t: Pipeline.from_config(preset("snapkv", BUDGET, window=t)),
    "critical_kv": lambda m, t: Pipeline.from_config(preset("critical_kv", BUDGET, window=t)),
    "kvzip": lambda m, t: Pipeline.from_config(preset("kvzip", BUDGET)),
}

KNOWN: dict[str, str] = {
    "kvzip chunks": (
        "KVzip teacher-forces its repeat inputs in one pass per distinct input length, the chunks of one "
        "length as branches of the prompt: at most three passes (the first chunk, the later full chunks, a "
        "shorter last chunk) whatever n is. ModelRollout.teacher_force range-checks each pass's ids, one "
        "read of a host tensor (no device sync; counted here), then copies them to the device (a blocking "
        "copy, a stream sync on CUDA, that the CPU counter cannot see)."
    ),
}


def model_of(kind: str, layers: int) -> torch.nn.Module:
    """A tiny model with ``layers`` layers; Gemma 3 alternates sliding and full attention."""
    if kind == "llama":
        return tiny_llama(layers=layers)
    return tiny_gemma3(layer_types=("sliding_attention", "full_attention") * (layers // 2))


def count(pipeline: Pipeline, model: torch.nn.Module, n: int) -> SyncCounter:
    """The syncs of one query-aware ``compress`` of a random n-token prompt, by phase."""
    with pipeline_phases(SyncCounter()) as counter:
        pipeline.compress(model, random_ids(n, seed=1), tokenizer=CharTokenizer())
    return counter


def check_constant(method: str, kind: str, sizes: tuple[Size, ...] = SIZES) -> dict[Size, SyncCounter]:
    """Count at every size; raise AssertionError, with where the syncs are, unless each phase
    holds the same syncs at the same places at every size."""
    counters = {(L, M, T, n): count(METHODS[method](M, T), model_of(kind, L), n) for L, M, T, n in sizes}
    base = counters[sizes[0]]
    for size, counter in counters.items():
        same = {p: base.places(p) for p in base.per_phase()} == {p: counter.places(p) for p in counter.per_phase()}
        assert same, (
            f"{method} on {kind}: syncs depend on (L, M, T, n)\n"
            f"at {sizes[0]}:\n{base.report()}\nat {size}:\n{counter.report()}"
        )
    return counters


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_syncs_do_not_grow_with_layers_futures_tokens_or_prompt(method: str, kind: str) -> None:
    counters = check_constant(method, kind)
    in_scorers = [where for _, where in counters[BASE].places("scoring") if where.startswith("lorekv/scorers")]
    assert not in_scorers, counters[BASE].report()


def test_the_check_fails_on_a_sync_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    score_layer = ProjectedLOOScorer.score_layer

    def reading(self: ProjectedLOOScorer, layer: Any) -> torch.Tensor:
        scores = score_layer(self, layer)
        scores.sum().item()
        return scores

    monkeypatch.setattr(ProjectedLOOScorer, "score_layer", reading)
    with pytest.raises(AssertionError, match=r"(?s)scoring: 4\n.*4 x item .*lorekv/scorers/base.py"):
        check_constant("lore_kv", "llama", ((2, 2, 2, 40), (4, 2, 2, 40)))


def test_kvzip_reads_once_per_repeat_length() -> None:
    """:data:`KNOWN` ``"kvzip chunks"``: one counted read per distinct repeat-input length, in sampling,
    the same at any n; nothing else grows. The uniform policy keeps the other phases' reads fixed (the
    preset's global one reads per-layer sizes when heads keep different counts, which depends on the
    scores, not on n)."""
    model = tiny_llama()
    uniform = preset("kvzip", BUDGET, chunk_size=16).override({"policy": {"name": "uniform", "budget": BUDGET}})
    pipeline = Pipeline.from_config(uniform)
    ragged = count(pipeline, model, 40)  # chunks of 16, 16, 8: three lengths
    checks = sum(c for (kind, where), c in ragged.places("sampling").items() if where.startswith("lorekv/hf/rollout"))
    assert checks == 3, ragged.report()
    short, long = count(pipeline, model, 48), count(pipeline, model, 96)  # 3 and 6 full chunks: two lengths
    assert short.per_phase() == long.per_phase(), f"{short.report()}\n{long.report()}"
    assert ragged.per_phase()["sampling"] - short.per_phase()["sampling"] == 1


SCALAR_READ = "aten::_local_scalar_dense"
"""The operator every host read of one tensor value goes through, whoever makes it (Python or
C++): ``aten::item``, ``bool``/``int``/``float`` of a tensor and ``is_nonzero`` all end in it,
once per read (counting ``aten::item`` as well would count a Python ``.item()`` twice)."""


def scalar_reads(method: str, layers: int, futures: int = 2, tokens: int = 3) -> int:
    """Host reads of tensor values (:data:`SCALAR_READ` events) in one compression, from torch.profiler.

    The profiler sees the reads :class:`SyncCounter` cannot: those made inside C++ (a ``bool``
    of a tensor inside an operator, ``multinomial``'s probability checks on the CPU).
    """
    pipeline = METHODS[method](futures, tokens)
    model, ids = tiny_llama(layers=layers), random_ids(40, seed=1)
    pipeline.compress(model, ids, tokenizer=CharTokenizer())  # warm-up: first-call caches are not syncs
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pipeline.compress(model, ids, tokenizer=CharTokenizer())
    return sum(event.count for event in prof.key_averages() if event.key == SCALAR_READ)


@pytest.mark.parametrize("method", ["lore_kv", "snapkv"])
def test_scalar_reads_do_not_grow_with_layers(method: str) -> None:
    """A value read per layer (or per layer and future step) is a stall per layer on a device:
    the profiler's count of scalar reads is the same at 2 and at 5 layers."""
    counts = {layers: scalar_reads(method, layers) for layers in (2, 5)}
    assert counts[2] == counts[5], f"{method}: scalar reads per compression by layer count {counts}"


def test_the_scalar_read_count_fails_on_a_read_per_layer_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.item()`` in the query capture (once per layer per future step) is caught."""
    from lorekv.hf.attention import QueryCapture

    record = QueryCapture.record

    def reading(self: QueryCapture, module: torch.nn.Module, query: torch.Tensor, scaling: float) -> None:
        record(self, module, query, float(query.abs().amax().item()) * 0 + scaling)

    monkeypatch.setattr(QueryCapture, "record", reading)
    counts = {layers: scalar_reads("lore_kv", layers) for layers in (2, 5)}
    assert counts[5] - counts[2] == 3 * 3, counts  # 3 more layers, each read at each of T = 3 steps


def generate_reads(model: torch.nn.Module, ids: torch.Tensor, steps: int, cache: Any = None) -> int:
    """Host reads (:data:`SCALAR_READ` events and :class:`SyncCounter`'s sync points) of one greedy
    ``model.generate`` of ``steps`` tokens, on ``cache`` (None: transformers' own)."""
    options = {"max_new_tokens": steps, "do_sample": False, "pad_token_id": 0, "eos_token_id": []}
    mask = torch.ones_like(ids)
    with SyncCounter() as counter, profile(activities=[ProfilerActivity.CPU]) as prof:
        model.generate(ids, attention_mask=mask, **({} if cache is None else {"cache": cache}), **options)
    reads = sum(event.count for event in prof.key_averages() if event.key == SCALAR_READ)
    return reads + len(counter.syncs)


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_generate_on_a_compressed_cache_reads_the_device_no_more_per_step_than_transformers(kind: str) -> None:
    """The decode loop after compression: per step, the same host reads as ``generate`` on
    transformers' own cache (its stopping check), none of lorekv's (the step's positions come from the
    attention mask checked once before the loop); a direct model call still checks its position_ids."""
    model, ids = model_of(kind, 2), random_ids(40, seed=1)
    compressed = Pipeline.from_config(preset("snapkv", BUDGET, window=4)).compress(model, ids)
    ours = {steps: generate_reads(model, ids, steps, compressed.fork()) for steps in (2, 8)}
    theirs = {steps: generate_reads(model, ids, steps) for steps in (2, 8)}
    assert ours[8] - ours[2] == theirs[8] - theirs[2], f"reads by steps: compressed {ours}, transformers' {theirs}"
    state = compressed.fork()
    with pytest.raises(ValueError, match="position_ids"):
        model(ids[:, -1:], cache=state, position_ids=torch.tensor([[ids.shape[1]]]))
