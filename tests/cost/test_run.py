"""One end-to-end run on a tiny model produces every section, with medians and ratios that
follow from the raw runs it stores; the baselines compute what lorekv computes."""

from __future__ import annotations

import statistics

import pytest
import torch
from tiny_models import random_ids, tiny_gemma3, tiny_llama, word_tokenizer

from lorekv.cost.baselines import decode_steps, generate_from, generate_tokens, prefilled_cache
from lorekv.cost.prompts import batch_lengths, prompt_batch, prompt_of_length
from lorekv.cost.run import THROUGHPUTS, build_scorer
from lorekv.hf import ATTENTION_NAME, continue_full, forward, prepare, using_sdpa
from lorekv.hf.cache import PositionedCache

PER_LENGTH = ("n", "prefill", "compression", "memory", "futures", "scorers", "decode_steps", "decode", "ratios")


def _timings(node, path=()):
    """Every stored timing (a dict with runs and a median) in ``node``, with its path."""
    if isinstance(node, dict):
        if "runs" in node and "median" in node:
            yield path, node
        for key, value in node.items():
            yield from _timings(value, (*path, key))


def test_a_run_produces_every_section_at_the_exact_lengths(tiny_results) -> None:
    r = tiny_results
    assert list(r["lengths"]) == ["32", "64"]
    for key, length in r["lengths"].items():
        assert set(PER_LENGTH) <= set(length), key
        assert length["n"] == int(key)
        assert list(length["futures"]) == ["1", "2"]
        assert set(length["scorers"]) == {"attention_mass", "loo", "projected_loo"}
        assert all(kinds["compiled"] is None for kinds in length["scorers"].values()), "compile was off"
        phases = length["compression"]["lore_kv"]["phase_medians"]
        assert set(phases) == {"prefill", "sampling", "scoring", "selection"}
        memory = length["memory"]
        assert memory["prefill"] > 0 and memory["lore_kv"] >= memory["prefill"] * 0.5
        assert 0 < memory["kv_bytes_after"] <= memory["kv_bytes_before"]
        assert length["decode"]["generate"]["tokens"] == 3
    assert r["lengths"]["64"]["memory"]["kv_bytes_before"] > r["lengths"]["32"]["memory"]["kv_bytes_before"]
    assert r["compile"] is False
    assert r["threads"] == 1 and r["settings"]["lengths"] == [32, 64]
    assert len(r["load_average"]["start"]) == 3 and r["wall_seconds"] > 0
    assert {"cpu", "cores"} <= set(r["machine"]) and r["packages"]["torch"] == torch.__version__
    assert r["_log"][0].startswith("loading tiny") and any("n=64: decoding" in line for line in r["_log"])


def test_medians_and_ratios_follow_from_the_raw_runs(tiny_results) -> None:
    found = list(_timings(tiny_results))
    # per n: prefills, compressions, sweep, scorers, steps, decodes, batch sizes
    assert len(found) == 2 * (2 + 2 + 2 * 2 + 3 + 1 + 4 * 2 + 4)
    for path, timing in found:
        assert len(timing["runs"]) == 1 and timing["median"] == statistics.median(timing["runs"]), path
        assert timing["first"] > 0, path
    for length in tiny_results["lengths"].values():
        ratios = length["ratios"]
        tf = length["prefill"]["transformers"]["median"]
        lore = length["compression"]["lore_kv"]
        assert ratios["lore_kv_over_transformers_prefill"] == lore["median"] / tf
        assert ratios["lore_kv_over_snapkv"] == lore["median"] / length["compression"]["snapkv"]["median"]
        assert ratios["lorekv_prefill_over_transformers_prefill"] == length["prefill"]["lorekv"]["median"] / tf
        assert ratios["sampling_over_decode_steps"] == lore["phases"][0]["sampling"] / length["decode_steps"]["median"]
        mass, ploo = length["scorers"]["attention_mass"]["eager"], length["scorers"]["projected_loo"]["eager"]
        assert ratios["projected_loo_over_attention_mass_eager"] == ploo["median"] / mass["median"]
        assert ratios["projected_loo_over_attention_mass_compiled"] is None
        compressed, full = (length["decode"][k]["median_per_token"] for k in ("generate_compressed", "generate"))
        assert ratios["compressed_generate_over_generate"] == (compressed / full if full > 0 else None)
        for name in ("generate", "generate_compressed", "lorekv_full", "lorekv_compressed"):
            d = length["decode"][name]
            assert d["per_token"] == [(a - b) / 2 for a, b in zip(d["long"]["runs"], d["short"]["runs"], strict=True)]
            tps = d["tokens_per_second"]
            assert (tps == 1 / d["median_per_token"]) if d["median_per_token"] > 0 else (tps is None)
        memory = length["memory"]
        assert (
            memory["lore_kv_over_prefill_per_kv"] == (memory["lore_kv"] - memory["prefill"]) / memory["kv_bytes_before"]
        )
        after = memory["after_prefill"]
        assert after["sampling"] >= after["sampling_retained"] > 0 and after["scoring"] > 0
        assert after["peak"] == max(
            after["sampling"],
            after["sampling_retained"] + after["scoring"],
            after["sampling_retained"] + after["scoring_retained"] + after["selection"],
        )
        assert memory["after_prefill_per_kv"] == after["peak"] / memory["kv_bytes_before"]


