"""The presets that need samplers of their own (H2O, KVzip, LAQ) against brute-force references.

As in :mod:`test_presets`: the references read the model's own queries, keys and values
(recorded from its eager attention, :mod:`recording`, or from the masked eager attention
below), recompute attention in float64 with explicit masks, and apply the paper's rule in
reference terms: a capacity C of kept prompt tokens per head, C = B + 1 in query-aware mode
(the re-fed last token on top), C = B query-agnostic. Selection per KV head from the group's
scores; ties to the lower index.
"""

from __future__ import annotations

import math

import pytest
import torch
from recording import reference
from test_presets import GROUP, MODES, as_candidates, attention_rows, kept, top
from tiny_models import CharTokenizer, random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import evictable_layers

N = 60


def group_mean(per_head: torch.Tensor) -> torch.Tensor:
    """(H, n) -> (G, n), the mean over each KV head's query heads."""
    return per_head.view(-1, GROUP, per_head.shape[-1]).mean(dim=1)


# ---------------------------------------------------------------------------------------------
# H2O


@MODES
@pytest.mark.parametrize("budget,recent", [(20, None), (14, 3), (9, 9)])
def test_h2o_equals_the_reference_rule(query_aware: bool, budget: int, recent: int | None) -> None:
    """Accumulated causal attention of ALL n prompt queries (summed), group mean, the last
    ``recent`` prompt tokens + the top C - recent of the tokens before them."""
    model = tiny_llama(111, layers=3)
    ids = random_ids(N, seed=211)
    recs = reference(model, ids)
    r = budget // 2 if recent is None else recent
    capacity = budget + query_aware
    expected = []
    for layer in evictable_layers(model):
        a = attention_rows(recs[layer], range(0, N), N)  # (H, n, n), causal, 0 above the diagonal
        accumulated = group_mean(a.sum(dim=1))  # (G, n), summed over every query
        expected.append([top(s[: N - r], capacity - r) | set(range(N - r, N)) for s in accumulated])
    config = preset("h2o", budget) if recent is None else preset("h2o", budget, recent=recent)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, N, query_aware)


def test_h2o_scores_every_prompt_query_in_chunks(monkeypatch) -> None:
    """The prefill captures all n queries; the scorer sees them QUERY_CHUNK at a time."""
    import lorekv.scorers.base as scorer_base
    from lorekv.scorers.attention_mass import AttentionMassScorer

    monkeypatch.setattr(scorer_base, "QUERY_CHUNK", 16)
    seen: list[int] = []
    original = AttentionMassScorer.query_scores

    def spy(self, layer):
        seen.append(layer.queries.shape[2])
        return original(self, layer)

    monkeypatch.setattr(AttentionMassScorer, "query_scores", spy)
    model = tiny_llama(112, layers=2)
    ids = random_ids(40, seed=212)
    compressed = Pipeline.from_config(preset("h2o", 10)).compress(model, ids)
    assert seen == [16, 16, 8] * 2
    assert compressed.stats.kept == ((10, 10), (10, 10))


def test_h2o_recent_must_fit_the_budget() -> None:
    with pytest.raises(ValueError, match="recent"):
        preset("h2o", 8, recent=9)
    assert preset("h2o", 64).policy.recent == 32
    assert preset("h2o", 64).sampler.window == "all"


# ---------------------------------------------------------------------------------------------
# KVzip

INSTRUCTION = "\n\nRepeat the previous context exactly."
CONTINUATION = "\n\nRepeat the part of the previous context exactly, starting with"


