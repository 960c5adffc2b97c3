"""``model.generate`` continuing a compressed cache (issue 18).

Every comparison is against the strong reference of :mod:`masked_reference`: transformers'
``generate`` on the FULL cache with the evicted entries hidden by the model's own eager
attention. A cache continued at the compressed length instead of the original position, a first
answer token taken from the full prefill, or an evicted entry left visible changes the logits.
"""

from __future__ import annotations

import pytest
import torch
from masked_reference import keep_masks, reference_generate, reference_logits
from tiny_models import VOCAB, random_ids, tiny_gemma3, tiny_llama, word_tokenizer
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer, TextStreamer
from transformers.generation.streamers import BaseStreamer

from lorekv import Pipeline, decode
from lorekv.hf import forward

TOL = {"rtol": 1e-6, "atol": 1e-6}
"""float32 rounding: ``generate`` hands out float32 logits of the float64 models, and the eager reference
rounds 1 ulp apart from SDPA; a wrong position or a visible evicted entry moves them by ~1e-2."""
FUTURES = {"name": "temperature", "num_futures": 2, "num_tokens": 3}
POLICIES = {
    "uniform": {"name": "uniform", "budget": 5, "sink": 1},
    "per_layer": {"name": "per_layer", "budget": 6, "beta": 3.0},
    "per_head": {"name": "per_head", "budget": 6, "alpha": 0.0},
}
MODELS = {"llama": lambda: tiny_llama(31, layers=3), "gemma3": lambda: tiny_gemma3(33, window=8)}


def compressed_and_ids(model, policy: dict, query_aware: bool):
    """A compressed 28-token prompt and the input_ids generate continues (query-agnostic: + a question)."""
    context = random_ids(28, seed=41)
    compressed = Pipeline(FUTURES, "projected_loo", "mean", policy).compress(model, context, query_aware=query_aware)
    ids = context if query_aware else torch.cat([context, random_ids(5, seed=43)], 1)
    return compressed, ids


