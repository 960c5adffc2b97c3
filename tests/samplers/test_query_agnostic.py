"""The query-agnostic samplers (questions, partial_kvzip, mixture) and ``Rollout.follow``.

Properties: the fed instruction's tokens are never candidates and never kept, and budgets stay
exact; the same seed gives the same futures and another seed others; the instruction and the
futures after it sit at the positions the model's own forward over context + script gives them
(queries against the model's own eager attention, log-probs against its own logits); bad
configs fail at construction with the parameter named.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from recording import reference
from tiny_models import CharTokenizer, random_ids, tiny_gemma3, tiny_llama

from lorekv import Pipeline, preset, token_rules
from lorekv.hf import ModelRollout, evictable_layers, prepare
from lorekv.samplers import (
    SAMPLERS,
    KVzipConfig,
    KVzipSampler,
    MixtureSampler,
    PartialKVzipConfig,
    PartialKVzipSampler,
    QuestionsConfig,
    QuestionsSampler,
)
from lorekv.scorers import SCORERS
from lorekv.trajectories import Drawn, Fed, FutureMixture

N = 40
SHORT = {"instruction": "?Q", "question_prefix": "q:", "answer_prefix": "a:"}
"""Short fed texts, so the tiny models' scripts stay small (CharTokenizer: one id a character)."""
EXACT = {"rtol": 1e-6, "atol": 1e-6}  # the model's eager attention takes its softmax in float32


def questions(**options) -> QuestionsSampler:
    return QuestionsSampler(QuestionsConfig(**{**SHORT, **options}))


def rollout(model, ids: torch.Tensor, window: int = 0) -> ModelRollout:
    prepare(model)
    return ModelRollout(model, ids, evictable_layers(model), window, tokenizer=CharTokenizer())


def agnostic(sampler_spec: dict, budget: int) -> Pipeline:
    return Pipeline.from_config(preset("lore_kv", budget).override({"sampler": sampler_spec}))


# ---------------------------------------------------------------------------------------------
# configs


@pytest.mark.parametrize(
    "spec,field,bound",
    [
        ({"name": "questions", "num_futures": 0}, "num_futures", "greater than or equal to 1"),
        ({"name": "questions", "question_tokens": 0}, "question_tokens", "greater than or equal to 1"),
        ({"name": "questions", "answer_tokens": -2}, "answer_tokens", "greater than or equal to 1"),
        ({"name": "questions", "temperature": 0.0}, "temperature", "greater than 0"),
        ({"name": "questions", "temperature": float("inf")}, "temperature", "finite"),
        ({"name": "questions", "top_p": 0.0}, "top_p", "greater than 0"),
        ({"name": "questions", "top_p": 1.5}, "top_p", "less than or equal to 1"),
        ({"name": "questions", "queries": "middle"}, "queries", "'answer', 'question' or 'both'"),
        ({"name": "questions", "instruction": 3}, "instruction", "string"),
        ({"name": "questions", "seed": 1.5}, "seed", "integer"),
        ({"name": "questions", "draws": "antithetic"}, "draws", "'independent' or 'stratified'"),
        ({"name": "partial_kvzip", "fraction": 0.0}, "fraction", "greater than 0"),
        ({"name": "partial_kvzip", "fraction": 1.5}, "fraction", "less than or equal to 1"),
        ({"name": "partial_kvzip", "num_chunks": 0, "fraction": None}, "num_chunks", "greater than or equal to 1"),
        ({"name": "partial_kvzip", "num_chunks": 2, "fraction": 0.5}, "exclusive", "num_chunks"),
        ({"name": "partial_kvzip", "fraction": None}, "fraction", "num_chunks"),
        ({"name": "partial_kvzip", "chunk_size": 0}, "chunk_size", "greater than or equal to 1"),
        ({"name": "strided_kvzip", "replay": 0}, "replay", "greater than or equal to 1"),
        ({"name": "strided_kvzip", "replay": 2.5}, "replay", "integer"),
        ({"name": "mixture", "samplers": [{"name": "questions"}]}, "samplers", "at least two"),
        ({"name": "mixture", "samplers": "questions"}, "samplers", "at least two"),
        ({"name": "mixture", "samplers": ["questions", "nonesuch"]}, "nonesuch", "known"),
        ({"name": "mixture", "samplers": ["greedy", {"name": "questions", "num_futures": 0}]}, "num_futures", "1"),
        ({"name": "mixture"}, "samplers", "required"),
    ],
)
def test_bad_configs_name_the_parameter_and_range(spec: dict, field: str, bound: str) -> None:
    with pytest.raises(ValueError) as error:
        SAMPLERS.build(spec)
    assert field in str(error.value) and bound in str(error.value)


