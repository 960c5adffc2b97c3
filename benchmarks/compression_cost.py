"""Wall-clock cost of compression per phase, LORE-KV against the prompt-window control.

Prints, per method, the median over ``--repeats`` runs of each phase (prefill, sampling,
scoring, selection) and of the whole compression, then the ratio LORE-KV / prompt-window of
the medians measured in this one run. Usage:

    python benchmarks/compression_cost.py --tokens 1500 --budget 64 --repeats 5
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch

from lorekv import Pipeline, load, preset
from lorekv.eval import make_task, prompt_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default="lore_kv,snapkv")
    args = parser.parse_args()

    model, tokenizer = load(args.model)
    ids = prompt_ids(tokenizer, make_task(tokenizer, args.tokens, 0.5, seed=0))
    print(f"machine: {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; model {args.model}; prompt {ids.shape[1]} tokens; "
          f"B={args.budget}; {args.repeats} repeats (first run discarded as warm-up)")  # fmt: skip
    totals: dict[str, float] = {}
    for name in args.methods.split(","):
        pipeline = Pipeline.from_config(preset(name, args.budget))
        pipeline.compress(model, ids)
        runs = [pipeline.compress(model, ids).stats.seconds for _ in range(args.repeats)]
        phases = {phase: statistics.median(r[phase] for r in runs) for phase in runs[0]}
        totals[name] = statistics.median(sum(r.values()) for r in runs)
        shown = "  ".join(f"{phase} {seconds:.3f}" for phase, seconds in phases.items())
        print(f"{name:<14} median s: {shown}  total {totals[name]:.3f}")
    names = list(totals)
    for other in names[1:]:
        print(f"ratio {names[0]} / {other}: {totals[names[0]] / totals[other]:.2f}x")


if __name__ == "__main__":
    main()
