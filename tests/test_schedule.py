"""Compression while generating (:mod:`lorekv.schedule`, :mod:`lorekv.hf.bounded`).

The strong check: every step of a bounded generation gives the logits of transformers' own
full cache (``DynamicCache``, the model's eager attention) with the entries the schedule had
dropped *at that step* hidden (:mod:`masked_reference`), so positions, the kept sets, the
futures' tokens never entering the cache and the row bookkeeping are all pinned by the model's
own computation. Then the bound itself, batches row by row, generate's options and refusals.
"""

from __future__ import annotations

import pytest
import torch
from masked_reference import KEEP, REFERENCE, masked_eager
from recording import attention_function
from tiny_models import random_ids, tiny_gemma3, tiny_llama
from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList

from lorekv import DecodingSchedule, Pipeline, ScheduleConfig, preset
from lorekv.hf import PADDING, evictable_layers, left_pad

BUDGET, BUFFER = 12, 6


@pytest.fixture(scope="module")
def model():
    return tiny_llama(7, layers=2, context=1024).eval()


def held_masks(cache, layers, total: int) -> dict[int, torch.Tensor]:
    """Layer -> (G, total) bool: the positions each KV head of a one-row cache holds."""
    out = {}
    for idx in layers:
        positions = cache.layers[idx].positions[0]
        mask = torch.zeros(positions.shape[0], total, dtype=torch.bool)
        for g, row in enumerate(positions):
            real = row[row != PADDING]
            mask[g, real] = True
        out[idx] = mask
    return out


@torch.no_grad()
def drive(model, cache, prompt: torch.Tensor, steps: int, feed: torch.Tensor | None = None):
    """Feed ``prompt`` then ``steps`` tokens one by one (greedy, or ``feed``'s), recording each
    step's logits and the positions held before it. Returns tokens, logits, held masks."""
    layers = evictable_layers(model)
    logits = model(prompt, cache=cache, attention_mask=torch.ones_like(prompt)).logits[0, -1].float()
    total = prompt.shape[1]
    tokens, out, masks = [], [logits], []
    for step in range(steps):
        token = logits.argmax().view(1, 1) if feed is None else feed[:, step : step + 1]
        masks.append(held_masks(cache, layers, total))
        logits = model(token, cache=cache).logits[0, -1].float()
        tokens.append(token)
        out.append(logits)
        total += 1
    return torch.cat(tokens, 1), out, masks


def reference_steps(model, prompt: torch.Tensor, tokens: torch.Tensor, masks) -> list[torch.Tensor]:
    """The full cache with the dropped entries hidden, step by step."""
    cache = DynamicCache(config=model.config)
    out = []
    try:
        with attention_function(model, REFERENCE, masked_eager):
            KEEP.clear()
            out.append(model(prompt, cache=cache, use_cache=True).logits[0, -1].float())
            for step, keep in enumerate(masks):
                KEEP.clear()
                KEEP.update(keep)
                out.append(model(tokens[:, step : step + 1], cache=cache, use_cache=True).logits[0, -1].float())
    finally:
        KEEP.clear()
    return out


SCHEDULES = {
    "snapkv": lambda: DecodingSchedule(preset("snapkv", BUDGET, window=4), buffer=BUFFER),
    "lore_kv": lambda: DecodingSchedule(preset("lore_kv", BUDGET, num_futures=2, num_tokens=3), buffer=BUFFER),
    "rkv": lambda: DecodingSchedule(preset("rkv", BUDGET, window=4), buffer=BUFFER),
    "streaming_llm": lambda: DecodingSchedule(preset("streaming_llm", BUDGET, sink=2), buffer=BUFFER),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_each_step_equals_the_full_cache_with_the_dropped_entries_hidden(model, name: str) -> None:
    schedule = SCHEDULES[name]()
    prompt = random_ids(20, seed=3)
    cache = schedule.cache(model)
    steps = 10 * BUDGET
    tokens, logits, masks = drive(model, cache, prompt, steps)
    expected = reference_steps(model, prompt, tokens, masks)
    for step, (got, want) in enumerate(zip(logits, expected, strict=True)):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4, msg=f"step {step}")
    bound = cache.bound
    assert bound.compressions[0] == 1 + steps // BUFFER  # the prompt pass, then every buffer tokens
    # after the first compression every head holds between B and B + buffer entries (a
    # future's tokens never: the masks cover the fed positions only), the recent window always
    recent = schedule.pipeline.policy.config.recent
    for step, keep in enumerate(masks[1:], start=1):
        for mask in keep.values():
            held = mask.sum(-1)
            assert bool(((held >= BUDGET) & (held <= BUDGET + BUFFER)).all()), (step, held)
            assert bool(mask[:, mask.shape[1] - recent :].all())
    assert bound.peak == [20]  # the prompt pass, then never above B + buffer


