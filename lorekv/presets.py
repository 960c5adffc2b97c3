"""Published methods as (sampler, scorer, aggregator, policy) configurations.

Each preset is a function of the budget B (kept candidates per KV head on average) returning a
:class:`~lorekv.pipeline.PipelineConfig`; ``PRESETS`` finds them by name. Each docstring cites
its paper and says where lorekv differs from the paper's reference code. They are starting
points for ablations: change one part and keep the rest.

Conventions shared by every preset, and how they map to the reference implementations:

- **Budget.** B counts the kept *candidates* of each KV head. In query-aware mode the prompt's
  last token is not a candidate: it is re-fed through the compressed cache (so the first
  answer token is never computed from the full cache) and is kept on top of B. A preset at
  budget B therefore keeps what the reference keeps at capacity C = B + 1 in query-aware mode,
  and at C = B in query-agnostic mode. ``recent`` counts prompt tokens, the re-fed one
  included, so an observation window of w tokens is the last w prompt tokens in both modes.
- **GQA.** Selection is per KV head (the cache is pruned per KV head), from the mean of the
  scores of its query heads, as kvpress does. The original SnapKV-family code repeats the KV
  heads and selects per query head, which a GQA cache cannot store without copies.
- **Ties** go to the lower token index (and, across heads, the lower head).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from lorekv.pipeline import PipelineConfig


def _with_policy(config: PipelineConfig, **changes: object) -> PipelineConfig:
    """``config`` with its policy's fields updated (same budget and protected tokens)."""
    return config.override({f"policy.{field}": value for field, value in changes.items()})


def _check_window(method: str, budget: int, window: int) -> None:
    if budget <= window:
        raise ValueError(
            f"budget must be > window for {method}: it keeps the last window={window} prompt tokens and scores "
            f"budget - window others; got budget={budget}. Pass a smaller window (e.g. window={max(1, budget // 4)})"
        )


