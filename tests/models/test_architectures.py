"""The shipped architectures: their numbers are the published ones (a table written here, so a typo in the
data fails), each builds at a tiny size with random weights, Gemma 3 keeps its layer pattern when cut, and
a random model compresses with the LORE-KV preset."""

from __future__ import annotations

import pytest
import torch

import lorekv
from lorekv.models.architectures import (
    FULL,
    SLIDING,
    architecture,
    parameter_count,
    published_architectures,
    random_model,
    random_name,
)

# name: (source, model_type, hidden, MLP, layers, query heads, KV heads, head dim, vocabulary, context,
#        rope theta, RMS eps, tied embeddings, sliding window), from each repository's config.json.
PUBLISHED = {
    "llama-3.2-1b": (
        "meta-llama/Llama-3.2-1B", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 500000.0, 1e-5, True, None
    ),
    "llama-3.1-8b": (
        "meta-llama/Llama-3.1-8B", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 500000.0, 1e-5, False, None
    ),
    "qwen2.5-7b": (
        "Qwen/Qwen2.5-7B-Instruct", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 1e6, 1e-6, False, None
    ),
    "qwen3-8b": ("Qwen/Qwen3-8B", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6, 1e-6, False, None),
    "mistral-7b": (
        "mistralai/Mistral-7B-Instruct-v0.3", "mistral", 4096, 14336, 32, 32, 8, 128, 32768, 32768, 1e6, 1e-5, False,
        None,
    ),
    "gemma-3-4b": (
        "google/gemma-3-4b-it", "gemma3_text", 2560, 10240, 34, 8, 4, 256, 262208, 131072, 1e6, 1e-6, True, 1024
    ),
    "gemma-3-12b": (
        "google/gemma-3-12b-it", "gemma3_text", 3840, 15360, 48, 16, 8, 256, 262208, 131072, 1e6, 1e-6, True, 1024
    ),
}  # fmt: skip
GEMMA_FULL_LAYERS = {"gemma-3-4b": [5, 11, 17, 23, 29], "gemma-3-12b": [5, 11, 17, 23, 29, 35, 41, 47]}


def test_every_architecture_is_in_the_table() -> None:
    assert set(published_architectures()) == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_fields_are_the_published_numbers(name: str) -> None:
    source, kind, hidden, mlp, layers, heads, kv, head_dim, vocab, context, theta, eps, tied, window = PUBLISHED[name]
    arch = architecture(name)
    assert arch.source == source
    c = arch.config
    assert (c["model_type"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]) == (
        kind,
        hidden,
        mlp,
        layers,
    )
    assert (c["num_attention_heads"], c["num_key_value_heads"], arch.head_dim) == (heads, kv, head_dim)
    assert (c["vocab_size"], c["max_position_embeddings"], c["rope_theta"], c["rms_norm_eps"]) == (
        vocab,
        context,
        theta,
        eps,
    )
    assert c["tie_word_embeddings"] is tied
    built = arch.transformers_config()  # what transformers makes of the published fields, at full size
    assert (built.hidden_size, built.intermediate_size, built.num_hidden_layers) == (hidden, mlp, layers)
    assert (built.num_attention_heads, built.num_key_value_heads, built.head_dim) == (heads, kv, head_dim)
    assert (built.vocab_size, built.max_position_embeddings) == (vocab, context)
    assert getattr(built, "sliding_window", None) == window
    assert built.eos_token_id is None and built.pad_token_id is None, "no tokenizer: no special ids"


def test_rope_settings_survive_transformers_conversion() -> None:
    llama = architecture("llama-3.1-8b").transformers_config().rope_parameters
    assert llama["rope_type"] == "llama3" and llama["factor"] == 8.0 and llama["rope_theta"] == 500000.0
    assert llama["original_max_position_embeddings"] == 8192
    assert (llama["low_freq_factor"], llama["high_freq_factor"]) == (1.0, 4.0)
    for name in GEMMA_FULL_LAYERS:
        rope = architecture(name).transformers_config().rope_parameters
        assert rope["full_attention"]["rope_type"] == "linear" and rope["full_attention"]["factor"] == 8.0
        assert rope["full_attention"]["rope_theta"] == 1e6 and rope["sliding_attention"]["rope_theta"] == 1e4
    assert architecture("qwen2.5-7b").transformers_config().layer_types == [FULL] * 28


