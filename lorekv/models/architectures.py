"""Real architectures with random weights: the published configs of 1-12B models, built without a download.

The cost of compression (prefill, sampling the futures, scoring, selection, decoding) depends on the
shapes of the model (layers, width, heads, head size, vocabulary, attention pattern), not on the values
of its weights. A model built from a published ``config.json`` with random weights therefore measures
that cost at the real size on a machine without a model hub. It measures nothing about accuracy: its
text is noise, and which tokens an eviction keeps means nothing.

The configs ship as JSON files beside this module (``lorekv/models/architectures/<name>.json``): the
published fields of each Hugging Face repository that determine the compute, each file naming its
repository (``source``). Gemma 3 is its text model (``text_config``; the causal LM without the vision
tower). ``random:<name>`` is how ``lorekv bench`` names them.

A quick run shrinks a model: ``layers`` keeps the first k layers of the published layer pattern, and
``width`` divides the hidden size, the MLP's size and both head counts by a factor, keeping the head size
and the query/KV group ratio.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

RANDOM_PREFIX = "random:"
CONFIG_DIR = Path(__file__).with_name("architectures")
# Fields of the published files that describe the checkpoint, not the compute.
_NOT_BUILT = ("architectures", "torch_dtype", "transformers_version", "sliding_window_pattern")
# Special token ids mean nothing without a tokenizer: unset, so that generation never stops early.
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
# A prime near 2**22: the length of the block of random numbers that fills the weights.
BLOCK = 4_194_301
FULL = "full_attention"
SLIDING = "sliding_attention"


@dataclass(frozen=True)
class Architecture:
    """One published architecture.

    Attributes:
        name: lorekv's name (``random:<name>`` in ``lorekv bench``).
        source: the Hugging Face repository whose ``config.json`` the numbers come from.
        note: how the file relates to the published one (defaults written out, the text config, ...).
        config: the published fields, as ``config.json`` spells them.
    """

    name: str
    source: str
    note: str
    config: dict[str, Any]

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.config["hidden_size"] // self.config["num_attention_heads"])

    @property
    def layer_types(self) -> list[str]:
        """Each layer's attention as published: Gemma 3's every ``sliding_window_pattern``-th layer is full
        attention and the others slide; a model without a sliding pattern is full attention throughout."""
        pattern = self.config.get("sliding_window_pattern")
        if pattern is None:
            return [FULL] * self.layers
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(self.layers)]

    def widths(self) -> tuple[int, ...]:
        """The width factors that divide the KV heads, the hidden size and the MLP's size exactly."""
        c = self.config
        return tuple(
            f
            for f in range(1, c["num_key_value_heads"] + 1)
            if all(c[key] % f == 0 for key in ("num_key_value_heads", "hidden_size", "intermediate_size"))
        )

    def check(self, layers: int | None = None, width: int | None = None) -> None:
        """Raise a one-line ValueError naming the option and its allowed values unless ``layers`` and
        ``width`` shrink this architecture."""
        if layers is not None and (isinstance(layers, bool) or not 1 <= layers <= self.layers):
            raise ValueError(f"layers must be an integer from 1 to {self.layers} for {self.name}, got {layers!r}")
        if width is not None and width not in self.widths():
            allowed = ", ".join(map(str, self.widths()))
            raise ValueError(f"width must be one of {allowed} for {self.name} (divides the KV heads), got {width!r}")

    def shrunk_layer_types(self, layers: int | None = None) -> list[str]:
        """The first ``layers`` of :attr:`layer_types`. A hybrid model cut before its first full-attention
        layer (Gemma 3 below 6 layers) gets its last layer made full attention: lorekv evicts in the
        full-attention layers only, so a model without one would have nothing to compress."""
        types = self.layer_types[: layers or self.layers]
        if FULL not in types:
            types[-1] = FULL
        return types

    def fields(self, layers: int | None = None, width: int | None = None) -> dict[str, Any]:
        """The config fields to build: the published ones, cut to ``layers`` and divided by ``width``,
        with the head size written out (it must not change with the width) and no special token ids."""
        self.check(layers, width)
        f = width or 1
        fields = {k: v for k, v in self.config.items() if k not in _NOT_BUILT}
        fields.update(dict.fromkeys(_TOKEN_IDS))
        fields["head_dim"] = self.head_dim
        fields["num_hidden_layers"] = layers or self.layers
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
            fields[key] = self.config[key] // f
        if "sliding_window_pattern" in self.config:
            fields["layer_types"] = self.shrunk_layer_types(layers)
        return fields

    def transformers_config(self, layers: int | None = None, width: int | None = None) -> PretrainedConfig:
        """transformers' config of the (shrunk) architecture; legacy fields (``rope_scaling``,
        ``rope_theta``, ``rope_local_base_freq``) are converted by its config class."""
        fields = self.fields(layers, width)
        return AutoConfig.for_model(fields.pop("model_type"), **fields)

    def describe(self, layers: int | None = None, width: int | None = None) -> dict[str, Any]:
        """What a result built from this architecture must say about its model (JSON-ready)."""
        types = self.shrunk_layer_types(layers)
        return {
            "weights": "random",
            "architecture": self.name,
            "source": self.source,
            "layers": len(types),
            "published_layers": self.layers,
            "full_attention_layers": types.count(FULL),
            "width": width or 1,
            "measures": "cost: time and memory of prefill, compression and decoding at this architecture's shapes",
            "cannot_measure": "accuracy: the weights are random, so the text and which tokens are kept mean nothing",
        }


