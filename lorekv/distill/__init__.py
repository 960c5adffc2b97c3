"""Distillation: a per-layer map from a token's hidden state to its score under an expensive
teacher (a reconstruction's KVzip+ score, LORE-KV's futures), fitted once per model and applied
where the prefill already computes the hidden states.

KVzap ("KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", https://arxiv.org/abs/2601.07891)
fits, per layer, a linear map or a two-layer MLP from the hidden state entering the attention to
the log of the KVzip+ score of each KV head. :mod:`lorekv.distill.fit` fits both on recorded
(hidden state, teacher score) pairs and measures them on held-out ones;
:mod:`lorekv.distill.files` saves a fit for one model with its provenance and refuses it for any
other.
"""

from lorekv.distill.files import Surrogate, load_surrogate, save_surrogate
from lorekv.distill.fit import FitReport, LayerFit, fit_linear, fit_mlp, held_out_report
from lorekv.scorers.surrogate import SurrogateMap

__all__ = [
    "FitReport",
    "LayerFit",
    "Surrogate",
    "SurrogateMap",
    "fit_linear",
    "fit_mlp",
    "held_out_report",
    "load_surrogate",
    "save_surrogate",
]
