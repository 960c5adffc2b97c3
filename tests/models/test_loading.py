"""The dequantised-model cache: verified by checksum, rebuilt when damaged, temporaries cleaned.

The GGUF dequantisation is replaced by a tiny random Llama and a word-level tokenizer built in
the test, so the cache logic runs in milliseconds on its real files.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from tiny_models import tiny_llama
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lorekv.models import loading
from lorekv.models.bundled import BundledModel


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", "hello", "world"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture
def bundled(tmp_path, monkeypatch):
    """A fake bundled model whose 'GGUF' dequantises to a tiny Llama; counts the dequantisations."""
    monkeypatch.setenv("LOREKV_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"not really a gguf")
    calls = []

    def fake_gguf(path, dtype):
        calls.append(path)
        return tiny_llama(0).float(), tiny_tokenizer()

    monkeypatch.setattr(loading, "_load_gguf", fake_gguf)
    model = BundledModel("tiny", "torch", "pip install torch", lambda _: gguf)
    return model, calls, tmp_path / "cache" / "tiny"


def weights_of(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_cache_is_written_once_and_verified(bundled) -> None:
    model, calls, target = bundled
    first, _ = loading.load_bundled(model)
    second, tokenizer = loading.load_bundled(model)
    assert len(calls) == 1, "the second load reads the cache"
    assert torch.equal(weights_of(first), weights_of(second))
    assert tokenizer("hello world")["input_ids"] == [2, 3]
    assert loading._cache_problem(target, loading._gguf_key(target.parent.parent / "tiny.gguf")) is None


@pytest.mark.parametrize("damage", ["overwrite", "truncate", "delete", "marker"])
def test_a_damaged_cache_is_rebuilt_with_a_notice(bundled, damage: str, caplog) -> None:
    model, calls, target = bundled
    clean = weights_of(loading.load_bundled(model)[0])  # a copy: the loaded weights map the file
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "overwrite":  # same size, garbage in the middle: would load as wrong weights
        middle = len(data) // 2
        data[middle : middle + 4096] = b"\xff" * 4096
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "delete":
        weights.unlink()
    else:
        (target / "lorekv-cache.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="lorekv"):
        again, _ = loading.load_bundled(model)
    assert len(calls) == 2, "rebuilt from the GGUF"
    notices = [r.getMessage() for r in caplog.records if r.name == "lorekv"]
    assert len(notices) == 1 and "rebuilding it from the GGUF" in notices[0] and "\n" not in notices[0]
    assert torch.equal(weights_of(again), clean) and bool(torch.isfinite(weights_of(again)).all())
    loading.load_bundled(model)
    assert len(calls) == 2, "the rebuilt cache is valid"


def test_temporaries_of_an_interrupted_first_load_are_removed(bundled) -> None:
    model, _, target = bundled
    target.parent.mkdir(parents=True)
    stale = target.parent / f".{target.name}-abc123"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    loading.load_bundled(model)
    assert not stale.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [".tiny.lock", "tiny"]


def test_loads_at_once_build_the_cache_once(bundled, monkeypatch) -> None:
    """Two first loads started together (a grid's shards on a fresh machine): one builds the cache,
    the other waits for it and reads it, and both get the same weights."""
    model, calls, _ = bundled
    slow_build = loading._load_gguf

    def slow(path, dtype):
        time.sleep(0.3)  # wide enough for the other load to reach the cache unlocked
        return slow_build(path, dtype)

    monkeypatch.setattr(loading, "_load_gguf", slow)
    start = threading.Barrier(2)
    loaded: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def load() -> None:
        start.wait()
        try:
            loaded.append(weights_of(loading.load_bundled(model)[0]))
        except BaseException as error:  # reported below: a thread's exception is otherwise lost
            errors.append(error)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(calls) == 1, "the second load read the first one's cache"
    assert torch.equal(loaded[0], loaded[1])


def test_a_cache_without_a_checksum_is_rebuilt_once(bundled, caplog) -> None:
    import json

    model, calls, target = bundled
    loading.load_bundled(model)
    marker = target / "lorekv-cache.json"
    meta = json.loads(marker.read_text())
    del meta["weights_sha256"]
    marker.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="lorekv"):
        loading.load_bundled(model)
    assert len(calls) == 2 and "without a checksum" in caplog.text
    loading.load_bundled(model)
    assert len(calls) == 2
