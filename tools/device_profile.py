"""Where LORE-KV's compression spends its time on a device: the kernels and operators by time, and the
host synchronisations.

Prefills a random-weight architecture at length n, compresses once untimed (warm-up), then runs one
compression under :mod:`torch.profiler` and prints the phases' seconds, the operators with the most
self time on the device (or the CPU when there is no GPU), and how many device-to-host copies and
synchronisations the compression made. A measurement for the performance page, not a test.

    python tools/device_profile.py --model llama-3.1-8b --length 8192 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from lorekv.cost.prompts import RandomPrompts
from lorekv.hf.attention import prepare
from lorekv.models.architectures import random_model
from lorekv.pipeline import Pipeline
from lorekv.presets import preset

SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::_local_scalar_dense", "aten::item")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a shipped architecture (random weights)")
    parser.add_argument("--layers", type=int, default=None, help="keep this many layers (default: all)")
    parser.add_argument("--width", type=int, default=None, help="divide the widths by this (default: 1)")
    parser.add_argument("--length", type=int, default=8192, help="prompt length n")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--top", type=int, default=25, help="operators to list")
    args = parser.parse_args()
    if args.length < 1:
        parser.error(f"--length must be >= 1, got {args.length}")

    dtype = getattr(torch, args.dtype)
    model = prepare(random_model(args.model, layers=args.layers, width=args.width, dtype=dtype, device=args.device))
    ids = RandomPrompts(model.get_input_embeddings().num_embeddings)(args.length, 0).to(args.device)
    lore = Pipeline.from_config(preset("lore_kv", args.budget))
    gpu = args.device.startswith("cuda")

    def compress() -> Any:
        compressed = lore.compress(model, ids)
        if gpu:
            torch.cuda.synchronize()
        return compressed

    compress()
    began = time.perf_counter()
    compressed = compress()
    wall = time.perf_counter() - began
    print(f"{args.model} (layers {args.layers or 'all'}, width /{args.width or 1}), {args.dtype} on {args.device}, "
          f"n={args.length}, LORE-KV defaults (M=4, T=8, B={args.budget}), torch {torch.__version__}")  # fmt: skip
    phases = ", ".join(f"{k} {v:.3f}" for k, v in compressed.stats.seconds.items())
    print(f"compression {wall:.3f} s; phases (s): {phases}")

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities, with_stack=True) as prof:
        compress()
    events = prof.key_averages()
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    print(events.table(sort_by=key, row_limit=args.top, max_name_column_width=60))
    counts = {e.key: e.count for e in events if e.key in SYNC_EVENTS or "Memcpy DtoH" in e.key}
    print("host synchronisations and device-to-host copies in one compression:", counts or "none")
    print("where the host reads a device value (aten::_local_scalar_dense), innermost caller first:")
    for chain, count in read_sites(prof.events()).most_common():
        print(f"  {count:>5} x  {chain}")


def read_sites(events: Any) -> Counter[str]:
    """Each host read's chain of enclosing operators and Python frames (``with_stack``), five deep."""
    sites: Counter[str] = Counter()
    for event in events:
        if event.name == "aten::_local_scalar_dense":
            chain, parent = [], event.cpu_parent
            while parent is not None and len(chain) < 5:
                chain.append(parent.name)
                parent = parent.cpu_parent
            sites[" <- ".join(chain) or "-"] += 1
    return sites


if __name__ == "__main__":
    main()
