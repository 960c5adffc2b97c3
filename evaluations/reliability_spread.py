"""How far apart LORE-KV's futures are: the spread of the reliability aggregator's signals.

The reliability aggregator standardises three per-future signals across the M futures (mean
token log-prob, mean token entropy, disagreement with the ensemble), with a floor on the
spread (see :class:`lorekv.aggregators.ReliabilityConfig`). This script measures what
spreads occur: it compresses prompts of the main grid's task families with the paper's
futures (M = 4 temperature-1 futures of T = 8 tokens, projected LOO) on the bundled
SmolLM2-135M-Instruct and records, per prompt, the population standard deviation of each
signal across the 4 futures and across every pair of them (M = 2), and how far the default
floors move the weights from the unfloored rule's (floors 0). The prompts are drawn with
``--seed`` (default 1), so they are not the evaluated grids' prompts (seed 0).

    python evaluations/reliability_spread.py --samples 8 --threads 1 --out results/reliability_spread.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from lorekv import Pipeline, load, preset
from lorekv.aggregators import ReliabilityAggregator, ReliabilityConfig
from lorekv.eval.tasks import make_sample, parse_task

TASKS = [
    {"name": "niah_single", "haystack": "noise"},
    "niah_single",
    {"name": "niah_single", "value": "word"},
    "niah_multikey",
]
QUANTILES = (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0)


UNFLOORED = ReliabilityConfig(floor_lp=0.0, floor_ent=0.0, floor_dis=0.0)


class Recorder(ReliabilityAggregator):
    """The reliability aggregator (default floors), keeping each call's three signals (M,)
    and its weights beside those of the unfloored rule (floors 0) on the same futures."""

    def __init__(self) -> None:
        super().__init__(ReliabilityConfig())
        self.signals: list[dict[str, list[float]]] = []

    def compute_weights(
        self, per_future: torch.Tensor, logprobs: torch.Tensor, entropies: torch.Tensor
    ) -> torch.Tensor:
        weights = super().compute_weights(per_future, logprobs, entropies)
        self.signals.append(
            {
                "logprob": logprobs.double().mean(dim=1).tolist(),
                "entropy": entropies.double().mean(dim=1).tolist(),
                "disagreement": self.disagreement(per_future).tolist(),
                "weights": weights.tolist(),
                "weights_unfloored": ReliabilityAggregator(UNFLOORED).weights(per_future, logprobs, entropies).tolist(),
            }
        )
        return weights


def spreads(values: list[float], size: int) -> list[float]:
    """Population std of every ``size``-subset of ``values``."""
    return [float(np.std(subset)) for subset in itertools.combinations(values, size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--samples", type=int, default=8, help="prompts per task family")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load("smollm2-135m-instruct")
    config = preset("lore_kv", 64, temperature=1.0)  # the futures the floors were measured on
    recorder = Recorder()
    pipeline = Pipeline(config.sampler, config.scorer, recorder, config.policy)
    for index in range(args.samples):
        for spec in TASKS:
            sample = make_sample(parse_task(spec), tokenizer, args.tokens, index, args.seed)
            pipeline.compress(model, sample.prompt_ids(tokenizer), tokenizer=tokenizer)
            print(sample.task, index, {k: np.round(v, 4).tolist() for k, v in recorder.signals[-1].items()})
    summary = {}
    for signal in ("logprob", "entropy", "disagreement"):
        for m in (4, 2):
            values = [s for record in recorder.signals for s in spreads(record[signal], m)]
            summary[f"{signal}, M={m}"] = {f"q{q:g}": float(np.quantile(values, q)) for q in QUANTILES}
    floors = {"logprob": recorder.config.floor_lp, "entropy": recorder.config.floor_ent}
    floors["disagreement"] = recorder.config.floor_dis
    binds = [any(np.std(r[k]) < f for k, f in floors.items()) for r in recorder.signals]
    moved = [float(np.max(np.abs(np.subtract(r["weights"], r["weights_unfloored"])))) for r in recorder.signals]
    summary["floors bind (any signal), fraction of prompts"] = float(np.mean(binds))
    summary["max |w - w_unfloored| per prompt"] = {f"q{q:g}": float(np.quantile(moved, q)) for q in QUANTILES}
    for name, row in summary.items():
        shown = "  ".join(f"{k}={v:.4f}" for k, v in row.items()) if isinstance(row, dict) else f"{row:.3f}"
        print(f"{name:>18}: {shown}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "summary": summary, "signals": recorder.signals}, indent=1
            )
        )


if __name__ == "__main__":
    main()
