"""What the grid's shared work saves: 8 methods x 4 budgets on one prompt, shared vs independent.

The shared path (:func:`lorekv.eval.shared.run_unit`) prefills once, draws each sampler's
futures once and scores each (sampler, scorer, aggregator) once; the independent path calls
``Pipeline.generate`` for every (method, budget) cell and ``generate_full`` for the full
cache. Both answer every cell; the script checks the answers are identical, then prints the
medians of ``--repeats`` alternating runs in one process and their ratio.

    python evaluations/grid_sharing.py --tokens 1500 --repeats 3 --out results/grid_sharing.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from lorekv import Pipeline, generate_full, load
from lorekv.eval.grid import Budget, MethodSpec, Unit
from lorekv.eval.shared import Cell, run_unit
from lorekv.eval.tasks import make_sample, parse_task
from lorekv.models.tokens import end_of_turn_ids
from lorekv.runfiles import machine

METHODS = [
    "lore_kv",
    {"name": "snapkv", "preset": "snapkv", "options": {"window": 8}},
    {"name": "pyramidkv", "preset": "pyramidkv", "options": {"window": 8}},
    {"name": "ada_kv", "preset": "ada_kv", "options": {"window": 8}},
    "tova",
    "streaming_llm",
    "greedy_lookahead",
    "knorm",
]
BUDGETS = [16, 32, 64, 128]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load("smollm2-135m-instruct")
    task = parse_task({"name": "niah_single", "haystack": "noise"})
    sample = make_sample(task, tokenizer, args.tokens, 0, 0)
    ids = sample.prompt_ids(tokenizer)
    methods = [MethodSpec.model_validate(m) for m in METHODS]
    cells = [Cell(MethodSpec.model_validate("full"), Budget())] + [
        Cell(m, Budget(tokens=b)) for m in methods for b in BUDGETS
    ]
    unit = Unit("smollm2-135m-instruct", "query_aware", args.tokens, task, 0)
    eos = end_of_turn_ids(tokenizer)

    def shared() -> dict[str, str]:
        rows: list[dict] = []
        run_unit(model, tokenizer, unit, sample, cells, rows.append)
        return {f"{r['method']}|{r['budget_label']}": r["prediction"] for r in rows}

    def independent() -> dict[str, str]:
        out = {}
        for cell in cells:
            if cell.method.is_full:
                result = generate_full(model, ids, sample.max_new_tokens, eos_token_id=eos)
            else:
                pipeline = Pipeline.from_config(cell.method.build(cell.budget.tokens))
                result = pipeline.generate(model, ids, sample.max_new_tokens, eos_token_id=eos, tokenizer=tokenizer)
            out[f"{cell.method.name}|{cell.budget.label}"] = result.text(tokenizer)
        return out

    times: dict[str, list[float]] = {"shared": [], "independent": []}
    answers = {}
    for _ in range(args.repeats):
        for name, fn in (("shared", shared), ("independent", independent)):
            start = time.perf_counter()
            answers[name] = fn()
            times[name].append(time.perf_counter() - start)
    mismatched = [k for k in answers["shared"] if answers["shared"][k] != answers["independent"].get(k)]
    shared_s, independent_s = statistics.median(times["shared"]), statistics.median(times["independent"])
    result = {
        "cells": len(cells),
        "prompt_tokens": int(ids.shape[1]),
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "machine": machine(),
        "shared_seconds": times["shared"],
        "independent_seconds": times["independent"],
        "median_shared": shared_s,
        "median_independent": independent_s,
        "speedup": independent_s / shared_s,
        "answers_identical": not mismatched,
    }
    print(f"{len(cells)} cells (8 methods x 4 budgets + full cache), {ids.shape[1]}-token prompt, {args.repeats} runs")
    print(f"independent Pipeline.generate calls: median {independent_s:.1f} s")
    print(f"shared grid path:                   median {shared_s:.1f} s")
    print(f"speed-up: {independent_s / shared_s:.2f}x; answers identical: {not mismatched}")
    if mismatched:
        print("mismatched cells:", mismatched)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