def test_partial_kvzip_num_chunks_alone_clears_the_fraction() -> None:
    config = PartialKVzipConfig(num_chunks=3)
    assert (config.fraction, config.num_chunks) == (None, 3)
    assert SAMPLERS.parse(config.model_dump()) == config
    assert PartialKVzipConfig().fraction == 0.25 and PartialKVzipConfig().chunk_size == 128


def test_configs_round_trip_through_the_registry() -> None:
    mixture = SAMPLERS.parse({"name": "mixture", "samplers": [{"name": "questions", "queries": "both"}, "greedy"]})
    configs = [QuestionsConfig(queries="question", seed=3), PartialKVzipConfig(fraction=0.5), mixture]
    for config in configs:
        assert SAMPLERS.parse(config.model_dump()) == config
        assert type(config).model_validate_json(config.model_dump_json()) == config
    pipeline = preset("lore_kv", 8).override({"sampler": mixture.model_dump()})
    assert Pipeline.from_config(pipeline).sampler.config == mixture


@pytest.mark.parametrize("aggregator", ["logprob", "reliability"])
def test_a_mixture_weighed_by_token_stats_needs_them_from_every_part(aggregator: str) -> None:
    """A kvzip part without its token statistics would read as the most certain future (log-prob
    0): refused at construction under an aggregator that weighs by them; accepted once asked."""
    parts = [{"name": "kvzip"}, {"name": "questions"}]
    config = preset("lore_kv", 8).override({"sampler": {"name": "mixture", "samplers": parts}})
    with pytest.raises(ValueError, match="kvzip part.*token_stats: true"):
        Pipeline.from_config(config.override({"aggregator": {"name": aggregator}}))
    parts[0]["token_stats"] = True
    stats = config.override({"sampler": {"name": "mixture", "samplers": parts}, "aggregator": {"name": aggregator}})
    assert Pipeline.from_config(stats).aggregator.config.name == aggregator
    assert Pipeline.from_config(config.override({"aggregator": {"name": "mean"}})).aggregator.config.name == "mean"


def test_the_tokenizer_is_required_before_any_model_work() -> None:
    model = tiny_llama(301)

    def forbidden(*args, **kwargs):
        raise AssertionError("the model ran before the missing tokenizer was reported")

    model.forward = forbidden
    for spec in (
        {"name": "questions"},
        {"name": "partial_kvzip"},
        {"name": "strided_kvzip"},
        {"name": "mixture", "samplers": ["questions", "greedy"]},
    ):
        with pytest.raises(ValueError, match="tokenizer"):
            agnostic(spec, 8).compress(model, random_ids(N, seed=1), query_aware=False)


def test_the_script_must_fit_the_context_before_any_work() -> None:
    model = tiny_llama(302)  # 512 positions
    model.forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran"))
    with pytest.raises(ValueError, match="questions future"):
        agnostic({"name": "questions", "question_tokens": 500}, 8).compress(
            model, random_ids(N, seed=2), query_aware=False, tokenizer=CharTokenizer()
        )


# ---------------------------------------------------------------------------------------------
# Rollout.follow and the questions' positions, against the model's own computation


