"""A fitted surrogate on disk: one safetensors file, refused by any other model.

The file holds every layer's map (:class:`~lorekv.scorers.surrogate.SurrogateMap`) and, in its
metadata, what a reader needs to trust it: the fingerprint of the model it was fitted for (in
any floating dtype: :func:`~lorekv.hf.storage.model_fingerprint` with ``dtype=False``), the
target the maps predict, the teacher's pipeline config, the calibration contexts (each with its
SHA-256) and the held-out figures of the fit. :func:`load_surrogate` refuses a missing file, a
damaged one and one fitted for another model, each with an error that says which, before
anything is built from it; the ``surrogate`` scorer reads the same files
(:func:`~lorekv.scorers.surrogate.read_surrogate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lorekv.distill.fit import FitReport, LayerFit
from lorekv.hf.storage import check_fitted_for, model_fingerprint
from lorekv.scorers.surrogate import FORMAT, SurrogateMap, read_surrogate
from lorekv.tensorfiles import write_tensor_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Surrogate:
    """A fitted surrogate and its provenance.

    Attributes:
        map: the per-layer maps.
        teacher: the teacher pipeline's config (JSON form) whose scores were fitted.
        calibration: the calibration contexts, each ``{"name", "sha256"}`` (of its token ids) and,
            from ``lorekv distill``, its ``tokens``, ``split`` (``fit`` or ``held_out``) and
            ``target_means`` (the mean recorded target of each layer, a check that a rebuild
            recorded the same).
        report: the fit's held-out figures.
        extra: anything else the fitting recorded (its options, times).
        target: what the maps predict of the teacher's score s: ``"log"``, log s (the
            ``surrogate`` scorer reads its predictions back with exp).
    """

    map: SurrogateMap
    teacher: dict[str, Any]
    calibration: list[dict[str, Any]]
    report: FitReport
    extra: dict[str, Any] = field(default_factory=dict)
    target: str = "log"


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
        "target": surrogate.target,
        "teacher": surrogate.teacher,
        "calibration": surrogate.calibration,
        "report": {"tokens": surrogate.report.tokens, "layers": [vars(fit) for fit in surrogate.report.layers]},
        "extra": surrogate.extra,
    }
    return write_tensor_file(path, {name: t.contiguous() for name, t in net.state_dict().items()}, meta)


def load_surrogate(path: str | Path, model: PreTrainedModel) -> Surrogate:
    """The surrogate saved in ``path`` (a path, or the name of a shipped one), checked against
    ``model`` (on the CPU, in the dtype it was saved in).

    Raises:
        ValueError: no such file; not a lorekv surrogate (or of another format version);
            damaged; fitted for another model (another architecture or other weights).
    """
    net, meta = read_surrogate(path)
    check_fitted_for(meta["model"], model, str(path))
    saved = meta.get("report", {"tokens": 0, "layers": []})
    report = FitReport(saved["tokens"], tuple(LayerFit(**fit) for fit in saved["layers"]))
    return Surrogate(net, meta["teacher"], meta["calibration"], report, meta.get("extra", {}), meta["target"])
