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
import torch.nn.functional as F
from recording import attention_function, reference
from test_presets import GROUP, MODES, as_candidates, attention_rows, kept, snapkv_scores, top
from tiny_models import CharTokenizer, random_ids, tiny_llama

from lorekv import Pipeline, preset
from lorekv.hf import ModelRollout, evictable_layers, prepare

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
    """The prefill captures all n queries; the scorer sees them 16 at a time (a SCORE_CHUNK of
    16 queries' rows: 16 * H * n elements)."""
    import lorekv.scorers.base as scorer_base
    from lorekv.scorers.attention_mass import AttentionMassScorer

    seen: list[int] = []
    original = AttentionMassScorer.query_scores

    def spy(self, layer):
        seen.append(layer.queries.shape[2])
        return original(self, layer)

    monkeypatch.setattr(AttentionMassScorer, "query_scores", spy)
    model = tiny_llama(112, layers=2)
    ids = random_ids(40, seed=212)
    monkeypatch.setattr(scorer_base, "SCORE_CHUNK", 16 * model.config.num_attention_heads * 40)  # n = 40 keys
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


def kvzip_repeats(ids: torch.Tensor, chunk: int, replay: int | None = None) -> list[tuple[int, int, torch.Tensor]]:
    """(start, end, repeat input) per chunk [start, end) of ``ids`` (1, n): the instruction, or the
    continuation + the last 8 tokens of the previous chunk; "\\n"; the chunk, or its first
    ``replay`` tokens."""
    tok = CharTokenizer()
    n = ids.shape[1]
    out = []
    for i, start in enumerate(range(0, n, chunk)):
        end = min(start + chunk, n)
        if i == 0:
            prompt = torch.tensor(tok.encode(INSTRUCTION, add_special_tokens=False))
        else:
            prompt = torch.cat(
                [torch.tensor(tok.encode(CONTINUATION, add_special_tokens=False)), ids[0, start - 8 : start]]
            )
        replayed = ids[0, start : end if replay is None else min(start + replay, end)]
        out.append(
            (start, end, torch.cat([prompt, torch.tensor(tok.encode("\n", add_special_tokens=False)), replayed]))
        )
    return out


def kvzip_reference(
    model, ids: torch.Tensor, chunk: int, sink_from_every_chunk: bool, replay: int | None = None, plus: bool = False
) -> list[torch.Tensor]:
    """Per layer (G, n): kvpress's KVzip scores, recomputed from the model's own attention.

    For every chunk [start, end): the repeat input (:func:`kvzip_repeats`) is run after the
    prompt; its queries' softmax covers [first min(4, start) keys | the chunk's keys | its own keys, causal]; the
    chunk's keys score the max over queries and over the group's heads. kvpress records only
    the chunk's columns, so the sink keys keep chunk 0's score; lorekv's documented difference
    (``sink_from_every_chunk``) also takes the later chunks' attention to them into the max.
    ``replay``: only the chunk's first ``replay`` tokens are repeated (lorekv's ``strided_kvzip``),
    their queries' softmax still over the whole chunk. ``plus``: KVzip+ (kvpress's
    ``kvzip_plus_normalization``): each weight divided by the norm of its query's hidden state
    entering the attention and multiplied by ||W_o^h v|| of its key's value, before the max.
    """
    n = ids.shape[1]
    layers = evictable_layers(model)
    scores = [torch.zeros(model.config.num_key_value_heads, n, dtype=torch.float64) for _ in layers]
    for i, (start, end, repeat) in enumerate(kvzip_repeats(ids, chunk, replay)):
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
            a = torch.softmax(logits, dim=-1)  # (H, T, keys)
            if plus:
                h_norm = rec["attention_input"][n : n + t].double().norm(dim=-1)  # (T,)
                value = rec["value"].double()
                values = torch.cat([value[:, :sink], value[:, start:end], value[:, n : n + t]], dim=1)
                w_o = rec["o_proj"].detach().double().view(-1, len(values) * GROUP, values.shape[-1])  # (D, H, d)
                wov = torch.einsum("Dhd,hkd->hkD", w_o, values.repeat_interleave(GROUP, 0)).norm(dim=-1)
                a = a / h_norm[None, :, None] * wov[:, None, :]
            a = a.amax(dim=1)  # (H, keys): max over the queries
            per_kv = a.view(-1, GROUP, a.shape[-1]).amax(dim=1)  # max over the group
            scores[li][:, start:end] = per_kv[:, sink:own]
            if sink_from_every_chunk and i > 0:
                scores[li][:, :sink] = torch.maximum(scores[li][:, :sink], per_kv[:, :sink])
    return scores