def lore_kv(
    budget: int,
    num_futures: int = 4,
    num_tokens: int = 8,
    temperature: float = 0.7,
    seed: int = 0,
    chunk_size: int = 2048,
) -> PipelineConfig:
    """LORE-KV: M sampled futures of T tokens, projected leave-one-out scores, mean over futures.

    "Monte Carlo Estimation for KV Cache Eviction", https://arxiv.org/abs/2610.07643. As the
    paper: M = 4 futures of T = 8 tokens, projected LOO, a uniform budget, the plain mean over
    futures. Differs: the futures are drawn at temperature 0.7 (the paper: 1). At temperature 1
    the mean is the unbiased Monte Carlo estimate of the expected deletion cost under the
    model's own distribution; at 0.7 it estimates that cost under a sharper one, between the
    model's own and its greedy mode. lorekv's default follows its measurements (SmolLM2-135M,
    docs/benchmarks.md, "The smallest budgets"): chosen at B = 8 on one grid, then on 100
    held-out prompts ahead of temperature 1 at every budget, by +0.06 and +0.05 at B = 8 and 16
    and +0.02 to +0.03 at B = 32 to 128 (each a paired finding), with a narrower spread over
    sampler seeds up to B = 64, at the same cost. ``temperature=1.0`` is the paper's estimator. The
    reliability-weighted ensemble that gives the method its name is the ``reliability``
    aggregator; it reweights the futures and so estimates something else (a biased,
    mode-seeking estimate), which is why it is the variant and not the default.

    A context compressed before its question (``compress(..., query_aware=False)``, the
    ``lorekv-text-generation`` pipeline's default) is compressed with KVzip's parts
    (https://arxiv.org/abs/2505.23416; the ``kvzip`` preset): its futures are one
    reconstruction of the context (the model repeats it, teacher-forced, in chunks of
    ``chunk_size`` tokens), each token scored by the most attention any repeat query gives it
    (max over the group's heads), and one threshold over every layer and KV head keeps
    L * G * B entries in all (``agnostic_sampler``, ``agnostic_scorer``, ``agnostic_policy``).
    This is what won the paired comparisons of issue 35 (SmolLM2-135M, 70 needle samples,
    docs/benchmarks.md, "The query-agnostic default"): 0.28 / 0.38 / 0.71 at B = 32 / 64 / 128
    where the question futures the preset drew before answered 0.23 / 0.23 / 0.24 (+0.10 and
    +0.47 at B = 64 and 128, findings) and LORE-KV's projected leave-one-out on the same
    reconstruction 0.20 / 0.29 / 0.46 (behind at B = 128, a finding), at about 3.1x
    transformers' prefill against 2.0x for the question futures. A sampled question visits one
    detail of the context; the reconstruction visits every token, and attention mass under one
    threshold ranks it best. Not in the paper (query-aware only). It needs the model's
    tokenizer (``tokenizer=``); the repeat instruction is never a candidate.
    ``.override({"agnostic_sampler": None, "agnostic_scorer": None, "agnostic_policy": None})``
    restores continuing the context in both modes; ``lore_kv_agnostic`` draws question futures.
    """
    return PipelineConfig(
        sampler={"name": "temperature", "num_futures": num_futures, "num_tokens": num_tokens,
                 "temperature": temperature, "seed": seed},
        agnostic_sampler={"name": "kvzip", "chunk_size": chunk_size},
        scorer={"name": "projected_loo"},
        agnostic_scorer={"name": "attention_mass", "query_reduction": "max", "head_reduction": "max"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
        agnostic_policy={"name": "global", "budget": budget},
    )  # fmt: skip


def lore_kv_agnostic(
    budget: int,
    num_futures: int = 4,
    question_tokens: int = 16,
    answer_tokens: int = 8,
    queries: Literal["answer", "question", "both"] = "answer",
    seed: int = 0,
) -> PipelineConfig:
    """LORE-KV with question futures in both modes: the model poses and answers a question.

    LORE-KV ("Monte Carlo Estimation for KV Cache Eviction", https://arxiv.org/abs/2610.07643):
    ``lore_kv``'s scorer, aggregator and policy with the ``questions`` sampler: after the
    context, an instruction asks the model for a question about it and its answer; M futures
    each draw a question (T_q tokens) and an answer (T_a tokens), and the answer side's
    queries are scored (``queries``), at temperature 1: the form first measured for a context
    compressed before its question is known (futures that continue a context keep what a
    prompt window keeps). The fed instruction is never a candidate, never kept
    and not counted in the budget; the sampler tokenizes it, so compression needs
    ``tokenizer=``. Differs: not in the paper (which evaluates query-aware use only); measured on
    the benchmarks page ("Query-agnostic: futures that stand for the questions"): on needle
    prompts it keeps what the prompt window does not, but stays below KVzip from B = 64 on
    (0.23 / 0.23 / 0.24 at B = 32 / 64 / 128 against 0.28 / 0.38 / 0.71, both sides scored at
    temperature 0.7), and scoring both sides (``queries="both"``) was no finding over the
    answer side. ``preset("lore_kv", B)`` drew such futures when it compressed a context alone
    until KVzip's parts replaced them there; this preset draws them in both modes.
    """
    return PipelineConfig(
        sampler={"name": "questions", "num_futures": num_futures, "question_tokens": question_tokens,
                 "answer_tokens": answer_tokens, "queries": queries, "seed": seed},
        scorer={"name": "projected_loo"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )  # fmt: skip


def snapkv(budget: int, window: int = 32, pool_kernel: int = 7) -> PipelineConfig:
    """SnapKV: the last w prompt queries' attention, max-pooled; the window itself kept.

    "SnapKV: LLM Knows What You are Looking for Before Generation",
    https://arxiv.org/abs/2404.14469. As the reference code: the w window queries attend
    causally to every prompt key (window keys included in the softmax); their attention is
    averaged over the window (the reference sums: the same ranking) for the tokens before the
    window only, max-pooled (kernel 7, the paper's LongBench setting) over those tokens only;
    the top B - w of them are kept with the w window tokens. Differs: per KV head (see the
    module docstring); budget B > w is required (the reference skips compression instead).
    """
    _check_window("snapkv", budget, window)
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": window},
        scorer={"name": "attention_mass", "pool_kernel": pool_kernel},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": window},
    )


def pyramidkv(
    budget: int,
    window: int = 32,
    pool_kernel: int = 7,
    beta: float = 20.0,
    rounding: Literal["exact", "reference"] = "exact",
) -> PipelineConfig:
    """PyramidKV: SnapKV scoring with a pyramid of per-layer budgets, the window in every layer.

    "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling",
    https://arxiv.org/abs/2406.02069. As the reference (KVCache-Factory): every layer keeps the
    w window tokens plus b_l scored ones, b_l linear from 2(B - w) - b_min in the first layer
    to b_min = (B - w) / beta in the last, b_max clipped to the tokens before the window; a
    prompt shorter than 2(B - w) gets SnapKV in every layer. Differs: ``rounding="exact"``
    (default) rounds the linear schedule by largest remainder so every layer's total is
    exactly L * B, where the reference's floored integer step keeps up to ~L^2/2 tokens more
    (``rounding="reference"`` reproduces it); per KV head.
    """
    _check_window("pyramidkv", budget, window)
    return _with_policy(snapkv(budget, window, pool_kernel), name="per_layer", beta=beta, rounding=rounding)


def ada_kv(budget: int, window: int = 32, pool_kernel: int = 7, alpha: float = 0.2) -> PipelineConfig:
    """Ada-KV (with SnapKV scoring): the heads of a layer share its budget adaptively.

    "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM
    Inference", https://arxiv.org/abs/2407.11550. Every head keeps the w window tokens and its
    top floor(alpha * (B - w)) prefix tokens (the safeguard, alpha = 0.2); the layer's other
    G * (B - w) - G * floor(alpha * (B - w)) slots go to the best remaining (head, token) pairs
    compared on the raw pooled SnapKV scores. Differs: this is the allocation as kvpress writes
    it (guarantee per head, then one layer-wide top-k; total exactly G * B); the original code
    shrinks the layer-wide counts, round(n_h (1 - alpha) + floor(alpha (B - w))), whose total
    can differ from G * B by rounding.
    """
    _check_window("ada_kv", budget, window)
    return _with_policy(snapkv(budget, window, pool_kernel), name="per_head", alpha=alpha, normalize=False)


def tova(budget: int) -> PipelineConfig:
    """TOVA: the attention of the last prompt token, averaged over all heads of the layer.

    "Transformers are Multi-State RNNs", https://arxiv.org/abs/2401.06104. This is the one-shot
    (prefill) form of TOVA, as in kvpress: the last prompt query's attention over the prompt,
    averaged over all query heads of the layer, so every KV head keeps the same B tokens.
    TOVA proper also evicts one token per decoding step; lorekv compresses once. The last
    prompt token is always kept (re-fed in query-aware mode), as kvpress pins it.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "attention_mass", "kv_heads": "shared"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )


def streaming_llm(budget: int, sink: int = 4) -> PipelineConfig:
    """StreamingLLM: the first ``sink`` tokens (attention sinks) and the most recent ones.

    "Efficient Streaming Language Models with Attention Sinks", https://arxiv.org/abs/2309.17453.
    4 sinks, as the paper. Differs: keys keep their original positions (the reference
    re-assigns positions inside the cache; kvpress does not either).
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "recency"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "sink": sink},
    )