def test_the_batch_section_times_every_b_at_every_n_against_b1(tiny_results) -> None:
    batch = tiny_results["batch"]
    assert list(batch) == ["32", "64"] and tiny_results["settings"]["batch_sizes"] == [1, 2, 4, 8]
    assert any("n=64: batch throughput for b in [1, 2, 4, 8]" in line for line in tiny_results["_log"])
    for key, per_b in batch.items():
        n = int(key)
        assert list(per_b) == ["1", "2", "4", "8"]
        for b_key, entry in per_b.items():
            b = int(b_key)
            assert entry["b"] == b and entry["prompt_lengths"] == list(batch_lengths(n, b))
            assert len(entry["runs"]) == 1 and len(entry["phases"]) == 1
            parts = entry["phases"][0]
            assert set(parts) == {"compression", "decoding"} and all(v > 0 for v in parts.values())
            assert entry["median"] >= parts["compression"] + parts["decoding"]
            assert entry["prompts_per_second"] == b / entry["median"]
            assert entry["prompt_tokens_per_second"] == sum(entry["prompt_lengths"]) / parts["compression"]
            assert entry["generated_tokens_per_second"] == b * 3 / parts["decoding"]
            for name in THROUGHPUTS:
                assert entry["over_b1"][name] == entry[name] / per_b["1"][name]
        assert all(per_b["1"]["over_b1"][name] == 1.0 for name in THROUGHPUTS)


def test_a_batch_of_prompts_is_left_padded_ragged_and_row_0_is_the_batch_1_prompt() -> None:
    assert batch_lengths(64, 1) == (64,) and batch_lengths(64, 4) == (64, 60, 56, 52)
    assert batch_lengths(1024, 10) == (1024, 960, 896, 832, 768, 704, 640, 576, 1024, 960)
    tokenizer = word_tokenizer()
    ids, mask = prompt_batch(tokenizer, 64, 3, seed=2, pad_id=0)
    assert ids.shape == mask.shape == (3, 64)
    assert mask.sum(1).tolist() == [64, 60, 56] and bool((ids[mask == 0] == 0).all())
    assert torch.equal(ids[:1], prompt_of_length(tokenizer, 64, seed=2))
    assert torch.equal(ids[2:, 8:], prompt_of_length(tokenizer, 56, seed=4)), "row i: its own seed, on the right"


def test_growth_is_fitted_on_the_stored_medians(tiny_results) -> None:
    from lorekv.cost.measure import fit_exponent

    lengths = tiny_results["lengths"]
    growth = tiny_results["growth"]
    sampling = [lengths[k]["futures"]["2"]["sampling"]["median"] for k in ("32", "64")]
    assert growth["n"]["sampling M=2"] == fit_exponent([32, 64], sampling)
    scoring = [lengths["64"]["futures"][m]["scoring"]["median"] for m in ("1", "2")]
    assert growth["M"]["64"]["scoring"] == fit_exponent([1, 2], scoring)
    assert {"transformers prefill", "lorekv prefill", "lore_kv sampling", "lore_kv scoring"} <= set(growth["n"])
    overhead = tiny_results["first_call_overhead"]["lore_kv compression"]
    compression = lengths["32"]["compression"]["lore_kv"]
    assert overhead["32"] == compression["first"] - compression["median"]


