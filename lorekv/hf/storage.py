"""A compressed cache on disk: one safetensors file, reloaded onto the model it was compressed for.

Query-agnostic compression is how a cache is reused: a context compressed once, saved, and
answered by questions later, in another process. :func:`save_compressed` writes every layer's
kept keys, values and positions, the prompts and their mask, each row's kept set and stats, the
method that compressed it (``CompressedCache.method``) and a fingerprint of the model;
:func:`load_compressed` refuses a file written for another model (another architecture, other
weights or another dtype: the keys would mean nothing to it) and a damaged one (a checksum over
every tensor), each with an error that says which, before anything is built.

The file is written atomically (a temporary file beside it, then a rename), so an interrupted
save leaves the previous file or none, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from lorekv.hf.cache import PositionedCache
from lorekv.hf.compressed import CompressedCache, CompressionStats
from lorekv.hf.introspection import attention_modules
from lorekv.scores import Selection
from lorekv.tensorfiles import read_tensor_file, write_tensor_file

FORMAT = "lorekv.compressed-cache/1"
"""The format name and version written into every file's metadata."""

_NOT_THE_KEYS = frozenset(
    {
        "_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures", "id2label", "label2id",
        "problem_type", "output_attentions", "output_hidden_states", "return_dict", "use_cache", "bos_token_id",
        "eos_token_id", "pad_token_id", "chunk_size_feed_forward", "is_encoder_decoder", "tie_word_embeddings",
    }
)  # fmt: skip
"""Config fields that change nothing in the keys and values a model computes."""

SAMPLES = 64
"""Values of each parameter the fingerprint reads (evenly spaced): different weights differ there."""


def _compute_fields(config: Any) -> Any:
    """A config's dict without the fields that change nothing in the keys and values, at any depth
    (a multimodal model's text config included)."""
    if isinstance(config, dict):
        return {k: _compute_fields(v) for k, v in config.items() if k not in _NOT_THE_KEYS and not k.startswith("_")}
    return config


def model_fingerprint(model: PreTrainedModel, *, dtype: bool = True) -> str:
    """A SHA-256 of what makes a model's keys and values what they are: its class, its config
    (fields that change nothing in them left out), and every parameter's name, shape, dtype and
    :data:`SAMPLES` of its values. Cheap (no pass over the weights); two models that differ in any
    weight almost surely differ in the samples of a random or trained model.

    ``dtype=False``: the same weights in any floating dtype share the fingerprint (the dtype is
    left out and the samples are rounded to bfloat16 first), for what does not depend on it (a
    fitted surrogate scorer); a cache's keys do, so a compressed cache keeps the default."""
    config = _compute_fields(model.config.to_dict())
    digest = hashlib.sha256(json.dumps([type(model).__name__, config], sort_keys=True, default=str).encode())
    for name, parameter in model.named_parameters():
        flat = parameter.detach().reshape(-1)
        samples = flat[spaced(flat.numel(), SAMPLES).to(flat.device)]
        if not dtype and samples.is_floating_point():
            samples = samples.to(torch.bfloat16)
        digest.update(f"{name}:{tuple(parameter.shape)}{f':{parameter.dtype}' if dtype else ''}".encode())
        digest.update(samples.double().cpu().numpy().tobytes())
    return digest.hexdigest()