@pytest.mark.parametrize("name", sorted(GEMMA_FULL_LAYERS))
def test_gemma_layer_pattern_is_published_and_kept_when_cut(name: str) -> None:
    arch = architecture(name)
    full = [i for i, kind in enumerate(arch.transformers_config().layer_types) if kind == FULL]
    assert full == GEMMA_FULL_LAYERS[name], "every 6th layer full attention"
    assert arch.transformers_config(layers=12).layer_types == arch.layer_types[:12] == ([SLIDING] * 5 + [FULL]) * 2
    assert arch.transformers_config(layers=8).layer_types == [SLIDING] * 5 + [FULL] + [SLIDING] * 2
    # Cut before its first full layer, the model's last layer becomes full: lorekv evicts only there.
    assert arch.transformers_config(layers=2).layer_types == [SLIDING, FULL]
    assert arch.transformers_config(layers=1).layer_types == [FULL]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_architecture_builds_tiny_and_runs(name: str) -> None:
    arch = architecture(name)
    width = max(arch.widths())
    model = random_model(name, layers=1, width=width, dtype=torch.bfloat16, seed=3)
    c, published = model.config, arch.config
    assert model.config.num_hidden_layers == 1 and not model.training
    assert c.hidden_size * width == published["hidden_size"]
    assert c.intermediate_size * width == published["intermediate_size"]
    assert c.num_attention_heads * width == published["num_attention_heads"]
    assert c.num_key_value_heads * width == published["num_key_value_heads"]
    assert c.head_dim == arch.head_dim, "the head size is kept"
    assert c.vocab_size == published["vocab_size"]
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in model.parameters())
    weights = [p for p in model.parameters() if p.dim() == 2]
    assert 0.01 < weights[0].float().std().item() < 0.03, "a small normal, std ~ initializer_range"
    ids = torch.randint(c.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 8, c.vocab_size) and torch.isfinite(logits).all()


def test_the_seed_decides_the_weights() -> None:
    build = lambda seed: random_model("mistral-7b", layers=1, width=8, seed=seed)  # noqa: E731
    a, b, other = build(0), build(0), build(1)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q), name
        if p.dim() == 2:
            assert not torch.equal(p, r), name
    embed = a.get_input_embeddings().weight
    assert not torch.equal(embed[0], embed[1]), "rows differ although the weights repeat with a period"
    assert parameter_count(a) == sum(p.numel() for p in a.parameters())
    assert a.get_output_embeddings().weight is not embed, "untied as published"


def test_tied_embeddings_are_counted_once() -> None:
    model = random_model("gemma-3-4b", layers=1, width=4, dtype=torch.bfloat16)
    embed = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is embed, "tied as published"
    every = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert parameter_count(model) == every - embed.numel()


@pytest.mark.parametrize(
    "name,layers,width,match",
    [
        ("llama-3.1-8b", 0, None, "layers must be an integer from 1 to 32 for llama-3.1-8b, got 0"),
        ("llama-3.1-8b", 33, None, "layers must be an integer from 1 to 32"),
        ("llama-3.1-8b", None, 3, r"width must be one of 1, 2, 4, 8 for llama-3.1-8b"),
        ("qwen2.5-7b", None, 8, r"width must be one of 1, 2, 4 for qwen2.5-7b"),
        ("llama-4", None, None, r"unknown architecture 'llama-4'; the random-weight models are random:"),
    ],
)
def test_bad_shrink_settings_fail_with_the_allowed_values(name, layers, width, match) -> None:
    with pytest.raises(ValueError, match=match):
        random_model(name, layers=layers, width=width)


def test_random_names() -> None:
    assert random_name("random:qwen3-8b") == "qwen3-8b" and random_name("smollm2-135m-instruct") is None
    assert architecture("random:qwen3-8b") is architecture("qwen3-8b")
    described = architecture("gemma-3-4b").describe(layers=2, width=4)
    assert described["weights"] == "random" and described["source"] == "google/gemma-3-4b-it"
    assert (described["layers"], described["published_layers"], described["full_attention_layers"]) == (2, 34, 1)
    assert "accuracy" in described["cannot_measure"] and "cost" in described["measures"]


@pytest.mark.parametrize("name", ["mistral-7b", "gemma-3-4b"])
def test_a_random_model_compresses_with_the_lore_kv_preset(name: str) -> None:
    model = random_model(name, layers=2, width=4 if name.startswith("gemma") else 8)
    ids = torch.randint(model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    compressed = lorekv.Pipeline.from_config(lorekv.preset("lore_kv", 16)).compress(model, ids)
    stats = compressed.stats
    assert 0 < stats.bytes_after < stats.bytes_before
    assert set(stats.seconds) >= {"prefill", "sampling", "scoring", "selection"}
