"""The surrogates shipped for the bundled SmolLM2 (lorekv/surrogates): fitted for it, rebuilt from
their committed configs.

In CI: every calibration context the config names is rebuilt from the shipped texts with the
same digest, and one held-out context is re-recorded through the teacher with the per-layer
means the file holds. The whole rebuild (``make surrogates``, about 7 minutes a file on 2 cores)
is ``make surrogates-check``: the maps refitted from scratch equal the shipped ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lorekv.distill import load_surrogate
from lorekv.distill.calibration import contexts
from lorekv.distill.run import DistillConfig, distill, record_context
from lorekv.hf import prepare
from lorekv.models import load
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.scorers.surrogate import shipped_dir, shipped_surrogates

pytestmark = pytest.mark.integration

SHIPPED = ["smollm2-135m-instruct.kvzip_plus", "smollm2-135m-instruct.lore_kv"]


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf")
    model, tokenizer = load("smollm2-135m-instruct")
    return prepare(model), tokenizer


def test_the_shipped_surrogates_are_listed_with_their_configs() -> None:
    assert shipped_surrogates() == SHIPPED
    for name in SHIPPED:
        assert (shipped_dir() / f"{name}.yaml").is_file()


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_surrogate_rebuilds_its_calibration_and_recording(smollm2, name: str) -> None:
    model, tokenizer = smollm2
    surrogate = load_surrogate(name, model)  # refused for any other model
    config = DistillConfig.from_file(shipped_dir() / f"{name}.yaml")
    found = contexts(config.calibration, tokenizer)
    assert [(c["name"], c["sha256"]) for c in surrogate.calibration] == [(c.name, c.sha256) for c in found]
    assert surrogate.teacher == config.teacher_config().for_mode(False).model_dump(mode="json")
    assert surrogate.report.mean("spearman") > 0.3  # the fit learned a ranking, on texts it never saw
    index = next(i for i, c in enumerate(surrogate.calibration) if c["split"] == "held_out")
    teacher = Pipeline.from_config(config.teacher_config())
    _, targets = record_context(model, tokenizer, teacher, found[index], config)
    means = targets.double().mean(dim=(0, 2))
    want = torch.tensor(surrogate.calibration[index]["target_means"], dtype=torch.float64)
    torch.testing.assert_close(means, want, rtol=0, atol=2e-3)


def test_the_presets_run_on_the_bundled_model(smollm2) -> None:
    model, tokenizer = smollm2
    ids = contexts(DistillConfig().calibration, tokenizer)[0].ids[:, :600]
    for name in ("kvzap", "lore_kv_fast"):
        compressed = Pipeline.from_config(preset(name, 64, **({"window": 16} if name == "kvzap" else {}))).compress(
            model, ids, query_aware=False
        )
        kept = sum(len(head) for heads in compressed.selection.indices for head in heads)
        assert 0 < kept <= 30 * 3 * 64


@pytest.mark.skipif(not os.environ.get("LOREKV_REBUILD_SURROGATES"), reason="the full rebuild: make surrogates-check")
@pytest.mark.parametrize("name", SHIPPED)
def test_rebuilding_a_shipped_surrogate_gives_the_same_maps(smollm2, name: str, tmp_path: Path) -> None:
    model, tokenizer = smollm2
    shipped = load_surrogate(name, model)
    config = DistillConfig.from_file(shipped_dir() / f"{name}.yaml")
    rebuilt = distill(config, tmp_path / "rebuilt.safetensors", model, tokenizer, log=lambda _: None)
    for new, old in zip(rebuilt.calibration, shipped.calibration, strict=True):
        assert {k: new[k] for k in ("name", "sha256", "split")} == {k: old[k] for k in ("name", "sha256", "split")}
        assert new["target_means"] == pytest.approx(old["target_means"], abs=2e-3)
    for a, b in zip(rebuilt.map.state_dict().values(), shipped.map.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
