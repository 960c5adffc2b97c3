"""Each row of a left-padded batch equals that row alone, at the edges of ragged batches (issue 33).

The oracle: row i of a batch compressed and answered together is what the same pipeline gives
for row i alone (batch 1, no padding): the same futures (tokens, log-probs, entropies, captured
queries and keys), the same kept sets, stats and cache entries (positions, keys, values), the
same first-answer logits (to 1e-9 in float64) and greedy tokens, each row stopping at its own
eos. Where a row's budget keeps every candidate, its answer must also equal the model's own
forward and ``generate`` on that row with transformers' own cache: a bug shared by the batch and
the row alone (a sliding layer's slots, a position) cannot hide behind the first oracle there.

Row lengths are drawn across the edges the earlier batch tests never reached: 1 and 2 tokens,
the observation window w (a row shorter than the logits the prefill keeps, w + 1), the sliding
window of the tiny Gemma 3 (its local layers hold window - 1 slots) and one past it, one row many
times longer than the others, every row equal; budgets from the smallest a preset accepts to
above every row.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import CharTokenizer, random_ids, surrogate_for, tiny_gemma3, tiny_llama

from lorekv.hf import PADDING, CompressedCache, Generation, decode, decode_batch, left_pad, prepare
from lorekv.pipeline import Pipeline
from lorekv.presets import PRESETS, preset
from lorekv.trajectories import FutureMixture, Trajectories

WINDOW = 3
"""The observation window of the window presets (SnapKV's family, LAQ, CriticalKV) here."""
SLIDING = 6
"""The tiny Gemma 3's sliding window: its local layers hold SLIDING - 1 slots."""
LONGEST = 48
ANSWER = 3
OPTIONS = {
    "window": WINDOW,
    "draft_window": WINDOW,
    "num_futures": 2,
    "num_tokens": 3,
    "question_tokens": 3,
    "answer_tokens": 2,
    "sink": 2,
    "chunk_size": 16,
}
"""Small futures and windows, so that the edges are a few tokens away (each preset takes its own)."""

TOKENIZER = CharTokenizer()
MODES = {"query-aware": True, "query-agnostic": False}


@functools.cache
def models() -> dict[str, torch.nn.Module]:
    """Shared by every test of the module (built once: hypothesis runs many examples per test)."""
    return {"llama": prepare(tiny_llama(81, layers=2)), "gemma3": prepare(tiny_gemma3(82, window=SLIDING))}


def options(name: str, arch: str) -> dict[str, Any]:
    parameters = inspect.signature(PRESETS[name]).parameters
    chosen: dict[str, Any] = {key: value for key, value in OPTIONS.items() if key in parameters}
    if "surrogate" in parameters:  # a fitted file is refused by every other model
        chosen["surrogate"] = surrogate_for(models()[arch])
    return chosen


def pipeline(name: str, budget: int, arch: str = "llama") -> Pipeline:
    return Pipeline.from_config(preset(name, budget, **options(name, arch)))


@functools.cache
def smallest_budget(name: str) -> int:
    """The smallest budget the preset accepts for a row of any length here (its protected tokens fit)."""
    for budget in range(1, 4 * WINDOW):
        try:
            for tail in (0, 1):  # query-agnostic (every token a candidate) and query-aware
                pipeline(name, budget).policy.check_budget(LONGEST - tail, tail)
        except ValueError:
            continue
        return budget
    raise AssertionError(f"{name}: no budget below {4 * WINDOW} fits")


@functools.cache
def shortest_row(name: str, query_aware: bool) -> int:
    """The shortest prompt the preset compresses alone in this mode (the window presets need w tokens)."""
    model, method = models()["llama"], pipeline(name, smallest_budget(name))
    for n in range(1, 4 * WINDOW):
        try:
            method.check_input(model, random_ids(n), query_aware=query_aware, tokenizer=TOKENIZER)
        except ValueError:
            continue
        return n
    raise AssertionError(f"{name}: no prompt of fewer than {4 * WINDOW} tokens fits")


def rows_of(lengths: list[int], seed: int) -> list[torch.Tensor]:
    return [random_ids(n, seed=seed + 7 * i) for i, n in enumerate(lengths)]


# ------------------------------------------------------------------------------------------------
# The oracle


def assert_same(got: object, want: object, where: str) -> None:
    """Equal futures: tensors to 1e-9 (float) or exactly, dataclasses field by field, functions
    (the rotary tables) by their values."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == want.shape, f"{where}: shape"
        if want.dtype.is_floating_point:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-9, msg=lambda m: f"{where}: {m}")
        else:
            assert torch.equal(got, want), f"{where}: {got.tolist()} != {want.tolist()}"
    elif dataclasses.is_dataclass(want):
        assert type(got) is type(want), where
        for field in dataclasses.fields(want):
            assert_same(getattr(got, field.name), getattr(want, field.name), f"{where}.{field.name}")
    elif callable(want):  # the rotary tables: the same on a few positions
        assert callable(got), where
        assert_same(got(torch.arange(4)), want(torch.arange(4)), f"{where}(positions)")
    elif isinstance(want, dict):  # the prompt features, by name
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: names"
        for name in want:
            assert_same(got[name], want[name], f"{where}[{name!r}]")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), f"{where}: length"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def cache_rows(cache: CompressedCache, row: int) -> list[list[tuple[list[int], torch.Tensor, torch.Tensor]]]:
    """Each layer's real entries per KV head of one row, sorted by position: positions, keys, values."""
    out = []
    for layer in cache.layers:
        if not layer.is_initialized:
            out.append([])
            continue
        r = row if layer.positions.shape[0] > 1 else 0
        heads = []
        for positions, keys, values in zip(layer.positions[r], layer.keys[r], layer.values[r], strict=True):
            real = positions != PADDING
            order = positions[real].argsort()
            heads.append((positions[real][order].tolist(), keys[real][order], values[real][order]))
        out.append(heads)
    return out


def stats_without_times(stats) -> dict:
    out = stats.to_dict()
    del out["seconds"]
    return out


def questions_of(lengths: list[int], seed: int) -> list[torch.Tensor]:
    return [random_ids(q, seed=seed + 11 * i) for i, q in enumerate(lengths)]


def assert_compressed_as_alone(batch: CompressedCache, i: int, single: CompressedCache, n: int) -> None:
    """Row i of ``batch`` against the row compressed alone: kept sets, stats, cache entries."""
    kept = [[sorted(h.tolist()) for h in heads] for heads in batch.selections[i].indices]
    assert kept == [[sorted(h.tolist()) for h in heads] for heads in single.selection.indices], f"row {i}: kept"
    got, want = stats_without_times(batch.row_stats[i]), stats_without_times(single.stats)
    weights = got.pop("future_weights"), want.pop("future_weights")
    assert got == want, f"row {i}: stats (kept counts and bytes)"
    assert weights[0] == pytest.approx(weights[1], abs=1e-9)
    for layer, (got_heads, want_heads) in enumerate(zip(cache_rows(batch, i), cache_rows(single, 0), strict=True)):
        assert len(got_heads) == len(want_heads)
        for (gp, gk, gv), (wp, wk, wv) in zip(got_heads, want_heads, strict=True):
            assert gp == wp, f"row {i}, layer {layer}: the cache holds what the row alone holds"
            assert all(0 <= p < n for p in gp), "no padding slot kept"
            torch.testing.assert_close(gk, wk, rtol=0, atol=1e-9)
            torch.testing.assert_close(gv, wv, rtol=0, atol=1e-9)


def assert_keeping_everything_is_the_model(model: torch.nn.Module, full: torch.Tensor, answer: Generation) -> None:
    """An answer from a cache that kept every candidate against the model's own forward and
    ``generate`` on ``full`` (1, m) (the prompt, or the context then the question), with
    transformers' own cache and attention."""
    own = model(full).logits[0, -1].float()
    torch.testing.assert_close(answer.first_logits, own, rtol=0, atol=1e-9)
    tokens = model.generate(
        full, attention_mask=torch.ones_like(full), max_new_tokens=ANSWER, do_sample=False, eos_token_id=[],
        pad_token_id=0,
    )  # fmt: skip
    assert answer.token_ids.tolist() == tokens[0, full.shape[1] :].tolist()


def assert_rows_answer_as_alone(
    model: torch.nn.Module,
    method: Pipeline,
    rows: list[torch.Tensor],
    query_aware: bool,
    questions: list[torch.Tensor] | None,
    eos_at: tuple[int, int] | None = None,
) -> list[torch.Tensor]:
    """The whole oracle for one batch (``eos_at``: the row and step of an alone answer whose token
    is the eos); returns each row's first-answer logits."""
    ids, mask = left_pad(rows)
    sampler = method.sampler_for(query_aware)
    batch_futures = sampler.futures_batch(
        method.prefill(model, ids, attention_mask=mask, query_aware=query_aware, tokenizer=TOKENIZER)
    )
    batch = method.compress(model, ids, attention_mask=mask, query_aware=query_aware, tokenizer=TOKENIZER)
    assert batch.lengths == tuple(r.shape[1] for r in rows)
    assert batch.kept_bytes() == sum(s.bytes_kept for s in batch.row_stats)

    answers_alone = []
    for i, row in enumerate(rows):
        futures = sampler.futures_batch(method.prefill(model, row, query_aware=query_aware, tokenizer=TOKENIZER))[0]
        assert isinstance(futures, (Trajectories, FutureMixture))
        assert_same(batch_futures[i], futures, f"row {i} futures")
        single = method.compress(model, row, query_aware=query_aware, tokenizer=TOKENIZER)
        assert_compressed_as_alone(batch, i, single, row.shape[1])
        answers_alone.append(decode(model, single, None if query_aware else questions[i], ANSWER))

    eos = None if eos_at is None else int(answers_alone[eos_at[0] % len(rows)].token_ids[eos_at[1] % ANSWER])
    if questions is None:
        answers = decode_batch(model, batch, max_new_tokens=ANSWER, eos_token_id=eos)
    else:
        answers = decode_batch(model, batch, *left_pad(questions), ANSWER, eos_token_id=eos)
    for i, (answer, single) in enumerate(zip(answers, answers_alone, strict=True)):
        torch.testing.assert_close(answer.first_logits, single.first_logits, rtol=0, atol=1e-9)
        want = single.token_ids.tolist()
        if eos in want:
            want = want[: want.index(eos) + 1]
        assert answer.token_ids.tolist() == want, f"row {i}: greedy tokens, each row stopping at its own eos"
        if method.policy.config.budget >= row_candidates(rows[i], query_aware):
            full = rows[i] if query_aware else torch.cat([rows[i], questions[i]], 1)
            assert_keeping_everything_is_the_model(model, full, single)
    return [a.first_logits for a in answers]


def row_candidates(row: torch.Tensor, query_aware: bool) -> int:
    return row.shape[1] - (1 if query_aware else 0)


# ------------------------------------------------------------------------------------------------
# Every preset, both modes, both models, rows at every edge at once


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_preset_answers_each_edge_row_as_alone(arch: str, name: str, mode: str) -> None:
    """One batch per case: a row many times longer than the others, the shortest the preset takes
    (at the window presets, shorter than the prefill's kept logits), one past and at the sliding
    window; the budget keeps every candidate of the short rows and evicts from the long one."""
    query_aware = MODES[mode]
    shortest = shortest_row(name, query_aware)
    lengths = [LONGEST, shortest, SLIDING + 1, SLIDING]
    budget = max(smallest_budget(name), SLIDING + 1)
    method = pipeline(name, budget, arch)
    questions = None if query_aware else questions_of([1, 3, 2, 4], seed=300)
    first = assert_rows_answer_as_alone(models()[arch], method, rows_of(lengths, 100), query_aware, questions, (2, 1))
    assert min((first[0] - f).abs().max() for f in first[1:]) > 1e-3, "rows differ: the comparison can fail"


# ------------------------------------------------------------------------------------------------
# The same oracle on drawn batches


def edge_lengths(shortest: int) -> st.SearchStrategy[list[int]]:
    """Row lengths at the edges (at least ``shortest``): ragged, one many times longer, or all equal."""
    edges = sorted({1, 2, WINDOW, WINDOW + 1, SLIDING - 1, SLIDING, SLIDING + 1, 2 * SLIDING} - set(range(shortest)))
    one = st.sampled_from(edges) | st.integers(shortest, 2 * SLIDING) | st.integers(4 * SLIDING, LONGEST)
    ragged = st.lists(one, min_size=2, max_size=4)
    equal = st.tuples(one, st.integers(2, 3)).map(lambda pair: [pair[0]] * pair[1])
    return ragged | equal


@pytest.mark.parametrize("name", sorted(PRESETS))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawn_batches_answer_row_by_row_as_alone(name: str, data: st.DataObject) -> None:
    arch = data.draw(st.sampled_from(["llama", "gemma3"]), label="arch")
    mode = data.draw(st.sampled_from(sorted(MODES)), label="mode")
    query_aware = MODES[mode]
    lengths = data.draw(edge_lengths(shortest_row(name, query_aware)), label="lengths")
    smallest = smallest_budget(name)
    budget = data.draw(st.integers(smallest, max(smallest, max(lengths) + 2)), label="budget")
    widths = data.draw(st.lists(st.integers(1, 4), min_size=len(lengths), max_size=len(lengths)), label="questions")
    questions = None if query_aware else questions_of(widths, 7)
    eos_at = data.draw(st.none() | st.tuples(st.integers(0, 3), st.integers(0, ANSWER - 1)), label="eos at")
    rows = rows_of(lengths, data.draw(st.integers(0, 10**6), label="seed"))
    assert_rows_answer_as_alone(models()[arch], pipeline(name, budget, arch), rows, query_aware, questions, eos_at)


@pytest.mark.parametrize("name", sorted(PRESETS))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_a_batch_is_refused_exactly_when_one_of_its_rows_alone_is(name: str, data: st.DataObject) -> None:
    """``check_input`` (which compression runs before any model work) refuses a batch iff some row
    alone is refused, with that row's own error naming it; it accepts every other batch."""
    model = models()["gemma3"]
    query_aware = data.draw(st.booleans(), label="query_aware")
    lengths = data.draw(st.lists(st.integers(1, 2 * WINDOW + 1), min_size=2, max_size=4), label="lengths")
    method = pipeline(name, smallest_budget(name), "gemma3")
    rows = rows_of(lengths, 5)
    named = []
    for i, row in enumerate(rows):
        try:
            method.check_input(model, row, query_aware=query_aware, tokenizer=TOKENIZER)
        except ValueError as error:
            alone = str(error)
            named.append(alone.replace("row 0", f"row {i}") if "row 0" in alone else f"row {i}: {alone}")
    ids, mask = left_pad(rows)
    if not named:
        lengths_seen = method.check_input(model, ids, attention_mask=mask, query_aware=query_aware, tokenizer=TOKENIZER)
        assert lengths_seen == tuple(lengths)
        return
    with pytest.raises(ValueError) as caught:
        method.check_input(model, ids, attention_mask=mask, query_aware=query_aware, tokenizer=TOKENIZER)
    assert str(caught.value) in named


# ------------------------------------------------------------------------------------------------
# model.generate on a compressed batch


def batch_inputs(
    rows: list[torch.Tensor], questions: list[torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """What a user passes to ``model.generate``: the prompts (then the questions, each part
    left-padded on its own), the mask, and each row's own unpadded input."""
    ids, mask = left_pad(rows)
    if questions is None:
        return ids, mask, rows
    question_ids, question_mask = left_pad(questions)
    alone = [torch.cat([r, q], 1) for r, q in zip(rows, questions, strict=True)]
    return torch.cat([ids, question_ids], 1), torch.cat([mask, question_mask], 1), alone


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_model_generate_continues_each_row_of_a_compressed_batch_as_alone(data: st.DataObject) -> None:
    """Tokens and every step's raw logits of ``model.generate(ids, attention_mask=mask, cache=...)``
    on a compressed batch equal each row's own ``model.generate`` on its own compression, every row
    stopping at its own eos and padding after it; questions of different widths (query-agnostic)."""
    arch = data.draw(st.sampled_from(["llama", "gemma3"]), label="arch")
    name = data.draw(st.sampled_from(sorted(PRESETS)), label="preset")
    query_aware = MODES[data.draw(st.sampled_from(sorted(MODES)), label="mode")]
    lengths = data.draw(edge_lengths(shortest_row(name, query_aware)), label="lengths")
    smallest = smallest_budget(name)
    budget = data.draw(st.integers(smallest, max(smallest, max(lengths) + 2)), label="budget")
    widths = data.draw(st.lists(st.integers(1, 5), min_size=len(lengths), max_size=len(lengths)), label="questions")
    new = data.draw(st.integers(1, 4), label="max_new_tokens")
    model, method = models()[arch], pipeline(name, budget, arch)
    rows = rows_of(lengths, data.draw(st.integers(0, 10**6), label="seed"))
    questions = None if query_aware else questions_of(widths, 13)
    ids, mask, alone_inputs = batch_inputs(rows, questions)
    options = {"max_new_tokens": new, "do_sample": False, "pad_token_id": 0, "return_dict_in_generate": True}
    options["output_logits"] = True

    alone = []
    for row, full in zip(rows, alone_inputs, strict=True):
        compressed = method.compress(model, row, query_aware=query_aware, tokenizer=TOKENIZER)
        out = model.generate(full, attention_mask=torch.ones_like(full), cache=compressed, eos_token_id=[], **options)
        alone.append((out.sequences[0, full.shape[1] :].tolist(), [step[0] for step in out.logits]))
    at = data.draw(st.none() | st.tuples(st.integers(0, len(rows) - 1), st.integers(0, new - 1)), label="eos at")
    eos = [] if at is None else alone[at[0]][0][at[1]]

    prompt_ids, prompt_mask = left_pad(rows)
    compressed = method.compress(
        model, prompt_ids, attention_mask=prompt_mask, query_aware=query_aware, tokenizer=TOKENIZER
    )
    out = model.generate(ids, attention_mask=mask, cache=compressed, eos_token_id=eos, **options)
    width = ids.shape[1]
    for i, (tokens, logits) in enumerate(alone):
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        got = out.sequences[i, width:].tolist()
        assert got[: len(tokens)] == tokens, f"row {i}: tokens"
        assert set(got[len(tokens) :]) <= {0}, f"row {i}: a finished row only pads"
        for step, want in enumerate(logits[: len(tokens)]):
            torch.testing.assert_close(out.logits[step][i], want, rtol=0, atol=1e-9, msg=f"row {i}, step {step}")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_context_is_checked_per_row_at_the_models_exact_limit(arch: str, mode: str) -> None:
    """A row that fits by one token is accepted and one over is refused, naming the row, before any
    model work, by ``model.generate``, ``decode_batch`` and ``Pipeline.generate_batch`` alike; the
    padded width (the longest context plus the widest question, from different rows) never counts."""
    context = 40
    build = tiny_llama if arch == "llama" else tiny_gemma3
    model = prepare(build(83, context=context))
    query_aware = MODES[mode]
    method = pipeline("snapkv", 6)
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    for long_first in (True, False):
        lengths, widths = ([30, 8], [1, 20]) if long_first else ([8, 30], [20, 1])
        rows, questions = rows_of(lengths, 21), None if query_aware else questions_of(widths, 22)
        ids, mask, alone_inputs = batch_inputs(rows, questions)
        used = [full.shape[1] for full in alone_inputs]
        fits = context - max(used)  # every row fits with this many new tokens; the longest one by none
        over = used.index(max(used))
        if not query_aware:
            assert ids.shape[1] + fits > context, "the padded width alone would refuse the batch"
        prompt_ids, prompt_mask = left_pad(rows)
        question_ids, question_mask = (None, None) if query_aware else left_pad(questions)
        compressed = method.compress(model, prompt_ids, attention_mask=prompt_mask, query_aware=query_aware)

        out = model.generate(ids, attention_mask=mask, cache=compressed.fork(), max_new_tokens=fits, do_sample=False)
        assert out.shape == (2, ids.shape[1] + fits)
        answers = decode_batch(model, compressed, question_ids, question_mask, fits)
        answers_too = method.generate_batch(
            model, prompt_ids, fits, attention_mask=prompt_mask, question_ids=question_ids,
            question_mask=question_mask,
        )  # fmt: skip
        for i, row in enumerate(rows):
            single = method.compress(model, row, query_aware=query_aware)
            want = decode(model, single, None if query_aware else questions[i], fits)
            assert answers[i].token_ids.tolist() == want.token_ids.tolist() == answers_too[i].token_ids.tolist()

        calls.clear()
        refusal = rf"row {over}: .* needs {context + 1} positions; the model's context is {context}"
        with pytest.raises(ValueError, match=refusal):
            model.generate(ids, attention_mask=mask, cache=compressed.fork(), max_new_tokens=fits + 1)
        with pytest.raises(ValueError, match=refusal):
            decode_batch(model, compressed, question_ids, question_mask, fits + 1)
        with pytest.raises(ValueError, match=refusal):
            method.generate_batch(
                model, prompt_ids, fits + 1, attention_mask=prompt_mask, question_ids=question_ids,
                question_mask=question_mask,
            )  # fmt: skip
        assert not calls, "refused before any model work"