@pytest.mark.parametrize("side", ["answer", "question", "both"])
def test_questions_queries_and_logprobs_match_a_full_forward(side: str) -> None:
    """Context + instruction + question + prefix + answer run as one plain sequence through the
    model: the sampler's queries are that forward's at n + their script index, its drawn tokens'
    log-probs that forward's logits."""
    model = tiny_llama(303)
    ids = random_ids(N, seed=3)
    sampler = questions(num_futures=2, question_tokens=3, answer_tokens=4, queries=side, seed=5)
    head, cue = sampler.texts(CharTokenizer())
    k, c = head.numel(), cue.numel()
    futures = sampler.sample(rollout(model, ids))
    query_index, token_index = sampler.sides(k, c)
    assert futures.token_ids.shape == (2, len(token_index))
    for m in range(2):
        script = full_script(model, ids, sampler, m)  # every fed and drawn token of future m
        assert script[:k].equal(head) and script[k + 3 : k + 3 + c].equal(cue)
        assert script[token_index].equal(futures.token_ids[m])
        sequence = torch.cat([ids[0], script]).view(1, -1)
        recs = reference(model, sequence)
        logits = model(sequence, use_cache=False).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        expected = logp[[N + i - 1 for i in token_index], futures.token_ids[m]]
        torch.testing.assert_close(futures.logprobs[m].double(), expected, atol=1e-6, rtol=0)
        for layer in futures.layers:
            assert layer.query_positions.tolist() == [N + i for i in query_index]
            own = recs[layer.layer_idx]["query"][:, [N + i for i in query_index]]
            torch.testing.assert_close(layer.queries[m], own, **EXACT)
            keys = recs[layer.layer_idx]["key"]
            torch.testing.assert_close(layer.prompt_keys, keys[:, :N], **EXACT)
            torch.testing.assert_close(layer.response_keys[m], keys[:, N:], **EXACT)


def full_script(model, ids: torch.Tensor, sampler: QuestionsSampler, m: int) -> torch.Tensor:
    """(S,) future ``m``'s whole script (fed and drawn), through ``Rollout.follow`` with the
    sampler's own seed and rule."""
    r = rollout(model, ids)
    head, cue = sampler.texts(CharTokenizer())
    cfg = sampler.config
    rule = sampler.rule(r.generator(cfg.seed))
    steps = [Fed(head), Drawn(rule, cfg.question_tokens), Fed(cue), Drawn(rule, cfg.answer_tokens)]
    return r.follow(steps, cfg.num_futures).token_ids[m]


