"""The rollout's captures checked against the model's own eager attention, layer by layer.

The reference runs the plain model over prompt + future tokens in one pass with a recording
wrapper around the model's own ``eager_attention_forward``: the queries, keys, values,
scaling and outputs it records are what the model computes, through none of lorekv's code.
Every field of every :class:`LayerCapture` must equal them.
"""

from __future__ import annotations

import pytest
import torch
from recording import reference
from tiny_models import random_ids, tiny_gemma3, tiny_llama

from lorekv.hf import ModelRollout, evictable_layers, prepare
from lorekv.samplers import SAMPLERS
from lorekv.scorers.attention import causal_attention

MODELS = [
    pytest.param(lambda: tiny_llama(11, layers=3), id="llama-gqa"),
    pytest.param(lambda: tiny_gemma3(12, window=64), id="gemma3-hybrid"),
]


def full_attention(model, idx: int) -> bool:
    """Layer ``idx`` attends without a sliding window (its passes record their log-sum-exps)."""
    types = getattr(model.config, "layer_types", None)
    return types is None or types[idx] != "sliding_attention"


def assert_capture_matches(
    layer, ref: dict[str, object], n: int, start: int, future: int, response: bool, lse: bool = False
) -> None:
    """``layer`` (one LayerCapture) against the reference of one sequence, queries from ``start``;
    ``lse``: the pass recorded its log-sum-exps (over the prompt and over the own keys)."""
    t = layer.queries.shape[2]
    exact = {"rtol": 1e-6, "atol": 1e-6}  # eager attention takes its softmax in float32
    torch.testing.assert_close(layer.query_positions, torch.arange(start, start + t))
    torch.testing.assert_close(layer.queries[future], ref["query"][:, start : start + t], **exact)
    torch.testing.assert_close(layer.prompt_keys, ref["key"][:, :n], **exact)
    torch.testing.assert_close(layer.prompt_values, ref["value"][:, :n], **exact)
    if response:
        torch.testing.assert_close(layer.response_keys[future], ref["key"][:, n : n + t], **exact)
        torch.testing.assert_close(layer.response_values[future], ref["value"][:, n : n + t], **exact)
    else:
        assert layer.response_keys.shape[2] == 0 and layer.response_values.shape[2] == 0
    assert layer.scaling == pytest.approx(ref["scaling"], rel=1e-12)
    norms = ref["attention_input"][start : start + t].norm(dim=-1)
    torch.testing.assert_close(layer.query_norms[future], norms, **exact)
    assert layer.o_proj is ref["o_proj"] or torch.equal(layer.o_proj, ref["o_proj"])
    # The attention the scorers recompute from the capture is the model's own (float32 softmax there).
    output = causal_attention(layer).output[future].double()
    torch.testing.assert_close(output, ref["output"][:, start : start + t].double(), rtol=1e-5, atol=1e-5)
    assert (layer.lse is not None) == lse
    if lse:  # the model's logits, every prompt key seen and the own keys causally
        query, key = ref["query"][:, start : start + t].double(), ref["key"].double()
        key = key.repeat_interleave(query.shape[0] // key.shape[0], dim=0)
        logits = (query @ key[:, : n + t].transpose(-1, -2)) * ref["scaling"]
        own = logits[..., n:].masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -torch.inf)
        want = torch.stack([logits[..., :n].logsumexp(-1), own.logsumexp(-1)], dim=-1)
        torch.testing.assert_close(layer.lse[future].double(), want, **exact)


@pytest.mark.parametrize("make", MODELS)
def test_sampled_futures_capture_what_the_model_computes(make) -> None:
    model = make()
    ids = random_ids(17, seed=21)
    n = ids.shape[1]
    layers = evictable_layers(model)
    rollout = ModelRollout(prepare(model), ids, layers, query_norms=True)
    futures = rollout.decode(lambda logits: torch.multinomial(logits.softmax(-1), 1).squeeze(-1), 3, 4)
    assert futures.layer_indices == tuple(layers)
    assert len({tuple(row) for row in futures.token_ids.tolist()}) > 1, "test needs distinct futures"
    for m in range(3):
        refs = reference(model, torch.cat([ids, futures.token_ids[m : m + 1]], dim=1))
        for layer in futures.layers:
            recorded = full_attention(model, layer.layer_idx)
            assert_capture_matches(layer, refs[layer.layer_idx], n, n, m, response=True, lse=recorded)


