"""The grid's ``decoding`` mode: each method a decoding schedule, every row what transformers'
``generate`` writes with that schedule's cache; its validation before any work."""

from __future__ import annotations

import pytest
import torch
import yaml
from tiny_models import random_ids, tiny_gemma3, tiny_llama, word_tokenizer

from lorekv.eval.grid import Budget, GridConfig, MethodSpec, Unit
from lorekv.eval.harness import read_results, run_grid
from lorekv.eval.shared import Cell, run_units
from lorekv.eval.tasks import parse_task
from lorekv.hf import cache_bytes, full_cache, full_cache_bytes, left_pad
from lorekv.models.tokens import end_of_turn_ids
from lorekv.schedule import DecodingSchedule

METHODS = [
    MethodSpec.model_validate("full"),
    MethodSpec(name="snapkv", preset="snapkv", options={"window": 4}, buffer=6),
    MethodSpec(name="lore_kv", preset="lore_kv", buffer=8),
    MethodSpec(name="streaming_llm", preset="streaming_llm", buffer=8),
    MethodSpec(name="decoding_press", preset="knorm", buffer=3),
]
CELLS = [Cell(m, Budget() if m.is_full else Budget(tokens=12)) for m in METHODS]


class Sample:
    """The parts of a task sample the decoding mode reads, over random token ids."""

    def __init__(self, ids: torch.Tensor, max_new_tokens: int = 40) -> None:
        self.ids, self.max_new_tokens = ids, max_new_tokens
        self.task, self.seed, self.metric, self.answers = "list_recall", 3, "in_order", ("w7", "w12")
        self.suite, self.tags = None, {}

    def prompt_ids(self, tokenizer) -> torch.Tensor:
        return self.ids

    def score(self, prediction: str) -> float:
        return float("w7" in prediction.split())


def unit(index: int) -> Unit:
    return Unit("tiny", "decoding", 300, parse_task("list_recall"), index)


