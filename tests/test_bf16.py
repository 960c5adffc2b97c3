"""bfloat16 end to end: the same tiny random model compressed in bfloat16 and in float32.

LORE-KV (temperature futures, projected LOO) and SnapKV (prompt window, attention mass) on the
tiny Llama (GQA) and Gemma 3 (hybrid) models, prompt n = 48, budget 16. The bf16 model is the
float32 model's weights rounded to bf16 (relative rounding 2^-9 ~ 2e-3 per tensor and per
activation), so the two runs differ by the model's own bf16 arithmetic; lorekv must add nothing
to that: captures of a bf16 model are scored in float32.

Measured (seeds 0..2 x 2 models x 2 presets), then the bounds:
- scorer precision, isolated: the bf16 run's own captures rescored in float64 give the bf16
  run's scores to <= 1.1e-7 (max |difference| / max |score|): the scorer works in float32.
  Bound 1e-5; scoring in bf16 instead fails it.
- scores, bf16 run vs float32 run: <= 9.8e-3 (max |difference| / max |score|), the bf16
  forward's drift through two to four layers. Bound 5e-2.
- kept sets: overlap (kept in both / kept in float32) >= 0.938; scores of a random model have
  close calls, so a few swaps at the budget boundary are legitimate. Bound 0.85.
- first-token logits through the compressed cache, for the same kept set (the float32 model
  selecting with the bf16 run's scores; different kept sets legitimately move them by up to
  6e-2): <= 1.4e-2 relative to max |logit|. Bound 5e-2.
- the futures' tokens are the same in both runs (the samplers draw with the same generator and
  the bf16 drift does not flip a draw here), or comparing LORE-KV's scores would be void.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import random_ids, tiny_gemma3, tiny_llama

from lorekv.hf.decoding import decode
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.presets import preset
from lorekv.trajectories import Trajectories

PROMPT = 48
BUDGET = 16
SCORER_RTOL = 1e-5
SCORE_RTOL = 5e-2
MIN_OVERLAP = 0.85
LOGIT_RTOL = 5e-2

PRESETS = {"lore_kv": lambda: preset("lore_kv", BUDGET), "snapkv": lambda: preset("snapkv", BUDGET, window=4)}
MODELS = {"llama-gqa": tiny_llama, "gemma3-hybrid": tiny_gemma3}


def compress(
    model: torch.nn.Module, ids: torch.Tensor, config: PipelineConfig, scores: torch.Tensor | None = None
) -> tuple[Trajectories, torch.Tensor, torch.Tensor, torch.Tensor, Pipeline]:
    """``Pipeline.compress`` phase by phase, keeping what it discards.

    ``scores`` (L, H, c), when given, replace the pipeline's own in the selection: the same
    kept set as the run that produced them, through this model.

    Returns:
        The futures (captures in the model's dtype), their aggregated scores (L, H, c), the kept
        mask (L, G, n) of the selection, the first-token logits (V,) through the compressed
        cache, and the pipeline.
    """
    pipeline = Pipeline.from_config(config)
    batch = pipeline.prefill(model, ids)
    (futures,) = pipeline.sampler.futures_batch(batch)
    own, weights = pipeline.score(futures, batch.rows[0].candidates)
    compressed = pipeline.select_rows(batch.rows, [(own if scores is None else scores, weights)])
    first_logits = decode(model, compressed, max_new_tokens=1).first_logits
    return futures, own, compressed.selection.mask(), first_logits, pipeline


def relative(got: torch.Tensor, reference: torch.Tensor) -> float:
    """max |got - reference| / max |reference|, in float64."""
    return float((got.double() - reference.double()).abs().max() / reference.double().abs().max())


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("method", PRESETS)
@pytest.mark.parametrize("model_name", MODELS)
def test_bf16_compression_matches_float32(model_name: str, method: str, seed: int) -> None:
    """See the module docstring for every bound and why."""
    base = MODELS[model_name](seed)
    ids = random_ids(PROMPT, seed=seed + 3)
    config = PRESETS[method]()
    f32 = compress(copy.deepcopy(base).float(), ids, config)
    b16 = compress(copy.deepcopy(base).to(torch.bfloat16), ids, config)
    futures, scores, kept, logits, pipeline = b16

    assert futures.layers[0].queries.dtype == torch.bfloat16, "the bf16 run captured in bf16"
    assert scores.dtype == torch.float32 and logits.dtype == torch.float32
    rescored = Trajectories(
        token_ids=futures.token_ids,
        logprobs=futures.logprobs,
        entropies=futures.entropies,
        layers=tuple(layer.to(torch.float64) for layer in futures.layers),
        prompt_length=futures.prompt_length,
    )
    exact = pipeline.score(rescored, scores.shape[-1])[0]
    assert relative(scores, exact) < SCORER_RTOL, f"scorer precision {relative(scores, exact):.2e}"

    assert torch.equal(futures.token_ids, f32[0].token_ids), "same futures in both dtypes"
    assert relative(scores, f32[1]) < SCORE_RTOL, f"scores {relative(scores, f32[1]):.2e}"
    overlap = float((kept & f32[2]).sum() / f32[2].sum())
    assert overlap >= MIN_OVERLAP, f"kept-set overlap {overlap:.3f}"
    same_kept = compress(copy.deepcopy(base).float(), ids, config, scores=scores)
    assert torch.equal(same_kept[2], kept)
    assert relative(logits, same_kept[3]) < LOGIT_RTOL, f"first-token logits {relative(logits, same_kept[3]):.2e}"
