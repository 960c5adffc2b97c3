"""The settings of one ``lorekv bench`` run, validated before any model is loaded.

Every field fails with its name and allowed range: lengths that the SnapKV preset's window or
the budget's protected tokens do not fit, futures below 1, too few decode tokens to difference,
an unknown scorer, a CUDA device on a machine without one. The model's context is checked
from its ``config.json`` where that can be read without loading the model (the bundled
models' cache, a local directory), and again once the model is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from lorekv.cost.prompts import batch_lengths
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scorers.base import SCORERS

DEFAULT_LENGTHS = (512, 1024, 2048, 4096)
DEFAULT_FUTURES = (1, 2, 4, 8)
DEFAULT_SCORERS = ("attention_mass", "loo", "projected_loo")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)

Dtype = Literal["float32", "bfloat16", "float16"]


def _invalid(field: str, message: str, value: object) -> ValidationError:
    """A validation error located at ``field`` (a model-level check naming the field it is about)."""
    error = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(field,), input=value)
    return ValidationError.from_exception_data("BenchConfig", [error])


def _ints(name: str, values: tuple[int, ...], low: int) -> tuple[int, ...]:
    if not values:
        raise ValueError(f"{name} must name at least one integer >= {low}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be integers >= {low}, got {value!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat a value, got {list(values)}")
    return tuple(sorted(values))


class BenchConfig(BaseModel):
    """What ``lorekv bench`` measures and how.

    Attributes:
        model: a bundled name, local transformers directory, ``.gguf`` file or hub id; or
            ``random:<architecture>``, a published architecture with random weights
            (:mod:`lorekv.models.architectures`: it measures cost at that size, not accuracy).
        layers: a ``random:`` model's layers: the first k of its published layer pattern (None: all).
        width: a ``random:`` model's width divisor of the hidden size, the MLP and the head counts
            (head size and query/KV group ratio kept; None: the published width).
        lengths: prompt lengths n in tokens (each prompt is built to exactly n tokens).
        futures: the M of the sampling/scoring sweep (growth with M).
        num_futures: M of the LORE-KV compression and of the scorers' captured queries.
        tokens: T, tokens per future.
        budget: B, kept tokens per KV head (LORE-KV and SnapKV).
        repeats: timed runs per measurement after one warm-up; medians are reported.
        decode_tokens: K, tokens decoded per decode measurement (per-token time = (t_K - t_1) / (K - 1)).
        scorers: the scorers timed alone on the same captured queries.
        threads: ``torch.set_num_threads``; None: every core (``os.cpu_count()``).
        device: ``cpu``, ``cuda`` or ``cuda:<i>``.
        dtype: the weights' dtype; None: float32 on the CPU, bfloat16 on CUDA.
        compile: also time the torch.compile'd scorers (and compress with them).
        seed: the prompts' seed.
        batch_sizes: the b of the batch throughput (LORE-KV compression and decoding of b ragged
            prompts at once, :func:`~lorekv.cost.prompts.batch_lengths`); must hold 1, the reference.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: StrictStr = "smollm2-135m-instruct"
    layers: StrictInt | None = None
    width: StrictInt | None = None
    lengths: tuple[StrictInt, ...] = DEFAULT_LENGTHS
    futures: tuple[StrictInt, ...] = DEFAULT_FUTURES
    num_futures: StrictInt = Field(default=4, ge=1)
    tokens: StrictInt = Field(default=8, ge=1)
    budget: StrictInt = Field(default=128, ge=1)
    repeats: StrictInt = Field(default=5, ge=1)
    decode_tokens: StrictInt = Field(default=32, ge=2)
    scorers: tuple[StrictStr, ...] = DEFAULT_SCORERS
    threads: StrictInt | None = Field(default=None, ge=1)
    device: StrictStr = "cpu"
    dtype: Dtype | None = None
    compile: StrictBool = True
    seed: StrictInt = Field(default=0, ge=0)
    batch_sizes: tuple[StrictInt, ...] = DEFAULT_BATCH_SIZES

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return _ints("lengths", value, 2)

    @field_validator("futures")
    @classmethod
    def _futures(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return _ints("futures", value, 1)

    @field_validator("batch_sizes")
    @classmethod
    def _batch_sizes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        value = _ints("batch_sizes", value, 1)
        if 1 not in value:
            raise ValueError(f"batch_sizes must include 1 (the reference of the ratios), got {list(value)}")
        return value

    @field_validator("scorers")
    @classmethod
    def _scorers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = SCORERS.names()
        unknown = [name for name in value if name not in known]
        if not value or unknown:
            raise ValueError(f"scorers must name one or more of {', '.join(known)}, got {list(value)}")
        if len(set(value)) != len(value):
            raise ValueError(f"scorers must not repeat a name, got {list(value)}")
        return value

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        try:
            device = torch.device(value)
        except RuntimeError:
            raise ValueError(f"device must be cpu, cuda or cuda:<index>, got {value!r}") from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu, cuda or cuda:<index>, got {value!r}")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {value!r}: no CUDA device is available on this machine (use cpu)")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"device {value!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return value

    @model_validator(mode="after")
    def _random_architecture(self) -> BenchConfig:
        from lorekv.models.architectures import architecture, random_name

        if random_name(self.model) is None:
            for name in ("layers", "width"):
                if getattr(self, name) is not None:
                    message = f"{name} shrinks a random:<architecture> model only, not {self.model!r}"
                    raise _invalid(name, message, getattr(self, name))
            return self
        try:
            arch = architecture(self.model)
        except ValueError as error:
            raise _invalid("model", str(error).removeprefix("model: "), self.model) from None
        try:
            arch.check(self.layers, self.width)
        except ValueError as error:
            field = "layers" if str(error).startswith("layers") else "width"
            raise _invalid(field, str(error), getattr(self, field)) from None
        return self

    @property
    def random_weights(self) -> bool:
        """Whether the model is a ``random:<architecture>`` (random weights: cost, not accuracy)."""
        from lorekv.models.architectures import random_name

        return random_name(self.model) is not None

    @property
    def label(self) -> str:
        """The model's name for file names: a random architecture's with its shrink settings (``-L2-w4``)."""
        shrink = "".join(f"-{tag}{value}" for tag, value in (("L", self.layers), ("w", self.width)) if value)
        return self.model + shrink

    @model_validator(mode="after")
    def _fits_the_methods(self) -> BenchConfig:
        try:
            pipelines = self.pipelines()
        except ValueError as error:
            raise _invalid("budget", str(error), self.budget) from None
        for pipeline in pipelines.values():
            window = pipeline.sampler.prefill_window
            for n in self.lengths:
                if window != "all" and window > n:
                    raise _invalid("lengths", f"each length must be >= {window} (the SnapKV window)", n)
                try:  # query-aware: n - 1 candidates, the last prompt token kept on top
                    pipeline.policy.check_budget(n - 1, 1)
                except ValueError as error:
                    raise _invalid("lengths", f"{n} does not fit budget {self.budget}: {error}", n) from None
        lore = pipelines["lore_kv"]
        for n in self.lengths:  # the batch's shorter rows (LORE-KV only)
            for length in set(batch_lengths(n, max(self.batch_sizes))) - {n}:
                try:
                    if lore.sampler.prefill_window != "all" and lore.sampler.prefill_window > length:
                        raise ValueError(f"the LORE-KV window {lore.sampler.prefill_window} does not fit")
                    lore.policy.check_budget(length - 1, 1)
                except ValueError as error:
                    message = f"{n}: a batch row of {length} tokens does not fit budget {self.budget}: {error}"
                    raise _invalid("batch_sizes", message, self.batch_sizes) from None
        return self

    def pipelines(self) -> dict[str, Pipeline]:
        """The two compressions timed: ``lore_kv`` (M = ``num_futures``, T = ``tokens``) and ``snapkv``."""
        snapkv = preset("snapkv", self.budget)
        lore = preset("lore_kv", self.budget, num_futures=self.num_futures, num_tokens=self.tokens)
        return {"lore_kv": Pipeline.from_config(lore), "snapkv": Pipeline.from_config(snapkv)}

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.resolved_dtype)

    @property
    def resolved_dtype(self) -> str:
        if self.dtype is not None:
            return self.dtype
        return "bfloat16" if torch.device(self.device).type == "cuda" else "float32"

    @property
    def resolved_threads(self) -> int:
        return self.threads if self.threads is not None else os.cpu_count() or 1

    @property
    def positions_needed(self) -> int:
        """Positions the longest prompt needs: n, then T future tokens or K decoded ones."""
        return max(self.lengths) + max(self.tokens, self.decode_tokens)

    def check_context(self, context: int | None) -> None:
        """Raise unless the longest prompt and what follows it fit a context of ``context`` positions."""
        if context is not None and self.positions_needed > context:
            room = context - max(self.tokens, self.decode_tokens)
            raise ValueError(
                f"lengths must be <= {room} for {self.model} (context {context}, minus "
                f"max(tokens, decode_tokens) = {max(self.tokens, self.decode_tokens)}), got {max(self.lengths)}"
            )


