"""A fitted surrogate on disk: one safetensors file, refused by any other model.

The file holds every layer's map (:class:`~lorekv.distill.fit.SurrogateMap`) and, in its
metadata, what a reader needs to trust it: the fingerprint of the model it was fitted for (in
any floating dtype: :func:`~lorekv.hf.storage.model_fingerprint` with ``dtype=False``), the
teacher's pipeline config, the calibration contexts (each with its SHA-256) and the held-out
figures of the fit. :func:`load_surrogate` refuses a missing file, a damaged one and one fitted
for another model, each with an error that says which, before anything is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorekv.distill.fit import FitReport, LayerFit, SurrogateMap
from lorekv.hf.storage import model_fingerprint
from lorekv.tensorfiles import read_tensor_file, write_tensor_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FORMAT = "lorekv.surrogate/1"
"""The format name and version written into every surrogate file's metadata."""


@dataclass(frozen=True)
class Surrogate:
    """A fitted surrogate and its provenance.

    Attributes:
        map: the per-layer maps.
        teacher: the teacher pipeline's config (JSON form) whose scores were fitted.
        calibration: the calibration contexts, each ``{"name": ..., "sha256": ...}``.
        report: the fit's held-out figures.
        extra: anything else the fitting recorded (its options, times).
    """

    map: SurrogateMap
    teacher: dict[str, Any]
    calibration: list[dict[str, str]]
    report: FitReport
    extra: dict[str, Any] = field(default_factory=dict)


def save_surrogate(surrogate: Surrogate, path: str | Path, model: PreTrainedModel) -> Path:
    """Write ``surrogate`` (fitted for ``model``) to ``path`` (``.safetensors``, replaced atomically)."""
    net = surrogate.map
    meta = {
        "format": FORMAT,
        "model": model_fingerprint(model, dtype=False),
        "layers": list(net.layers),
        "input_dim": net.input_dim,
        "output_dim": net.output_dim,
        "hidden_dim": net.hidden_dim,
        "teacher": surrogate.teacher,
        "calibration": surrogate.calibration,
        "report": {"tokens": surrogate.report.tokens, "layers": [vars(fit) for fit in surrogate.report.layers]},
        "extra": surrogate.extra,
    }
    return write_tensor_file(path, dict(net.state_dict()), meta)


def load_surrogate(path: str | Path, model: PreTrainedModel) -> Surrogate:
    """The surrogate saved in ``path``, checked against ``model`` (on the CPU, in float32 or the
    dtype it was saved in).

    Raises:
        ValueError: no such file; not a lorekv surrogate (or of another format version);
            damaged; fitted for another model (another architecture or other weights).
    """
    required = {"model", "layers", "input_dim", "output_dim", "hidden_dim", "teacher", "calibration", "report"}
    tensors, meta = read_tensor_file(path, FORMAT, required, "surrogate")
    ours = model_fingerprint(model, dtype=False)
    if meta["model"] != ours:
        raise ValueError(
            f"{path}: a surrogate fitted for another model (fingerprint {meta['model'][:12]}..., this model's is "
            f"{ours[:12]}...): another architecture or other weights; fit one for this model"
        )
    net = SurrogateMap(meta["layers"], meta["input_dim"], meta["output_dim"], meta["hidden_dim"])
    try:
        net = net.to(next(iter(tensors.values())).dtype)
        net.load_state_dict(tensors)
    except (RuntimeError, StopIteration) as error:
        raise ValueError(f"{path}: damaged: its tensors do not fit the maps its metadata describes: {error}") from None
    report = FitReport(meta["report"]["tokens"], tuple(LayerFit(**fit) for fit in meta["report"]["layers"]))
    return Surrogate(
        net.eval().requires_grad_(False), meta["teacher"], meta["calibration"], report, meta.get("extra", {})
    )