def lorekv_loop(model, compressed, input_ids: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """lorekv's previous decode loop: explicit positions through lorekv's ``forward``, greedy."""
    state = compressed.fork()
    position = compressed.start
    feed = input_ids[:, position:]
    tokens, logits = [], []
    for _ in range(steps):
        positions = torch.arange(position, position + feed.shape[1])
        step = forward(model, feed, state, positions)[0, -1]
        position += feed.shape[1]
        logits.append(step)
        tokens.append(int(step.argmax()))
        feed = torch.tensor([[tokens[-1]]])
    return tokens, logits


def generate(model, input_ids, cache, **options):
    return model.generate(
        input_ids,
        cache=cache,
        return_dict_in_generate=True,
        output_logits=True,
        output_scores=True,
        **options,
    )


def assert_same_as_reference(got, want) -> None:
    """Same tokens; the same raw logits and processed scores at every step."""
    assert got.sequences.tolist() == want.sequences.tolist()
    for step, (a, b) in enumerate(zip(got.logits, want.logits, strict=True)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, s=step: f"logits of step {s}: {m}")
    for step, (a, b) in enumerate(zip(got.scores, want.scores, strict=True)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, s=step: f"scores of step {s}: {m}")


@pytest.fixture(scope="module")
def ragged():
    """Tiny Llama, per-head budgets with ragged heads, query-aware: the options' test bed."""
    model = tiny_llama(31, layers=2)
    compressed, ids = compressed_and_ids(model, POLICIES["per_head"], query_aware=True)
    counts = compressed.selection.counts()
    assert (counts != counts[:, :1]).any(), "the test bed needs ragged heads (padding in decode steps)"
    return model, compressed, ids


@pytest.mark.parametrize("mode", ["query_aware", "query_agnostic"])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("arch", list(MODELS))
def test_greedy_generate_equals_lorekv_loop_and_masked_full_cache(arch: str, policy: str, mode: str) -> None:
    model = MODELS[arch]()
    compressed, ids = compressed_and_ids(model, POLICIES[policy], query_aware=mode == "query_aware")
    steps = 6
    got = generate(model, ids, compressed.fork(), max_new_tokens=steps, do_sample=False)
    new = got.sequences[0, ids.shape[1] :].tolist()

    loop_tokens, loop_logits = lorekv_loop(model, compressed, ids, steps)
    assert new == loop_tokens
    for a, b in zip(got.logits, loop_logits, strict=True):
        torch.testing.assert_close(a[0], b, **TOL)

    assert_same_as_reference(got, reference_generate(model, ids, compressed, max_new_tokens=steps, do_sample=False))
    fed = [ids[:, compressed.start :]] + [torch.tensor([[t]]) for t in new[:-1]]
    independent = reference_logits(model, ids[:, : compressed.start], keep_masks(compressed), fed)
    for a, b in zip(got.logits, independent, strict=True):
        torch.testing.assert_close(a[0], b, **TOL)


def test_first_answer_token_is_computed_through_the_compressed_cache() -> None:
    """Tiny budget: the first logits change with the evicted entries (no leak from the full prefill)."""
    model = tiny_llama(37, layers=2)
    ids = random_ids(30, seed=47)
    firsts = []
    for sink in (1, 4):
        policy = {"name": "uniform", "budget": 4, "sink": sink}
        compressed = Pipeline(FUTURES, "projected_loo", "mean", policy).compress(model, ids)
        out = generate(model, ids, compressed, max_new_tokens=1, do_sample=False)
        firsts.append(out.logits[0][0])
    assert not torch.allclose(firsts[0], firsts[1], atol=1e-6)


def test_decode_is_generate_on_a_fork(ragged) -> None:
    model, compressed, ids = ragged
    before = [layer.keys.shape for layer in compressed.layers]
    via_decode = decode(model, compressed, max_new_tokens=5)
    via_generate = generate(model, ids, compressed.fork(), max_new_tokens=5, do_sample=False)
    assert via_decode.token_ids.tolist() == via_generate.sequences[0, ids.shape[1] :].tolist()
    torch.testing.assert_close(via_decode.first_logits, via_generate.logits[0][0], rtol=0, atol=0)
    assert [layer.keys.shape for layer in compressed.layers] == before and compressed.extended == 0


def test_generate_on_a_fork_leaves_the_original_untouched(ragged) -> None:
    model, compressed, ids = ragged
    keys = [layer.keys.clone() for layer in compressed.layers]
    first = generate(model, ids, compressed.fork(), max_new_tokens=4, do_sample=False)
    fork = compressed.fork()
    second = generate(model, ids, fork, max_new_tokens=4, do_sample=False)
    assert first.sequences.tolist() == second.sequences.tolist()
    assert compressed.next_position == compressed.start and fork.next_position == compressed.start + 4
    for layer, before in zip(compressed.layers, keys, strict=True):
        assert torch.equal(layer.keys, before)


def test_several_questions_from_one_query_agnostic_compression() -> None:
    model = tiny_llama(34, layers=2)
    context = random_ids(24, seed=42)
    compressed = Pipeline("greedy", "attention_mass", "mean", POLICIES["per_head"]).compress(
        model, context, query_aware=False
    )
    for seed in (43, 44):
        ids = torch.cat([context, random_ids(5, seed=seed)], 1)
        got = generate(model, ids, compressed.fork(), max_new_tokens=4, do_sample=False)
        assert_same_as_reference(got, reference_generate(model, ids, compressed, max_new_tokens=4, do_sample=False))


def test_sampling_seeded_twice_gives_the_same_tokens_as_the_reference(ragged) -> None:
    model, compressed, ids = ragged
    options = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 8}
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(generate(model, ids, compressed.fork(), **options))
    assert runs[0].sequences.tolist() == runs[1].sequences.tolist()
    torch.manual_seed(5)
    assert_same_as_reference(runs[0], reference_generate(model, ids, compressed, **options))
    torch.manual_seed(6)
    other = generate(model, ids, compressed.fork(), **options)
    assert other.sequences.tolist() != runs[0].sequences.tolist(), "another seed samples other tokens"


