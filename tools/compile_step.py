"""Does ``torch.compile`` of the whole futures decode step pay? A measurement, not a test.

Decodes LORE-KV's futures (M rows of T tokens, greedy, as branches of one prefilled prompt)
three ways on a random-weight architecture and prints, for each, the first call (compilation
included) and the median of the later calls:

- ``eager``: lorekv's default;
- ``kernels``: lorekv's own attention kernels compiled (the pipeline's ``compile=True``);
- ``step``: the whole model call compiled (``torch.compile(model.forward, dynamic=True)``):
  every projection, norm, MLP and attention of the step.

Then it profiles one eager decode and prints the share of the time spent in the model's
matrix products (``aten::mm``/``aten::addmm``), the part no compilation removes.

    python tools/compile_step.py --model llama-3.2-1b --layers 2 --length 1024
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import profile

from lorekv.hf.attention import prepare
from lorekv.hf.rollout import BatchRollout
from lorekv.models.architectures import random_model
from lorekv.token_rules import greedy


def timed(batch: BatchRollout, futures: int, tokens: int, repeats: int) -> tuple[float, float]:
    """(first call, median of ``repeats`` later calls) of decoding the futures, in seconds."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        batch.decode([greedy], futures, tokens)
        times.append(time.perf_counter() - start)
    return times[0], statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b", help="a shipped architecture (random weights)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024, help="prompt tokens n")
    parser.add_argument("--futures", type=int, default=4, help="M")
    parser.add_argument("--tokens", type=int, default=8, help="T")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    model = prepare(random_model(args.model, layers=args.layers))
    layers = range(model.config.num_hidden_layers)
    ids = torch.randint(0, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0))
    print(
        f"{args.model}, {args.layers} layers, n={args.length}, M={args.futures}, T={args.tokens}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    with torch.inference_mode():
        batch = BatchRollout(model, ids, [args.length], layers)
        eager = timed(batch, args.futures, args.tokens, args.repeats)
        with profile() as prof:
            batch.decode([greedy], args.futures, args.tokens)
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        products = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm"))
        compiled_kernels = BatchRollout(model, ids, [args.length], layers, compile=True)
        kernels = timed(compiled_kernels, args.futures, args.tokens, args.repeats)
        model.forward = torch.compile(model.forward, dynamic=True)
        step = timed(batch, args.futures, args.tokens, args.repeats)
    print("| futures decode | first call (s) | median later (s) | vs eager |")
    print("|---|---:|---:|---:|")
    for name, (first, median) in (("eager", eager), ("kernels compiled", kernels), ("whole step compiled", step)):
        print(f"| {name} | {first:.2f} | {median:.3f} | {median / eager[1]:.2f}x |")
    print(f"matrix products: {products / total:.1%} of the eager decode's CPU time")


if __name__ == "__main__":
    main()
