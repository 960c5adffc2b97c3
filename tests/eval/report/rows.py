"""Synthetic result rows in the grid runner's schema, for the report and figure tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lorekv.eval.results import encode_keep_map


def make_row(
    *,
    task: str = "niah",
    index: int = 0,
    method: str = "snapkv",
    label: str = "B=64",
    score: float = 1.0,
    model: str = "tiny",
    mode: str = "query_aware",
    length: int = 256,
    seconds: float = 1.0,
    group: str | None = None,
    keep_map: Mapping[str, Any] | None = None,
    gold_positions: Sequence[int] | None = None,
) -> dict[str, Any]:
    """One valid row; ``label`` "B=k", "ratio=r" or "full" sets budget and ratio to match."""
    if label == "full":
        budget, ratio = None, None
    elif label.startswith("ratio="):
        ratio = float(label.split("=")[1])
        budget = int(ratio * length)
    else:
        budget, ratio = int(label.split("=")[1]), None
    tokens = length
    return {
        "type": "row", "id": f"{model}|{mode}|{length}|{task}|{index}|{method}|{label}", "model": model,
        "task": task, "length": length, "mode": mode, "index": index, "seed": index, "method": method,
        "group": group, "budget_label": label, "budget": budget, "ratio": ratio, "tokens": tokens,
        "prediction": "x", "answers": ["x"], "metric": "all", "score": float(score),
        "kept": float(budget or tokens), "candidates": tokens, "kv_bytes_before": 1000, "kv_bytes_after": 500,
        "seconds": {"prefill": seconds / 2, "sampling": seconds / 4, "scoring": seconds / 8, "selection": seconds / 8,
                    "decode": 0.1},
        "compression_seconds": float(seconds), "keep_map": keep_map, "gold_positions": gold_positions,
    }  # fmt: skip


def cell_rows(task: str, method: str, label: str, scores: Sequence[float], **kwargs: Any) -> list[dict[str, Any]]:
    """Rows of one (task, method, budget) cell: sample i gets ``scores[i]``."""
    return [make_row(task=task, index=i, method=method, label=label, score=s, **kwargs) for i, s in enumerate(scores)]


def random_mask(seed: int, shape: tuple[int, int, int], keep: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).random(shape) < keep


def grid(
    *,
    tasks: Sequence[str] = ("niah", "qa"),
    methods: Sequence[str] = ("full", "snapkv", "lore_kv"),
    labels: Sequence[str] = ("B=32", "B=64", "B=128"),
    n: int = 10,
    seed: int = 0,
    keep_maps: bool = False,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """A full grid with random 0/1 scores (better with budget), full cache once per sample."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in tasks:
        for method in methods:
            for label in ["full"] if method == "full" else labels:
                p = 0.9 if method == "full" else min(0.9, 0.3 + 0.002 * float(label.split("=")[1]))
                for i in range(n):
                    extra: dict[str, Any] = {}
                    if keep_maps:
                        length = kwargs.get("length", 256)
                        mask = random_mask(i, (2, 2, length), 0.2 if label == "B=32" else 0.5)
                        extra = {"keep_map": encode_keep_map(mask, [0, 1]), "gold_positions": [100, 101]}
                    rows.append(
                        make_row(task=task, index=i, method=method, label=label, score=float(rng.random() < p),
                                 seconds=1.0 + 0.5 * (method == "lore_kv") + rng.random() * 0.1, **extra, **kwargs)
                    )  # fmt: skip
    return rows