def greedy_lookahead(budget: int, num_tokens: int = 8) -> PipelineConfig:
    """One greedy future of T tokens decoded from the full cache, attention mass of its queries.

    lorekv's own variant, the one-future, greedy, attention-mass corner of LORE-KV's design
    space: the cheapest future-aware method. It is *not* LAQ ("Lookahead Q-Cache",
    https://arxiv.org/abs/2505.20334), which decodes its pseudo-queries from a cache already
    compressed by SnapKV and adds the observation window back (see the ``laq`` preset).
    """
    return PipelineConfig(
        sampler={"name": "greedy", "num_tokens": num_tokens},
        scorer={"name": "attention_mass"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )


def knorm(budget: int) -> PipelineConfig:
    """Knorm: keep the keys with the lowest L2 norm, per KV head, whatever the queries.

    "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression",
    https://arxiv.org/abs/2406.11430. As kvpress ``KnormPress``: every layer, every KV head on
    its own, no window and no sinks; the ``key_norm`` scorer reads no attention, so the sampler
    is the cheapest (a one-query prompt window). Differs: the score is -||k|| shifted by the
    layer's largest key norm (non-negative scores, same ranking); KVCache-Factory's
    ``L2NormCluster`` leaves layers 0 and 1 uncompressed, lorekv (like kvpress) compresses every
    layer; in query-aware mode the prompt's last token is kept (re-fed) whatever its norm, where
    the reference keeps it only if its norm is among the C = B + 1 lowest.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "key_norm"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )


def random(budget: int, seed: int = 0) -> PipelineConfig:
    """Random: B tokens per KV head drawn uniformly at random, a different set in every head.

    The random baseline of kvpress (``RandomPress``), the library released with "Expected
    Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution",
    https://arxiv.org/abs/2510.00636; the method has no paper of its own. Scores are iid uniform per
    (layer, KV head, token) from a generator seeded with ``seed`` (the ``random`` scorer), so a
    seed gives the same selection on every run and device. Differs: kvpress reseeds the global
    generator with the same seed for every layer (every layer of equal shape gets the same
    pattern); lorekv draws each layer from its own seed. In query-aware mode the prompt's last
    token is kept (re-fed) on top, where the reference would keep it with probability C / n.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "random", "seed": seed},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )


def critical_kv(
    budget: int, window: int = 32, pool_kernel: int = 7, first_stage_ratio: float = 0.5, epsilon: float = 1e-4
) -> PipelineConfig:
    """CriticalKV on SnapKV: half the budget by attention, the rest by attention x ||W_o v||_1.

    "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective",
    https://arxiv.org/abs/2502.03805, as kvpress ``CriticalKVPress(SnapKVPress())`` (the authors'
    code, upstreamed). Base score: SnapKV as the ``snapkv`` preset (window attention averaged
    over the window, group mean, max-pooled over the tokens before the window; the window
    pinned above every other token). Stage 1 keeps the top b1 = int(C * first_stage_ratio)
    tokens of each KV head by the base score (the window first), C the reference capacity;
    stage 2 fills the other C - b1 by (s + epsilon) * nu, nu the mean over the group's query
    heads of ||W_o^h v_j||_1 (the ``critical_mass`` scorer). b1 is set for C = B + 1, the
    query-aware capacity (the re-fed last token is a window token, so in stage 1).
    Differs: in query-agnostic mode (C = B) stage 1 holds one token more than the reference's
    int(B * first_stage_ratio) when int((B + 1) * r) > int(B * r) (never for an even B at
    r = 1/2); lorekv always keeps the whole window, while the reference, when b1 < window,
    keeps b1 window tokens (an arbitrary b1, all tied) and lets the others compete in stage 2;
    SnapKV conventions as the ``snapkv`` preset (kvpress's SnapKVPress defaults are w = 64 and
    an average pool of width 5 per query head); per KV head.
    """
    _check_window("critical_kv", budget, window)
    if not 0.0 <= first_stage_ratio <= 1.0:
        raise ValueError(f"first_stage_ratio must lie in [0, 1], got {first_stage_ratio!r}")
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": window},
        scorer={"name": "critical_mass", "pool_kernel": pool_kernel,
                "first_stage": int((budget + 1) * first_stage_ratio), "epsilon": epsilon},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": window},
    )  # fmt: skip


def h2o(budget: int, recent: int | None = None) -> PipelineConfig:
    """H2O: heavy hitters by attention summed over all prompt queries, plus a recent window.

    "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models",
    https://arxiv.org/abs/2306.14048. As the reference (H2OKVCache_LayerWise, and
    KVCache-Factory's H2OKVCluster after its causal-mask fix): every prompt query's causal
    attention is accumulated per key (a query that cannot see key j adds 0); the last
    ``recent`` prompt tokens are kept, and the heavy hitters are the top-scored tokens before
    them. lorekv averages over the n queries (the sum divided by n: the same ranking); the n
    queries are scored in chunks of 256, so memory stays O(n * 256) per head. ``recent``
    defaults to B // 2: the paper evaluates equal heavy and recent shares (its lm-eval
    script: 10% + 10%), so the reference at capacity C keeps C - recent heavy hitters.
    Differs: one compression after the prefill (H2O also evicts at every decoding step,
    adding each new query's attention to the accumulated scores); per KV head from the group
    mean (the reference is per head of an MHA model); not kvpress's ObservedAttentionPress,
    whose mean over the queries that see key j (sum / (n - j)) ranks differently.
    """
    recent = budget // 2 if recent is None else recent
    if not 0 <= recent <= budget:
        raise ValueError(f"recent must lie in [0, budget={budget}] for h2o (the rest are heavy hitters), got {recent}")
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": "all"},
        scorer={"name": "attention_mass"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": recent},
    )