@pytest.mark.parametrize("n", [2, 32, 64, 300])
def test_prompts_have_exactly_n_tokens(n) -> None:
    tokenizer = word_tokenizer()
    ids = prompt_of_length(tokenizer, n)
    assert ids.shape == (1, n) and ids.dtype == torch.long
    assert torch.equal(ids, prompt_of_length(tokenizer, n)), "seeded"


def test_a_long_prompt_keeps_its_question() -> None:
    from lorekv.eval import make_sample

    tokenizer = word_tokenizer()
    ids = prompt_of_length(tokenizer, 300)
    _, question = make_sample("niah_single", tokenizer, 332).context_and_question_ids(tokenizer)
    assert torch.equal(ids[:, -question.shape[1] :], question)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_transformers_baselines_decode_what_lorekv_decodes_and_leave_the_cache_as_it_was(arch: str) -> None:
    """Gemma 3's sliding layers (window 6) hold their window before decoding, which
    transformers' ``crop`` cannot undo: the baselines restore the cache instead."""
    model = prepare(tiny_llama() if arch == "llama" else tiny_gemma3(window=6))
    ids = random_ids(20, seed=3)
    with using_sdpa(model):
        assert model.config._attn_implementation == "sdpa"
        cache = prefilled_cache(model, ids[:, :-1])
        assert cache.get_seq_length() == 19
        generated = generate_from(model, ids, cache, 5)
        assert cache.get_seq_length() == 19
        last = decode_steps(model, cache, ids[:, -1:], 5)
        assert cache.get_seq_length() == 19
    assert model.config._attn_implementation == ATTENTION_NAME, "the attention implementation is restored"
    head = PositionedCache.for_model(model.config)
    forward(model, ids[:, :-1], head, torch.arange(19))
    ours = continue_full(model, head, ids[:, -1:], 19, 5)
    assert generated.shape == (1, 25) and torch.equal(generated[0, 20:], ours.token_ids)
    assert int(last) == int(ours.token_ids[-1]), "T steps choose the same tokens"
    with using_sdpa(model):
        again = generate_from(model, ids, cache, 5)
    assert torch.equal(again, generated), "the restored cache decodes as the prefilled one did"


def test_the_timed_generate_on_a_compressed_fork_decodes_what_decode_does() -> None:
    """The bench times the same ``generate`` call on a fork of the compressed cache; it answers
    as lorekv's ``decode`` does and leaves the compressed cache as it was."""
    from lorekv.hf import decode
    from lorekv.pipeline import Pipeline
    from lorekv.presets import preset

    model = tiny_llama()
    ids = random_ids(40, seed=5)
    compressed = Pipeline.from_config(preset("snapkv", 12, window=4)).compress(model, ids)
    generated = generate_tokens(model, ids, compressed.fork(), 6)
    assert compressed.next_position == 39, "a fork was extended, not the compressed cache"
    assert torch.equal(generated[0, 40:], decode(model, compressed, None, 6).token_ids)


def test_build_scorer_compiles_on_request() -> None:
    eager = build_scorer("loo", False)
    assert eager is not None and not getattr(eager, "compile", False)
    assert build_scorer("loo", True).compile is True


def test_load_model_reads_a_local_directory_in_the_configured_dtype(tmp_path) -> None:
    from lorekv.cost import BenchConfig, known_context
    from lorekv.cost.run import load_model

    tiny_llama(layers=2).float().save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)
    assert known_context(str(tmp_path)) == 512
    model, tokenizer = load_model(BenchConfig(model=str(tmp_path), lengths=(64,), dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16 and next(model.parameters()).device.type == "cpu"
    assert tokenizer("w1 w2")["input_ids"] == [1, 2]
