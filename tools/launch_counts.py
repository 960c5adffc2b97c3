"""Kernel launches of LORE-KV's compression and of decoding after it, against transformers' own.

The first GPU run found compression launch-bound (docs/performance.md). A launch-bound step costs in
proportion to the kernels it launches, and that number does not depend on the device: this counts,
on any machine, the operators that would each launch a kernel (:func:`lorekv.cost.measure.kernel_launches`)
in each phase of one compression of a random-weight architecture, beside transformers' own prefill
and decode steps of the same model, and per decode step of ``generate`` on the compressed and on the
full cache. Per layer and per step, so that the figures hold for the full-depth model.

    python tools/launch_counts.py --model llama-3.1-8b --layers 4 --width 8 --lengths 1024,4096
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from lorekv.cost.measure import kernel_launches
from lorekv.cost.prompts import RandomPrompts
from lorekv.hf.attention import prepare, using_sdpa
from lorekv.hf.compressed import CompressedCache
from lorekv.models.architectures import random_model
from lorekv.pipeline import Pipeline
from lorekv.presets import preset


def total(run: Callable[[], object]) -> int:
    """Kernel launches of one call of ``run``."""
    return sum(kernel_launches(run).values())


def measure(
    model: PreTrainedModel, lore: Pipeline, snapkv: Pipeline, ids: torch.Tensor, tokens: int
) -> dict[str, float]:
    """Launches of each phase of one compression of ``ids`` (1, n), of transformers' prefill and its
    ``tokens`` decode steps, and of one ``generate`` step on the full and on the compressed cache."""
    mask = torch.ones_like(ids)
    with using_sdpa(model):
        model(ids)
        prefill_hf = total(lambda: model(ids))
    lore.compress(model, ids)  # warm-up
    batch = lore.prefill(model, ids)
    futures = lore.sampler.futures_batch(batch)
    scored = [lore.score(futures[0], batch.rows[0].candidates)]

    def generate(steps: int, cache: CompressedCache | None = None) -> None:
        options = {} if cache is None else {"cache": cache.fork()}
        model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False, pad_token_id=0,
                       eos_token_id=[], **options)  # fmt: skip

    compressed = snapkv.compress(model, ids)
    return {
        "transformers prefill": prefill_hf,
        "prefill": total(lambda: lore.prefill(model, ids)),
        "sampling": total(lambda: lore.sampler.futures_batch(batch)),
        "transformers' T steps": total(lambda: generate(tokens + 1)) - total(lambda: generate(1)),
        "scoring": total(lambda: lore.score(futures[0], batch.rows[0].candidates)),
        "selection": total(lambda: lore.select_rows(batch.rows, scored)),
        "step, full cache": (total(lambda: generate(9)) - total(lambda: generate(1))) / 8,
        "step, compressed": (total(lambda: generate(9, compressed)) - total(lambda: generate(1, compressed))) / 8,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a shipped architecture (random weights)")
    parser.add_argument("--layers", type=int, default=4, help="keep this many layers")
    parser.add_argument("--width", type=int, default=8, help="divide the widths by this")
    parser.add_argument("--lengths", default="1024,4096", help="prompt lengths n, comma-separated")
    parser.add_argument("--futures", type=int, default=4, help="M")
    parser.add_argument("--tokens", type=int, default=8, help="T")
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.layers < 1 or args.width < 1 or any(n < 2 for n in lengths):
        parser.error("--layers and --width must be >= 1, every length >= 2")

    model = prepare(random_model(args.model, layers=args.layers, width=args.width))
    lore = Pipeline.from_config(preset("lore_kv", 128, num_futures=args.futures, num_tokens=args.tokens))
    snapkv = Pipeline.from_config(preset("snapkv", 128))
    prompts = RandomPrompts(model.get_input_embeddings().num_embeddings)
    print(f"{args.model} ({args.layers} layers, width /{args.width}), float32, torch {torch.__version__}; "
          f"LORE-KV M={args.futures}, T={args.tokens}; kernel launches per layer")  # fmt: skip
    for n in lengths:
        figures = measure(model, lore, snapkv, prompts(n, 0), args.tokens)
        if n == lengths[0]:
            print("| n | " + " | ".join(figures) + " |")
            print("|---" * (len(figures) + 1) + "|")
        print(f"| {n} | " + " | ".join(f"{value / args.layers:.1f}" for value in figures.values()) + " |")


if __name__ == "__main__":
    main()
