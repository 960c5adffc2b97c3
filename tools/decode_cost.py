"""What a bounded generation costs per token against the full cache, in one process.

Every cache is fed the same tokens in lockstep (:func:`lorekv.eval.long_output.follow_full_output`:
the full cache's greedy output), so each method's time per token is measured beside the full
cache's at every position, on the same machine state. Prints a markdown table: time per token
(median-free: the whole run's total over the tokens, the prompt's pass included), its ratio to
the full cache, the share spent compressing, the peak key/value bytes against the full cache's.

    python tools/decode_cost.py --model smollm2-135m-instruct --tokens 1024 --budget 256
    python tools/decode_cost.py --model random:llama-3.1-8b --layers 2 --tokens 1024 --budget 256
"""

from __future__ import annotations

import argparse
import json

import torch

from lorekv.eval.long_output import follow_full_output
from lorekv.models import load
from lorekv.models.architectures import random_model, random_name
from lorekv.runfiles import git_commit, machine
from lorekv.schedule import DecodingSchedule


def methods(budget: int) -> dict[str, DecodingSchedule]:
    lore_kv = DecodingSchedule.preset("lore_kv", budget).pipeline
    return {
        "streaming_llm": DecodingSchedule.preset("streaming_llm", budget),
        "decoding_press": DecodingSchedule.preset("decoding_press", budget),
        "snapkv": DecodingSchedule.preset("snapkv", budget, window=8),
        "rkv": DecodingSchedule.preset("rkv", budget),
        "lore_kv": DecodingSchedule(lore_kv, buffer=64),
        "lore_kv (buffer 128)": DecodingSchedule(lore_kv, buffer=128),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--layers", type=int, default=None, help="random architectures: keep this many layers")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the figures as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if random_name(args.model) is not None:
        model = random_model(random_name(args.model), layers=args.layers)
    else:
        model, _ = load(args.model)
    vocab = model.config.vocab_size
    prompt = torch.randint(vocab, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    _, full, tracks = follow_full_output(model, prompt, methods(args.budget), args.tokens)
    rows = {"full cache": full, **tracks}
    print(f"{args.model}{'' if args.layers is None else f' ({args.layers} layers)'}, prompt {args.prompt_tokens}, "
          f"{args.tokens} tokens, B = {args.budget}")  # fmt: skip
    print("\n| cache | ms / token | × full | compressing | peak bytes × full |\n|:---|---:|---:|---:|---:|")
    figures = {}
    for name, track in rows.items():
        per_token = 1000 * track.seconds / args.tokens
        share = track.compress_seconds / track.seconds if track.seconds else 0.0
        ratio = track.seconds / full.seconds
        peak = track.peak_bytes / full.peak_bytes
        figures[name] = {"ms_per_token": per_token, "time_ratio": ratio, "compress_share": share, "peak_ratio": peak}
        print(f"| {name} | {per_token:.1f} | {ratio:.2f} | {share:.0%} | {peak:.3f} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"args": vars(args), "commit": git_commit(), "machine": machine(), "figures": figures}, handle)


if __name__ == "__main__":
    main()
