"""lorekv: future-aware KV-cache eviction for PyTorch and Hugging Face transformers.

The public API::

    from lorekv import Pipeline, PipelineConfig, preset, load, decode, generate_full

Every method is a 4-tuple (sampler, scorer, aggregator, policy): :class:`Pipeline` runs one
on a model, :class:`PipelineConfig` is its YAML/JSON form, :func:`preset` builds published
methods by name, :func:`load` loads a model and its tokenizer, :func:`decode` answers from a
compressed cache and :func:`generate_full` is the full-cache baseline. A compressed cache is a
transformers ``Cache``: ``model.generate(input_ids, cache=compressed)`` continues it.
:func:`save_compressed` and :func:`load_compressed` keep a compressed context in a file.
:class:`DecodingSchedule` keeps a cache within its budget while ``generate`` runs (compression
while generating).
:class:`TextGenerationPipeline` is the ``"lorekv-text-generation"`` transformers pipeline (a
context and questions in, answers out): ``import lorekv`` makes ``transformers.pipeline`` know it
as soon as transformers' pipelines load (:mod:`lorekv.autoregister`);
:func:`register_text_generation` registers it explicitly.

The names are imported on first use, so that ``import lorekv.scorers`` (or any other
component family) does not import transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lorekv.autoregister import install as _install_text_generation

__version__ = "0.1.0"

_EXPORTS = {
    "Pipeline": "lorekv.pipeline",
    "PipelineConfig": "lorekv.pipeline",
    "preset": "lorekv.presets",
    "PRESETS": "lorekv.presets",
    "load": "lorekv.models",
    "decode": "lorekv.hf",
    "generate_full": "lorekv.hf",
    "CompressedCache": "lorekv.hf",
    "CompressionStats": "lorekv.hf",
    "save_compressed": "lorekv.hf",
    "load_compressed": "lorekv.hf",
    "Generation": "lorekv.hf",
    "TextGenerationPipeline": "lorekv.text_generation",
    "register_text_generation": "lorekv.text_generation",
    "DecodingSchedule": "lorekv.schedule",
    "ScheduleConfig": "lorekv.schedule",
}

__all__ = [
    "PRESETS",
    "CompressedCache",
    "CompressionStats",
    "DecodingSchedule",
    "Generation",
    "Pipeline",
    "PipelineConfig",
    "ScheduleConfig",
    "TextGenerationPipeline",
    "decode",
    "generate_full",
    "load",
    "load_compressed",
    "preset",
    "register_text_generation",
    "save_compressed",
]

if TYPE_CHECKING:
    from lorekv.hf import (
        CompressedCache,
        CompressionStats,
        Generation,
        decode,
        generate_full,
        load_compressed,
        save_compressed,
    )
    from lorekv.models import load
    from lorekv.pipeline import Pipeline, PipelineConfig
    from lorekv.presets import PRESETS, preset
    from lorekv.schedule import DecodingSchedule, ScheduleConfig
    from lorekv.text_generation import TextGenerationPipeline, register_text_generation


_install_text_generation()


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lorekv' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
