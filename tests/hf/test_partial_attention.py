"""The fused log-sum-exp kernels behind cascade attention, each against the plain float32 reference.

The reference (:func:`reference_partial_attention`) is itself checked against a float64 softmax in
``test_shared_prefix.py``; here every fused path must agree with it on random shapes, masks with
rows that see no key (output 0, log-sum-exp -inf) and keys/values shared by the batch.

Tolerances, why:
- float32, same device: both paths compute q . k, the softmax and P @ v in float32 and differ only in
  summation order and the kernels' exp, errors of a few float32 ulps on O(1) values: 1e-5.
- bfloat16 (CPU flash) / float16 / bfloat16 (CUDA): the kernels round the probabilities to the input
  dtype before P @ v and the output once more; the reference rounds only the output. Two ulps of the
  dtype at 1: float16 2e-3, bfloat16 1.6e-2. The log-sum-exp stays float32 in both (products of
  half-precision inputs are exact in float32): 1e-4 relative and absolute.
"""

from __future__ import annotations

import pytest
import torch

from lorekv.hf import attention
from lorekv.hf.attention import fused_kernel, partial_attention, reference_partial_attention

OUT_TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 1.6e-2},
}
LSE_TOL = {"rtol": 1e-4, "atol": 1e-4}
SHAPES = [  # (B, keys' batch, H, Q, K, d): Q around the 32-row log-sum-exp padding, K around the 16-column bias rows
    (2, 2, 3, 5, 7, 8),
    (3, 1, 2, 33, 16, 16),
    (1, 1, 4, 32, 17, 32),
    (2, 1, 2, 1, 40, 64),
]