@pytest.mark.parametrize("make", MODELS)
def test_teacher_forced_futures_capture_what_the_model_computes(make) -> None:
    model = make()
    ids = random_ids(15, seed=22)
    n = ids.shape[1]
    forced = torch.tensor([[3, 9, 27], [5, 1, 40]])
    rollout = ModelRollout(prepare(model), ids, evictable_layers(model), query_norms=True)
    futures = rollout.teacher_force(forced)
    for m in range(2):
        refs = reference(model, torch.cat([ids, forced[m : m + 1]], dim=1))
        for layer in futures.layers:
            recorded = full_attention(model, layer.layer_idx)
            assert_capture_matches(layer, refs[layer.layer_idx], n, n, m, response=True, lse=recorded)


@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("window", [1, 5])
def test_prompt_window_captures_the_last_prompt_queries(make, window: int) -> None:
    """The prefill captures more queries than the window reads (window + 3): the last ones are taken."""
    model = make()
    ids = random_ids(19, seed=23)
    n = ids.shape[1]
    rollout = ModelRollout(prepare(model), ids, evictable_layers(model), prefill_window=window + 3, query_norms=True)
    futures = rollout.prompt_window(window)
    assert futures.token_ids.tolist() == ids[:, n - window :].tolist()
    refs = reference(model, ids)
    for layer in futures.layers:
        assert_capture_matches(layer, refs[layer.layer_idx], n, n - window, 0, response=False)


def test_futures_drafted_from_another_cache_carry_no_normalisers() -> None:
    """A draft (LAQ's stage 1) is a subset of the prompt: its futures' log-sum-exps are over
    it, not over the prompt their scorer sees, so they are not kept; from the full cache they are."""
    from lorekv.scores import Selection

    model = tiny_llama(16, layers=2)
    ids = random_ids(14, seed=28)
    layers = evictable_layers(model)
    rollout = ModelRollout(prepare(model), ids, layers)
    keep = Selection(tuple((torch.arange(0, 14, 2),) * 2 for _ in layers), tuple(layers), 14)
    drafted = rollout.decode(lambda logits: logits.argmax(-1), 2, 3, keep=keep)
    full = rollout.decode(lambda logits: logits.argmax(-1), 2, 3)
    assert all(layer.lse is None for layer in drafted.layers)
    assert all(layer.lse is not None for layer in full.layers)


def test_hidden_state_norms_are_recorded_only_when_asked() -> None:
    """Off by default (a norm per layer and pass that only KVzip+ reads): the captures carry None."""
    model = tiny_llama(15, layers=2)
    ids = random_ids(12, seed=27)
    rollout = ModelRollout(prepare(model), ids, evictable_layers(model), prefill_window=3)
    for futures in (rollout.teacher_force(torch.tensor([[1, 2]])), rollout.prompt_window(3)):
        assert all(layer.query_norms is None for layer in futures.layers)


def test_every_layer_gets_its_own_keys() -> None:
    model = tiny_llama(13, layers=3)
    ids = random_ids(10, seed=24)
    futures = ModelRollout(prepare(model), ids, evictable_layers(model)).teacher_force(torch.tensor([[1, 2]]))
    keys = [layer.prompt_keys for layer in futures.layers]
    assert not torch.allclose(keys[0], keys[1]) and not torch.allclose(keys[1], keys[2])


FUTURE_SAMPLERS = [
    pytest.param({"name": "temperature", "num_futures": 3, "num_tokens": 4, "seed": 5}, id="sampled"),
    pytest.param({"name": "greedy", "num_tokens": 3}, id="greedy"),
    pytest.param({"name": "oracle", "token_ids": [[3, 9, 27], [5, 1, 40]]}, id="oracle"),
]


