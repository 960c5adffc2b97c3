"""The LORE-KV paper's claims, tested on evaluation results (docs/benchmarks.md).

    python evaluations/claims.py --main results/smollm2_main.jsonl --ablations results/smollm2_ablations.jsonl

1. LORE-KV beats its prompt-window control at small budgets, and the gain shrinks as the
   budget grows: paired differences lore_kv - window_control per budget (main results).
2. One future recovers about 89% of the gain of M futures: (acc(M=1) - acc(control)) /
   (acc(M=4) - acc(control)), macro over tasks, with a bootstrap interval that resamples
   samples within each task (ablation results).
3. Greedy vs sampled futures per task family, and the best of both per sample (an upper
   bound of what a mixture of the two could reach).
4. The oracle gap: the gold answer as the future, minus LORE-KV, per task and budget.

Every accuracy is a mean score over paired samples; intervals are 95%.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from lorekv.eval import read_results
from lorekv.eval.stats import macro_interval, paired_difference

Scores = dict[tuple[str, int], float]


def by_method(rows: list[dict], budget: str) -> dict[str, Scores]:
    """method -> {(task, index): score} at ``budget`` (the full cache at every budget)."""
    out: dict[str, Scores] = defaultdict(dict)
    for r in rows:
        if r["budget_label"] in (budget, "full"):
            out[r["method"]][(r["task"], r["index"])] = r["score"]
    return out


def paired(a: Scores, b: Scores) -> str:
    keys = sorted(a.keys() & b.keys())
    d = paired_difference([a[k] for k in keys], [b[k] for k in keys])
    star = " *" if d.significant else ""
    return (
        f"{d.mean:+.2f} [{d.lo:+.2f}, {d.hi:+.2f}]{star} W/L/T {d.wins}/{d.losses}/{d.ties} p={d.p_sign:.2g} (n={d.n})"
    )


def macro(scores: Scores, keys: list[tuple[str, int]]) -> str:
    tasks: dict[str, list[float]] = defaultdict(list)
    for k in keys:
        tasks[k[0]].append(scores[k])
    mean, lo, hi = macro_interval(dict(tasks))
    return f"{mean:.2f} [{lo:.2f}, {hi:.2f}]"


def recovery(one: Scores, many: Scores, control: Scores, resamples: int = 10_000, seed: int = 0) -> str:
    """(acc(one) - acc(control)) / (acc(many) - acc(control)), macro over tasks, bootstrap within tasks."""
    keys = sorted(one.keys() & many.keys() & control.keys())
    tasks = sorted({k[0] for k in keys})
    arrays = [np.array([[one[k], many[k], control[k]] for k in keys if k[0] == t]) for t in tasks]

    def ratio(samples: list[np.ndarray]) -> float:
        means = np.mean([s.mean(axis=0) for s in samples], axis=0)
        gain = means[1] - means[2]
        return float("nan") if gain == 0 else (means[0] - means[2]) / gain

    point = ratio(arrays)
    rng = np.random.default_rng(seed)
    boot = [ratio([a[rng.integers(0, len(a), len(a))] for a in arrays]) for _ in range(resamples)]
    boot = np.array([b for b in boot if np.isfinite(b)])
    lo, hi = np.percentile(boot, [2.5, 97.5]) if boot.size else (float("nan"), float("nan"))
    return f"{point:.0%} [{lo:.0%}, {hi:.0%}] (n={len(keys)}, {boot.size} finite resamples)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=Path, nargs="+", required=True)
    parser.add_argument("--ablations", type=Path, nargs="+", required=True)
    args = parser.parse_args()
    main_rows, _ = read_results(args.main)
    ablation_rows, _ = read_results(args.ablations)
    budgets = sorted({r["budget"] for r in main_rows if r["budget"] is not None})

    print("## 1. LORE-KV - prompt-window control (paired), by budget")
    for b in budgets:
        m = by_method(main_rows, f"B={b}")
        lore, control = m["lore_kv"], m["window_control"]
        diff = paired(lore, control)
        print(f"B={b:<4} lore_kv {macro(lore, sorted(lore))}  control {macro(control, sorted(control))}  diff {diff}")

    ablation_budgets = sorted({r["budget"] for r in ablation_rows if r["budget"] is not None})
    print("\n## 2. Share of the gain one future recovers: (M=1 - control) / (M=4 - control)")
    for b in ablation_budgets:
        m = by_method(ablation_rows, f"B={b}")
        print(f"B={b:<4} {recovery(m['lore_kv[M=1]'], m['lore_kv'], m['window_control'])}")
        for name in ("lore_kv[M=1]", "lore_kv[M=2]", "lore_kv", "lore_kv[M=8]"):
            print(f"        {name:<16} - control {paired(m[name], m['window_control'])}")

    print("\n## 3. Greedy vs sampled futures, per task (ablations: same scorer, aggregator, policy)")
    for b in ablation_budgets:
        m = by_method(ablation_rows, f"B={b}")
        greedy, sampled = m["lore_kv[greedy]"], m["lore_kv"]
        best = {k: max(greedy[k], sampled[k]) for k in greedy.keys() & sampled.keys()}
        for task in sorted({k[0] for k in best}):
            keys = [k for k in best if k[0] == task]
            g = np.mean([greedy[k] for k in keys])
            s = np.mean([sampled[k] for k in keys])
            u = np.mean([best[k] for k in keys])
            print(f"B={b:<4} {task:<30} greedy {g:.2f}  sampled(M=4) {s:.2f}  best of both {u:.2f}  (n={len(keys)})")
        print(
            f"B={b:<4} {'all tasks':<30} greedy - sampled {paired(greedy, sampled)}; "
            f"best of both - sampled {paired(best, sampled)}"
        )

    print("\n## 4. Oracle gap: gold answer as the future - LORE-KV, per task")
    for b in ablation_budgets:
        m = by_method(ablation_rows, f"B={b}")
        oracle, lore = m["lore_kv[oracle]"], m["lore_kv"]
        for task in sorted({k[0] for k in oracle}):
            keys = {k for k in oracle if k[0] == task}
            print(f"B={b:<4} {task:<30} {paired({k: oracle[k] for k in keys}, {k: lore[k] for k in keys})}")
        print(f"B={b:<4} {'all tasks':<30} {paired(oracle, lore)}")


if __name__ == "__main__":
    main()
