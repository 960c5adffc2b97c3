"""The measurements of ``lorekv bench``, all in one process, as a JSON-ready dict.

Per prompt length n, in this order: each scorer alone on LORE-KV's futures (eager and
compiled; first, so that a kernel's compilation shows in its own first call), transformers'
prefill, lorekv's prefill, SnapKV and LORE-KV compression (with phases), peak memory above the
loaded model, sampling and scoring for every M of the sweep (one prefill per n, the phases
called directly), T batch-1 decode steps of transformers on the full cache, and decoding speed
(transformers' ``generate`` on the full and on the compressed cache, lorekv's conveniences on
both). Then, per n, the batch throughput: LORE-KV compression and decoding of b ragged prompts
at once for every b of ``batch_sizes``. Then the fitted growth exponents and the first-call
overheads. The targets these figures are held to are documentation (docs/performance.md), not code.

Every timing is a warm-up call then ``repeats`` timed calls; the JSON keeps them all.
"""

from __future__ import annotations

import datetime
import functools
import gc
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from lorekv.cost.baselines import decode_steps, generate_from, generate_tokens, prefilled_cache
from lorekv.cost.config import BenchConfig, known_context
from lorekv.cost.measure import Clock, PeakMemory, PerToken, Timed, fit_exponent, per_token, repeat, repeat_seconds
from lorekv.cost.prompts import Prompts, batch_lengths, batch_of, prompts_for
from lorekv.cost.report import THROUGHPUTS
from lorekv.hf import (
    BatchRollout,
    CompressedCache,
    ModelRollout,
    continue_full,
    decode,
    decode_batch,
    max_positions,
    now,
    reference_prefill_seconds,
    using_sdpa,
)
from lorekv.pipeline import Pipeline
from lorekv.runfiles import git_commit, load_average, machine, package_versions
from lorekv.samplers.base import SAMPLERS
from lorekv.scorers.base import SCORERS, Scorer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# A loader returns the model and its tokenizer; None for a model without one (random weights), whose
# prompts are then random token ids (lorekv.cost.prompts.prompts_for).
Loader = Callable[[BenchConfig], "tuple[PreTrainedModel, PreTrainedTokenizerBase | None]"]
Log = Callable[[str], None]