def test_follow_feeds_every_future_the_same_text_at_the_positions_after_the_prompt() -> None:
    """Fed tokens are the same in every future and their log-probs are the model's; a fed step of
    no tokens adds nothing; drawn tokens follow the rule (greedy here)."""
    model = tiny_llama(304)
    ids = random_ids(N, seed=4)
    fed = torch.tensor([5, 9, 11])
    futures = rollout(model, ids).follow(
        [Fed(fed), Drawn(token_rules.greedy, 2), Fed(torch.zeros(0, dtype=torch.long)), Fed(fed[:1])], 3
    )
    assert futures.token_ids.shape == (3, 6)
    assert (futures.token_ids[:, :3] == fed).all() and (futures.token_ids[:, 5] == 5).all()
    assert (futures.token_ids == futures.token_ids[0]).all()  # greedy: every future alike
    sequence = torch.cat([ids[0], futures.token_ids[0]]).view(1, -1)
    logits = model(sequence, use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    expected = logp[torch.arange(N - 1, N + 5), futures.token_ids[0]]
    torch.testing.assert_close(futures.logprobs[0].double(), expected, atol=1e-6, rtol=0)
    assert futures.token_ids[0, 3] == int(logits[N + 2].argmax())  # greedy after the fed text
    for layer in futures.layers:
        assert layer.query_positions.tolist() == list(range(N, N + 6))
        assert layer.response_keys.shape[2] == 6


def test_follow_rejects_bad_scripts() -> None:
    r = rollout(tiny_llama(305), random_ids(N, seed=5))
    with pytest.raises(ValueError, match="vocabulary"):
        r.follow([Fed(torch.tensor([1, 10_000]))], 2)
    with pytest.raises(ValueError, match="at least one token"):
        r.follow([Fed(torch.zeros(0, dtype=torch.long))], 2)
    with pytest.raises(ValueError, match="num_futures"):
        r.follow([Fed(torch.tensor([1]))], 0)


def test_follow_on_a_hybrid_model_matches_its_own_forward() -> None:
    """Gemma 3 (sliding layers, one full layer captured): the drawn tokens' log-probs match a plain
    forward over context + script, past the sliding window."""
    model = tiny_gemma3(306)
    ids = random_ids(N, seed=6)
    sampler = questions(num_futures=2, question_tokens=2, answer_tokens=3, queries="both")
    futures = sampler.sample(rollout(model, ids))
    script = full_script(model, ids, sampler, 1)
    sequence = torch.cat([ids[0], script]).view(1, -1)
    logits = model(sequence, use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    _, token_index = sampler.sides(*(t.numel() for t in sampler.texts(CharTokenizer())))
    expected = logp[[N + i - 1 for i in token_index], futures.token_ids[1]]
    torch.testing.assert_close(futures.logprobs[1].double(), expected, atol=1e-6, rtol=0)


def test_question_sides_select_the_drawn_queries() -> None:
    sampler = questions(question_tokens=3, answer_tokens=2)
    assert sampler.sides(5, 2) == ([9, 10, 11], [10, 11])
    both = questions(question_tokens=3, answer_tokens=2, queries="both")
    assert both.sides(5, 2) == ([4, 5, 6, 7, 9, 10, 11], [5, 6, 7, 10, 11])
    assert questions(question_tokens=3, queries="question").sides(5, 2) == ([4, 5, 6, 7], [5, 6, 7])
    assert questions(question_tokens=3, queries="both").sides(0, 0)[0] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_the_suffix_comes_from_the_chat_template_or_is_a_newline() -> None:
    class Templated(CharTokenizer):
        chat_template = "x"

        def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
            return "<u>" + messages[0]["content"] + "</u><a>"

    tok = CharTokenizer()
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert questions().texts(Templated())[0].tolist() == enc("?Q</u><a>q:")
    assert questions().texts(tok)[0].tolist() == enc("?Q\nq:")  # a base model: no template
    assert questions(suffix="|").texts(Templated())[0].tolist() == enc("?Q|q:")
    assert questions().texts(tok)[1].tolist() == enc("a:")


# ---------------------------------------------------------------------------------------------
# seeds


def test_same_seed_same_futures_other_seed_other_futures() -> None:
    model = tiny_llama(307)
    ids = random_ids(N, seed=7)
    first = questions(num_futures=3, seed=1).sample(rollout(model, ids))
    again = questions(num_futures=3, seed=1).sample(rollout(model, ids))
    other = questions(num_futures=3, seed=2).sample(rollout(model, ids))
    assert first.token_ids.equal(again.token_ids)
    for a, b in zip(first.layers, again.layers, strict=True):
        assert a.queries.equal(b.queries)
    assert not first.token_ids.equal(other.token_ids)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_questions_draws_are_the_token_rules_draws(top_p: float) -> None:
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(5))
    for draws in ("independent", "stratified"):
        drawn = questions(temperature=0.9, top_p=top_p, draws=draws).rule(torch.Generator().manual_seed(3))(logits)
        rule = token_rules.temperature if top_p == 1.0 else partial(token_rules.nucleus, top_p=top_p)
        assert drawn.equal(rule(logits, temperature=0.9, generator=torch.Generator().manual_seed(3), draws=draws))
    assert QuestionsConfig().draws == "independent"


def test_partial_chunks_are_seeded_and_in_prompt_order() -> None:
    def ranges(**options):
        return PartialKVzipSampler(PartialKVzipConfig(chunk_size=10, **options)).chunk_ranges(95)

    assert ranges(seed=3) == ranges(seed=3)
    assert ranges(seed=3) != ranges(seed=4)
    drawn = ranges(fraction=0.3)
    every = KVzipSampler(KVzipConfig(chunk_size=10)).chunk_ranges(95)
    assert len(drawn) == 3 and set(drawn) <= set(every) and drawn == sorted(drawn)
    assert len(ranges(num_chunks=4, fraction=None)) == 4
    assert ranges(num_chunks=99, fraction=None) == every
    assert ranges(fraction=1.0) == every
    assert len(ranges(fraction=0.01)) == 1


# ---------------------------------------------------------------------------------------------
# budgets and what is kept


SPECS = [
    {"name": "questions", **SHORT, "num_futures": 2, "question_tokens": 3, "answer_tokens": 3, "queries": "both"},
    {"name": "partial_kvzip", "chunk_size": 8, "fraction": 0.5},
    {"name": "strided_kvzip", "chunk_size": 8, "replay": 3},
    {"name": "mixture", "samplers": [{"name": "questions", **SHORT, "num_futures": 2}, {"name": "greedy"}]},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
@pytest.mark.parametrize("budget", [1, 7, 16])
def test_fed_text_is_never_a_candidate_nor_kept_and_budgets_are_exact(spec: dict, budget: int) -> None:
    model = tiny_llama(308)
    ids = random_ids(N, seed=8)
    compressed = agnostic(spec, budget).compress(model, ids, query_aware=False, tokenizer=CharTokenizer())
    stats = compressed.stats
    assert stats.prompt_tokens == N and stats.candidate_tokens == N and stats.pending_tokens == 0
    assert stats.kept == tuple((budget,) * model.config.num_key_value_heads for _ in evictable_layers(model))
    for heads in compressed.selection.indices:
        for head in heads:
            assert head.numel() == budget and int(head.max()) < N and head.unique().numel() == budget
    for idx in evictable_layers(model):
        positions = compressed.cache.layers[idx].positions
        assert positions.shape[-1] == budget and int(positions.max()) < N


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["name"])
def test_query_aware_too_the_fed_text_stays_out(spec: dict) -> None:
    model = tiny_llama(309)
    ids = random_ids(N, seed=9)
    compressed = agnostic(spec, 6).compress(model, ids, query_aware=True, tokenizer=CharTokenizer())
    assert compressed.stats.candidate_tokens == N - 1
    assert all(int(h.max()) < N - 1 for heads in compressed.selection.indices for h in heads)


# ---------------------------------------------------------------------------------------------
# partial reconstruction is KVzip's, over fewer chunks


def test_partial_over_every_chunk_is_kvzip() -> None:
    model = tiny_llama(310)
    ids = random_ids(N, seed=10)
    tok = CharTokenizer()
    full = Pipeline.from_config(preset("kvzip", 6, chunk_size=12))
    part = Pipeline.from_config(
        preset("kvzip", 6).override({"sampler": {"name": "partial_kvzip", "chunk_size": 12, "fraction": 1.0}})
    )
    a = full.compress(model, ids, query_aware=False, tokenizer=tok)
    b = part.compress(model, ids, query_aware=False, tokenizer=tok)
    assert [[h.tolist() for h in heads] for heads in a.selection.indices] == [
        [h.tolist() for h in heads] for heads in b.selection.indices
    ]


def test_partial_scores_only_the_drawn_chunks_and_the_sinks() -> None:
    model = tiny_llama(311)
    ids = random_ids(N, seed=11)
    sampler = PartialKVzipSampler(PartialKVzipConfig(chunk_size=8, num_chunks=2, fraction=None, seed=1))
    chunks = sampler.chunk_ranges(N)
    futures = sampler.sample(rollout(model, ids))
    per_future = SCORERS.build(preset("kvzip", 8).scorer).score(futures)  # (1, L, G, n)
    visible = set(range(4)) | {j for start, end in chunks for j in range(start, end)}
    hidden = [j for j in range(N) if j not in visible]
    assert (per_future[..., hidden] == 0).all()
    assert (per_future[..., sorted(visible - set(range(4)))] > 0).all()


# ---------------------------------------------------------------------------------------------
# the mixture


def test_mixture_scores_each_part_as_alone_and_pads_stats_with_each_futures_mean() -> None:
    model = tiny_llama(312)
    ids = random_ids(N, seed=12)
    parts = [
        {"name": "questions", **SHORT, "num_futures": 2, "question_tokens": 2, "answer_tokens": 5},
        {"name": "greedy", "num_tokens": 3},
        {"name": "partial_kvzip", "chunk_size": 10, "num_chunks": 2, "fraction": None},
    ]
    mixture = MixtureSampler(SAMPLERS.parse({"name": "mixture", "samplers": parts}))
    r = rollout(model, ids)
    mixed = mixture.futures(r)
    alone = [SAMPLERS.build(p).futures(rollout(model, ids)) for p in parts]
    assert isinstance(mixed, FutureMixture) and mixed.num_futures == 4
    pipeline = Pipeline.from_config(preset("lore_kv", 8))
    expected = torch.cat([pipeline.scorer.score(t) for t in alone])
    torch.testing.assert_close(pipeline.scorer.score(mixed), expected, atol=0, rtol=0)
    lp = mixed.logprobs
    assert lp.shape == (4, max(t.logprobs.shape[1] for t in alone))
    means = torch.cat([t.logprobs.mean(dim=1) for t in alone])
    torch.testing.assert_close(lp.mean(dim=1), means.to(lp.dtype))
    scores, weights = pipeline.score(mixed, N)
    torch.testing.assert_close(weights, torch.full((4,), 0.25, dtype=weights.dtype))
    torch.testing.assert_close(scores, expected.mean(dim=0).to(scores.dtype))


def test_mixture_positions_windows_and_last_prompt_query() -> None:
    parts = ["greedy", {"name": "prompt_window", "window": 5}, {"name": "questions", **SHORT, "question_tokens": 4}]
    mixture = SAMPLERS.build({"name": "mixture", "samplers": parts, "include_last_prompt_query": True})
    tok = CharTokenizer()
    ids = random_ids(N, seed=13)
    assert mixture.prefill_window == 5
    assert mixture.future_positions(ids, tok) == max(8, questions(question_tokens=4).future_positions(ids, tok))
    futures = mixture.futures(rollout(tiny_llama(313), ids, mixture.prefill_window))
    for part in futures.parts:  # every part holds the query at n-1 once
        for layer in part.layers:
            assert layer.query_positions.tolist().count(N - 1) == 1


def test_mixture_batch_equals_each_row_alone() -> None:
    """A left-padded batch: every row's mixed futures are exactly its futures alone."""
    model = tiny_llama(314)
    tok = CharTokenizer()
    a, b = random_ids(N, seed=14), random_ids(N - 6, seed=15)
    spec = {"name": "mixture", "samplers": [{"name": "questions", **SHORT, "num_futures": 2}, "temperature"]}
    pipeline = agnostic(spec, 5)
    batch = torch.cat([a, torch.cat([torch.zeros(1, 6, dtype=torch.long), b], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :6] = 0
    together = pipeline.compress(model, batch, attention_mask=mask, query_aware=False, tokenizer=tok)
    for row, ids in enumerate((a, b)):
        alone = pipeline.compress(model, ids, query_aware=False, tokenizer=tok)
        got = [[h.tolist() for h in heads] for heads in together.selections[row].indices]
        assert got == [[h.tolist() for h in heads] for heads in alone.selection.indices]
