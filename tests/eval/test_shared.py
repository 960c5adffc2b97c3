"""The grid's shared work gives exactly the answers of independent ``Pipeline.generate`` calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tiny_models import random_ids, tiny_gemma3, tiny_llama, word_tokenizer

from lorekv import Pipeline, decode, generate_full
from lorekv.eval.grid import Budget, MethodSpec, Unit
from lorekv.eval.results import decode_keep_map
from lorekv.eval.shared import Cell, oracle_ids, run_unit, run_units
from lorekv.eval.tasks import parse_task
from lorekv.models.tokens import end_of_turn_ids


@dataclass(frozen=True)
class FakeSample:
    """The parts of a task sample the grid reads, over random token ids."""

    ids: torch.Tensor
    split: int
    answers: tuple[str, ...] = ("w7", "w12")
    metric: str = "part"
    max_new_tokens: int = 5
    seed: int = 3
    task: str = "niah_single"
    suite: str | None = None
    tags: tuple = ()

    def prompt_ids(self, tokenizer) -> torch.Tensor:
        return self.ids

    def context_and_question_ids(self, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[:, : self.split], self.ids[:, self.split :]

    def score(self, prediction: str) -> float:
        return float(any(a in prediction.split() for a in self.answers))

    def answer_positions(self, tokenizer) -> list[int]:
        return [4, 5]


METHODS = [
    MethodSpec.model_validate("full"),
    MethodSpec.model_validate("lore_kv"),
    MethodSpec(name="lore_kv_m2_loo", preset="lore_kv", options={"num_futures": 2}, set={"scorer.name": "loo"}),
    MethodSpec(name="lore_kv_reliability", preset="lore_kv", set={"aggregator": {"name": "reliability"}}),
    MethodSpec(name="lore_kv_oracle", preset="lore_kv", oracle=True),
    MethodSpec(name="window_control", preset="lore_kv", set={"sampler": {"name": "prompt_window", "window": 4}}),
    MethodSpec(name="snapkv", preset="snapkv", options={"window": 4}),
    MethodSpec(name="snapkv_w6", preset="snapkv", options={"window": 6}),
    MethodSpec(name="lore_kv_last_query", preset="lore_kv", set={"sampler.include_last_prompt_query": True}),
    MethodSpec(
        name="window_reliability",
        preset="lore_kv",
        set={"sampler": {"name": "prompt_window", "window": 5}, "aggregator": {"name": "reliability"}},
    ),
    MethodSpec(name="pyramidkv", preset="pyramidkv", options={"window": 4}),
    MethodSpec(name="ada_kv", preset="ada_kv", options={"window": 4}),
    MethodSpec(name="critical_kv", preset="critical_kv", options={"window": 4}),
    MethodSpec(name="laq", preset="laq", options={"window": 4, "draft_window": 4}),
    *(MethodSpec.model_validate(p) for p in ("tova", "streaming_llm", "greedy_lookahead", "knorm", "random", "h2o")),
    MethodSpec.model_validate("kvzip"),
]
BUDGETS = [Budget(tokens=8), Budget(tokens=16), Budget(ratio=0.75)]


def cells() -> list[Cell]:
    return [Cell(m, Budget() if m.is_full else b) for m in METHODS for b in ([None] if m.is_full else BUDGETS)]


def logits_of(rows: list[dict], monkeypatch) -> Callable[[dict], None]:
    """An ``emit`` that adds each row's first-token logits (``_logits``), read from the
    generations the grid decodes (rows are emitted in the order they were decoded)."""
    import lorekv.eval.shared as shared

    decoded: list = []
    real_batch, real_full = shared.decode_batch, shared.continue_full

    def decode_batch(*args, **kwargs):
        generations = real_batch(*args, **kwargs)
        decoded.extend(generations)
        return generations

    def continue_full(*args, **kwargs):
        decoded.append(real_full(*args, **kwargs))
        return decoded[-1]

    monkeypatch.setattr(shared, "decode_batch", decode_batch)
    monkeypatch.setattr(shared, "continue_full", continue_full)
    return lambda row: rows.append({**row, "_logits": decoded.pop(0).first_logits})


@pytest.mark.parametrize("mode", ["query_aware", "query_agnostic"])
@pytest.mark.parametrize("make_model", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3"])
def test_shared_work_answers_exactly_as_independent_generate_calls(make_model, mode, monkeypatch) -> None:
    """Every cell's kept set, first-token logits and answer equal those of its own ``compress`` +
    ``decode`` (the full cache: ``generate_full``, which prefills in one pass: logits to 1e-9)."""
    model, tokenizer = make_model(), word_tokenizer()
    sample = FakeSample(random_ids(48, seed=5), split=40)
    unit = Unit("tiny", mode, 48, parse_task("niah_single"), 0)
    rows: list[dict] = []
    run_unit(model, tokenizer, unit, sample, cells(), logits_of(rows, monkeypatch), keep_map=True)
    assert len(rows) == len(cells()) and len({r["id"] for r in rows}) == len(rows)

    eos = end_of_turn_ids(tokenizer)
    question = None if mode == "query_aware" else sample.ids[:, 40:]
    ids = sample.ids if question is None else sample.ids[:, :40]
    candidates = ids.shape[1] - (1 if question is None else 0)
    by_cell = {(r["method"], r["budget_label"]): r for r in rows}
    for cell in cells():
        row = by_cell[(cell.method.name, cell.budget.label)]
        if cell.method.is_full:
            expected = generate_full(model, sample.ids, sample.max_new_tokens, eos_token_id=eos)
            assert row["prediction"] == expected.text(tokenizer)
            torch.testing.assert_close(row["_logits"], expected.first_logits, rtol=1e-9, atol=1e-9)
            assert row["budget"] is None and row["keep_map"] is None and row["futures"] is None
            continue
        budget = cell.budget.resolve(candidates)
        config = cell.method.build(budget)
        if cell.method.oracle:
            config = config.override({"sampler": {"name": "oracle", "token_ids": [oracle_ids(sample, tokenizer)]}})
        pipeline = Pipeline.from_config(config)
        compressed = pipeline.compress(model, ids, query_aware=question is None, tokenizer=tokenizer)
        expected = decode(model, compressed, question, sample.max_new_tokens, eos_token_id=eos)
        assert torch.equal(row["_logits"], expected.first_logits), (cell.method.name, cell.budget.label)
        assert row["prediction"] == expected.text(tokenizer), (cell.method.name, cell.budget.label)
        mask = compressed.selection.mask()
        layers, kept = decode_keep_map(row["keep_map"])
        assert layers == list(compressed.selection.layer_indices)
        assert (kept == mask.numpy()).all(), (cell.method.name, cell.budget.label)
        assert row["budget"] == budget and row["kept"] == pytest.approx(np.mean(compressed.stats.kept))
        assert row["futures"] == len(compressed.stats.future_weights) >= 1
        assert row["compression_seconds"] == pytest.approx(
            sum(row["seconds"][k] for k in ("prefill", "sampling", "scoring", "selection"))
        )


@pytest.mark.parametrize("mode", ["query_aware", "query_agnostic"])
def test_the_full_cache_row_decodes_under_the_models_generation_config_as_generate_full(mode) -> None:
    """A generation config that reads the prompt (a repetition penalty) sees the real prompt in the
    full-cache row too, as in every compressed row: the baseline is decoded like the methods."""
    model, tokenizer = tiny_llama(), word_tokenizer()
    model.generation_config.repetition_penalty = 1.5
    sample = FakeSample(random_ids(48, seed=1), split=40, max_new_tokens=8)
    rows: list[dict] = []
    unit = Unit("tiny", mode, 48, parse_task("niah_single"), 0)
    run_unit(model, tokenizer, unit, sample, [Cell(METHODS[0], Budget())], rows.append)
    expected = generate_full(model, sample.ids, sample.max_new_tokens, eos_token_id=end_of_turn_ids(tokenizer))
    assert rows[0]["prediction"] == expected.text(tokenizer)


def assert_same_rows(batched: list[dict], alone: list[dict]) -> None:
    """Each batched row equals the row of the same id run alone, first-token logits included, but for its times."""
    by_id = {r["id"]: r for r in alone}
    for row in batched:
        expected = by_id[row["id"]]
        assert torch.equal(row.pop("_logits"), expected.pop("_logits")), row["id"]
        for times in ("seconds", "compression_seconds"):
            row.pop(times), expected.pop(times)
        assert row == expected


BATCH_METHODS = ["full", "lore_kv", "lore_kv_oracle", "laq", "h2o", "kvzip"]


@pytest.mark.parametrize(
    "make_model,mode",
    [(tiny_llama, "query_aware"), (tiny_llama, "query_agnostic"), (tiny_gemma3, "query_agnostic")],
    ids=["llama-query_aware", "llama-query_agnostic", "gemma3-query_agnostic"],
)
def test_a_batch_of_units_answers_as_each_unit_alone(make_model, mode, monkeypatch) -> None:
    """Prompts (and questions) of different lengths left-padded into one batch: every row, its
    first-token logits included, is that of the unit run alone, but for its times."""
    model, tokenizer = make_model(), word_tokenizer()
    samples = [FakeSample(random_ids(n, seed=n), split=n - q) for n, q in ((48, 8), (41, 5), (45, 6))]
    units = [Unit("tiny", mode, 48, parse_task("niah_single"), i) for i in range(3)]
    chosen = [c for c in cells() if c.method.name in BATCH_METHODS and c.budget.label in ("full", "B=8", "ratio=0.75")]
    alone: list[dict] = []
    for unit, sample in zip(units, samples, strict=True):
        run_unit(model, tokenizer, unit, sample, chosen, logits_of(alone, monkeypatch), keep_map=unit.index != 1)
    batched: list[dict] = []
    run_units(model, tokenizer, units, samples, chosen, logits_of(batched, monkeypatch), keep_maps=[True, False, True])
    assert len(batched) == 3 * len(chosen) and len({r["tokens"] for r in batched}) == 3
    assert_same_rows(batched, alone)


@pytest.mark.parametrize("oracle", [False, True])
def test_questions_on_one_context_share_its_compression_and_answer_as_alone(oracle, monkeypatch) -> None:
    """Query-agnostic units whose contexts are the same tokens (a benchmark row's questions) are
    prefilled and compressed once, then each question decodes as its unit alone would; with an
    oracle cell (its future is each question's answer) every question compresses its own copy."""
    import lorekv.eval.shared as shared

    model, tokenizer = tiny_llama(), word_tokenizer()
    context = random_ids(40, seed=11)
    samples = [
        FakeSample(torch.cat([context, random_ids(q, seed=q)], dim=1), split=40, answers=(f"w{q}",)) for q in (5, 8, 6)
    ]
    samples.insert(2, FakeSample(random_ids(46, seed=2), split=40))  # another context among them
    units = [Unit("tiny", "query_agnostic", 48, parse_task("niah_single"), i) for i in range(4)]
    names = ["full", "lore_kv", "h2o"] + (["lore_kv_oracle"] if oracle else [])
    chosen = [c for c in cells() if c.method.name in names and c.budget.label in ("full", "B=8", "ratio=0.75")]
    alone: list[dict] = []
    for unit, sample in zip(units, samples, strict=True):
        run_unit(model, tokenizer, unit, sample, chosen, logits_of(alone, monkeypatch))
    prefilled: list[int] = []
    real_prefill = shared.prefill
    monkeypatch.setattr(
        shared,
        "prefill",
        lambda model, ids, *a, **k: prefilled.append(ids.shape[0]) or real_prefill(model, ids, *a, **k),
    )
    batched: list[dict] = []
    run_units(model, tokenizer, units, samples, chosen, logits_of(batched, monkeypatch))
    assert prefilled == [4 if oracle else 2]
    assert len(batched) == len(alone) == 4 * len(chosen)
    assert_same_rows(batched, alone)
