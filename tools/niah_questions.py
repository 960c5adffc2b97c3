#!/usr/bin/env python3
"""Write a multi-question needle file: several questions on each context, for query-agnostic runs.

Each context is a ``niah_multikey`` sample (its target needle among ``--distractors`` others, in
prose), and every one of its needles is asked about in a row of its own, in the generic JSONL
form (``context``, ``question`` after a blank line, ``answer``, ``answer_prefix``, ``task``,
``max_new_tokens``):
adjacent rows share their context, so a query-agnostic grid compresses it once and asks all
its questions of that one compression. The needles' questions and answer prefixes are the
``niah`` family's own.

Usage:
    python tools/niah_questions.py --contexts 40 --length 1450 \\
        --out evaluations/data/niah_questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lorekv import load
from lorekv.eval.tasks import make_sample

NEEDLE = re.compile(r"The special magic number for (\S+) is: (\d+)\.")


def rows(tokenizer, contexts: int, length: int, distractors: int, seed: int) -> list[dict]:
    """Every context's needles as questions, contexts in order."""
    spec = {"name": "niah_multikey", "num_distractors": distractors}
    out = []
    for index in range(contexts):
        sample = make_sample(spec, tokenizer, length, index=index, seed=seed)
        needles = NEEDLE.findall(sample.context)
        if len(needles) != distractors + 1:
            raise ValueError(f"context {index}: found {len(needles)} needles, expected {distractors + 1}")
        for key, value in needles:
            out.append({
                "context": sample.context,
                "question": f"\n\nWhat is the special magic number for {key} mentioned in the text above?",
                "answer_prefix": f"The special magic number for {key} mentioned in the text is",
                "answer": value,
                "task": "niah_questions",
                "max_new_tokens": sample.max_new_tokens,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=40)
    parser.add_argument("--length", type=int, default=1450, help="the prompt's tokens (SmolLM2's tokenizer)")
    parser.add_argument("--distractors", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("evaluations/data/niah_questions.jsonl"))
    args = parser.parse_args()
    _, tokenizer = load("smollm2-135m-instruct")
    records = rows(tokenizer, args.contexts, args.length, args.distractors, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {len(records)} questions on {args.contexts} contexts to {args.out}")


if __name__ == "__main__":
    main()
