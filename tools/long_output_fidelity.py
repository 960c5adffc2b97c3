"""Compression while generating, measured along the full cache's own long outputs (SmolLM2).

For each prompt (a Python documentation section to rewrite in detail, in the chat template) the
full cache generates ``--tokens`` tokens greedily and every decoding schedule is teacher-forced
along them in lockstep (:func:`lorekv.eval.long_output.follow_full_output`): per-token KL to the
full cache's next-token distribution, top-1 agreement, the identical greedy prefix, each cache's
time per token and peak bytes. One JSON entry per prompt, written atomically after each prompt, so
an interrupted run resumes where it stopped; the report is printed from the file.

    python tools/long_output_fidelity.py --out docs/reports/long_output/results.json
    python tools/long_output_fidelity.py --out docs/reports/long_output/results.json --report
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from pydoc_data.topics import topics

import torch

from lorekv.eval.long_output import follow_full_output
from lorekv.eval.stats import mean_interval, value_interval
from lorekv.models import chat_text, load
from lorekv.runfiles import atomic_write_text, git_commit, machine
from lorekv.schedule import DecodingSchedule

TOPICS = ["assert", "break", "conversions", "raise", "typesmodules", "exceptions", "if", "lambda"]
BUDGETS = (128, 256)


def schedules(budget: int) -> dict[str, DecodingSchedule]:
    """The methods compared at budget B, by report name."""
    return {
        f"streaming_llm@{budget}": DecodingSchedule.preset("streaming_llm", budget),
        f"decoding_press@{budget}": DecodingSchedule.preset("decoding_press", budget),
        f"snapkv@{budget}": DecodingSchedule.preset("snapkv", budget, window=8),
        f"rkv@{budget}": DecodingSchedule.preset("rkv", budget),
        f"lore_kv@{budget}": DecodingSchedule.preset("lore_kv", budget),
        f"lore_kv_fast@{budget}": DecodingSchedule.preset("lore_kv_fast", budget),
    }


def prompt_ids(tokenizer, topic: str, words: int) -> torch.Tensor:
    text = " ".join(topics[topic].split()[:words])
    user = f"{text}\n\nRewrite the documentation above in your own words, section by section, in full detail."
    return tokenizer(chat_text(tokenizer, user), return_tensors="pt", add_special_tokens=False).input_ids


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    done = json.loads(out.read_text()) if out.exists() else {"prompts": {}}
    model, tokenizer = load("smollm2-135m-instruct")
    torch.set_num_threads(args.threads)
    methods = {name: s for budget in BUDGETS for name, s in schedules(budget).items()}
    done["settings"] = {
        "model": "smollm2-135m-instruct", "tokens": args.tokens, "words": args.words, "budgets": list(BUDGETS),
        "schedules": {name: s.config.model_dump(mode="json") for name, s in methods.items()},
        "commit": git_commit(), "machine": machine(), "threads": args.threads,
    }  # fmt: skip
    for topic in TOPICS[: args.prompts]:
        entry = done["prompts"].get(topic)
        missing = {name: s for name, s in methods.items() if entry is None or name not in entry["methods"]}
        if not missing:
            continue
        ids = prompt_ids(tokenizer, topic, args.words)
        output, full, tracks = follow_full_output(model, ids, missing, args.tokens)
        text = tokenizer.decode(output[0])
        if entry is None:
            entry = {"prompt_tokens": ids.shape[1], "output": text, "full": full.to_dict(), "methods": {}}
            done["prompts"][topic] = entry
        elif text != entry["output"]:
            raise ValueError(f"{topic}: the full cache's output differs from the one recorded; write to a new --out")
        # A method added later is timed against the full cache of its own lockstep run.
        entry["methods"].update({name: {**t.to_dict(), "full_seconds": full.seconds} for name, t in tracks.items()})
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(done))
        print(topic, {name: round(statistics.fmean(t.kl), 3) for name, t in tracks.items()}, flush=True)


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    prompts = data["prompts"]
    names = list(dict.fromkeys(name for p in prompts.values() for name in p["methods"]))
    tokens = data["settings"]["tokens"]
    missing = [name for name in names if any(name not in p["methods"] for p in prompts.values())]
    if missing:
        raise ValueError(f"{path}: {', '.join(missing)} not run on every prompt; rerun without --report to add them")
    lines = [
        f"{len(prompts)} prompts, {tokens} tokens each; mean over prompts (95% bootstrap interval over prompts).",
        "",
        "| method | mean KL (nats) | top-1 agreement | identical prefix (median) | time / token × full "
        "| peak bytes × full |",
        "|:---|---:|---:|---:|---:|---:|",
    ]
    per_prompt: dict[str, list[float]] = {}
    for name in names:
        kls = [statistics.fmean(p["methods"][name]["kl"]) for p in prompts.values()]
        per_prompt[name] = kls
        agree = [statistics.fmean(p["methods"][name]["agree"]) for p in prompts.values()]
        prefix = statistics.median(p["methods"][name]["identical_prefix"] for p in prompts.values())
        time_ratio = statistics.median(
            p["methods"][name]["seconds"] / p["methods"][name].get("full_seconds", p["full"]["seconds"])
            for p in prompts.values()
        )
        bytes_ratio = statistics.median(
            p["methods"][name]["peak_bytes"] / p["full"]["peak_bytes"] for p in prompts.values()
        )
        kl, lo, hi = value_interval(kls)
        ag, alo, ahi = mean_interval(agree)
        lines.append(
            f"| {name} | {kl:.3f} [{lo:.3f}, {hi:.3f}] | {ag:.3f} [{alo:.3f}, {ahi:.3f}] | {prefix:.0f} | "
            f"{time_ratio:.2f} | {bytes_ratio:.3f} |"
        )
    lines += ["", "Mean KL by output position (nats):", ""]
    buckets = [(start, min(start + 256, tokens)) for start in range(0, tokens, 256)]
    lines.append("| method | " + " | ".join(f"{a}–{b}" for a, b in buckets) + " |")
    lines.append("|:---|" + "---:|" * len(buckets))
    for name in names:
        cells = [
            statistics.fmean(statistics.fmean(p["methods"][name]["kl"][a:b]) for p in prompts.values())
            for a, b in buckets
        ]
        lines.append(f"| {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    lines += ["", "Paired over prompts, lorekv's presets against each baseline (mean KL difference, 95% interval):", ""]
    for budget in data["settings"]["budgets"]:
        for preset in ("lore_kv", "lore_kv_fast"):
            ours = per_prompt.get(f"{preset}@{budget}")
            if ours is None:
                continue
            for name in names:
                if not name.endswith(f"@{budget}") or name.startswith("lore_kv"):
                    continue
                diff = [a - b for a, b in zip(ours, per_prompt[name], strict=True)]
                mean, lo, hi = value_interval(diff)
                ratio = statistics.fmean(ours) / statistics.fmean(per_prompt[name])
                baseline = name.split("@")[0]
                lines.append(
                    f"- B = {budget}: {preset} − {baseline}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (ratio {ratio:.2f})"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--words", type=int, default=220)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="print the report of --out and run nothing")
    args = parser.parse_args()
    if not args.report:
        run(args)
    print(report(Path(args.out)))


if __name__ == "__main__":
    main()