def rkv(budget: int, window: int = 8, pool_kernel: int = 7, mix_lambda: float = 0.07) -> PipelineConfig:
    """R-KV: the attention of a recent window less each key's redundancy, B per KV head.

    "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models",
    https://arxiv.org/abs/2505.24133: the ``rkv`` scorer
    (:class:`~lorekv.scorers.redundancy.RedundancyScorer`) over the queries of the last
    ``window`` tokens (8), λ = 0.07, the attention pooled over 7 tokens, the window kept inside
    the budget. Made for compression while generating
    (``DecodingSchedule(preset("rkv", B), buffer=128)``, the reference's buffer); on a prompt
    the window is its last ``window`` tokens. Differs: the reference keeps the window and the
    top B - w of the rest per KV head; lorekv protects the same window with the policy's
    ``recent`` (B counts it too), so the kept sets are the same.
    """
    _check_window("rkv", budget, window)
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": window},
        scorer={"name": "rkv", "pool_kernel": pool_kernel, "mix_lambda": mix_lambda},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": window},
    )


def kvzip(budget: int, chunk_size: int = 2048) -> PipelineConfig:
    """KVzip: the max attention each token gets while the model repeats the context (needs tokenizer=).

    "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
    https://arxiv.org/abs/2505.23416. As kvpress's KVzipPress: the prompt is reconstructed in
    chunks of 2048 tokens, each teacher-forced after "Repeat the previous context exactly."
    (later chunks: "Repeat the part of the previous context exactly, starting with" + the
    previous chunk's last 8 tokens) and the chat template's assistant header; every position
    of a repeat input is a query whose softmax covers the first 4 prompt keys, its own chunk's
    keys and its own earlier keys; score = the max over those queries and over the group's
    query heads. Query-agnostic is KVzip's setting; query-aware mode reconstructs the whole
    prompt (question included) and keeps the re-fed last token on top. Pass the model's
    tokenizer: ``Pipeline.compress(..., tokenizer=tok)``. One threshold over every layer and KV
    head, as kvpress and the original (its global "pair" threshold): the ``global`` policy keeps
    L * G * B entries in all, B per KV head on average (``policy.name=per_head`` with
    ``alpha=0``, ``normalize=False`` is kvpress's ``layerwise=True``; ``uniform``, lorekv 0.2's
    choice, a fixed B per head). Differs: the whole prompt is reconstructed (kvpress skips a chat
    template prefix, whose tokens then score 0); the 4 sink keys, in every later chunk's
    softmax, score the max over every chunk's queries (kvpress keeps chunk 0's); softmax in
    float32 (kvpress: the model dtype); KVzip+'s normalisation is the ``kvzip_plus`` preset.
    """
    return PipelineConfig(
        sampler={"name": "kvzip", "chunk_size": chunk_size},
        scorer={"name": "attention_mass", "query_reduction": "max", "head_reduction": "max"},
        aggregator={"name": "mean"},
        policy={"name": "global", "budget": budget},
    )


def kvzip_plus(budget: int, chunk_size: int = 2048) -> PipelineConfig:
    """KVzip+: KVzip's reconstruction attention, divided by ||h|| and weighted by ||W_o v|| (needs tokenizer=).

    The score KVzap learns to predict (KVzap, https://arxiv.org/abs/2601.07891, and its code in
    kvpress), as kvpress's ``KVzipPress(kvzip_plus_normalization=True)``:
    KVzip's reconstruction (the ``kvzip`` preset: the same chunks, instruction, visibility and
    global threshold), each repeat query's softmax weight on token j divided by ||h||, the norm
    of the query's hidden state entering the attention (after the layer's input norm), and
    multiplied by ||W_o^h v_j||_2, the norm of what token j's value adds to head h's output;
    the max over the queries and the group's heads. Differs from kvpress as the ``kvzip``
    preset does (sink keys scored by every chunk, softmax in float32).
    """
    return kvzip(budget, chunk_size).override({"scorer.name": "kvzip_plus"})