def test_repetition_penalty(ragged) -> None:
    model, compressed, ids = ragged
    options = {"do_sample": False, "repetition_penalty": 1.8, "max_new_tokens": 8}
    got = generate(model, ids, compressed.fork(), **options)
    assert_same_as_reference(got, reference_generate(model, ids, compressed, **options))
    plain = generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=8)
    assert not torch.equal(got.scores[0], plain.scores[0]), "the penalty reads the prompt"


class StopAfter(StoppingCriteria):
    """Stops when ``token`` has been generated."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return input_ids[:, -1] == self.token


def test_stopping_criteria_and_eos_lists(ragged) -> None:
    model, compressed, ids = ragged
    n = ids.shape[1]
    free = generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=8).sequences[0, n:].tolist()
    stop = free[2]
    expected = free[: free.index(stop) + 1]
    criteria = StoppingCriteriaList([StopAfter(stop)])
    got = generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=8, stopping_criteria=criteria)
    assert got.sequences[0, n:].tolist() == expected
    want = reference_generate(
        model,
        ids,
        compressed,
        do_sample=False,
        max_new_tokens=8,
        stopping_criteria=StoppingCriteriaList([StopAfter(stop)]),
    )
    assert_same_as_reference(got, want)
    eos = [60, stop] if stop != 60 else [59, stop]
    got = generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=8, eos_token_id=eos)
    assert got.sequences[0, n:].tolist() == expected
    assert_same_as_reference(
        got, reference_generate(model, ids, compressed, do_sample=False, max_new_tokens=8, eos_token_id=eos)
    )


def test_min_new_tokens_holds_back_eos(ragged) -> None:
    model, compressed, ids = ragged
    n = ids.shape[1]
    free = generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=6).sequences[0, n:].tolist()
    options = {"do_sample": False, "max_new_tokens": 6, "eos_token_id": free[0], "min_new_tokens": 3}
    got = generate(model, ids, compressed.fork(), **options)
    assert len(got.sequences[0, n:]) >= 3 and got.sequences[0, n] != free[0]
    assert torch.isinf(got.scores[0][0, free[0]]), "eos suppressed before min_new_tokens"
    assert_same_as_reference(got, reference_generate(model, ids, compressed, **options))


class Collect(BaseStreamer):
    """A streamer stub: what ``put`` received, and whether ``end`` was called."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended = True


def test_streamers_receive_the_prompt_then_the_reference_tokens(ragged, capsys) -> None:
    model, compressed, ids = ragged
    n = ids.shape[1]
    want = reference_generate(model, ids, compressed, do_sample=False, max_new_tokens=5)
    new = want.sequences[0, n:].tolist()
    stub = Collect()
    generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=5, streamer=stub)
    assert stub.chunks == [ids[0].tolist(), *([t] for t in new)] and stub.ended

    tokenizer = word_tokenizer()
    text = tokenizer.decode(new, skip_special_tokens=True)
    generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=5, streamer=TextStreamer(tokenizer, True))
    assert capsys.readouterr().out.strip() == text
    iterator = TextIteratorStreamer(tokenizer, skip_prompt=True)
    generate(model, ids, compressed.fork(), do_sample=False, max_new_tokens=5, streamer=iterator)
    assert "".join(iterator).strip() == text


def test_output_scores_and_logits(ragged) -> None:
    model, compressed, ids = ragged
    options = {"do_sample": True, "temperature": 0.5, "top_k": 5, "max_new_tokens": 4}
    torch.manual_seed(1)
    got = generate(model, ids, compressed.fork(), **options)
    assert len(got.scores) == len(got.logits) == 4
    assert all(int(torch.isfinite(s).sum()) <= 5 for s in got.scores), "scores are after top_k"
    torch.testing.assert_close(got.scores[0].max(), (got.logits[0] / 0.5).max(), **TOL)
    torch.manual_seed(1)
    assert_same_as_reference(got, reference_generate(model, ids, compressed, **options))