@pytest.mark.parametrize("make_model", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3"])
def test_every_row_is_what_generate_writes_with_its_schedules_cache(make_model) -> None:
    """Each bounded row's answer is transformers' own ``generate`` on the schedule's cache, the
    full row generate's on its own; ``kept`` the bound's peak; the bytes those of transformers'
    cache holding every token fed, and of the bounded cache."""
    model, tokenizer = make_model(), word_tokenizer()
    sample = Sample(random_ids(30, seed=4))
    rows: list[dict] = []
    run_units(model, tokenizer, [unit(0)], [sample], CELLS, rows.append)
    eos = end_of_turn_ids(tokenizer)
    assert [r["method"] for r in rows] == [m.name for m in METHODS] and all(r["mode"] == "decoding" for r in rows)
    for cell, row in zip(CELLS, rows, strict=True):
        options = {"max_new_tokens": 40, "do_sample": False, "eos_token_id": eos}
        if cell.method.is_full:
            cache = full_cache(model)
        else:
            schedule = DecodingSchedule.from_config(cell.method.schedule(12))
            cache = schedule.cache(model)
        out = model.generate(sample.ids, attention_mask=torch.ones_like(sample.ids), cache=cache, **options)
        answer = out[0, 30:]
        assert row["prediction"] == tokenizer.decode(answer, skip_special_tokens=True), cell.method.name
        fed = 30 + len(answer) - 1
        assert row["candidates"] == fed and row["tokens"] == 30
        if cell.method.is_full:
            assert row["kept"] == fed and row["budget"] is None
            assert row["kv_bytes_before"] == row["kv_bytes_after"] == cache_bytes(cache)
            continue
        assert row["budget"] == 12 and row["kept"] == cache.bound.peak[0], cell.method.name
        assert 30 <= row["kept"] <= max(30, 12 + schedule.buffer), "the prompt is prefilled whole, then bounded"
        assert row["kv_bytes_after"] == cache.allocated_bytes() and row["kv_bytes_before"] == full_cache_bytes(
            model, fed
        )
        assert 0 < row["compression_seconds"] < row["seconds"]["decode"], (cell.method.name, cache.bound.compressions)
        assert cache.bound.compressions[0] >= 1


def test_a_batch_of_decoding_units_answers_as_each_unit_alone() -> None:
    """Prompts of different lengths, left-padded into one batch, each row compressed on its own
    schedule: every row is that of its unit alone, but for its times and its share of the
    batch's bytes."""
    model, tokenizer = tiny_llama(), word_tokenizer()
    samples = [Sample(random_ids(n, seed=n)) for n in (30, 22, 27)]
    units = [unit(i) for i in range(3)]
    alone: list[dict] = []
    for u, s in zip(units, samples, strict=True):
        run_units(model, tokenizer, [u], [s], CELLS, alone.append)
    batched: list[dict] = []
    run_units(model, tokenizer, units, samples, CELLS, batched.append)
    assert len(batched) == len(alone) == 3 * len(CELLS) and len({r["tokens"] for r in batched}) == 3
    by_id = {r["id"]: r for r in alone}
    for row in batched:
        expected = by_id[row["id"]]
        for field in ("seconds", "compression_seconds", "kv_bytes_after"):
            row.pop(field), expected.pop(field)
        assert row == expected


def decoding_grid(**change) -> dict:
    return {
        "name": "tiny_decoding",
        "models": ["tiny"],
        "methods": ["full", "streaming_llm", {"name": "lore_kv_r4", "preset": "lore_kv", "set": {"policy.recent": 4}}],
        "budgets": [16],
        "tasks": ["list_recall"],
        "lengths": [256],
        "modes": ["decoding"],
        "samples": 1,
        **change,
    }


def test_a_decoding_grid_runs_and_records_each_schedule(tmp_path) -> None:
    grid = GridConfig.model_validate(decoding_grid())
    out = run_grid(grid, tmp_path / "r.jsonl", loader=lambda name, g: (tiny_llama(context=1024).float(),
                   word_tokenizer()), progress=False)  # fmt: skip
    rows, (header,) = read_results([out])
    assert {r["method"] for r in rows} == {"full", "streaming_llm", "lore_kv_r4"} and len(rows) == 3
    assert all(r["mode"] == "decoding" and r["metric"] == "in_order" for r in rows)
    schedule = header["pipelines"]["lore_kv_r4|B=16|decoding"]
    assert schedule["buffer"] == 64 and schedule["method"]["policy"]["recent"] == 4
    assert header["pipelines"]["streaming_llm|B=16|decoding"]["method"]["policy"]["name"] == "uniform"


def test_a_method_runs_as_its_decoding_preset() -> None:
    """A preset in decoding mode is :meth:`DecodingSchedule.preset`'s: the reference's buffer, the
    protected window of LORE-KV's futures, B per KV head for its fitted surrogate; then ``set``."""
    assert MethodSpec.model_validate("rkv").schedule(32).buffer == 128
    lore = MethodSpec.model_validate("lore_kv").schedule(32)
    assert lore.buffer == 64 and lore.method.policy.recent == 8
    reference = DecodingSchedule.preset("lore_kv", 32).config
    assert lore.method == reference.method.for_mode(True) and lore.buffer == reference.buffer
    fast = MethodSpec.model_validate("lore_kv_fast").schedule(32).method.policy
    assert (fast.name, fast.budget, fast.recent) == ("uniform", 32, 8)
    tuned = MethodSpec(name="x", preset="knorm", buffer=10, set={"policy.sink": 2}).schedule(32)
    assert tuned.buffer == 10 and tuned.method.policy.sink == 2 and tuned.method.policy.budget == 32
    assert MethodSpec(name="s", preset="lore_kv", seeds=[5]).schedule(32, seed=5).method.sampler.seed == 5


def test_grids_without_decoding_resolve_as_before() -> None:
    plain = {**decoding_grid(), "modes": ["query_aware"]}
    assert not any(key.endswith("|decoding") for key in GridConfig.model_validate(plain).pipelines())


@pytest.mark.parametrize(
    "change,match",
    [
        ({"ratios": [0.5]}, "ratios: decoding mode"),
        ({"methods": ["full", "h2o"]}, "method h2o at B=16: .*window"),
        ({"methods": ["full", "kvzip"]}, "method kvzip at B=16: sampler 'kvzip'"),
        (
            {"methods": ["full", {"name": "x", "preset": "snapkv", "options": {"window": 8}, "buffer": 4}]},
            "x at B=16: buffer",
        ),
        ({"methods": [{"name": "full", "buffer": 8}]}, "takes no .*buffer"),
        ({"modes": ["query_aware"], "methods": [{"name": "x", "preset": "tova", "buffer": 8}]}, "buffer applies to"),
        ({"methods": [{"name": "x", "preset": "tova", "buffer": 0}]}, "buffer"),
    ],
)
def test_bad_decoding_grids_are_refused_before_any_work(tmp_path, change, match) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(decoding_grid(**change)))
    with pytest.raises(ValueError, match=match):
        GridConfig.from_file(path)


def test_full_cache_bytes_are_what_transformers_cache_holds() -> None:
    from lorekv.hf import generate_full, generate_full_batch

    for model in (tiny_llama(), tiny_gemma3(window=6)):
        ids = random_ids(20, seed=2)
        cache = full_cache(model)
        model.generate(ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=5,
                       do_sample=False)  # fmt: skip
        assert cache_bytes(cache) == full_cache_bytes(model, 24)
    rows = [random_ids(n, seed=n) for n in (12, 9)]
    ids, mask = left_pad(rows)
    batched = generate_full_batch(model, ids, mask, 6)
    for row, generation in zip(rows, batched, strict=True):
        alone = generate_full(model, row, 6)
        assert torch.equal(generation.token_ids, alone.token_ids)
        torch.testing.assert_close(generation.first_logits, alone.first_logits, rtol=1e-9, atol=1e-9)
    schedule = DecodingSchedule.preset("streaming_llm", 8)
    with pytest.raises(ValueError, match="cache must be an empty cache"):
        generate_full_batch(model, ids, mask, 6, decoding=schedule, cache=full_cache(model))
