#!/usr/bin/env python3
"""Write lorekv's RULER-style task families as a RULER file in kvpress's unified form.

kvpress evaluates RULER from unified rows (``context``, ``question``, ``answer_prefix``,
``answer``, ``task``, ``max_new_tokens``); lorekv reads them with the ``ruler_unified`` format,
which takes each task's metric from its RULER task name. RULER's own data needs its
``prepare.py`` and the hub, neither reachable here, so this writes the generated families that
follow RULER's tasks under RULER's names: ``niah_single_1`` (noise haystack), ``niah_single_2``
(essay haystack), ``niah_multikey_1`` (one needle among distractors), ``vt`` (variable
tracking), ``cwe`` (common words) and ``fwe`` (frequent coded words). Their prompts are
lorekv's (``lorekv.eval.tasks``), not RULER's, and so is the answer length per row. RULER's
``qa_*`` is left out: RULER scores it with ``string_match_part`` while lorekv's ``qa`` family
asks for every blank.

Usage:
    python tools/ruler_unified.py --samples 6 --length 1450 --out evaluations/data/ruler_unified.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lorekv import load
from lorekv.eval.tasks import make_sample

TASKS: dict[str, dict[str, Any]] = {
    "niah_single_1": {"name": "niah_single", "haystack": "noise"},
    "niah_single_2": {"name": "niah_single"},
    "niah_multikey_1": {"name": "niah_multikey"},
    "vt": {"name": "variable_tracking"},
    "cwe": {"name": "common_words"},
    "fwe": {"name": "frequent_words"},
}
"""RULER's task name -> the lorekv task family that follows it."""


def rows(tokenizer: Any, samples: int, length: int, seed: int) -> list[dict[str, Any]]:
    """``samples`` rows of every task, tasks in order."""
    out = []
    for task, spec in TASKS.items():
        for index in range(samples):
            sample = make_sample(spec, tokenizer, length, index=index, seed=seed)
            out.append({
                "context": sample.context,
                "question": sample.separator + sample.question,
                "answer_prefix": sample.answer_prefix,
                "answer": list(sample.answers),
                "task": task,
                "max_new_tokens": sample.max_new_tokens,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6, help="rows per task")
    parser.add_argument("--length", type=int, default=1450, help="the prompt's tokens (SmolLM2's tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("evaluations/data/ruler_unified.jsonl"))
    args = parser.parse_args()
    _, tokenizer = load("smollm2-135m-instruct")
    records = rows(tokenizer, args.samples, args.length, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {len(records)} rows of {len(TASKS)} RULER tasks to {args.out}")


if __name__ == "__main__":
    main()