def test_cache_entries_and_bytes_stay_bounded_past_ten_times_the_budget(model) -> None:
    schedule = SCHEDULES["snapkv"]()
    prompt = random_ids(8, seed=4)
    cache = schedule.cache(model)
    layers = evictable_layers(model)
    out = model(prompt, cache=cache, attention_mask=torch.ones_like(prompt))
    slot = 2 * cache.layers[0].keys.shape[-1] * cache.layers[0].keys.element_size()
    bound_bytes = len(layers) * cache.layers[0].keys.shape[1] * (BUDGET + BUFFER) * slot
    for _ in range(12 * BUDGET):
        out = model(out.logits[:, -1:].argmax(-1), cache=cache)
        entries = [int((cache.layers[idx].positions != PADDING).sum(-1).max()) for idx in layers]
        assert max(entries) <= BUDGET + BUFFER
        assert cache.allocated_bytes() <= bound_bytes
    assert cache.row_positions.tolist() == [8 + 12 * BUDGET]


def test_generate_continues_the_bounded_cache_as_the_step_loop(model) -> None:
    prompt = random_ids(20, seed=5)
    tokens, logits, _ = drive(model, SCHEDULES["lore_kv"]().cache(model), prompt, 40)
    cache = SCHEDULES["lore_kv"]().cache(model)
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), cache=cache, max_new_tokens=41, do_sample=False,
        return_dict_in_generate=True, output_logits=True, eos_token_id=[], pad_token_id=0,
    )  # fmt: skip
    assert torch.equal(out.sequences[:, 20:-1], tokens)
    for step in (0, 20, 40):
        torch.testing.assert_close(out.logits[step][0], logits[step], atol=1e-5, rtol=1e-5)
    assert cache.bound.compressions == [1 + 40 // BUFFER]


def test_a_compressed_prompt_continues_bounded_in_both_modes(model) -> None:
    prompt = random_ids(30, seed=6)
    schedule = SCHEDULES["snapkv"]()
    for query_aware in (True, False):
        compressed = Pipeline.from_config(preset("snapkv", 10, window=4)).compress(
            model, prompt, query_aware=query_aware
        )
        cache = schedule.attach(model, compressed)
        assert cache is not compressed and compressed.bound is None
        assert cache.bound.held == [10]
        question = random_ids(3, seed=7) if not query_aware else None
        ids = prompt if question is None else torch.cat([prompt, question], 1)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=60, do_sample=False,
            eos_token_id=[], pad_token_id=0,
        )  # fmt: skip
        assert out.shape[1] == ids.shape[1] + 60
        assert max(cache.bound.peak) <= BUDGET + BUFFER
        assert cache.bound.compressions[0] >= 8


def test_rows_of_a_batch_are_compressed_as_alone(model) -> None:
    prompts = [random_ids(26, seed=8), random_ids(17, seed=9)]
    ids, mask = left_pad([p for p in prompts])
    schedule = SCHEDULES["lore_kv"]()
    cache = schedule.cache(model, batch_size=2)
    out = model.generate(
        ids, attention_mask=mask, cache=cache, max_new_tokens=50, do_sample=False, return_dict_in_generate=True,
        output_logits=True, eos_token_id=[], pad_token_id=0,
    )  # fmt: skip
    assert cache.bound.compressions[0] != cache.bound.compressions[1] or cache.bound.held[0] != cache.bound.held[1]
    for row, prompt in enumerate(prompts):
        alone = schedule.cache(model)
        single = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), cache=alone, max_new_tokens=50, do_sample=False,
            return_dict_in_generate=True, output_logits=True, eos_token_id=[], pad_token_id=0,
        )  # fmt: skip
        assert torch.equal(out.sequences[row, ids.shape[1] :], single.sequences[0, prompt.shape[1] :])
        for step in (0, 25, 49):
            torch.testing.assert_close(out.logits[step][row], single.logits[step][0], atol=2e-4, rtol=1e-4)
        assert cache.bound.compressions[row] == alone.bound.compressions[0]