def laq(
    budget: int, num_tokens: int = 8, window: int = 8, draft_window: int = 32, pool_kernel: int = 7
) -> PipelineConfig:
    """LAQ: pseudo-queries decoded from a SnapKV-compressed cache score the full prompt (LAQ++ window 8).

    "Lookahead Q-Cache: Achieving More Consistent KV Eviction via Pseudo Query",
    https://arxiv.org/abs/2505.20334. As the reference (noforit/Lookahead_Q-Cache): SnapKV
    (window 32, max-pool 7) compresses the prompt to the same budget; L = 8 greedy pseudo
    tokens are decoded from that compressed cache, the first being the full prefill's next
    token; the ORIGINAL prompt keys are then scored with the last w2 prompt queries and the
    pseudo-queries (softmax over the prompt keys only), summed over queries (lorekv: the mean,
    same ranking), max-pooled (7) over the tokens before the window, and the top C - w2 are
    kept with the last w2 prompt tokens. ``window`` = w2: 8 is LAQ++ (the default), 0 plain
    LAQ. Differs: always L tokens (the reference stops at EOS, which needs a host sync per
    step); correct causal visibility (the reference's mask over its last w2 + L prompt keys is
    misaligned: it hides from window query i the L keys after it that it may see, and from
    pseudo-query i the last w2 + L - 1 - i prompt keys); per KV head, the draft included.
    """
    _check_window("laq", budget, max(window, draft_window))
    return PipelineConfig(
        sampler={"name": "lookahead", "draft_budget": budget, "num_tokens": num_tokens, "window": window,
                 "draft_window": draft_window, "draft_pool_kernel": pool_kernel},
        scorer={"name": "attention_mass", "pool_kernel": pool_kernel},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": window},
    )  # fmt: skip


def expected_attention(budget: int, horizon: int = 512, sink: int = 4) -> PipelineConfig:
    """Expected Attention: the attention a Gaussian model of the future queries expects, times ||v||.

    "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
    Distribution", https://arxiv.org/abs/2510.00636. As kvpress's ``ExpectedAttentionPress``
    (its defaults): the mean and covariance of the prompt's queries before RoPE (all but the
    first ``sink``), rotated by RoPE averaged over the next ``horizon`` positions; each key's
    score is the softmax over the keys of the expected log-attention s μ'.k + s² kᵀΣ'k / 2,
    averaged over the query heads of its KV head, times ||v||; the ``sink`` first tokens are kept
    (kvpress gives them the largest score; lorekv also protects them in the policy, so they
    count in the budget as there); a uniform B per KV head (kvpress's per-head top-k). Differs:
    the statistics come from the model's own queries (bias and query norm included, where
    kvpress multiplies the layer's input by W_q), the scale is the layer's own; no extra pass:
    the prefill captures every prompt query (the ``prompt_window("all")`` sampler), the scorer
    reduces them to a mean and a covariance per head. Query-agnostic, its statistics are the
    context's; query-aware, the question's queries are among them.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": "all"},
        scorer={"name": "expected_attention", "horizon": horizon, "sink": sink},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "sink": sink},
    )


SMOLLM2 = "smollm2-135m-instruct"
"""The bundled model whose fitted surrogates ship with lorekv (``lorekv/surrogates``)."""


def kvzap(
    budget: int, surrogate: str = f"{SMOLLM2}.kvzip_plus", threshold: float = -4.0, window: int = 128
) -> PipelineConfig:
    """KVzap: a fitted map predicts each token's log KVzip+ score from its hidden state; keep above a threshold.

    Pruned below the threshold outside a recent window, at the cost of the prefill.

    "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", https://arxiv.org/abs/2601.07891
    (kvpress's ``KVzapPress`` inside a ``ThresholdPress``). As the paper: the ``surrogate``
    scorer applies a fitted map to the hidden state entering each layer's attention (after its
    input norm), predicting the log of the ``kvzip_plus`` preset's score per KV head (the
    reconstruction's attention divided by ||h||, times ||W_o v||, max over queries and the
    group's heads); a token is kept where its prediction is >= ``threshold`` (-4, the paper's
    example), and the last ``window`` (128) prompt tokens always (``threshold`` policy). The
    sampler is the cheapest (a one-query prompt window): the score needs no futures. The shipped
    ``surrogate`` is the linear map fitted for the bundled SmolLM2-135M-Instruct by
    ``make surrogates`` (another model: fit one with ``lorekv distill --teacher kvzip_plus``;
    the pipeline refuses a file of another model). Differs: the budget B caps the entries kept
    (L * G * B in all, the highest predictions; KVzap has no cap), so that the cache is bounded
    and runs compare at a stated budget; the map is fitted by lorekv on its own calibration
    texts (KVzap's on Nemotron pretraining samples, with NVIDIA's weights on the hub).
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "surrogate", "file": surrogate},
        aggregator={"name": "mean"},
        policy={"name": "threshold", "budget": budget, "threshold": threshold, "recent": window},
    )


