"""The transformers binding: everything that touches a transformers model.

- :mod:`~lorekv.hf.attention`: the registered ``"lorekv"`` attention function, query capture,
  and :func:`~lorekv.hf.attention.forward`, the one way tokens are fed at explicit positions.
- :mod:`~lorekv.hf.context`: the forward pass in flight (the one channel for positions).
- :mod:`~lorekv.hf.cache`: :class:`~lorekv.hf.cache.PositionedCache` and
  :func:`~lorekv.hf.cache.gather`, which keeps a selection's entries.
- :mod:`~lorekv.hf.introspection`: layer types, evictable layers, supported architectures.
- :mod:`~lorekv.hf.rollout`: prefill once, then futures for a sampler.
- :mod:`~lorekv.hf.compressed`: the compressed cache, a transformers ``Cache`` that
  ``model.generate`` continues at the original positions.
- :mod:`~lorekv.hf.generation`: what lets ``model.generate`` continue it (forward hooks that
  place the fed tokens, and the up-front refusal of what it cannot continue).
- :mod:`~lorekv.hf.decoding`: conveniences over ``model.generate`` (decoding from a compressed
  cache, the full-cache baseline).
- :mod:`~lorekv.hf.bounded`: compression while generating (a decoding schedule's state and the
  rollout its sampler draws from).
- :mod:`~lorekv.hf.storage`: a compressed cache saved to and loaded from a safetensors file.
- :mod:`~lorekv.hf.timing`: device-synchronised clocks and transformers' own prefill time.

Only this package and :mod:`lorekv.models` import transformers.
"""

from lorekv.hf.attention import ATTENTION_NAME, QueryCapture, cache_argument, forward, prepare, register, using_sdpa
from lorekv.hf.cache import PADDING, PositionedCache, PositionedLayer, gather
from lorekv.hf.compressed import CompressedCache, CompressionStats
from lorekv.hf.decoding import (
    Generation,
    cache_bytes,
    check_generate_options,
    continue_full,
    decode,
    decode_batch,
    full_cache,
    full_cache_bytes,
    generate_full,
    generate_full_batch,
)
from lorekv.hf.inputs import check_batch, check_context, check_token_ids, left_pad
from lorekv.hf.introspection import check_supported, evictable_layers, layer_types, max_positions
from lorekv.hf.rollout import BatchRollout, ModelRollout
from lorekv.hf.storage import check_fitted_for, load_compressed, model_fingerprint, save_compressed
from lorekv.hf.timing import PhaseTimer, now, reference_prefill_seconds

__all__ = [
    "ATTENTION_NAME",
    "PADDING",
    "PhaseTimer",
    "CompressedCache",
    "CompressionStats",
    "Generation",
    "BatchRollout",
    "ModelRollout",
    "PositionedCache",
    "PositionedLayer",
    "QueryCapture",
    "cache_argument",
    "cache_bytes",
    "check_batch",
    "check_context",
    "check_fitted_for",
    "check_generate_options",
    "check_supported",
    "check_token_ids",
    "continue_full",
    "decode",
    "decode_batch",
    "evictable_layers",
    "forward",
    "full_cache",
    "full_cache_bytes",
    "gather",
    "generate_full",
    "generate_full_batch",
    "layer_types",
    "left_pad",
    "load_compressed",
    "max_positions",
    "model_fingerprint",
    "now",
    "prepare",
    "reference_prefill_seconds",
    "register",
    "save_compressed",
    "using_sdpa",
]
