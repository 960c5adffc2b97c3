"""A learned score: each prompt token's teacher score predicted from its hidden state.

KVzap ("KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", https://arxiv.org/abs/2601.07891)
predicts, per layer, the log of each KV head's KVzip+ score from the hidden state h (D,) entering
the token's attention (after the layer's input norm), with a linear map or a two-layer MLP. lorekv
fits such maps on any teacher pipeline's scores (:mod:`lorekv.distill`); the ``surrogate`` scorer
applies one where the prefill already computes h (the binding's capture records only the map's
G outputs per token, :attr:`~lorekv.trajectories.LayerCapture.prompt_features`): no second pass
and no futures, about 2 D G multiply-adds per token and layer for the linear map.

A fitted file holds every layer's map and, in its metadata, the fingerprint of the model it was
fitted for; the pipeline refuses it for another model before any work
(:meth:`lorekv.pipeline.Pipeline.check_input`), and :func:`read_surrogate` refuses a missing or
damaged file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lorekv.scorers.base import SCORERS, ScorerConfig
from lorekv.scorers.kv_head import KVHeadScorer
from lorekv.tensorfiles import read_tensor_file
from lorekv.trajectories import LayerCapture
from lorekv.validation import check_int_at_least

FORMAT = "lorekv.surrogate/1"
"""The format name and version written into every surrogate file's metadata."""

REQUIRED = frozenset({"model", "layers", "input_dim", "output_dim", "hidden_dim", "target", "teacher", "calibration"})
"""The metadata fields every surrogate file holds."""


class SurrogateMap(nn.Module):
    """Per fitted layer l, s_l(h): (..., D) hidden states -> (..., G) predicted scores, one per KV head.

    ``hidden_dim`` None: linear, s_l(h) = W_l h + b_l; else a two-layer MLP of that width,
    s_l(h) = W₂ GELU(W₁ h + b₁) + b₂ (KVzap's two forms).
    """

    def __init__(self, layers: Sequence[int], input_dim: int, output_dim: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        if not layers or len(set(layers)) != len(layers):
            raise ValueError(f"layers must list distinct layer indices, at least one, got {list(layers)}")
        check_int_at_least("input_dim", input_dim, 1)
        check_int_at_least("output_dim", output_dim, 1)
        if hidden_dim is not None:
            check_int_at_least("hidden_dim", hidden_dim, 1)
        self.layers = tuple(int(layer) for layer in layers)
        self.input_dim, self.output_dim, self.hidden_dim = input_dim, output_dim, hidden_dim

        def one() -> nn.Module:
            if hidden_dim is None:
                return nn.Linear(input_dim, output_dim)
            return nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))

        self.maps = nn.ModuleList(one() for _ in self.layers)

    @property
    def kind(self) -> str:
        """``"linear"`` or ``"mlp"``."""
        return "linear" if self.hidden_dim is None else "mlp"

    def forward(self, layer: int, states: torch.Tensor) -> torch.Tensor:
        """(..., G) the predicted scores of layer ``layer``'s tokens from their hidden states (..., D)."""
        if layer not in self.layers:
            raise ValueError(f"layer {layer} has no fitted map; this surrogate maps layers {list(self.layers)}")
        module = self.maps[self.layers.index(layer)]
        weight = next(module.parameters())
        return module(states.to(device=weight.device, dtype=weight.dtype))

    def all_layers(self, states: torch.Tensor) -> torch.Tensor:
        """(N, L, G) every layer's predictions from (N, L, D) states, layers in :attr:`layers` order."""
        return torch.stack([self(layer, states[:, i]) for i, layer in enumerate(self.layers)], dim=1)


def shipped_dir() -> Path:
    """The folder of the surrogates that ship with lorekv (``lorekv/surrogates``)."""
    return Path(str(resources.files("lorekv") / "surrogates"))


def shipped_surrogates() -> list[str]:
    """The names of the surrogates shipped with lorekv (``<model>.<teacher>``), sorted."""
    return sorted(path.name.removesuffix(".safetensors") for path in shipped_dir().glob("*.safetensors"))


def resolve_surrogate(file: str | Path) -> Path:
    """The path of ``file``: the name of a shipped surrogate (:func:`shipped_surrogates`), or a path."""
    shipped = shipped_dir() / f"{file}.safetensors"
    return shipped if str(file) in shipped_surrogates() else Path(file)