@pytest.mark.parametrize("make", MODELS)
@pytest.mark.parametrize("spec", FUTURE_SAMPLERS)
def test_last_prompt_query_comes_first(make, spec) -> None:
    """With ``include_last_prompt_query`` the queries are [prompt-window query at n-1] + [the futures' own]."""
    model = make()
    ids = random_ids(16, seed=25)
    n = ids.shape[1]
    on = SAMPLERS.build({**spec, "include_last_prompt_query": True})
    layers = evictable_layers(model)
    rollout = ModelRollout(prepare(model), ids, layers, prefill_window=on.prefill_window, query_norms=True)
    with_last = on.futures(rollout)
    without = SAMPLERS.build(spec).futures(rollout)
    last = rollout.prompt_window(1)
    m, t = without.token_ids.shape
    assert torch.equal(with_last.token_ids, without.token_ids)
    assert torch.equal(with_last.logprobs, without.logprobs)
    for layer, plain, prompt in zip(with_last.layers, without.layers, last.layers, strict=True):
        assert layer.layer_idx == plain.layer_idx == prompt.layer_idx
        assert layer.query_positions.tolist() == [n - 1, *range(n, n + t)]
        expected = torch.cat([prompt.queries.expand(m, -1, -1, -1), plain.queries], dim=2)
        assert torch.equal(layer.queries, expected)
        for name in ("prompt_keys", "prompt_values", "response_keys", "response_values", "o_proj"):
            assert torch.equal(getattr(layer, name), getattr(plain, name)), name
    # The first query is the model's own query at n-1, and it attends to the prompt only.
    for future in range(m):
        refs = reference(model, torch.cat([ids, with_last.token_ids[future : future + 1]], dim=1))
        for layer in with_last.layers:
            assert_capture_matches(layer, refs[layer.layer_idx], n, n - 1, future, response=True)


@pytest.mark.parametrize("make", MODELS)
def test_last_prompt_query_leaves_the_prompt_window_alone(make) -> None:
    model = make()
    ids = random_ids(16, seed=26)
    on = SAMPLERS.build({"name": "prompt_window", "window": 4, "include_last_prompt_query": True})
    rollout = ModelRollout(prepare(model), ids, evictable_layers(model), prefill_window=on.prefill_window)
    with_last, without = on.futures(rollout), rollout.prompt_window(4)
    for layer, plain in zip(with_last.layers, without.layers, strict=True):
        assert layer.query_positions.tolist() == list(range(12, 16))
        assert torch.equal(layer.queries, plain.queries)


@pytest.mark.parametrize("window", [1, 5])
def test_prompt_window_token_stats_are_the_models_own(window: int) -> None:
    """The window's log-probs and entropies are those of the model's own next-token distributions."""
    model = tiny_llama(14, layers=2)
    ids = random_ids(19, seed=25)
    n = ids.shape[1]
    futures = ModelRollout(prepare(model), ids, evictable_layers(model), prefill_window=window).prompt_window(window)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # (n, V): row i predicts token i + 1
    rows = logp[n - window - 1 : n - 1]
    expected_lp = rows.gather(-1, ids[0, n - window :].unsqueeze(-1)).squeeze(-1)
    expected_entropy = -(rows.exp() * rows).sum(-1)
    torch.testing.assert_close(futures.logprobs[0].double(), expected_lp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(futures.entropies[0].double(), expected_entropy, rtol=1e-5, atol=1e-6)


def test_a_wider_stats_window_serves_smaller_windows_and_every_query() -> None:
    """One prefill capturing every query with stats for 6 positions (the grid's shared prefill)
    gives windows 1..6 the stats of their own prefill, and ``"all"`` zero stats, as its own does."""
    model = prepare(tiny_llama(14, layers=2))
    ids = random_ids(19, seed=25)
    layers = evictable_layers(model)
    shared = ModelRollout(model, ids, layers, prefill_window="all", stats_window=6)
    for window in (1, 4, 6):
        own = ModelRollout(model, ids, layers, prefill_window=window).prompt_window(window)
        mine = shared.prompt_window(window)
        assert torch.equal(mine.logprobs, own.logprobs) and torch.equal(mine.entropies, own.entropies)
        assert torch.equal(mine.layers[0].queries, own.layers[0].queries)
    every = shared.prompt_window("all")
    alone = ModelRollout(model, ids, layers, prefill_window="all").prompt_window("all")
    assert torch.equal(every.logprobs, alone.logprobs) and not every.logprobs.any()
    with pytest.raises(ValueError, match="window 7: the prefill kept the logits of the last 7 prompt positions only"):
        shared.prompt_window(7)


def test_transformers_own_prefill_is_timed_and_lorekv_attention_restored() -> None:
    from lorekv.hf import ATTENTION_NAME, reference_prefill_seconds

    model = prepare(tiny_llama(14, layers=2))
    ids = random_ids(19, seed=25)
    before = ModelRollout(model, ids, evictable_layers(model)).last_logits
    assert reference_prefill_seconds(model, ids) > 0
    assert model.config._attn_implementation == ATTENTION_NAME
    assert torch.equal(ModelRollout(model, ids, evictable_layers(model)).last_logits, before)