def kvzip_reference(model, ids: torch.Tensor, chunk: int, sink_from_every_chunk: bool) -> list[torch.Tensor]:
    """Per layer (G, n): kvpress's KVzip scores, recomputed from the model's own attention.

    For every chunk [start, end): the repeat input (instruction, or continuation + the last 8
    tokens of the previous chunk; "\\n"; the chunk) is run after the prompt; its queries'
    softmax covers [first min(4, start) keys | the chunk's keys | its own keys, causal]; the
    chunk's keys score the max over queries and over the group's heads. kvpress records only
    the chunk's columns, so the sink keys keep chunk 0's score; lorekv's documented difference
    (``sink_from_every_chunk``) also takes the later chunks' attention to them into the max.
    """
    tok = CharTokenizer()
    n = ids.shape[1]
    layers = evictable_layers(model)
    scores = [torch.zeros(model.config.num_key_value_heads, n, dtype=torch.float64) for _ in layers]
    for i, start in enumerate(range(0, n, chunk)):
        end = min(start + chunk, n)
        if i == 0:
            prompt = torch.tensor(tok.encode(INSTRUCTION, add_special_tokens=False))
        else:
            prompt = torch.cat(
                [torch.tensor(tok.encode(CONTINUATION, add_special_tokens=False)), ids[0, start - 8 : start]]
            )
        repeat = torch.cat([prompt, torch.tensor(tok.encode("\n", add_special_tokens=False)), ids[0, start:end]])
        t = len(repeat)
        recs = reference(model, torch.cat([ids[0], repeat]).view(1, -1))
        sink = min(4, start)
        for li, layer in enumerate(layers):
            rec = recs[layer]
            q = rec["query"][:, n : n + t].double()  # (H, T, d)
            key = rec["key"].double()
            keys = torch.cat([key[:, :sink], key[:, start:end], key[:, n : n + t]], dim=1).repeat_interleave(GROUP, 0)
            logits = (q @ keys.transpose(-1, -2)) * rec["scaling"]  # (H, T, sink + chunk + T)
            own = sink + end - start
            for row in range(t):
                logits[:, row, own + row + 1 :] = -math.inf
            a = torch.softmax(logits, dim=-1).amax(dim=1)  # (H, keys): max over the queries
            per_kv = a.view(-1, GROUP, a.shape[-1]).amax(dim=1)  # max over the group
            scores[li][:, start:end] = per_kv[:, sink:own]
            if sink_from_every_chunk and i > 0:
                scores[li][:, :sink] = torch.maximum(scores[li][:, :sink], per_kv[:, :sink])
    return scores


@MODES
@pytest.mark.parametrize("n,chunk", [(40, 2048), (50, 20)], ids=["one-chunk", "three-chunks"])
def test_kvzip_equals_the_reference_rule(query_aware: bool, n: int, chunk: int) -> None:
    """One chunk: kvpress's rule exactly. Several: the same with the sink keys scored by every chunk."""
    model = tiny_llama(113, layers=2)
    ids = random_ids(n, seed=213)
    budget = 11
    candidates = n - 1 if query_aware else n
    expected = [
        [top(s[:candidates], budget) for s in per_layer]
        for per_layer in kvzip_reference(model, ids, chunk, sink_from_every_chunk=True)
    ]
    config = preset("kvzip", budget, chunk_size=chunk)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware, tokenizer=CharTokenizer())
    assert kept(compressed) == expected
    if chunk < n:  # the difference is real but small: the rule without it keeps nearly the same sets
        strict = kvzip_reference(model, ids, chunk, sink_from_every_chunk=False)
        assert all(
            s[:, 4:].equal(t[:, 4:]) for s, t in zip(strict, kvzip_reference(model, ids, chunk, True), strict=True)
        )


def test_kvzip_needs_a_tokenizer_but_its_config_does_not() -> None:
    config = preset("kvzip", 8)
    assert config.sampler.chunk_size == 2048 and config.scorer.query_reduction == "max"
    model = tiny_llama(114, layers=2)
    with pytest.raises(ValueError, match="tokenizer"):
        Pipeline.from_config(config).compress(model, random_ids(20, seed=214))


def test_kvzip_suffix_comes_from_the_chat_template() -> None:
    from lorekv.samplers import KVzipConfig, KVzipSampler

    class Templated(CharTokenizer):
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
            assert add_generation_prompt and not tokenize
            return "<user>" + messages[0]["content"] + "</user><assistant>"

    assert KVzipSampler(KVzipConfig()).suffix_text(Templated()) == "</user><assistant>"
    assert KVzipSampler(KVzipConfig()).suffix_text(CharTokenizer()) == "\n"
    assert KVzipSampler(KVzipConfig(suffix="!")).suffix_text(Templated()) == "!"
