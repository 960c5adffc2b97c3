"""Tiny random transformers models built in the tests: no downloads, milliseconds per call."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 61


def tiny_llama(seed: int = 0, *, kv_heads: int = 2, layers: int = 2, context: int = 512) -> LlamaForCausalLM:
    """2-layer Llama, 4 query heads over ``kv_heads`` KV heads (GQA), float64, ``context`` positions."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval().double()


GEMMA3_LAYERS = ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")


def tiny_gemma3(
    seed: int = 0, *, window: int = 6, layer_types: Sequence[str] = GEMMA3_LAYERS, context: int = 512
) -> Gemma3ForCausalLM:
    """Hybrid Gemma 3: layers sliding, sliding, full, sliding (window ``window``; or ``layer_types``),
    4 query / 1 KV head, ``context`` positions."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=window,
        layer_types=list(layer_types),
        max_position_embeddings=context,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    return Gemma3ForCausalLM(config).eval().double()


def random_ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


class CharTokenizer:
    """A tokenizer without a chat template, one id per character (for samplers that feed text: KVzip)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False, "samplers tokenize their own text without special tokens"
        return [ord(c) % VOCAB for c in text]


def word_tokenizer():
    """A word-level fast tokenizer over the tiny models' vocabulary: w0 .. w58, <unk>, <eos>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB - 2)} | {"<unk>": VOCAB - 2, "<eos>": VOCAB - 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")


def surrogate_for(model: torch.nn.Module, seed: int = 0) -> str:
    """The path of a random linear surrogate fitted for ``model`` (a file with the model's
    fingerprint, in a temporary folder of this process, written once per model and seed): what the
    ``surrogate`` scorer and the presets built on it need to run on a tiny model."""
    from lorekv.distill import FitReport, Surrogate, save_surrogate
    from lorekv.hf import evictable_layers, model_fingerprint
    from lorekv.scorers.surrogate import SurrogateMap

    key = (model_fingerprint(model, dtype=False), seed)
    if key not in _SURROGATES:
        config = model.config.get_text_config()
        layers = sorted(evictable_layers(model))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            net = SurrogateMap(layers, config.hidden_size, config.num_key_value_heads)
        folder = Path(tempfile.mkdtemp(prefix="lorekv-surrogates-"))
        report = FitReport(0, ())
        path = save_surrogate(Surrogate(net, {}, [], report), folder / f"{key[0][:12]}-{seed}.safetensors", model)
        _SURROGATES[key] = str(path)
    return _SURROGATES[key]


_SURROGATES: dict[tuple[str, int], str] = {}
