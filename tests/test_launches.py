"""Operator launches per compression: on the CPU, the proxy for kernel launches on a device (issue 34).

The first GPU run found compression launch-bound: tens of thousands of small kernels (mm, bmm,
copy_) at 8B and 8K tokens, the device idle half the time. Each PyTorch operator that does work
is a kernel launch there (views and allocations are not), so the number of such operators one
compression calls, counted here with torch.profiler on the CPU, is what a device run pays in
launches. They must be a fixed number per layer (a per-layer cost, no loop over something that
grows), the same at every prompt length (no chunk loop that grows with n), and the same for more
futures (decoded and scored together); only the future steps T add a step's launches each.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from strategies import CaptureDims, make_capture, make_trajectories
from tiny_models import CharTokenizer, random_ids, tiny_gemma3, tiny_llama

import lorekv.scorers.base as scorer_base
from lorekv.cost.measure import kernel_launches
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scorers import SCORERS


def compression_launches(name: str, kind: str, layers: int, n: int, futures: int = 2, tokens: int = 3) -> int:
    options = {"num_futures": futures, "num_tokens": tokens} if name == "lore_kv" else {"window": tokens}
    pipeline = Pipeline.from_config(preset(name, 12, **options))
    if kind == "llama":
        model = tiny_llama(layers=layers, context=2048)
    else:
        model = tiny_gemma3(layer_types=("sliding_attention", "full_attention") * (layers // 2))
    ids = random_ids(n, seed=1)
    pipeline.compress(model, ids, tokenizer=CharTokenizer())  # warm-up: first-call work is not per compression
    return sum(kernel_launches(lambda: pipeline.compress(model, ids, tokenizer=CharTokenizer())).values())


@pytest.mark.parametrize(("name", "kind"), [("lore_kv", "llama"), ("lore_kv", "gemma3"), ("snapkv", "llama")])
def test_launches_are_a_fixed_number_per_layer_at_any_prompt_length(name: str, kind: str) -> None:
    four, six, eight = (compression_launches(name, kind, layers, 40) for layers in (4, 6, 8))
    assert six - four == eight - six > 0, f"launches at 4, 6, 8 layers: {four}, {six}, {eight}: not linear"
    longer = compression_launches(name, kind, 4, 160)
    assert longer == four, f"launches at n = 40 and 160: {four} and {longer}: something loops over n"


def test_more_futures_launch_nothing_more_and_each_future_step_a_step() -> None:
    base = compression_launches("lore_kv", "llama", 2, 40, futures=2, tokens=3)
    assert compression_launches("lore_kv", "llama", 2, 40, futures=6, tokens=3) == base
    per_step = compression_launches("lore_kv", "llama", 2, 40, futures=2, tokens=4) - base
    assert compression_launches("lore_kv", "llama", 2, 40, futures=2, tokens=6) - base == 3 * per_step > 0


@pytest.mark.parametrize("name", ["projected_loo", "loo", "attention_mass"])
def test_a_layer_whose_queries_fit_its_prompt_kv_is_scored_in_one_pass(name: str, monkeypatch) -> None:
    """LORE-KV's few queries per layer hold fewer (query, head, key) elements than the layer's prompt
    keys and values (head size 128, as at 8B): one ``query_scores`` call per layer however small
    SCORE_CHUNK is, so its launches do not grow with n; many more queries are still chunked."""
    dims = CaptureDims(futures=4, kv_heads=2, group=4, queries=9, prompt=300, response=8, head_dim=128, hidden=16)
    layer = make_capture(dims, 0, dtype=torch.float32)
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", 1)
    scorer = SCORERS.build({"name": name})
    calls = []
    original = scorer.query_scores
    monkeypatch.setattr(scorer, "query_scores", lambda part, *terms: calls.append(1) or original(part, *terms))
    scorer.score(make_trajectories((layer,)))
    assert len(calls) == 1
    calls.clear()
    more = {key: getattr(layer, key).repeat(8, 1, 1, 1) for key in ("queries", "response_keys", "response_values")}
    many = replace(layer, **more, query_norms=layer.query_norms.repeat(8, 1))
    scorer.score(make_trajectories((many,)))
    assert len(calls) > 1, "32 futures' queries hold more than the layer's prompt KV: chunked"


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_decode_step_on_a_compressed_cache_launches_what_transformers_step_does(kind: str) -> None:
    """Per ``generate`` step, the compressed cache launches at most one kernel more per layer (the
    position of the slot it appends) and one per step (the rows' next positions) than transformers'
    own cache of the whole prompt: no mask, no position arithmetic beyond that."""
    layers = 4
    hybrid = ("sliding_attention", "full_attention") * (layers // 2)
    model = tiny_llama(layers=layers) if kind == "llama" else tiny_gemma3(layer_types=hybrid)
    ids = random_ids(40, seed=2)
    compressed = Pipeline.from_config(preset("snapkv", 12, window=4)).compress(model, ids)

    def step_launches(cache) -> float:
        def generate(steps: int) -> None:
            options = {} if cache is None else {"cache": cache.fork()}
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False,
                           pad_token_id=0, eos_token_id=[], **options)  # fmt: skip

        return (
            sum(kernel_launches(lambda: generate(7)).values()) - sum(kernel_launches(lambda: generate(1)).values())
        ) / 6

    ours, theirs = step_launches(compressed), step_launches(None)
    assert ours <= theirs + layers + 1, f"launches per decode step: compressed {ours}, transformers' {theirs}"
