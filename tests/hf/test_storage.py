"""A compressed cache saved to a file and loaded in its place answers exactly as the original,
and a file of another model, a damaged file or an extended cache is refused with an error that
says which (issue 35)."""

from __future__ import annotations

import os

import pytest
import torch
from tiny_models import CharTokenizer, random_ids, tiny_gemma3, tiny_llama

from lorekv.hf import (
    CompressedCache,
    decode_batch,
    left_pad,
    load_compressed,
    model_fingerprint,
    prepare,
    save_compressed,
)
from lorekv.hf.storage import spaced
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.presets import preset


@pytest.fixture(scope="module")
def models():
    return {"llama": prepare(tiny_llama(91)), "gemma3": prepare(tiny_gemma3(92, window=6))}


ROWS = [random_ids(n, seed=300 + n) for n in (30, 3, 9)]
QUESTIONS = [random_ids(q, seed=400 + q) for q in (2, 3, 1)]


def config(name: str) -> PipelineConfig:
    return preset(name, 5, window=2) if name == "ada_kv" else preset(name, 5)


def compressed_batch(model, name: str = "lore_kv") -> CompressedCache:
    ids, mask = left_pad(ROWS)
    method = Pipeline.from_config(config(name))
    return method.compress(model, ids, attention_mask=mask, query_aware=False, tokenizer=CharTokenizer())


@pytest.mark.parametrize("name", ["lore_kv", "ada_kv", "kvzip"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_loaded_cache_answers_as_the_one_saved(models, arch: str, name: str, tmp_path) -> None:
    """Every row's first-answer logits (to 0: the same tensors) and tokens, its kept set and stats,
    the method, and the cache's entries (ragged heads and sliding layers included)."""
    model = models[arch]
    original = compressed_batch(model, name)
    path = save_compressed(original, tmp_path / "context.safetensors", model)
    loaded = load_compressed(path, model)
    assert loaded.row_stats == original.row_stats and loaded.method == original.method
    assert PipelineConfig.model_validate(loaded.method) == config(name).for_mode(False)
    for got, want in zip(loaded.selections, original.selections, strict=True):
        assert torch.equal(got.mask(), want.mask())
    for got, want in zip(loaded.layers, original.layers, strict=True):
        assert got.is_initialized == want.is_initialized and got.padded == want.padded and got.slack == want.slack
        if want.is_initialized:
            assert torch.equal(got.positions, want.positions) and torch.equal(got.keys, want.keys)
    questions, mask = left_pad(QUESTIONS)
    answers = decode_batch(model, loaded, questions, mask, 4)
    for got, want in zip(answers, decode_batch(model, original, questions, mask, 4), strict=True):
        torch.testing.assert_close(got.first_logits, want.first_logits, rtol=0, atol=0)
        assert got.token_ids.tolist() == want.token_ids.tolist()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")], "no temporary file left"


def test_a_file_of_another_model_is_refused(models, tmp_path) -> None:
    path = save_compressed(compressed_batch(models["llama"]), tmp_path / "c.safetensors", models["llama"])
    other_weights = prepare(tiny_llama(93))
    with pytest.raises(ValueError, match="compressed for another model"):
        load_compressed(path, other_weights)
    with pytest.raises(ValueError, match="compressed for another model"):
        load_compressed(path, prepare(tiny_llama(91).float()))  # the same weights in another dtype
    with pytest.raises(ValueError, match="compressed for another model"):
        load_compressed(path, models["gemma3"])
    assert model_fingerprint(tiny_llama(91)) == model_fingerprint(models["llama"]), "prepare changes nothing"


def test_a_damaged_file_is_refused(models, tmp_path) -> None:
    model = models["llama"]
    path = save_compressed(compressed_batch(model), tmp_path / "c.safetensors", model)
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.safetensors"
    data[-7] ^= 0xFF  # a byte of the last tensor's data
    flipped.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged: its tensors do not match"):
        load_compressed(flipped, model)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable lorekv compressed cache"):
        load_compressed(cut, model)
    with pytest.raises(ValueError, match="no such compressed cache file"):
        load_compressed(tmp_path / "missing.safetensors", model)


def test_an_extended_cache_is_refused_and_a_fork_taken_before_is_saved(models, tmp_path) -> None:
    model = models["llama"]
    compressed = compressed_batch(model)
    state = compressed.fork()
    model.generate(torch.cat([compressed.prompt_ids, left_pad(QUESTIONS)[0]], 1),
                   attention_mask=torch.cat([compressed.attention_mask, left_pad(QUESTIONS)[1]], 1),
                   cache=state, max_new_tokens=2, do_sample=False, pad_token_id=0)  # fmt: skip
    with pytest.raises(ValueError, match="before answering from it"):
        save_compressed(state, tmp_path / "c.safetensors", model)
    assert not (tmp_path / "c.safetensors").exists()
    save_compressed(compressed, tmp_path / "c.safetensors", model)


@pytest.mark.parametrize("size", [1, 2, 63, 64, 65, 2**24 + 1, 28_311_552, 2**40 + 7])
def test_the_fingerprints_samples_span_every_parameter_exactly(size: int) -> None:
    """Evenly spaced indices of a parameter's values, first and last included, at every size (an
    embedding of 28 M values once broke a float spacing)."""
    picks = spaced(size, 64)
    assert len(picks) == min(size, 64) and int(picks[0]) == 0 and int(picks[-1]) == size - 1
    assert bool((picks[1:] > picks[:-1]).all())


def test_a_file_takes_the_umasks_mode_and_a_file_without_its_metadata_is_refused(models, tmp_path) -> None:
    import json
    import stat

    from safetensors.torch import load_file, save_file

    model = models["llama"]
    old = os.umask(0o027)
    try:
        path = save_compressed(compressed_batch(model), tmp_path / "c.safetensors", model)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640, "0666 less the umask, as any file written"
    bare = tmp_path / "bare.safetensors"
    save_file(load_file(path), bare, metadata={"lorekv": json.dumps({"format": "lorekv.compressed-cache/1"})})
    with pytest.raises(ValueError, match=r"not a readable lorekv compressed cache .*metadata without"):
        load_compressed(bare, model)
    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, other)
    with pytest.raises(ValueError, match="not a readable lorekv compressed cache"):
        load_compressed(other, model)
