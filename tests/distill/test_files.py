"""A fitted surrogate saved and loaded: the same maps and provenance back, in any dtype of the
same model, and every other file refused before anything is built."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_llama

from lorekv.distill import Surrogate, fit_linear, fit_mlp, held_out_report, load_surrogate, save_surrogate

TEACHER = {"sampler": {"name": "kvzip"}, "scorer": {"name": "kvzip_plus"}}
CALIBRATION = [{"name": "niah_single #0", "sha256": "ab" * 32}]


def fitted(kind: str) -> Surrogate:
    generator = torch.Generator().manual_seed(7)
    states, scores = torch.randn(40, 2, 32, generator=generator), torch.randn(40, 2, 2, generator=generator)
    layers = [0, 1]
    net = (
        fit_linear(states, scores, layers)
        if kind == "linear"
        else fit_mlp(states, scores, layers, hidden_dim=8, epochs=2)
    )
    return Surrogate(net, TEACHER, CALIBRATION, held_out_report(net, states, scores), {"alpha": 1.0})


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_a_surrogate_round_trips_onto_its_model_in_any_dtype(kind, tmp_path) -> None:
    model = tiny_llama(30).float()
    surrogate = fitted(kind)
    path = save_surrogate(surrogate, tmp_path / "s.safetensors", model)
    loaded = load_surrogate(path, tiny_llama(30).to(torch.bfloat16))  # the same weights, rounded
    assert (loaded.teacher, loaded.calibration, loaded.report, loaded.extra) == (
        surrogate.teacher, surrogate.calibration, surrogate.report, surrogate.extra
    )  # fmt: skip
    assert loaded.map.kind == kind and loaded.map.layers == (0, 1)
    states = torch.randn(5, 32)
    for layer in (0, 1):
        assert torch.equal(loaded.map(layer, states), surrogate.map(layer, states))


def test_a_file_of_another_model_a_damaged_one_and_a_missing_one_are_refused(tmp_path) -> None:
    model = tiny_llama(30)
    path = save_surrogate(fitted("linear"), tmp_path / "s.safetensors", model)
    with pytest.raises(ValueError, match="a surrogate fitted for another model"):
        load_surrogate(path, tiny_llama(31))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a byte of the last tensor's data
    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged: its tensors do not match"):
        load_surrogate(flipped, model)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ValueError, match="not a readable lorekv surrogate"):
        load_surrogate(cut, model)
    with pytest.raises(ValueError, match="no such file, and not a surrogate shipped"):
        load_surrogate(tmp_path / "missing.safetensors", model)


def test_the_fitted_check_follows_the_weights() -> None:
    """The fingerprint a fitted file is checked against is recomputed once a weight changes in place."""
    from lorekv.hf.storage import model_fingerprint, weights_fingerprint

    model = tiny_llama(30)
    before = weights_fingerprint(model)
    assert before == model_fingerprint(model, dtype=False) == weights_fingerprint(model)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
    assert weights_fingerprint(model) == model_fingerprint(model, dtype=False) != before