def lore_kv_fast(budget: int, surrogate: str = f"{SMOLLM2}.lore_kv") -> PipelineConfig:
    """LORE-KV at the cost of a prefill: a fitted map predicts the ``lore_kv`` preset's query-agnostic scores.

    The map reads each token's hidden state.

    LORE-KV ("Monte Carlo Estimation for KV Cache Eviction", https://arxiv.org/abs/2610.07643)
    distilled as KVzap (https://arxiv.org/abs/2601.07891) distils KVzip+: ``lorekv distill``
    runs the teacher (``preset("lore_kv", B)`` compressing a context before its question: its
    reconstruction futures scored by attention mass, see ``lore_kv``), fits per layer a map
    from the hidden state entering the attention to the log of the teacher's score per KV head,
    and the ``surrogate`` scorer applies it during the prefill; the teacher's allocation, one
    ``global`` threshold over every layer and KV head keeping L * G * B entries. The shipped
    ``surrogate`` is fitted for the bundled SmolLM2-135M-Instruct (``make surrogates``); for
    another model, ``lorekv distill`` fits one in minutes. The same in both modes (the score
    reads no question). Not in either paper.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "surrogate", "file": surrogate},
        aggregator={"name": "mean"},
        policy={"name": "global", "budget": budget},
    )


PRESETS: dict[str, Callable[..., PipelineConfig]] = {
    "lore_kv": lore_kv,
    "lore_kv_agnostic": lore_kv_agnostic,
    "snapkv": snapkv,
    "pyramidkv": pyramidkv,
    "ada_kv": ada_kv,
    "tova": tova,
    "streaming_llm": streaming_llm,
    "greedy_lookahead": greedy_lookahead,
    "laq": laq,
    "h2o": h2o,
    "critical_kv": critical_kv,
    "kvzip": kvzip,
    "kvzip_plus": kvzip_plus,
    "knorm": knorm,
    "random": random,
    "expected_attention": expected_attention,
    "kvzap": kvzap,
    "lore_kv_fast": lore_kv_fast,
    "rkv": rkv,
}


PAPERS: dict[str, str | None] = {
    "lore_kv": "https://arxiv.org/abs/2610.07643",
    "lore_kv_agnostic": "https://arxiv.org/abs/2610.07643",
    "snapkv": "https://arxiv.org/abs/2404.14469",
    "pyramidkv": "https://arxiv.org/abs/2406.02069",
    "ada_kv": "https://arxiv.org/abs/2407.11550",
    "tova": "https://arxiv.org/abs/2401.06104",
    "streaming_llm": "https://arxiv.org/abs/2309.17453",
    "greedy_lookahead": None,
    "laq": "https://arxiv.org/abs/2505.20334",
    "h2o": "https://arxiv.org/abs/2306.14048",
    "critical_kv": "https://arxiv.org/abs/2502.03805",
    "kvzip": "https://arxiv.org/abs/2505.23416",
    "kvzip_plus": "https://arxiv.org/abs/2601.07891",
    "knorm": "https://arxiv.org/abs/2406.11430",
    "random": None,
    "expected_attention": "https://arxiv.org/abs/2510.00636",
    "kvzap": "https://arxiv.org/abs/2601.07891",
    "lore_kv_fast": "https://arxiv.org/abs/2610.07643",
    "rkv": "https://arxiv.org/abs/2505.24133",
}
"""The paper each preset implements (its docstring cites it), None for lorekv's own variants and baselines."""


def preset(name: str, budget: int, **options: Any) -> PipelineConfig:
    """The preset ``name`` at budget B = ``budget`` kept tokens per KV head on average.

    ``options`` are the preset's own keyword arguments (e.g. ``window=16`` for SnapKV).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name](budget, **options)
