"""``lorekv distill``: run a teacher over calibration contexts, record its scores with the hidden
states, fit a surrogate, write it with its provenance.

The teacher is any pipeline (a preset's name or a YAML/JSON file); a context is prefilled once
through the teacher's own prefill, which records every prompt token's hidden state entering each
evictable layer's attention (the binding's capture, ``state_maps``), and the teacher's futures,
scorer and aggregator give the score of each (layer, KV head, token): exactly what the teacher's
policy would rank. The fit's target is the log score (KVzap's), floored at ``floor`` so that a
score of 0 stays finite; the loss is the mean squared error on it (ridge for the linear map,
AdamW with weight decay for the MLP, :mod:`lorekv.distill.fit`). Whole contexts are held out
(``held_out``), so the reported figures are on texts the fit never saw.

Each context's recording (a random subset of ``tokens_per_context`` of its tokens) is written to a
parts folder beside the output as soon as it is done, atomically; a rerun with the same settings
reads the finished ones back instead of recomputing them, so a killed run loses at most the
context in flight.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field

from lorekv.distill.calibration import CalibrationConfig, Context, contexts
from lorekv.distill.files import Surrogate, save_surrogate
from lorekv.distill.fit import FitReport, fit_linear, fit_mlp, held_out_report
from lorekv.hf import evictable_layers
from lorekv.pipeline import Pipeline, PipelineConfig, prefill
from lorekv.presets import PRESETS, preset
from lorekv.tensorfiles import read_tensor_file, write_tensor_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

HIDDEN = "hidden"
"""The name under which the teacher's prefill records the hidden states themselves."""

PARTS_FORMAT = "lorekv.distill-part/1"


class DistillConfig(BaseModel):
    """A surrogate fit: the teacher, the contexts it scores, the map and how it is fitted.

    Attributes:
        model: the model (a bundled name, a directory, a .gguf file); the CLI loads it.
        teacher: a preset's name (at ``budget``) or the path of a pipeline YAML/JSON file.
        budget: the budget the preset is built at (its scores do not depend on it).
        query_aware: score contexts as the teacher compresses a prompt whose question it holds
            (False: before its question, the teacher's ``agnostic_`` parts; the contexts then end
            where the question would start).
        calibration: the contexts (:class:`~lorekv.distill.calibration.CalibrationConfig`).
        tokens_per_context: tokens of each context recorded (drawn at random, seeded by the
            context's digest), >= 1; a context with fewer gives them all.
        held_out: the share of the contexts held out of the fit for its report, in [0, 1).
        kind: ``linear`` (ridge, KVzap's linear form) or ``mlp`` (a two-layer MLP).
        alpha: the ridge penalty of the linear map (>= 0).
        hidden_dim / epochs / lr / batch_size / weight_decay: the MLP's (KVzap's defaults).
        floor: scores below it count as it before the log (> 0).
        seed: the held-out split's, the token draw's and the MLP's seed.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = "smollm2-135m-instruct"
    teacher: str = "lore_kv"
    budget: int = Field(default=128, ge=1, strict=True)
    query_aware: bool = False
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    tokens_per_context: int = Field(default=512, ge=1, strict=True)
    held_out: float = Field(default=0.2, ge=0.0, lt=1.0)
    kind: Literal["linear", "mlp"] = "linear"
    alpha: float = Field(default=1.0, ge=0.0)
    hidden_dim: int = Field(default=512, ge=1, strict=True)
    epochs: int = Field(default=15, ge=1, strict=True)
    lr: float = Field(default=5e-3, gt=0.0)
    batch_size: int = Field(default=512, ge=1, strict=True)
    weight_decay: float = Field(default=0.01, ge=0.0)
    floor: float = Field(default=1e-10, gt=0.0)
    seed: int = Field(default=0, ge=0, strict=True)

    @classmethod
    def from_file(cls, path: str | Path) -> DistillConfig:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such distill config file")
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})

    def teacher_config(self) -> PipelineConfig:
        """The teacher pipeline's config (a preset at ``budget``, or the file)."""
        if self.teacher in PRESETS:
            return preset(self.teacher, self.budget)
        if not Path(self.teacher).is_file():
            raise ValueError(
                f"teacher: {self.teacher!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a pipeline file"
            )
        return PipelineConfig.from_file(self.teacher)

    def recording_digest(self) -> str:
        """What a context's recording depends on (the teacher's config in its mode, the token draw,
        the floor): a part written under another digest is recomputed, not reused."""
        recipe = {
            "teacher": self.teacher_config().for_mode(self.query_aware).model_dump(mode="json"),
            "query_aware": self.query_aware,
            "tokens_per_context": self.tokens_per_context,
            "floor": self.floor,
            "seed": self.seed,
        }
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def record_context(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    teacher: Pipeline,
    context: Context,
    config: DistillConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, L, D) float32 hidden states and (k, L, G) float32 log teacher scores of ``k`` tokens of
    ``context`` (``tokens_per_context`` drawn among its candidates, sorted), layers in order.

    One prefill through the teacher's mode, recording the hidden states entering every evictable
    layer's attention; the teacher's futures, per-future scores and aggregation as its
    ``compress`` computes them."""
    mode = teacher.for_mode(config.query_aware)
    mode.check_input(model, context.ids, query_aware=config.query_aware, tokenizer=tokenizer)
    batch = prefill(
        model,
        context.ids,
        [mode.sampler],
        query_aware=config.query_aware,
        tokenizer=tokenizer,
        query_norms=mode.scorer.needs_query_norms,
        state_maps={**mode.scorer.state_maps, HIDDEN: lambda layer, hidden: hidden},
    )
    row = batch.rows[0]
    futures = mode.sampler.futures_batch(batch)[0]
    scores, _ = mode.score(futures, row.candidates)  # (L, G, c)
    layers = sorted(row.evict_layers)
    states = torch.stack([batch.capture.stacked_states(HIDDEN, idx)[0, : row.candidates] for idx in layers], dim=1)
    generator = torch.Generator().manual_seed(int(context.sha256[:15], 16) + config.seed)
    count = min(config.tokens_per_context, row.candidates)
    chosen = torch.randperm(row.candidates, generator=generator)[:count].sort().values
    targets = scores.permute(2, 0, 1)[chosen].double().clamp_min(config.floor).log()
    return states[chosen].float().cpu(), targets.float().cpu()


def _part_path(parts: Path, context: Context) -> Path:
    return parts / f"{context.sha256[:24]}.safetensors"


def _read_part(path: Path, digest: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A finished context's recording, or None when absent, unreadable or recorded otherwise."""
    try:
        tensors, meta = read_tensor_file(path, PARTS_FORMAT, {"recording"}, "distill part")
    except ValueError:
        return None
    if meta["recording"] != digest:
        return None
    return tensors["states"], tensors["targets"]


