"""Published methods as (sampler, scorer, aggregator, policy) configurations.

Each preset is a function of the budget B (kept tokens per KV head on average) returning a
:class:`~lorekv.pipeline.PipelineConfig`; ``PRESETS`` finds them by name. They are starting
points for ablations: change one part and keep the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from lorekv.pipeline import PipelineConfig


def _with_policy(config: PipelineConfig, **changes: object) -> PipelineConfig:
    """``config`` with its policy's fields updated (same budget and protected tokens)."""
    return config.override({f"policy.{field}": value for field, value in changes.items()})


def lore_kv(
    budget: int, num_futures: int = 4, num_tokens: int = 8, temperature: float = 1.0, seed: int = 0
) -> PipelineConfig:
    """LORE-KV: M sampled futures of T tokens, projected leave-one-out scores, mean over futures.

    "Monte Carlo Estimation for KV Cache Eviction", https://arxiv.org/abs/2610.07643.
    """
    return PipelineConfig(
        sampler={"name": "temperature", "num_futures": num_futures, "num_tokens": num_tokens,
                 "temperature": temperature, "seed": seed},
        scorer={"name": "projected_loo"},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget},
    )  # fmt: skip


def snapkv(budget: int, window: int = 32, pool_kernel: int = 7) -> PipelineConfig:
    """SnapKV: the last ``window`` prompt queries' attention, pooled; the window itself kept.

    "SnapKV: LLM Knows What You are Looking for Before Generation", https://arxiv.org/abs/2404.14469.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": window},
        scorer={"name": "attention_mass", "pool_kernel": pool_kernel},
        aggregator={"name": "mean"},
        policy={"name": "uniform", "budget": budget, "recent": min(window, budget)},
    )


def pyramidkv(budget: int, window: int = 32, pool_kernel: int = 7) -> PipelineConfig:
    """PyramidKV: SnapKV scoring with a pyramid of per-layer budgets.

    "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling",
    https://arxiv.org/abs/2406.02069.

    The window is not protected: the top layers' budgets (down to B / beta) are smaller than
    any useful window, and the window's own tokens score high under its queries anyway.
    """
    return _with_policy(snapkv(budget, window, pool_kernel), name="per_layer", schedule="pyramid", recent=0)


def ada_kv(budget: int, window: int = 32, pool_kernel: int = 7) -> PipelineConfig:
    """Ada-KV (with SnapKV scoring): heads of a layer share the layer's budget adaptively.

    "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM
    Inference", https://arxiv.org/abs/2407.11550.
    """
    return _with_policy(snapkv(budget, window, pool_kernel), name="per_head")


def tova(budget: int) -> PipelineConfig:
    """TOVA: the attention of the last prompt token alone.

    "Transformers are Multi-State RNNs", https://arxiv.org/abs/2401.06104.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "attention_mass"},
        policy={"name": "uniform", "budget": budget},
    )


def streaming_llm(budget: int, sink: int = 4) -> PipelineConfig:
    """StreamingLLM: attention sinks and the most recent tokens, nothing scored.

    "Efficient Streaming Language Models with Attention Sinks", https://arxiv.org/abs/2309.17453.
    """
    return PipelineConfig(
        sampler={"name": "prompt_window", "window": 1},
        scorer={"name": "attention_mass"},
        policy={"name": "uniform", "budget": budget, "sink": min(sink, budget), "recent": budget - min(sink, budget)},
    )


def lookahead(budget: int, num_tokens: int = 8) -> PipelineConfig:
    """Lookahead-style (LAQ): one greedy future, attention mass of its queries.

    After "Lookahead Q-Cache: Achieving More Consistent KV Eviction via Pseudo Query",
    https://arxiv.org/abs/2505.20334.
    """
    return PipelineConfig(
        sampler={"name": "greedy", "num_tokens": num_tokens},
        scorer={"name": "attention_mass"},
        policy={"name": "uniform", "budget": budget},
    )


PRESETS: dict[str, Callable[..., PipelineConfig]] = {
    "lore_kv": lore_kv,
    "snapkv": snapkv,
    "pyramidkv": pyramidkv,
    "ada_kv": ada_kv,
    "tova": tova,
    "streaming_llm": streaming_llm,
    "lookahead": lookahead,
}


def preset(name: str, budget: int) -> PipelineConfig:
    """The preset ``name`` at budget B = ``budget`` kept tokens per KV head on average."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name](budget)