def global_top(per_layer: list[torch.Tensor], candidates: int, budget: int) -> list[list[set[int]]]:
    """KVzip's allocation: the L * G * budget best (layer, head, token) triples over every layer and KV
    head at once (ties: lower layer, head, token), as per-head sets."""
    triples = [
        (-float(s[h, j]), layer, h, j) for layer, s in enumerate(per_layer) for h in range(s.shape[0])
        for j in range(candidates)
    ]  # fmt: skip
    chosen = sorted(triples)[: len(per_layer) * per_layer[0].shape[0] * budget]
    sets = [[set() for _ in range(s.shape[0])] for s in per_layer]
    for _, layer, h, j in chosen:
        sets[layer][h].add(j)
    return sets


@MODES
@pytest.mark.parametrize("n,chunk", [(40, 2048), (50, 20)], ids=["one-chunk", "three-chunks"])
def test_kvzip_equals_the_reference_rule(query_aware: bool, n: int, chunk: int) -> None:
    """One chunk: kvpress's rule exactly (its scores, one threshold across every layer and head).
    Several: the same with the sink keys scored by every chunk."""
    model = tiny_llama(113, layers=2)
    ids = random_ids(n, seed=213)
    budget = 11
    candidates = n - 1 if query_aware else n
    expected = global_top(kvzip_reference(model, ids, chunk, sink_from_every_chunk=True), candidates, budget)
    config = preset("kvzip", budget, chunk_size=chunk)
    compressed = Pipeline.from_config(config).compress(model, ids, query_aware=query_aware, tokenizer=CharTokenizer())
    assert kept(compressed) == expected
    if chunk < n:  # the difference is real but small: the rule without it keeps nearly the same sets
        strict = kvzip_reference(model, ids, chunk, sink_from_every_chunk=False)
        assert all(
            s[:, 4:].equal(t[:, 4:]) for s, t in zip(strict, kvzip_reference(model, ids, chunk, True), strict=True)
        )


@pytest.mark.parametrize("n,chunk", [(40, 2048), (50, 20)], ids=["one-chunk", "three-chunks"])
def test_kvzip_plus_equals_the_reference_rule(n: int, chunk: int) -> None:
    """KVzip+: the reconstruction's weights over ||h|| of the query's attention input times
    ||W_o^h v|| of the key, recomputed from the model's own hidden states, values and W_o; the
    scores differ from KVzip's, the kept sets follow them."""
    model = tiny_llama(115, layers=2)
    ids = random_ids(n, seed=215)
    budget = 9
    plus = kvzip_reference(model, ids, chunk, sink_from_every_chunk=True, plus=True)
    plain = kvzip_reference(model, ids, chunk, sink_from_every_chunk=True)
    assert not any(torch.allclose(p / p.max(), q / q.max(), rtol=0.05) for p, q in zip(plus, plain, strict=True))
    pipeline = Pipeline.from_config(preset("kvzip_plus", budget, chunk_size=chunk))
    prepare(model)
    rollout = ModelRollout(model, ids, evictable_layers(model), 0, tokenizer=CharTokenizer(), query_norms=True)
    got = pipeline.scorer.score(pipeline.sampler.futures(rollout))[0]  # (L, G, n)
    for layer, want in zip(got, plus, strict=True):
        torch.testing.assert_close(layer.double(), want, rtol=1e-4, atol=1e-7)
    compressed = pipeline.compress(model, ids, query_aware=False, tokenizer=CharTokenizer())
    assert kept(compressed) == global_top(plus, n, budget)