def read_surrogate(file: str | Path) -> tuple[SurrogateMap, dict[str, Any]]:
    """The maps and metadata of the surrogate ``file`` (a shipped name or a path), in the dtype
    they were saved in, on the CPU; not yet checked against a model (the fingerprint is
    ``meta["model"]``).

    Raises:
        ValueError: no such file (naming the shipped ones); not a lorekv surrogate (or of
            another format version); damaged.
    """
    path = resolve_surrogate(file)
    if not path.is_file():
        raise ValueError(
            f"surrogate file {str(file)!r}: no such file, and not a surrogate shipped with lorekv "
            f"({', '.join(shipped_surrogates()) or 'none'}); fit one with `lorekv distill`"
        )
    tensors, meta = read_tensor_file(path, FORMAT, set(REQUIRED), "surrogate")
    try:
        net = SurrogateMap(meta["layers"], meta["input_dim"], meta["output_dim"], meta["hidden_dim"])
        net = net.to(next(iter(tensors.values())).dtype)
        net.load_state_dict(tensors)
    except (RuntimeError, StopIteration, TypeError, ValueError) as error:
        raise ValueError(f"{path}: damaged: its tensors do not fit the maps its metadata describes: {error}") from None
    return net.eval().requires_grad_(False), meta


class SurrogateConfig(ScorerConfig):
    """Config of :class:`SurrogateScorer`.

    Attributes:
        file: a fitted surrogate: the name of one shipped with lorekv
            (:func:`shipped_surrogates`, e.g. ``"smollm2-135m-instruct.kvzip_plus"``) or the path
            of a ``.safetensors`` file written by ``lorekv distill``.
    """

    name: Literal["surrogate"] = "surrogate"
    file: str


@SCORERS.register(SurrogateConfig)
class SurrogateScorer(KVHeadScorer):
    """s[g, j] = exp(f_l(h_j)[g]): the fitted map f_l of layer l applied to the hidden state h_j
    entering its attention, read back from the log scale it was fitted on (scores are
    non-negative; every policy's comparisons are those of the predicted logs, and the
    ``threshold`` policy compares log s with its threshold). In the predictions' dtype (float32 at
    least): a predicted log above 88 overflows float32, and the policy refuses the infinite score
    (a fitted log score is far below; a map fitted on raw scores would not be).

    The prefill records f_l(h_j) for every prompt token (:attr:`state_maps`, applied by the
    binding's pre-hook on the attention module); the futures play no part, so the cheapest
    sampler goes with it (a one-query prompt window, as the ``kvzap`` preset). The file is read
    when the scorer is built, so a missing or damaged one is refused before any work.
    """

    config: SurrogateConfig

    def __init__(self, config: SurrogateConfig, *, compile: bool = False) -> None:
        super().__init__(config, compile=compile)
        self.map, self.meta = read_surrogate(config.file)

    @cached_property
    def feature(self) -> str:
        """The name under which the prefill records this surrogate's predictions (its tensors' digest)."""
        return f"surrogate:{self.meta['sha256'][:16]}"

    @property
    def fitted_for(self) -> str | None:
        """The fingerprint of the model the surrogate was fitted for."""
        return self.meta["model"]

    @property
    def state_maps(self) -> dict[str, Callable[[int, torch.Tensor], torch.Tensor]]:
        return {self.feature: self.predict}

    def predict(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, q, G) the predicted log scores of layer ``layer``'s tokens from their (B, q, D) hidden
        states, in their dtype promoted to at least float32 (the map moves to their device and
        that dtype once)."""
        dtype = torch.promote_types(hidden_states.dtype, torch.float32)
        weight = next(self.map.parameters())
        if (weight.device, weight.dtype) != (hidden_states.device, dtype):
            self.map = self.map.to(device=hidden_states.device, dtype=dtype)
        return self.map(layer, hidden_states)

    def kv_head_scores(self, layer: LayerCapture) -> torch.Tensor:
        """(G, n) exp of the predicted log scores of the prompt tokens (at least float32)."""
        predicted = layer.prompt_features.get(self.feature)
        if predicted is None:
            raise ValueError(
                "the surrogate scorer reads what its prefill recorded of the hidden states (LayerCapture."
                f"prompt_features[{self.feature!r}]), which this capture lacks: compress through a Pipeline, whose "
                "prefill records them"
            )
        if predicted.shape[-1] != layer.num_kv_heads:
            raise ValueError(
                f"surrogate {self.config.file!r} predicts {predicted.shape[-1]} scores per token, layer "
                f"{layer.layer_idx} has {layer.num_kv_heads} KV heads: a surrogate of another model"
            )
        return predicted.exp().T