def test_generate_options_sampling_streamer_and_stopping(model) -> None:
    class Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 70, dtype=torch.bool)

    class Count:
        tokens = 0

        def put(self, value):
            Count.tokens += value.numel()

        def end(self):
            pass

    prompt = random_ids(20, seed=10)
    cache = SCHEDULES["rkv"]().cache(model)
    torch.manual_seed(0)
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), cache=cache, max_new_tokens=200, do_sample=True,
        temperature=0.8, stopping_criteria=StoppingCriteriaList([Stop()]), streamer=Count(), eos_token_id=[],
        pad_token_id=0,
    )  # fmt: skip
    assert out.shape[1] == 70
    assert Count.tokens == 20 + 50  # the prompt, then every new token
    assert max(cache.bound.peak[0], BUDGET) <= 20 + 1 and cache.bound.held[0] <= BUDGET + BUFFER


def test_pipeline_generate_with_a_decoding_schedule(model) -> None:
    prompt = random_ids(30, seed=11)
    pipeline = Pipeline.from_config(preset("snapkv", 10, window=4))
    bounded = pipeline.generate(model, prompt, 80, decoding=SCHEDULES["snapkv"]())
    free = pipeline.generate(model, prompt, 80)
    assert bounded.token_ids.shape == free.token_ids.shape == (80,)
    torch.testing.assert_close(bounded.first_logits, free.first_logits)  # compressed prompt, first token alike


def test_gemma3_hybrid_bounds_its_full_attention_layers_only() -> None:
    model = tiny_gemma3(0).eval()
    schedule = DecodingSchedule(preset("snapkv", 8, window=2), buffer=4)
    cache = schedule.cache(model)
    prompt = random_ids(24, seed=12)
    model.generate(
        prompt, attention_mask=torch.ones_like(prompt), cache=cache, max_new_tokens=60, do_sample=False,
        eos_token_id=[], pad_token_id=0,
    )  # fmt: skip
    full = evictable_layers(model)
    assert cache.bound.layers == tuple(full)
    for idx, layer in enumerate(cache.layers):
        held = int((layer.positions != PADDING).sum(-1).max())
        assert held <= 12 if idx in full else layer.window is not None