def known_context(model: str) -> int | None:
    """The model's context (``max_position_embeddings``) read from its ``config.json`` without
    loading it: the bundled models' dequantised cache, a local directory or a shipped random
    architecture's published config; None when unknown."""
    from lorekv.models import BUNDLED, cache_root
    from lorekv.models.architectures import published_architectures, random_name

    name = random_name(model)
    if name is not None:
        arch = published_architectures().get(name)
        return None if arch is None else int(arch.config["max_position_embeddings"])

    folder = cache_root() / model if model in BUNDLED else Path(model)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) else None


def parse_ints(name: str, text: str) -> tuple[int, ...]:
    """``"512,1024"`` -> ``(512, 1024)``; anything else is an error naming ``name``."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or not all(p.lstrip("-").isdigit() for p in parts):
        raise ValueError(f"{name} must be comma-separated integers (e.g. 512,1024), got {text!r}")
    return tuple(int(p) for p in parts)


def parse_names(name: str, text: str) -> tuple[str, ...]:
    """``"loo, projected_loo"`` -> ``("loo", "projected_loo")``; empty names are an error naming ``name``."""
    parts = tuple(p.strip() for p in text.split(","))
    if not all(parts):
        raise ValueError(f"{name} must be comma-separated names (e.g. loo,projected_loo), got {text!r}")
    return parts