def counted(model):
    """A list that grows by one per forward call of ``model``."""
    calls: list[int] = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


REFUSALS = [
    pytest.param({"num_beams": 2}, "num_beams", id="beam-search"),
    pytest.param({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens", id="prompt-lookup"),
    pytest.param({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences", id="return-sequences"),
    pytest.param({"cache_implementation": "static"}, "cache_implementation", id="cache-implementation"),
    pytest.param({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha", id="contrastive"),
]


@pytest.mark.parametrize("options,named", REFUSALS)
def test_unsupported_options_are_refused_before_model_work(ragged, options: dict, named: str) -> None:
    model, compressed, ids = ragged
    calls, handle = counted(model)
    try:
        with pytest.raises(ValueError, match=f"refused: .*{named}"):
            model.generate(ids, cache=compressed.fork(), max_new_tokens=3, **options)
    finally:
        handle.remove()
    assert calls == []


def test_assisted_decoding_is_refused_before_model_work(ragged) -> None:
    model, compressed, ids = ragged
    assistant = tiny_llama(2, layers=1)
    calls, handle = counted(model)
    try:
        with pytest.raises(ValueError, match="refused: assistant_model"):
            model.generate(ids, cache=compressed.fork(), max_new_tokens=3, assistant_model=assistant)
    finally:
        handle.remove()
    assert calls == []


def unpadded(ids: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(ids).index_fill(1, torch.tensor([0]), 0)


BAD_INPUTS = [
    pytest.param(lambda ids: (ids.repeat(2, 1), {}), "rows", id="batch-2"),
    pytest.param(lambda ids: (torch.cat([(ids[:, :3] + 1) % VOCAB, ids[:, 3:]], 1), {}), "start with", id="prefix"),
    pytest.param(lambda ids: (ids[:, :-4], {}), "start with", id="shorter"),
    pytest.param(lambda ids: (ids, {"attention_mask": unpadded(ids)}), "attention_mask", id="padding"),
    pytest.param(lambda ids: (ids, {"pad_token_id": int(ids[0, 2])}), "pad token", id="pad-in-prompt"),
]


@pytest.mark.parametrize("make,named", BAD_INPUTS)
def test_inputs_that_do_not_continue_the_cache_are_refused_before_model_work(ragged, make, named: str) -> None:
    model, compressed, ids = ragged
    input_ids, extra = make(ids)
    calls, handle = counted(model)
    try:
        with pytest.raises(ValueError, match=named):
            model.generate(input_ids, cache=compressed.fork(), max_new_tokens=3, **extra)
    finally:
        handle.remove()
    assert calls == []


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_either_name_of_the_cache_argument_continues_a_compressed_cache(ragged, name: str) -> None:
    """transformers 5.25 renamed ``past_key_values`` to ``cache``; a compressed cache passed under
    either name gives the same tokens and logits, and is checked the same way."""
    model, compressed, ids = ragged
    want = generate(model, ids, compressed.fork(), max_new_tokens=3, do_sample=False)
    got = model.generate(
        ids, **{name: compressed.fork()}, max_new_tokens=3, do_sample=False, return_dict_in_generate=True,
        output_logits=True, output_scores=True,
    )  # fmt: skip
    assert_same_as_reference(got, want)
    state = compressed.fork()
    model.generate(ids, **{name: state}, max_new_tokens=1, do_sample=False)
    with pytest.raises(ValueError, match=f"^{name} was already extended by 1 tokens"):
        model.generate(ids, **{name: state}, max_new_tokens=1)


def test_an_extended_cache_is_refused_before_model_work(ragged) -> None:
    model, compressed, ids = ragged
    state = compressed.fork()
    model.generate(ids, cache=state, max_new_tokens=2, do_sample=False)
    calls, handle = counted(model)
    try:
        with pytest.raises(ValueError, match=r"already extended by 2 tokens.*fork\(\)"):
            model.generate(ids, cache=state, max_new_tokens=2)
    finally:
        handle.remove()
    assert calls == []


def test_query_agnostic_cache_without_a_question_is_refused() -> None:
    model = tiny_llama(34, layers=2)
    context = random_ids(24, seed=42)
    compressed = Pipeline("greedy", "attention_mass", "mean", POLICIES["uniform"]).compress(
        model, context, query_aware=False
    )
    with pytest.raises(ValueError, match="question"):
        model.generate(context, cache=compressed.fork(), max_new_tokens=3)


def test_model_calls_that_bypass_the_checks_are_still_refused_at_the_wrong_position(ragged) -> None:
    """Without the checked ``generate`` (transformers' class method called directly), the forward
    hook still places tokens at the cache's positions and refuses inconsistent ones."""
    from transformers import GenerationMixin

    model, compressed, ids = ragged
    with pytest.raises(ValueError, match="rows"):
        GenerationMixin.generate(model, ids, cache=compressed.fork(), max_new_tokens=2, num_beams=2)
    state = compressed.fork()
    with pytest.raises(ValueError, match="position_ids"):
        model(ids[:, -1:], cache=state, position_ids=torch.tensor([[ids.shape[1]]]))
    assert not state.damaged and state.extended == 0
    logits = model(ids[:, -1:], cache=state).logits[0, -1].float()
    want = reference_logits(model, ids[:, :-1], keep_masks(compressed), [ids[:, -1:]])[0]
    torch.testing.assert_close(logits, want, **TOL)
    assert state.extended == 1


def test_pipeline_generate_and_decode_pass_generate_options_through() -> None:
    model = tiny_llama(31, layers=2)
    pipeline = Pipeline("greedy", "attention_mass", "mean", POLICIES["per_head"])
    ids = random_ids(28, seed=41)
    options = {"do_sample": True, "temperature": 0.8, "top_k": 10}
    torch.manual_seed(3)
    sampled = pipeline.generate(model, ids, 6, **options)
    compressed = pipeline.compress(model, ids)
    torch.manual_seed(3)
    direct = generate(model, ids, compressed.fork(), max_new_tokens=6, eos_token_id=[], pad_token_id=0, **options)
    assert sampled.token_ids.tolist() == direct.sequences[0, ids.shape[1] :].tolist()
    torch.testing.assert_close(sampled.first_logits, direct.logits[0][0], rtol=0, atol=0)
    greedy = decode(model, compressed, max_new_tokens=6)
    assert greedy.token_ids.tolist() != sampled.token_ids.tolist(), "the options changed the decoding"


def test_cache_operations_that_ignore_positions_are_refused(ragged) -> None:
    _, compressed, _ = ragged
    state = compressed.fork()
    assert not state.is_croppable, "transformers must not defer its stop check by cropping"
    for call in (lambda: state.crop(1), lambda: state.reorder_cache(torch.tensor([0]))):
        with pytest.raises(NotImplementedError):
            call()
    for call in (lambda: state.batch_repeat_interleave(2), lambda: state.batch_select_indices(torch.tensor([0]))):
        with pytest.raises(NotImplementedError, match="one sequence each|compressed.rows"):
            call()


# ---------------------------------------------------------------------------------------------
# Review findings: a cache fed around the bookkeeping, other attention, options, memory, pickling


def test_a_cache_fed_outside_generate_or_left_damaged_is_refused_with_its_forks(ragged) -> None:
    """lorekv's own ``forward`` on a fork, or a failed call, stores entries the position bookkeeping
    does not know; a fork of such a cache inherits the refusal instead of feeding positions twice."""
    model, compressed, ids = ragged
    fed = compressed.fork()
    forward(model, ids[:, -1:], fed, torch.arange(compressed.start, compressed.start + 1))
    assert fed.extended == 0 and fed.stored_past_next()
    damaged = compressed.fork()
    damaged.damaged = True
    for state in (fed, fed.fork(), damaged, damaged.fork()):
        calls, handle = counted(model)
        try:
            with pytest.raises(ValueError, match=r"at or past its next position .*fork\(\)"):
                model.generate(ids, cache=state, max_new_tokens=2)
        finally:
            handle.remove()
        assert calls == []
    assert not compressed.stored_past_next(), "the compressed cache itself was never fed"


def test_generate_with_another_attention_implementation_is_refused(ragged) -> None:
    """transformers' own attention masks by slot, not position: padded ragged slots would show."""
    model, compressed, ids = ragged
    model.set_attn_implementation("sdpa")
    try:
        with pytest.raises(ValueError, match=r"attention implementation is 'sdpa'.*prepare"):
            model.generate(ids, cache=compressed.fork(), max_new_tokens=2)
    finally:
        model.set_attn_implementation("lorekv")


def test_options_lorekv_sets_are_refused_and_a_generation_config_is_followed(ragged) -> None:
    from transformers import GenerationConfig

    model, compressed, _ = ragged
    for option in ("return_dict_in_generate", "attention_mask", "past_key_values"):
        with pytest.raises(ValueError, match=f"{option}: set by lorekv's decoding"):
            decode(model, compressed, None, 3, **{option: True})
    sampled = GenerationConfig(do_sample=True, temperature=1.5, top_k=0)
    runs = []
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        runs.append(decode(model, compressed, None, 6, generation_config=sampled).token_ids.tolist())
    greedy = decode(model, compressed, None, 6).token_ids.tolist()
    assert any(run != greedy for run in runs) and len({tuple(r) for r in runs}) > 1, "sampling as configured"


def test_generate_options_are_refused_before_the_compression(ragged) -> None:
    model, _, ids = ragged
    pipeline = Pipeline(FUTURES, "projected_loo", "mean", POLICIES["uniform"])
    calls, handle = counted(model)
    try:
        with pytest.raises(ValueError, match="num_beams=2"):
            pipeline.generate(model, ids, 4, num_beams=2)
        with pytest.raises(ValueError, match="output_logits"):
            pipeline.generate(model, ids, 4, output_logits=True)
    finally:
        handle.remove()
    assert calls == [], "refused before the prefill"


def test_room_reserved_for_an_answer_is_bounded_and_grows_when_needed() -> None:
    """A large max_new_tokens that stops early allocates about what it used; an answer longer
    than the first reservation (which then doubles) decodes exactly as with all room reserved."""
    from lorekv.hf import generation

    model = tiny_llama(31, layers=2)
    compressed, ids = compressed_and_ids(model, POLICIES["uniform"], query_aware=True)
    before = compressed.allocated_bytes()
    state = compressed.fork()
    model.generate(ids, cache=state, max_new_tokens=400, eos_token_id=[], pad_token_id=0,
                   stopping_criteria=StoppingCriteriaList([StopAfterSteps(2)]))  # fmt: skip
    per_slot_all_layers = before // compressed.layers[0].keys.shape[2]
    assert state.allocated_bytes() <= before + (generation.RESERVED_TOKENS + 1) * per_slot_all_layers
    long = generate(model, ids, compressed.fork(), max_new_tokens=300, do_sample=False, eos_token_id=[], pad_token_id=0)
    old = generation.RESERVED_TOKENS
    generation.RESERVED_TOKENS = 10_000
    try:
        roomy = generate(model, ids, compressed.fork(), max_new_tokens=300, do_sample=False, eos_token_id=[],
                         pad_token_id=0)  # fmt: skip
    finally:
        generation.RESERVED_TOKENS = old
    assert_same_as_reference(long, roomy)


class StopAfterSteps(StoppingCriteria):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.steps -= 1
        return torch.full((input_ids.shape[0],), self.steps <= 0, dtype=torch.bool)


def test_a_prepared_model_pickles_and_still_checks_generate(ragged) -> None:
    import pickle

    model, compressed, ids = ragged
    again = pickle.loads(pickle.dumps(model))
    with pytest.raises(ValueError, match="num_beams=2"):
        again.generate(ids, cache=compressed.fork(), max_new_tokens=2, num_beams=2)