@pytest.mark.parametrize(
    "method,buffer,match",
    [
        (preset("kvzip", 16), 64, "sampler 'kvzip' cannot draw"),
        (preset("ada_kv", 48, window=4), 64, "policy 'per_head'"),
        (preset("snapkv", 48, window=16), 8, "buffer must be >= the sampler's window"),
        (preset("h2o", 16), 64, "window 'all'"),
        (preset("streaming_llm", 4, sink=4), 8, "must exceed sink"),
        (
            preset("snapkv", 64, window=8).override({"scorer": {"name": "expected_attention"}}),
            64,
            "scorer 'expected_att",
        ),
        (preset("snapkv", 64, window=8).override({"scorer": {"name": "kvzip_plus"}}), 64, "scorer 'kvzip_plus'"),
    ],
)
def test_a_method_that_cannot_compress_while_generating_is_refused(method, buffer: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DecodingSchedule(method, buffer=buffer)


def test_refusals_before_any_work(model) -> None:
    with pytest.raises(ValueError, match="buffer"):
        DecodingSchedule(preset("snapkv", 16, window=4), buffer=0)
    prompt = random_ids(30, seed=13)
    ragged = Pipeline.from_config(preset("ada_kv", 10, window=4)).compress(model, prompt)
    with pytest.raises(ValueError, match="heads hold equal counts"):
        SCHEDULES["snapkv"]().attach(model, ragged)
    compressed = Pipeline.from_config(preset("snapkv", 10, window=4)).compress(model, prompt)
    fork = compressed.fork()
    model(prompt[:, -1:], cache=fork)
    with pytest.raises(ValueError, match="already extended"):
        SCHEDULES["snapkv"]().attach(model, fork)


def test_schedule_config_round_trips() -> None:
    schedule = DecodingSchedule.preset("decoding_press", 64)
    assert schedule.buffer == 10 and schedule.pipeline.scorer.config.name == "key_norm"
    assert DecodingSchedule.preset("rkv", 64).buffer == 128
    config = ScheduleConfig.model_validate_json(schedule.config.model_dump_json())
    assert config == schedule.config
    assert DecodingSchedule.from_config(config).config == schedule.config


@pytest.mark.parametrize("name", ["snapkv", "rkv", "lore_kv"])
def test_a_prompt_compressed_by_the_schedule_keeps_what_compress_keeps(model, name: str) -> None:
    """The first compression of a whole prompt is the method's own query-agnostic compression of it
    (every token a candidate, the window the prompt's last w tokens, futures from its last logits)."""
    schedule = SCHEDULES[name]()
    prompt = random_ids(30, seed=14)
    cache = schedule.cache(model)
    model(prompt, cache=cache, attention_mask=torch.ones_like(prompt))
    method = schedule.pipeline.config.override({"agnostic_sampler": None, "agnostic_scorer": None,
                                                "agnostic_policy": None})  # fmt: skip
    compressed = Pipeline.from_config(method).compress(model, prompt, query_aware=False)
    expected = compressed.selection.mask()
    for row, idx in enumerate(evictable_layers(model)):
        assert torch.equal(held_masks(cache, [idx], 30)[idx], expected[row])


def test_the_window_holds_the_queries_of_the_last_tokens_fed(model) -> None:
    """Layer 0's queries depend on the token and its position only: the recorded window must be the
    model's own queries of the last w tokens fed, at their real positions."""
    from recording import reference

    schedule = SCHEDULES["snapkv"]()
    prompt = random_ids(20, seed=15)
    cache = schedule.cache(model)
    tokens, _, _ = drive(model, cache, prompt, 9)  # one compression after the prompt, one at step 6
    sequence = torch.cat([prompt, tokens], 1)
    own = reference(model, sequence)[0]["query"]  # (H, q, d)
    torch.testing.assert_close(cache.bound.queries[0][0].float(), own[:, -4:].float(), atol=1e-5, rtol=1e-5)
    assert torch.equal(cache.bound.tokens[0], sequence[0, -4:])


def test_a_future_continues_the_row_at_its_real_positions(model) -> None:
    """A future drawn from a generating cache: its second token's log-prob is the model's own over
    the held entries with the first token fed at the row's next position."""
    from lorekv.hf.bounded import CacheRollout, real_entries

    schedule = SCHEDULES["lore_kv"]()
    prompt = random_ids(20, seed=16)
    cache = schedule.cache(model)
    tokens, logits, masks = drive(model, cache, prompt, 8)
    layers = evictable_layers(model)
    bound = cache.bound
    entries = {idx: real_entries(cache.layers[idx], None, 0, bound.held[0]) for idx in layers}
    rollout = CacheRollout(bound, cache, 0, entries, logits[-1].view(1, -1), 28)
    futures = rollout.decode(lambda x: x.argmax(-1), 1, 2)
    first, second = futures.token_ids[0].tolist()
    assert first == int(logits[-1].argmax())
    keep = held_masks(cache, layers, 28)
    fed = torch.cat([tokens, torch.tensor([[first]])], 1)
    expected = reference_steps(model, prompt, fed, [*masks, keep])[-1]
    assert second == int(expected.argmax())
    torch.testing.assert_close(futures.logprobs[0, 1], torch.log_softmax(expected, -1)[second], atol=2e-6, rtol=0)
    assert bound.held[0] == int((cache.layers[0].positions[0, 0] != PADDING).sum())  # nothing entered the cache


def test_each_rows_futures_start_from_its_own_state(model, monkeypatch: pytest.MonkeyPatch) -> None:
    from lorekv.hf.bounded import CacheRollout

    seen = []
    original = CacheRollout.__init__

    def spy(self, bound, cache, row, entries, last_logits, start):
        seen.append((row, last_logits.clone(), start))
        original(self, bound, cache, row, entries, last_logits, start)

    monkeypatch.setattr(CacheRollout, "__init__", spy)
    ids, mask = left_pad([random_ids(26, seed=17), random_ids(21, seed=18)])
    cache = SCHEDULES["lore_kv"]().cache(model, batch_size=2)
    with torch.no_grad():
        out = model(ids, cache=cache, attention_mask=mask)
    assert [row for row, _, _ in seen] == [0, 1]
    for row, logits, start in seen:
        torch.testing.assert_close(logits[0], out.logits[row, -1].float())
        assert start == [26, 21][row]


def surrogate_schedule(model) -> DecodingSchedule:
    """KVzap's way of decoding with a fitted map, B per KV head: each token scored once, when fed."""
    from tiny_models import surrogate_for

    method = preset("snapkv", BUDGET, window=1).override(
        {"scorer": {"name": "surrogate", "file": surrogate_for(model, seed=3)}, "policy.recent": 2}
    )
    return DecodingSchedule(method, buffer=BUFFER)


def test_a_surrogate_scores_every_held_token_from_what_was_recorded_when_it_was_fed(model, monkeypatch) -> None:
    from lorekv.hf.attention import QueryCapture

    recorded: dict[int, dict[int, torch.Tensor]] = {}  # layer -> position -> (G,) predictions
    original = QueryCapture.record_states

    def spy(self, module, hidden_states):
        original(self, module, hidden_states)
        if module.layer_idx in self.layers and self.state_maps:
            name = next(iter(self.state_maps))
            recorded.setdefault(module.layer_idx, {})["last"] = self.states[name][module.layer_idx][-1][0]

    monkeypatch.setattr(QueryCapture, "record_states", spy)
    schedule = surrogate_schedule(model)
    prompt = random_ids(20, seed=19)
    cache = schedule.cache(model)
    layers = evictable_layers(model)
    by_position: dict[int, dict[int, torch.Tensor]] = {idx: {} for idx in layers}
    with torch.no_grad():
        out = model(prompt, cache=cache, attention_mask=torch.ones_like(prompt))
        for idx in layers:
            for p in range(20):
                by_position[idx][p] = recorded[idx]["last"][p]
        for step in range(30):
            out = model(out.logits[:, -1:].argmax(-1), cache=cache)
            for idx in layers:
                by_position[idx][20 + step] = recorded[idx]["last"][0]
    assert cache.bound.compressions[0] == 1 + 30 // BUFFER
    for idx in layers:
        positions, slots = cache.layers[idx].positions[0], cache.bound.slots[idx][0, :, :, 0]
        for g in range(positions.shape[0]):
            for j, p in enumerate(positions[g].tolist()):
                assert p != PADDING and torch.equal(slots[g, j], by_position[idx][p][g])


def test_a_surrogate_compresses_a_whole_prompt_as_compress_does(model) -> None:
    schedule = surrogate_schedule(model)
    prompt = random_ids(30, seed=20)
    cache = schedule.cache(model)
    model(prompt, cache=cache, attention_mask=torch.ones_like(prompt))
    compressed = Pipeline.from_config(schedule.pipeline.config).compress(model, prompt, query_aware=False)
    expected = compressed.selection.mask()
    for row, idx in enumerate(evictable_layers(model)):
        assert torch.equal(held_masks(cache, [idx], 30)[idx], expected[row])
    with pytest.raises(ValueError, match="schedule.cache"):
        schedule.attach(model, compressed)


def test_the_lore_kv_decoding_preset_protects_its_newest_tokens() -> None:
    schedule = DecodingSchedule.preset("lore_kv", 64)
    assert schedule.pipeline.policy.config.recent == 8 and schedule.buffer == 64
    assert schedule.pipeline.sampler.config.name == "temperature"


def test_a_compression_that_fails_marks_the_cache_damaged(model, monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = SCHEDULES["snapkv"]()
    cache = schedule.cache(model)
    prompt = random_ids(30, seed=21)

    def fail(*args, **kwargs):
        raise RuntimeError("scorer out of memory")

    monkeypatch.setattr(schedule.pipeline, "score", fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        model(prompt, cache=cache, attention_mask=torch.ones_like(prompt))
    assert cache.damaged and cache.bound.held == [30] and cache.bound.compressions == [0]
    with pytest.raises(ValueError, match="incomplete"):
        model(prompt[:, :1], cache=cache)


def test_a_window_schedule_needs_the_token_ids(model) -> None:
    cache = SCHEDULES["snapkv"]().cache(model)
    embeds = model.get_input_embeddings()(random_ids(10, seed=22))
    with pytest.raises(ValueError, match="feed input_ids"):
        model(inputs_embeds=embeds, cache=cache)