@functools.cache
def published_architectures() -> dict[str, Architecture]:
    """Every shipped architecture by name, read from ``lorekv/models/architectures/*.json``."""
    found = {}
    for path in sorted(CONFIG_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        found[data["name"]] = Architecture(data["name"], data["source"], data["note"], data["config"])
    return found


def random_name(model: str) -> str | None:
    """The architecture named by ``random:<name>``; None for any other model name."""
    return model[len(RANDOM_PREFIX) :] if model.startswith(RANDOM_PREFIX) else None


def architecture(name: str) -> Architecture:
    """The shipped architecture ``name`` (``random:`` prefix optional); a one-line error lists the others."""
    key = random_name(name) or name
    known = published_architectures()
    if key not in known:
        allowed = ", ".join(RANDOM_PREFIX + k for k in known)
        raise ValueError(f"model: unknown architecture {name!r}; the random-weight models are {allowed}")
    return known[key]


@torch.no_grad()
def random_model(
    name: str,
    *,
    layers: int | None = None,
    width: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> PreTrainedModel:
    """The architecture ``name`` with random weights, in eval mode, built in ``dtype`` on ``device``.

    transformers' and torch's initialisers are skipped, and so is drawing a normal number per weight
    (about 60 M/s on a 2-core CPU: half a minute for an 8B-wide model of 2 layers): one block of
    :data:`BLOCK` numbers is drawn from a seeded normal of the config's ``initializer_range`` (0.02)
    in ``dtype`` and every matrix is filled with copies of it from its own seeded offset, at memory
    speed. The block's length is a prime, so consecutive rows of a matrix hold different values; the
    weights repeat with that period, which the cost does not see. Biases are zero; the norms keep the
    values their modules construct (ones, or zeros where the norm scales by 1 + weight, as Gemma's
    does). ``layers`` and ``width`` shrink the model (see :meth:`Architecture.fields`).
    """
    arch = architecture(name)
    config = arch.transformers_config(layers, width)
    with torch.device(device), no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # skipped with the initialisation; Gemma 3's output head is its embedding
    generator = torch.Generator(device=device).manual_seed(seed)
    std = float(arch.config.get("initializer_range", 0.02))
    block = torch.empty(BLOCK, dtype=dtype, device=device).normal_(0.0, std, generator=generator)
    offsets = torch.randint(BLOCK, (len(list(model.parameters())),), generator=torch.Generator().manual_seed(seed))
    for (param_name, param), offset in zip(model.named_parameters(), offsets.tolist(), strict=True):  # tied: once
        if param.dim() >= 2:
            _tile(param.view(-1), block, offset)
        elif param_name.endswith("bias"):
            param.zero_()
        elif not torch.isfinite(param).all():
            raise RuntimeError(f"{arch.name}: parameter {param_name} was left uninitialised")
    return model.eval()


def _tile(flat: torch.Tensor, block: torch.Tensor, start: int) -> None:
    """Fill ``flat`` with ``block`` repeated, beginning at ``block[start]``."""
    done = 0
    while done < flat.numel():
        take = min(flat.numel() - done, block.numel() - start)
        flat[done : done + take].copy_(block[start : start + take])
        done, start = done + take, 0


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once, as ``parameters()`` yields them)."""
    return sum(p.numel() for p in model.parameters())
