"""What LORE-KV's phases after the prefill allocate, by layer count and prompt length.

Prefills a random-weight architecture at each (layers, n) and measures sampling, scoring and
selection as ``lorekv bench`` does (:func:`lorekv.cost.run.phase_memory`): each phase's peak
above what was live when it started, and the bytes it leaves live. Two layer counts separate
what every layer adds from what one layer holds while it is scored; two lengths, what grows
with n. A measurement for the performance page, not a test.

    python tools/phase_memory.py --model llama-3.1-8b --layers 1,2 --lengths 1024,2048
"""

from __future__ import annotations

import argparse

import torch

from lorekv.cost.run import phase_memory
from lorekv.hf.attention import prepare
from lorekv.models.architectures import random_model
from lorekv.pipeline import Pipeline
from lorekv.presets import preset

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a shipped architecture (random weights)")
    parser.add_argument("--layers", default="1,2", help="layer counts, comma-separated")
    parser.add_argument("--lengths", default="1024,2048", help="prompt lengths n, comma-separated")
    parser.add_argument("--budget", type=int, default=128)
    args = parser.parse_args()

    lore = Pipeline.from_config(preset("lore_kv", args.budget))
    print(f"{args.model}, float32, LORE-KV defaults (M=4, T=8, B={args.budget}), torch {torch.__version__}")
    print("| layers | n | KV (MiB) | sampling | kept after | scoring | kept after | selection | peak | peak / KV |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in (int(x) for x in args.layers.split(",")):
        model = prepare(random_model(args.model, layers=layers))
        for n in (int(x) for x in args.lengths.split(",")):
            ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
            batch = lore.prefill(model, ids)
            kv = batch.cache.allocated_bytes()
            m = phase_memory(batch, lore, torch.device("cpu"))
            cells = [m[k] / MIB for k in ("sampling", "sampling_retained", "scoring", "scoring_retained")]
            print(
                f"| {layers} | {n} | {kv / MIB:.1f} | "
                + " | ".join(f"{c:.1f}" for c in cells)
                + f" | {m['selection'] / MIB:.1f} | {m['peak'] / MIB:.1f} | {m['peak'] / kv:.3f} |"
            )
        del model


if __name__ == "__main__":
    main()