def test_kvzip_plus_refuses_a_capture_without_hidden_state_norms() -> None:
    """A rollout built by hand without ``query_norms=True`` records none; the scorer says what to do."""
    model = tiny_llama(116, layers=1)
    ids = random_ids(30, seed=216)
    pipeline = Pipeline.from_config(preset("kvzip_plus", 6))
    prepare(model)
    futures = pipeline.sampler.futures(ModelRollout(model, ids, evictable_layers(model), 0, tokenizer=CharTokenizer()))
    assert all(layer.query_norms is None for layer in futures.layers)
    with pytest.raises(ValueError, match="kvzip_plus.*query_norms.*query_norms=True"):
        pipeline.scorer.score(futures)


@pytest.mark.parametrize("n,chunk,replay", [(50, 20, 6), (45, 16, 1), (50, 20, 20)])
def test_strided_kvzip_equals_the_reference_rule_with_part_of_each_chunk_replayed(
    n: int, chunk: int, replay: int
) -> None:
    """Each chunk's first ``replay`` tokens repeated, every chunk's keys scored by its replay's
    queries (none left at 0, unlike ``partial_kvzip``); replay = chunk is KVzip's rule."""
    model = tiny_llama(114, layers=2)
    ids = random_ids(n, seed=214)
    budget = 9
    scores = kvzip_reference(model, ids, chunk, sink_from_every_chunk=True, replay=replay)
    assert all(bool((s > 0).all()) for s in scores)
    sampler = {"name": "strided_kvzip", "chunk_size": chunk, "replay": replay}
    pipeline = Pipeline.from_config(preset("kvzip", budget).override({"sampler": sampler}))
    prepare(model)
    rollout = ModelRollout(model, ids, evictable_layers(model), 0, tokenizer=CharTokenizer())
    futures = pipeline.sampler.futures(rollout)
    assert futures.token_ids[0].tolist() == torch.cat([r for _, _, r in kvzip_repeats(ids, chunk, replay)]).tolist()
    got = pipeline.scorer.score(futures)[0]  # (L, G, n)
    for layer, want in zip(got, scores, strict=True):
        torch.testing.assert_close(layer.double(), want, rtol=1e-4, atol=1e-6)
    compressed = pipeline.compress(model, ids, query_aware=False, tokenizer=CharTokenizer())
    assert kept(compressed) == global_top(scores, n, budget)


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


# ---------------------------------------------------------------------------------------------
# LAQ

MASKED = "lorekv_test_masked"