def load_model(config: BenchConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The benchmark's model in its dtype on its device (device-resident weights): a transformers
    directory or hub id is loaded straight onto a GPU, a bundled model or GGUF file is moved there; a
    ``random:<architecture>`` is built there with random weights (shrunk by ``layers`` and ``width``) and
    has no tokenizer."""
    from lorekv.models import BUNDLED, load
    from lorekv.models.architectures import random_model, random_name

    if random_name(config.model) is not None:
        model = random_model(
            config.model, layers=config.layers, width=config.width, dtype=config.torch_dtype,
            device=config.device, seed=config.seed,
        )  # fmt: skip
        return model, None

    direct = config.device != "cpu" and config.model not in BUNDLED and not config.model.endswith(".gguf")
    model, tokenizer = load(config.model, config.torch_dtype, device_map=config.device if direct else None)
    return model.to(config.device), tokenizer


def build_scorer(name: str, compile: bool) -> Scorer:
    """The scorer ``name`` with its defaults; ``compile``: its kernel ``torch.compile``'d."""
    scorer = SCORERS.build({"name": name})
    scorer.compile = compile
    return scorer


def run_bench(
    config: BenchConfig,
    *,
    loader: Loader = load_model,
    clock: Clock | None = None,
    log: Log | None = None,
) -> dict[str, Any]:
    """Run every measurement of ``config``; returns the results (see :mod:`lorekv.cost.report`).

    ``clock``: seconds for the timings (default: :func:`lorekv.hf.now` on the device, which
    synchronises CUDA); ``log``: progress lines.
    """
    say = log or (lambda _: None)
    config.check_context(known_context(config.model))
    previous = torch.get_num_threads()
    torch.set_num_threads(config.resolved_threads)
    try:
        return _run(config, loader, clock, say)
    finally:
        torch.set_num_threads(previous)


def _run(config: BenchConfig, loader: Loader, clock: Clock | None, say: Log) -> dict[str, Any]:
    device = torch.device(config.device)
    clock = clock or functools.partial(now, device)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load_at_start = load_average()
    wall = time.perf_counter()
    say(f"loading {config.model} ({config.resolved_dtype}, {config.device}) ...")
    model, tokenizer = loader(config)
    config.check_context(max_positions(model))
    prompts = prompts_for(model, tokenizer)
    methods = {name: Pipeline.from_config(p.config, compile=config.compile) for name, p in config.pipelines().items()}
    methods["capture"] = Pipeline.from_config(methods["lore_kv"].config)  # eager: compiles nothing untimed
    scorers = {
        name: {"eager": build_scorer(name, False), "compiled": build_scorer(name, True) if config.compile else None}
        for name in config.scorers
    }
    lengths: dict[str, Any] = {}
    for n in config.lengths:
        lengths[str(n)] = measure_length(model, prompts, n, config, methods, scorers, clock, say)
    batch = {str(n): measure_batches(model, prompts, n, config, methods["lore_kv"], clock, say) for n in config.lengths}
    results: dict[str, Any] = {
        "type": "lorekv-bench",
        "version": 1,
        "settings": config.model_dump(mode="json"),
        "device": config.device,
        "dtype": config.resolved_dtype,
        "threads": torch.get_num_threads(),
        "compile": config.compile,
        "weights": weights(config, model),
        "prompts": prompts.kind,
        "machine": machine(),
        "packages": package_versions(),
        "commit": git_commit(),
        "started": started,
        "lengths": lengths,
        "batch": batch,
    }
    results["growth"] = growth(results)
    results["first_call_overhead"] = compile_costs(results)
    results["wall_seconds"] = time.perf_counter() - wall
    results["load_average"] = {"start": load_at_start, "end": load_average()}
    return results


def weights(config: BenchConfig, model: PreTrainedModel) -> dict[str, Any]:
    """What the results say about the model's weights: for a ``random:<architecture>``, that they are
    random, the architecture's source, the shrink settings, and what such a run measures and cannot."""
    from lorekv.models.architectures import architecture, parameter_count, random_name

    if random_name(config.model) is None:
        return {"weights": "pretrained", "parameters": parameter_count(model)}
    described = architecture(config.model).describe(config.layers, config.width)
    return {**described, "parameters": parameter_count(model)}


def measure_length(
    model: PreTrainedModel,
    prompts: Prompts,
    n: int,
    config: BenchConfig,
    methods: dict[str, Pipeline],
    scorers: dict[str, dict[str, Scorer | None]],
    clock: Clock,
    say: Log,
) -> dict[str, Any]:
    """Every measurement at prompt length ``n``, as a dict of raw timings and derived figures."""
    device = torch.device(config.device)
    ids = prompts(n, config.seed).to(device)
    lore, snap = methods["lore_kv"], methods["snapkv"]
    for pipeline in (lore, snap):
        pipeline.check_input(model, ids, query_aware=True, extra=config.decode_tokens)
    r = config.repeats
    out: dict[str, Any] = {"n": int(ids.shape[1])}

    say(f"n={n}: scorers alone on M={config.num_futures} futures")
    alone = _scorers_alone(model, ids, methods["capture"], scorers, r, clock)
    say(f"n={n}: prefill (transformers, lorekv)")
    prefill = {
        "transformers": repeat_seconds(lambda: reference_prefill_seconds(model, ids), r),
        "lorekv": repeat(lambda: lore.prefill(model, ids), r, clock),
    }
    say(f"n={n}: compression (snapkv, lore_kv)")
    compression = {
        "snapkv": repeat(lambda: snap.compress(model, ids), r, clock, phases=_phases),
        "lore_kv": repeat(lambda: lore.compress(model, ids), r, clock, phases=_phases),
    }

    say(f"n={n}: peak memory")
    memory, rollout, compressed = _memory(model, ids, lore, snap, device)
    say(f"n={n}: sampling and scoring for M in {list(config.futures)}")
    sweep = _sweep(rollout, lore, config, clock)
    say(f"n={n}: decoding (transformers steps and generate, lorekv full and compressed)")
    steps, decoding = _decoding(model, ids, rollout, compressed, config, clock)
    rollout = compressed = None
    gc.collect()

    out["prefill"] = {key: t.to_dict() for key, t in prefill.items()}
    out["compression"] = {key: t.to_dict() for key, t in compression.items()}
    out["memory"] = memory
    out["futures"] = {m: {key: t.to_dict() for key, t in parts.items()} for m, parts in sweep.items()}
    out["scorers"] = {
        name: {kind: (None if t is None else t.to_dict()) for kind, t in kinds.items()} for name, kinds in alone.items()
    }
    out["decode_steps"] = {"steps": config.tokens, **steps.to_dict()}
    out["decode"] = {key: t.to_dict() for key, t in decoding.items()}
    out["ratios"] = ratios(out, config)
    return out


def _memory(
    model: PreTrainedModel, ids: torch.Tensor, lore: Pipeline, snap: Pipeline, device: torch.device
) -> tuple[dict[str, Any], ModelRollout, CompressedCache]:
    """Peak bytes above the loaded model of each prefill and compression, the KV bytes before
    and after eviction; also the prefill (rollout) and LORE-KV's compressed cache it made."""
    memory: dict[str, Any] = {}
    with PeakMemory(device) as meter:
        reference_prefill_seconds(model, ids)
    memory["transformers_prefill"] = meter.peak
    with PeakMemory(device) as meter:
        batch = lore.prefill(model, ids)
    memory["prefill"] = meter.peak
    memory["after_prefill"] = phase_memory(batch, lore, device)
    with PeakMemory(device) as meter:
        snap.compress(model, ids)
    memory["snapkv"] = meter.peak
    with PeakMemory(device) as meter:
        compressed = lore.compress(model, ids)
    memory["lore_kv"] = meter.peak
    memory["kv_bytes_before"] = compressed.stats.bytes_before
    memory["kv_bytes_after"] = compressed.stats.bytes_after
    memory["kv_bytes_kept"] = compressed.stats.bytes_kept
    memory["lore_kv_over_prefill_per_kv"] = (memory["lore_kv"] - memory["prefill"]) / memory["kv_bytes_before"]
    memory["after_prefill_per_kv"] = memory["after_prefill"]["peak"] / memory["kv_bytes_before"]
    return memory, batch.rows[0], compressed


def phase_memory(batch: BatchRollout, lore: Pipeline, device: torch.device) -> dict[str, int]:
    """LORE-KV's phases after the prefill, each measured on its own: the peak bytes it allocates
    above what was live when it started, and the bytes it leaves live for the next phase (the
    futures' KV and queries; the scores). ``peak`` is the most the phases hold at once above the
    prefilled cache: what compression adds to a prefill at the same length."""
    with PeakMemory(device) as sampling:
        futures = lore.sampler.futures_batch(batch)
    with PeakMemory(device) as scoring:
        scored = [lore.score(t, row.candidates) for t, row in zip(futures, batch.rows, strict=True)]
    with PeakMemory(device) as selection:
        lore.select_rows(batch.rows, scored)
    held = sampling.retained + scoring.retained
    return {
        "sampling": sampling.peak,
        "sampling_retained": sampling.retained,
        "scoring": scoring.peak,
        "scoring_retained": scoring.retained,
        "selection": selection.peak,
        "peak": max(sampling.peak, sampling.retained + scoring.peak, held + selection.peak),
    }


def _scorers_alone(
    model: PreTrainedModel,
    ids: torch.Tensor,
    capture: Pipeline,
    scorers: dict[str, dict[str, Scorer | None]],
    repeats: int,
    clock: Clock,
) -> dict[str, dict[str, Timed | None]]:
    """Each scorer, eager and compiled, on the same futures: LORE-KV's (M = ``num_futures``),
    drawn untimed by the eager ``capture`` pipeline. Timed first thing at every length, so that
    each compiled kernel's compilation lands in its own first call (at the first length)."""
    futures = capture.sampler.futures(capture.prefill(model, ids).rows[0])
    return {
        name: {
            kind: (None if s is None else repeat(lambda s=s: s.score(futures), repeats, clock))
            for kind, s in kinds.items()
        }
        for name, kinds in scorers.items()
    }


def _sweep(rollout: ModelRollout, lore: Pipeline, config: BenchConfig, clock: Clock) -> dict[str, dict[str, Timed]]:
    """Sampling and scoring (LORE-KV's scorer and aggregator) from one prefill for every M of the sweep."""
    sweep: dict[str, dict[str, Timed]] = {}
    for m in config.futures:
        sampler = SAMPLERS.build(lore.config.override({"sampler.num_futures": m}).sampler)
        sampling = repeat(lambda s=sampler: s.futures(rollout), config.repeats, clock)
        futures = sampler.futures(rollout)
        scoring = repeat(lambda f=futures: lore.score(f, rollout.candidates), config.repeats, clock)
        sweep[str(m)] = {"sampling": sampling, "scoring": scoring}
    return sweep


def _decoding(
    model: PreTrainedModel,
    ids: torch.Tensor,
    rollout: ModelRollout,
    compressed: CompressedCache,
    config: BenchConfig,
    clock: Clock,
) -> tuple[Timed, dict[str, PerToken]]:
    """T batch-1 decode steps of transformers on the full cache; per-token decoding time of
    transformers' ``generate`` on its own full cache (SDPA) and on a fork of the compressed
    cache (the same call, ``cache=compressed.fork()``), and of lorekv's conveniences (``decode``
    and ``continue_full``, which add the first logits and the stats) on the full and the
    compressed cache. Every path starts from a cache of the first n - 1 tokens and feeds the
    last one (which cancels in the per-token difference)."""
    n, k, r = ids.shape[1], config.decode_tokens, config.repeats
    last = ids[:, -1:]
    with using_sdpa(model):
        cache = prefilled_cache(model, ids[:, :-1])
        steps = repeat(lambda: decode_steps(model, cache, last, config.tokens), r, clock)
        generate = per_token(lambda t: generate_from(model, ids, cache, t), k, r, clock)
    compressed_generate = per_token(lambda t: generate_tokens(model, ids, compressed.fork(), t), k, r, clock)
    full = per_token(lambda t: continue_full(model, rollout.head_cache, last, n - 1, t), k, r, clock)
    after = per_token(lambda t: decode(model, compressed, None, t), k, r, clock)
    return steps, {
        "generate": generate,
        "generate_compressed": compressed_generate,
        "lorekv_full": full,
        "lorekv_compressed": after,
    }


def measure_batches(
    model: PreTrainedModel,
    prompts: Prompts,
    n: int,
    config: BenchConfig,
    lore: Pipeline,
    clock: Clock,
    say: Log,
) -> dict[str, Any]:
    """Batch throughput at length ``n``: for every b of ``batch_sizes``, one timed call is LORE-KV's
    compression of a left-padded batch of b prompts (:func:`~lorekv.cost.prompts.batch_of`:
    rows of n, 15n/16, ... tokens, each its own prompt and seed) followed by decoding K =
    ``decode_tokens`` tokens for every row in one ``model.generate`` call on a fork of the
    compressed cache (:func:`~lorekv.hf.decode_batch`, no end-of-sequence stop), with the
    compression's and the decoding's seconds kept apart as phases. Returns, per b, the timing
    and its throughputs (see :func:`throughput`) and their ratios to b = 1."""
    say(f"n={n}: batch throughput for b in {list(config.batch_sizes)}")
    device = torch.device(config.device)
    k = config.decode_tokens
    out: dict[str, Any] = {}
    for b in config.batch_sizes:
        ids, mask = batch_of(prompts, n, b, config.seed)
        ids, mask = ids.to(device), mask.to(device)
        lore.check_input(model, ids, attention_mask=mask, query_aware=True, extra=k)

        def answer(ids: torch.Tensor = ids, mask: torch.Tensor = mask) -> dict[str, float]:
            start = clock()
            compressed = lore.compress(model, ids, attention_mask=mask)
            middle = clock()
            decode_batch(model, compressed, None, None, k)
            return {"compression": middle - start, "decoding": clock() - middle}

        timed = repeat(answer, config.repeats, clock, phases=lambda parts: parts)
        out[str(b)] = {"b": b, "prompt_lengths": list(batch_lengths(n, b)), **timed.to_dict()}
        out[str(b)].update(throughput(out[str(b)], k))
    reference = out["1"]
    for entry in out.values():
        entry["over_b1"] = {key: _ratio(entry[key], reference[key]) for key in THROUGHPUTS}
    return out


def throughput(entry: dict[str, Any], decode_tokens: int) -> dict[str, float | None]:
    """The throughputs of one batch timing (medians over the timed runs):

    - ``prompts_per_second``: b / the median seconds of compression plus decoding;
    - ``prompt_tokens_per_second``: the batch's real prompt tokens (padding left out) / the
      median seconds of the compression alone;
    - ``generated_tokens_per_second``: b * K / the median seconds of the decoding alone (K =
      ``decode_tokens`` per row, the first one included).
    """
    b, medians = entry["b"], entry["phase_medians"]

    def per(amount: float, seconds: float | None) -> float | None:
        return None if seconds is None or seconds <= 0 else amount / seconds

    return {
        "prompts_per_second": per(b, entry["median"]),
        "prompt_tokens_per_second": per(sum(entry["prompt_lengths"]), medians.get("compression")),
        "generated_tokens_per_second": per(b * decode_tokens, medians.get("decoding")),
    }


def _phases(compressed: Any) -> dict[str, float]:
    return dict(compressed.stats.seconds)


def _median(entry: dict[str, Any] | None) -> float | None:
    return None if entry is None else entry["median"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def ratios(length: dict[str, Any], config: BenchConfig) -> dict[str, float | None]:
    """The ratios of one length's medians that the performance page discusses."""
    tf = length["prefill"]["transformers"]["median"]
    lore = length["compression"]["lore_kv"]
    scorers = length["scorers"]
    out = {
        "lore_kv_over_transformers_prefill": _ratio(lore["median"], tf),
        "lore_kv_over_snapkv": _ratio(lore["median"], length["compression"]["snapkv"]["median"]),
        "lorekv_prefill_over_transformers_prefill": _ratio(length["prefill"]["lorekv"]["median"], tf),
        "sampling_over_decode_steps": _ratio(lore["phase_medians"].get("sampling"), length["decode_steps"]["median"]),
        "lorekv_decode_over_generate": _ratio(
            length["decode"]["lorekv_full"]["median_per_token"], length["decode"]["generate"]["median_per_token"]
        ),
        "compressed_generate_over_generate": _ratio(
            length["decode"]["generate_compressed"]["median_per_token"],
            length["decode"]["generate"]["median_per_token"],
        ),
        "compressed_decode_over_generate": _ratio(
            length["decode"]["lorekv_compressed"]["median_per_token"], length["decode"]["generate"]["median_per_token"]
        ),
    }
    if "projected_loo" in scorers and "attention_mass" in scorers:
        for kind in ("eager", "compiled"):
            out[f"projected_loo_over_attention_mass_{kind}"] = _ratio(
                _median(scorers["projected_loo"][kind]), _median(scorers["attention_mass"][kind])
            )
    return out


def growth(results: dict[str, Any]) -> dict[str, Any]:
    """Fitted exponents k of time ~ c * size^k: across n (each phase; the sweep at each M) and
    across M (the sweep at each n)."""
    lengths = list(results["lengths"].values())
    ns = [length["n"] for length in lengths]

    def across_n(get: Callable[[dict[str, Any]], float | None]) -> float | None:
        points = [(n, get(length)) for n, length in zip(ns, lengths, strict=True)]
        points = [(n, t) for n, t in points if t is not None]
        return fit_exponent([p[0] for p in points], [p[1] for p in points]) if points else None

    def phase(name: str) -> Callable[[dict[str, Any]], float | None]:
        return lambda length: length["compression"]["lore_kv"]["phase_medians"].get(name)

    by_n: dict[str, float | None] = {
        "transformers prefill": across_n(lambda length: length["prefill"]["transformers"]["median"]),
        "lorekv prefill": across_n(lambda length: length["prefill"]["lorekv"]["median"]),
        "lore_kv compression": across_n(lambda length: length["compression"]["lore_kv"]["median"]),
        "snapkv compression": across_n(lambda length: length["compression"]["snapkv"]["median"]),
        **{f"lore_kv {name}": across_n(phase(name)) for name in ("prefill", "sampling", "scoring", "selection")},
    }
    futures = list(lengths[0]["futures"]) if lengths else []
    for m in futures:
        for part in ("sampling", "scoring"):
            by_n[f"{part} M={m}"] = across_n(lambda length, m=m, part=part: length["futures"][m][part]["median"])
    by_m: dict[str, dict[str, float | None]] = {}
    for n, length in zip(ns, lengths, strict=True):
        ms = [int(m) for m in length["futures"]]
        by_m[str(n)] = {
            part: fit_exponent(ms, [length["futures"][str(m)][part]["median"] for m in ms])
            for part in ("sampling", "scoring")
        }
    return {"n": by_n, "M": by_m}


def compile_costs(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """First call minus the median of the later calls, per length in the order measured: at the
    first length the compilation (and any first-call cost), at later ones what a new shape costs
    (with dynamic shapes, no second compilation). Eager scorers are listed for comparison."""
    out: dict[str, dict[str, float]] = {}
    for key, length in results["lengths"].items():
        entries = {f"{name} compression": t for name, t in length["compression"].items()}
        for name, kinds in length["scorers"].items():
            entries.update({f"{name} ({kind})": t for kind, t in kinds.items() if t is not None})
        for label, t in entries.items():
            out.setdefault(label, {})[key] = t["first"] - t["median"]
    return out