_FITTED: weakref.WeakKeyDictionary[PreTrainedModel, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def weights_fingerprint(model: PreTrainedModel) -> str:
    """:func:`model_fingerprint` with ``dtype=False``, computed once per state of the weights: kept
    with the model until a parameter is replaced, moved or changed in place (its storage and
    version counter), so that checking a fitted file before every compression costs no pass over
    the parameters' samples."""
    state = tuple((p.data_ptr(), p._version) for p in model.parameters())
    cached = _FITTED.get(model)
    if cached is None or cached[0] != state:
        cached = (state, model_fingerprint(model, dtype=False))
        _FITTED[model] = cached
    return cached[1]


def check_fitted_for(fingerprint: str, model: PreTrainedModel, what: str) -> None:
    """Raise unless ``fingerprint`` (a fitted file's :func:`model_fingerprint` with ``dtype=False``)
    is ``model``'s: ``what`` (the file) was fitted for another architecture or other weights."""
    ours = weights_fingerprint(model)
    if fingerprint != ours:
        raise ValueError(
            f"{what}: a surrogate fitted for another model (fingerprint {fingerprint[:12]}..., this model's is "
            f"{ours[:12]}...): another architecture or other weights; fit one for this model (`lorekv distill`)"
        )


def spaced(size: int, count: int) -> torch.Tensor:
    """(min(count, size),) long: indices evenly spaced over [0, size), the first and the last
    included; integer arithmetic, exact at any size (float spacing rounds past 2**24)."""
    count = min(count, size)
    return torch.arange(count) * (size - 1) // max(count - 1, 1)


def save_compressed(compressed: CompressedCache, path: str | Path, model: PreTrainedModel) -> Path:
    """Write ``compressed`` (a fresh compression of ``model``, any number of rows) to ``path``
    (a ``.safetensors`` file, replaced atomically); returns the path.

    Raises:
        ValueError: the cache was extended since compression (an answer decoded into it) or
            damaged: save the compression itself, or a fork taken before answering.
    """
    if compressed.extended or compressed.damaged:
        raise ValueError(
            "save the compressed cache before answering from it (it was extended by "
            f"{compressed.extended} tokens{' and damaged' if compressed.damaged else ''}): "
            "decode from compressed.fork() and save compressed"
        )
    tensors = {"prompt_ids": compressed.prompt_ids, "attention_mask": compressed.attention_mask}
    layers = []
    for i, layer in enumerate(compressed.layers):
        layers.append({"window": layer.window, "slack": layer.slack, "padded": layer.padded,
                       "initialized": layer.is_initialized})  # fmt: skip
        if layer.is_initialized:
            tensors |= {f"layers.{i}.{part}": getattr(layer, part) for part in ("keys", "values", "positions")}
    selections = []
    for r, selection in enumerate(compressed.selections):
        tensors[f"rows.{r}.kept"] = selection.mask()
        selections.append({"layer_indices": list(selection.layer_indices), "num_tokens": selection.num_tokens})
    meta = {
        "format": FORMAT,
        "model": model_fingerprint(model),
        "start": compressed.start,
        "layers": layers,
        "selections": selections,
        "row_stats": [stats.to_dict() for stats in compressed.row_stats],
        "method": compressed.method,
    }
    return write_tensor_file(path, tensors, meta)


def load_compressed(path: str | Path, model: PreTrainedModel) -> CompressedCache:
    """The compressed cache saved in ``path``, each layer on the device of its attention, ready for ``model.generate``
    (``model`` is prepared for it, as ``Pipeline.compress`` does).

    Raises:
        ValueError: no such file; not a lorekv compressed cache (or of another format version);
            written for another model (its fingerprint differs: architecture, weights or dtype);
            damaged (the file does not parse, or its tensors do not match their checksum).
    """
    from lorekv.hf.attention import prepare

    path = Path(path)
    required = {"model", "start", "layers", "selections", "row_stats", "method"}
    tensors, meta = read_tensor_file(path, FORMAT, required, "compressed cache")
    ours = model_fingerprint(model)
    if meta["model"] != ours:
        raise ValueError(
            f"{path}: compressed for another model (fingerprint {meta['model'][:12]}..., this model's is "
            f"{ours[:12]}...): another architecture, other weights or another dtype"
        )
    device = model.get_input_embeddings().weight.device
    modules = attention_modules(model)
    cache = PositionedCache([layer["window"] for layer in meta["layers"]])
    for i, (layer, saved) in enumerate(zip(cache.layers, meta["layers"], strict=True)):
        if saved["initialized"]:  # each layer where its attention runs (a model split over devices)
            where = next(modules[i].parameters()).device if i in modules else device
            parts = [tensors[f"layers.{i}.{part}"].to(where) for part in ("keys", "values", "positions")]
            layer.set(*parts, padded=saved["padded"])
        layer.slack = saved["slack"]
    selections = [
        Selection(
            indices=tuple(tuple(head.nonzero().flatten() for head in heads) for heads in tensors[f"rows.{r}.kept"]),
            layer_indices=tuple(saved["layer_indices"]),
            num_tokens=saved["num_tokens"],
        )
        for r, saved in enumerate(meta["selections"])
    ]
    prepare(model)
    return CompressedCache(
        cache,
        tensors["prompt_ids"].to(device),
        meta["start"],
        selections,
        [_stats(row) for row in meta["row_stats"]],
        attention_mask=tensors["attention_mask"].to(device),
        method=meta["method"],
    )


def _stats(saved: dict[str, Any]) -> CompressionStats:
    """:class:`CompressionStats` from its ``to_dict`` (the derived fields left out)."""
    return CompressionStats(
        prompt_tokens=saved["prompt_tokens"],
        candidate_tokens=saved["candidate_tokens"],
        layer_indices=tuple(saved["layer_indices"]),
        kept=tuple(tuple(row) for row in saved["kept"]),
        bytes_before=saved["bytes_before"],
        bytes_after=saved["bytes_after"],
        bytes_kept=saved["bytes_kept"],
        pending_tokens=saved["pending_tokens"],
        bytes_held=saved["bytes_held"],
        seconds=dict(saved["seconds"]),
        future_weights=tuple(saved["future_weights"]),
    )