def split_contexts(found: list[Context], held_out: float, seed: int) -> tuple[list[Context], list[Context]]:
    """(fitting, held out): round(held_out * N) contexts held out (at least one when held_out > 0
    and N >= 2), drawn with ``seed`` among the N, each list in the contexts' order."""
    n = len(found)
    count = min(max(round(held_out * n), 1 if held_out > 0 and n >= 2 else 0), n - 1)
    generator = torch.Generator().manual_seed(seed)
    chosen = set(torch.randperm(n, generator=generator)[:count].tolist())
    return [c for i, c in enumerate(found) if i not in chosen], [c for i, c in enumerate(found) if i in chosen]


def distill(
    config: DistillConfig,
    out: str | Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    log: Callable[[str], None] = print,
) -> Surrogate:
    """Fit ``config``'s surrogate for ``model`` and write it to ``out`` (see the module docstring);
    returns it. Finished contexts are kept in ``<out>.parts/`` and reused by a rerun."""
    out = Path(out)
    teacher = Pipeline.from_config(config.teacher_config())
    found = contexts(config.calibration, tokenizer)
    if len(found) < 2 and config.held_out > 0:
        raise ValueError(f"calibration gives {len(found)} context(s); holding some out needs at least 2")
    digest = config.recording_digest()
    parts = out.with_name(out.name + ".parts")
    recorded: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    start = time.perf_counter()
    for i, context in enumerate(found, 1):
        path = _part_path(parts, context)
        part = _read_part(path, digest)
        if part is None:
            began = time.perf_counter()
            states, targets = record_context(model, tokenizer, teacher, context, config)
            meta = {"format": PARTS_FORMAT, "recording": digest}
            write_tensor_file(path, {"states": states, "targets": targets}, meta)
            part = (states, targets)
            seconds = time.perf_counter() - began
            log(f"[{i}/{len(found)}] {context.name}: {context.ids.shape[1]} tokens, {seconds:.1f} s")
        else:
            log(f"[{i}/{len(found)}] {context.name}: recorded before, read back")
        recorded[context.sha256] = part
    recording_seconds = time.perf_counter() - start

    fitting, held = split_contexts(found, config.held_out, config.seed)
    states = torch.cat([recorded[c.sha256][0] for c in fitting])
    targets = torch.cat([recorded[c.sha256][1] for c in fitting])
    layers = sorted(evictable_layers(model))
    began = time.perf_counter()
    if config.kind == "linear":
        net = fit_linear(states, targets, layers, alpha=config.alpha)
    else:
        net = fit_mlp(
            states, targets, layers, hidden_dim=config.hidden_dim, epochs=config.epochs, lr=config.lr,
            batch_size=config.batch_size, weight_decay=config.weight_decay, seed=config.seed,
        )  # fmt: skip
    fitting_seconds = time.perf_counter() - began
    if held:
        report = held_out_report(
            net, torch.cat([recorded[c.sha256][0] for c in held]), torch.cat([recorded[c.sha256][1] for c in held])
        )
    else:
        report = FitReport(0, ())
    held_digests = {c.sha256 for c in held}
    calibration = [
        {"name": c.name, "sha256": c.sha256, "tokens": c.ids.shape[1],
         "split": "held_out" if c.sha256 in held_digests else "fit",
         "target_means": [round(float(m), 4) for m in recorded[c.sha256][1].double().mean(dim=(0, 2))]}
        for c in found
    ]  # fmt: skip
    surrogate = Surrogate(
        net,
        teacher.config.for_mode(config.query_aware).model_dump(mode="json"),
        calibration,
        report,
        {
            "config": config.model_dump(mode="json"),
            "fitted_tokens": int(states.shape[0]),
            "recording_seconds": round(recording_seconds, 1),
            "fitting_seconds": round(fitting_seconds, 1),
        },
    )
    save_surrogate(surrogate, out, model)
    if report.layers:
        log(
            f"held out ({report.tokens} tokens of {len(held)} contexts): mean Spearman {report.mean('spearman'):.3f}, "
            f"R² {report.mean('r2'):.3f}"
        )
    log(f"wrote {out} (recording {recording_seconds:.0f} s, fitting {fitting_seconds:.1f} s)")
    return surrogate