def masked_run(model, seq: torch.Tensor, n: int, keep: list[list[set[int]]]) -> tuple[torch.Tensor, dict]:
    """Logits (S, V) and per-layer queries of ``seq`` run causally, except that the tokens at
    positions >= n see only the prompt keys in ``keep[layer][g]``: decoding from a compressed
    cache, emulated with the model's own projections and an explicit float64 per-head mask."""
    layers = evictable_layers(model)
    queries: dict[int, torch.Tensor] = {}

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        layer = module.layer_idx
        q, k, v = query[0].double(), key[0].double(), value[0].double()
        k, v = k.repeat_interleave(GROUP, 0), v.repeat_interleave(GROUP, 0)
        s = q.shape[1]
        allowed = torch.ones(q.shape[0], s, s, dtype=torch.bool).tril()
        for h in range(q.shape[0]):
            hidden = [j for j in range(n) if j not in keep[layers.index(layer)][h // GROUP]]
            allowed[h, n:, hidden] = False
        logits = ((q @ k.transpose(-1, -2)) * scaling).masked_fill(~allowed, -math.inf)
        queries[layer] = query[0]
        out = torch.softmax(logits, dim=-1) @ v  # (H, S, d)
        return out.transpose(0, 1).unsqueeze(0).to(query.dtype), None

    with attention_function(model, MASKED, attention):
        logits = model(seq, use_cache=False).logits[0]
    return logits, queries


def laq_reference(model, ids: torch.Tensor, capacity: int, w2: int, draft_window: int, steps: int):
    """LAQ's rule in reference terms: SnapKV draft at capacity C, L greedy tokens decoded from it,
    then the last w2 prompt queries + the L pseudo-queries scored on the FULL prompt keys with
    correct causal visibility, summed, group mean, max-pooled (7) before the window, top C - w2
    plus the last w2 tokens."""
    n = ids.shape[1]
    layers = evictable_layers(model)
    recs = reference(model, ids)
    draft = [
        [
            top(s, capacity - draft_window) | set(range(n - draft_window, n))
            for s in snapkv_scores(recs[l], n, draft_window, 7)
        ]
        for l in layers
    ]
    with torch.no_grad():
        tokens = [int(model(ids).logits[0, -1].argmax())]
    for _ in range(steps - 1):
        logits, _ = masked_run(model, torch.cat([ids, torch.tensor([tokens])], dim=1), n, draft)
        tokens.append(int(logits[-1].argmax()))
    _, pseudo = masked_run(model, torch.cat([ids, torch.tensor([tokens])], dim=1), n, draft)
    expected = []
    for layer in layers:
        rec = recs[layer]
        q = torch.cat([rec["query"][:, n - w2 : n], pseudo[layer][:, n : n + steps]], dim=1).double()
        k = rec["key"][:, :n].double().repeat_interleave(GROUP, dim=0)
        logits = (q @ k.transpose(-1, -2)) * rec["scaling"]  # (H, w2 + L, n): prompt keys only
        for i in range(w2):  # window query i sits at n - w2 + i; pseudo-queries see every prompt key
            logits[:, i, n - w2 + i + 1 :] = -math.inf
        summed = group_mean(torch.softmax(logits, dim=-1).sum(dim=1))  # (G, n)
        prefix = n - w2
        pooled = F.max_pool1d(summed[:, :prefix].unsqueeze(1), 7, 1, 3).squeeze(1)
        expected.append([top(s, capacity - w2) | set(range(prefix, n)) for s in pooled])
    return expected, tokens


@pytest.mark.parametrize(
    "query_aware,w2", [(True, 8), (False, 8), (False, 0)], ids=["LAQ++-query-aware", "LAQ++-agnostic", "LAQ-agnostic"]
)
def test_laq_equals_the_reference_rule(query_aware: bool, w2: int) -> None:
    model = tiny_llama(115, layers=2)
    ids = random_ids(N, seed=215)
    budget, draft_window, steps = 18, 10, 5
    expected, tokens = laq_reference(model, ids, budget + query_aware, w2, draft_window, steps)
    config = preset("laq", budget, num_tokens=steps, window=w2, draft_window=draft_window)
    pipeline = Pipeline.from_config(config)
    compressed = pipeline.compress(model, ids, query_aware=query_aware)
    assert kept(compressed) == as_candidates(expected, N, query_aware)
    rollout = ModelRollout(prepare(model), ids, evictable_layers(model), pipeline.sampler.prefill_window,
                           candidates=N - query_aware)  # fmt: skip
    assert pipeline.sampler.sample(rollout).token_ids[0, w2:].tolist() == tokens, "decoded from the draft cache"


def test_laq_pseudo_tokens_come_from_the_draft_not_the_full_cache() -> None:
    """With a draft much smaller than the prompt, the draft-decoded tokens differ from full-cache greedy."""
    model = tiny_llama(116, layers=2)
    ids = random_ids(N, seed=216)
    draft = preset("laq", 12, num_tokens=6, window=4, draft_window=4)
    full = preset("greedy_lookahead", 12, num_tokens=6)
    layers = evictable_layers(model)
    drafted = Pipeline.from_config(draft).sampler.sample(ModelRollout(prepare(model), ids, layers, 4)).token_ids
    greedy = Pipeline.from_config(full).sampler.sample(ModelRollout(prepare(model), ids, layers)).token_ids
    assert drafted[0, 4:].tolist() != greedy[0].tolist()