def inputs(shape, dtype, masked: str, seed: int, device: str = "cpu"):
    """Random (query, keys, values, mask); ``masked``: "none", "full" (B, H, Q, K) or "shared" (1, H, Q, K).

    Masks keep half the keys and blank one query row entirely (and a whole head's rows when shared).
    """
    b, kb, h, q, k, d = shape
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(b, h, q, d, generator=gen)
    keys, values = (torch.randn(kb, h, k, d, generator=gen) for _ in range(2))
    mask = None
    if masked != "none":
        mask = torch.rand(b if masked == "full" else 1, h, q, k, generator=gen) < 0.5
        mask[0, 0, q // 2] = False
        if masked == "shared":
            mask[0, h - 1] = False
    move = lambda t: None if t is None else t.to(device)  # noqa: E731
    return move(query.to(dtype)), move(keys.to(dtype)), move(values.to(dtype)), move(mask)


def assert_matches_reference(query, keys, values, mask, dtype) -> None:
    got_out, got_lse = partial_attention(query, keys, values, mask, 0.3)
    want_out, want_lse = reference_partial_attention(query, keys, values, mask, 0.3)
    assert got_out.shape == want_out.shape and got_out.dtype == dtype
    assert got_lse.shape == want_lse.shape and got_lse.dtype == torch.float32
    torch.testing.assert_close(got_out.float(), want_out.float(), **OUT_TOL[dtype])
    torch.testing.assert_close(got_lse, want_lse, **LSE_TOL)
    if mask is not None:
        empty = ~mask.any(-1).expand_as(got_lse)
        assert empty.any()
        assert (got_lse[empty] == -torch.inf).all() and (got_out[empty] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("masked", ["none", "full", "shared"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_flash_kernel_matches_the_reference(shape, masked: str, dtype: torch.dtype) -> None:
    query, keys, values, mask = inputs(shape, dtype, masked, seed=sum(shape))
    assert fused_kernel(query, keys, values, mask) == "cpu"
    assert_matches_reference(query, keys, values, mask, dtype)


def stand_in_efficient_attention(
    query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None
):
    """``aten._scaled_dot_product_efficient_attention`` on CPU, as strict as the CUDA kernel is and as unhelpful.

    Requires q, k, v of one shape and dtype, a (B, H, Q, K) bias in that dtype with 16-aligned rows;
    returns NaN outputs for rows without keys and a log-sum-exp padded to a multiple of 32 queries
    with garbage (and +inf for rows without keys).
    """
    assert compute_log_sumexp and dropout_p == 0.0 and not is_causal and scale is not None
    assert query.shape[:2] == key.shape[:2] == value.shape[:2] and key.shape == value.shape
    assert query.dtype == key.dtype == value.dtype
    b, h, q, _ = query.shape
    logits = (query.float() @ key.float().transpose(-1, -2)) * scale
    if attn_bias is not None:
        assert attn_bias.dtype == query.dtype and attn_bias.shape == (b, h, q, key.shape[-2])
        assert attn_bias.stride(-1) == 1 and all(s % 16 == 0 for s in attn_bias.stride()[:-1]), attn_bias.stride()
        logits = logits + attn_bias.float()
    lse = torch.logsumexp(logits, -1)
    out = torch.softmax(logits, -1) @ value.float()
    padded = torch.full((b, h, -(-q // 32) * 32), 1e30)
    padded[..., :q] = lse.masked_fill(lse == -torch.inf, torch.inf)
    return out.to(query.dtype), padded, torch.empty(()), torch.empty(())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("masked", ["none", "full", "shared"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cuda_branch_with_the_kernel_stood_in(monkeypatch, shape, masked: str, dtype: torch.dtype) -> None:
    """The CUDA branch's padding, slicing, broadcasting and empty rows, run on CPU (tolerances as on CUDA)."""
    monkeypatch.setattr(attention, "fused_kernel", lambda *args: "cuda")
    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", stand_in_efficient_attention)
    query, keys, values, mask = inputs(shape, dtype, masked, seed=sum(shape))
    assert_matches_reference(query, keys, values, mask, dtype)


def test_no_kernel_without_keys() -> None:
    query, keys, values, mask = inputs((1, 1, 2, 3, 0, 8), torch.float32, "full", seed=0)
    assert fused_kernel(query, keys, values, mask) is None
    out, lse = partial_attention(query, keys, values, mask, 0.3)
    assert (out == 0).all() and (lse == -torch.inf).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("masked", ["none", "full", "shared"])
@pytest.mark.parametrize("shape", [*SHAPES, (4, 1, 8, 70, 300, 128)], ids=str)
def test_cuda_efficient_kernel_matches_the_reference(shape, masked: str, dtype: torch.dtype) -> None:
    """The real memory-efficient kernel (float32 on sm80+ runs it with 3xTF32, float32-accurate)."""
    query, keys, values, mask = inputs(shape, dtype, masked, seed=sum(shape), device="cuda")
    assert fused_kernel(query, keys, values, mask) == "cuda"
    assert_matches_reference(query, keys, values, mask, dtype)


@pytest.mark.parametrize("kernel", ["cpu", "cuda", None], ids=["cpu", "cuda-stood-in", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_causal_attention_is_the_lower_triangle_without_a_mask(monkeypatch, kernel, dtype: torch.dtype) -> None:
    """``causal=True`` (a teacher-forced future's own keys): query i sees keys 0..i, as the reference
    with that triangle as its mask, on every path (the CPU kernel masks itself, the others get it)."""
    if kernel != "cpu":
        monkeypatch.setattr(attention, "fused_kernel", lambda *args: kernel)
        monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", stand_in_efficient_attention)
    query, keys, values, _ = inputs((2, 2, 3, 21, 21, 16), dtype, "none", seed=5)
    got_out, got_lse = partial_attention(query, keys, values, None, 0.3, causal=True)
    triangle = torch.ones(21, 21, dtype=torch.bool).tril()[None, None]
    want_out, want_lse = reference_partial_attention(query, keys, values, triangle, 0.3)
    torch.testing.assert_close(got_out.float(), want_out.float(), **OUT_TOL[dtype])
    torch.testing.assert_close(got_lse, want_lse, **LSE_TOL)
    full_out, _ = reference_partial_attention(query, keys, values, None, 0.3)
    assert (full_out[:, :, 0] - got_out[:, :, 0]).abs().max() > 1e-2, "the first query sees one key, not all"
