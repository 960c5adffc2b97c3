"""What lorekv cannot model is refused by ``check_supported`` before any model work.

Each case builds a tiny random model in the test (a real gpt-oss or Llama 4 text model where
transformers builds one cheaply, otherwise a tiny Llama patched to carry the feature), then
checks that ``Pipeline.compress`` raises a ``ValueError`` naming the feature and that no
forward pass ran.
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import VOCAB, random_ids, tiny_gemma3, tiny_llama
from transformers import GptOssConfig, GptOssForCausalLM, Llama4ForCausalLM, Llama4TextConfig

from lorekv import Pipeline
from lorekv.hf import ModelRollout, check_supported, prepare

SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
SMALL.update(max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=None)


def pipeline() -> Pipeline:
    return Pipeline(
        {"name": "temperature", "num_futures": 2, "num_tokens": 3},
        "projected_loo",
        "mean",
        {"name": "uniform", "budget": 4},
    )


def assert_refused_before_model_work(model: torch.nn.Module, match: str) -> None:
    calls: list[str] = []
    model.register_forward_pre_hook(lambda *a: calls.append("model"))
    for module in model.modules():
        if hasattr(module, "q_proj"):
            module.register_forward_pre_hook(lambda *a: calls.append("attention"))
    with pytest.raises(ValueError, match=match):
        pipeline().compress(model, random_ids(10))
    assert not calls, "check_supported must refuse before any forward pass"


def tiny_gpt_oss() -> GptOssForCausalLM:
    torch.manual_seed(0)
    config = GptOssConfig(
        **SMALL, intermediate_size=16, num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1
    )
    return GptOssForCausalLM(config).eval()


def tiny_llama4(**overrides: object) -> Llama4ForCausalLM:
    torch.manual_seed(0)
    config = Llama4TextConfig(
        **SMALL,
        intermediate_size=16,
        intermediate_size_mlp=16,
        num_hidden_layers=4,
        num_local_experts=2,
        **overrides,
    )
    return Llama4ForCausalLM(config).eval()


def test_supported_models_pass() -> None:
    check_supported(tiny_llama())
    check_supported(tiny_gemma3())


def test_gpt_oss_attention_sinks_refused() -> None:
    assert_refused_before_model_work(tiny_gpt_oss(), "attention sinks")


def test_sinks_found_on_the_attention_module() -> None:
    model = tiny_llama(layers=3)
    model.model.layers[1].self_attn.sinks = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    assert_refused_before_model_work(model, r"attention sinks .*layers \[1\]")


def test_sinks_found_by_model_type() -> None:
    model = tiny_llama()
    model.config.model_type = "gpt_oss"
    assert_refused_before_model_work(model, "attention sinks")


def test_lorekv_attention_refuses_s_aux() -> None:
    model = prepare(tiny_gpt_oss())
    with pytest.raises(NotImplementedError, match="s_aux"):
        ModelRollout(model, random_ids(6), [1])


def test_llama4_chunked_attention_refused() -> None:
    model = tiny_llama4(attention_chunk_size=4)
    assert "chunked_attention" in model.config.layer_types
    assert_refused_before_model_work(model, "chunked attention")


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param({"layer_types": ["chunked_attention", "full_attention"]}, id="layer_types"),
        pytest.param({"attention_chunk_size": 4}, id="attention_chunk_size"),
    ],
)
def test_chunked_llama_refused(patch: dict[str, object]) -> None:
    model = tiny_llama()
    for key, value in patch.items():
        setattr(model.config, key, value)
    assert_refused_before_model_work(model, "chunked attention")


def test_unknown_layer_types_refused() -> None:
    model = tiny_llama()
    model.config.layer_types = ["full_attention", "conv"]
    assert_refused_before_model_work(model, r"layer types \['conv'\]")


class Params4bit(torch.nn.Parameter):
    """Named like bitsandbytes' 4-bit weight; float and of the right shape, so only the name tells."""


class Linear4bit(torch.nn.Linear):
    """Named like bitsandbytes' 4-bit linear layer; its weight looks like a normal one."""


class Linear8bitLt(torch.nn.Linear):
    pass


def packed_uint8(proj: torch.nn.Linear) -> None:
    proj.weight = torch.nn.Parameter(
        torch.zeros(proj.out_features * proj.in_features // 2, 1, dtype=torch.uint8), requires_grad=False
    )


def int8_codes(proj: torch.nn.Linear) -> None:
    proj.weight = torch.nn.Parameter(
        torch.zeros(proj.out_features, proj.in_features, dtype=torch.int8), requires_grad=False
    )


def float_packed(proj: torch.nn.Linear) -> None:
    proj.weight = torch.nn.Parameter(proj.weight.detach().reshape(-1, 1)[: proj.weight.numel() // 2].clone())


def params4bit(proj: torch.nn.Linear) -> None:
    proj.weight = Params4bit(proj.weight.detach().clone())


def swap_class(cls: type) -> object:
    def patch(proj: torch.nn.Linear) -> None:
        proj.__class__ = cls

    return patch


def bitsandbytes_module(proj: torch.nn.Linear) -> None:
    proj.__class__ = type("QuantLinear", (torch.nn.Linear,), {"__module__": "bitsandbytes.nn.modules"})


@pytest.mark.parametrize(
    "patch,match",
    [
        pytest.param(packed_uint8, "torch.uint8", id="uint8-packed"),
        pytest.param(int8_codes, "torch.int8", id="int8-codes"),
        pytest.param(float_packed, "shape", id="float-wrong-shape"),
        pytest.param(params4bit, "Params4bit", id="Params4bit-weight"),
        pytest.param(swap_class(Linear4bit), "Linear4bit", id="Linear4bit"),
        pytest.param(swap_class(Linear8bitLt), "Linear8bitLt", id="Linear8bitLt"),
        pytest.param(bitsandbytes_module, "QuantLinear", id="bitsandbytes-module"),
    ],
)
def test_quantised_o_proj_refused(patch, match: str) -> None:
    model = tiny_llama()
    patch(model.model.layers[1].self_attn.o_proj)
    assert_refused_before_model_work(model, rf"layer 1's o_proj .*{match}.*quantised")


def tiny_mistral(window: int = 4):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=window,
        eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return MistralForCausalLM(config).eval().double()


def test_sliding_window_without_layer_types_follows_transformers() -> None:
    """A Mistral-style config (sliding_window, no layer_types): every layer slides, as in transformers."""
    from lorekv import generate_full
    from lorekv.hf import layer_types

    model = tiny_mistral(window=4)
    ids = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(3))
    assert layer_types(model.config) == ["sliding_attention"] * 2
    expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)[0, 12:]
    got = generate_full(model, ids, max_new_tokens=6)
    assert got.token_ids.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="every layer uses sliding-window attention"):
        Pipeline("greedy", "attention_mass", "mean", {"name": "uniform", "budget": 4}).compress(model, ids)
