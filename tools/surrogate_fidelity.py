"""How closely the shipped surrogates follow their teachers on contexts they were not fitted on.

For each (student, teacher) pair (``lore_kv_fast`` against ``lore_kv``'s query-agnostic parts,
``kvzap`` against ``kvzip_plus``) and each evaluation context (the needle families, which the
calibration leaves out, on both haystacks, and the questions file in the suites' jsonl format): the
per-layer rank correlation of the student's scores with the teacher's, and the share of the
teacher's kept set the student keeps at each budget (each with its own policy). Prints a markdown
table of the means per task and writes every figure to ``--out`` (JSON).

    python tools/surrogate_fidelity.py --out docs/reports/smollm2_surrogates/fidelity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict
from pathlib import Path

import torch

from lorekv.distill.calibration import CalibrationConfig, contexts
from lorekv.distill.fidelity import fidelity
from lorekv.hf import prepare
from lorekv.models import load
from lorekv.pipeline import Pipeline
from lorekv.presets import preset
from lorekv.runfiles import atomic_write_text

TASKS = [
    "niah_single",
    {"name": "niah_single", "haystack": "noise"},
    "niah_multikey",
    {"format": "jsonl", "path": "evaluations/data/niah_questions.jsonl", "title": "niah_questions"},
]
PAIRS = {"lore_kv_fast": ("lore_kv", {}), "kvzap": ("kvzip_plus", {"window": 8})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="contexts per task")
    parser.add_argument("--length", type=int, default=1500)
    parser.add_argument("--budgets", default="32,64,128")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    model, tokenizer = load("smollm2-135m-instruct")
    prepare(model)
    found = contexts(CalibrationConfig(tasks=TASKS, samples=args.samples, haystack=0, length=args.length), tokenizer)
    rows = []
    for student_name, (teacher_name, options) in PAIRS.items():
        student = Pipeline.from_config(preset(student_name, budgets[0], **options))
        teacher = Pipeline.from_config(preset(teacher_name, budgets[0]))
        for context in found:
            result = fidelity(model, tokenizer, student, teacher, context, budgets)
            rows.append({"student": student_name, "teacher": teacher_name, **asdict(result)})
            print(f"{student_name} {context.name}: Spearman {statistics.mean(result.spearman):.3f}", flush=True)
    atomic_write_text(args.out, json.dumps({"budgets": budgets, "length": args.length, "rows": rows}, indent=1))
    print(render(rows, budgets))


def render(rows: list[dict], budgets: list[int]) -> str:
    """Markdown: per student and task, the mean per-layer Spearman and the mean overlaps."""
    head = "| student (teacher) | task | contexts | Spearman | " + " | ".join(f"overlap B={b}" for b in budgets) + " |"
    lines = [head, "|" + "---|" * (4 + len(budgets))]
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        task = row["context"].rsplit("#", 1)[0]
        groups.setdefault((row["student"], row["teacher"], task), []).append(row)
    for (student, teacher, task), group in groups.items():
        spearman = statistics.mean(statistics.mean(r["spearman"]) for r in group)
        overlaps = [statistics.mean(r["overlap"][b] for r in group) for b in budgets]
        cells = " | ".join(f"{o:.2f}" for o in overlaps)
        lines.append(f"| {student} ({teacher}) | {task} | {len(group)} | {spearman:.2f} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
