"""What compressing a context before its question costs: each method's phases against transformers' prefill.

For the query-agnostic methods (KVzip's reconstruction, LORE-KV's question futures, Expected
Attention, SnapKV as the floor of a prefill-only scorer), on the bundled SmolLM2 and a context of
about n tokens built like the evaluation's needle contexts: the median over ``--repeats`` runs
(after one warm-up) of each phase of ``Pipeline.compress(..., query_aware=False)`` and of
transformers' own SDPA prefill of the same context, timed in the same process; with ``--profile``,
the operators that took the most time in one compression of the first method.

    python tools/agnostic_cost.py --length 1450 --methods kvzip,lore_kv,expected_attention,snapkv --threads 2
    python tools/agnostic_cost.py --grid evaluations/grids/smollm2_agnostic_reconstruction.yaml --threads 2
    python tools/agnostic_cost.py --model random:llama-3.1-8b --layers 1 --lengths 1024,2048,4096,8192 --methods kvzip

``--grid``: every method of a grid file but the full cache, built as the grid builds it (its
presets, options and overrides), in place of ``--methods``. ``--model random:<architecture>``:
a published architecture with random weights (``--layers``, ``--width`` shrink it, as for
``lorekv bench``): cost at its shapes, not accuracy; its contexts are random token ids and the
text the methods feed (KVzip's repeat instruction, the question futures' prompt) is tokenized
with the bundled SmolLM2 tokenizer, whose ids lie inside the architecture's vocabulary (the cost
depends on the lengths only); a method with the ``surrogate`` scorer (``kvzap``, ``lore_kv_fast``)
gets a random linear map fitted for it (the cost of the map, not its accuracy). ``--lengths``:
several context lengths, for the growth with n.

    python tools/agnostic_cost.py --model random:llama-3.1-8b --layers 2 --lengths 2048,4096 --methods kvzap,snapkv
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from lorekv.distill import FitReport, Surrogate, save_surrogate
from lorekv.eval import make_sample
from lorekv.eval.grid import GridConfig
from lorekv.hf import evictable_layers, reference_prefill_seconds
from lorekv.models import load
from lorekv.models.architectures import random_model, random_name
from lorekv.pipeline import Pipeline, PipelineConfig
from lorekv.presets import preset
from lorekv.scorers.surrogate import SurrogateMap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--length", type=int, default=1450, help="context length n (about)")
    parser.add_argument("--lengths", default=None, help="comma-separated context lengths (instead of --length)")
    parser.add_argument("--layers", type=int, default=None, help="a random:<architecture>'s first k layers")
    parser.add_argument("--width", type=int, default=None, help="a random:<architecture>'s width divisor")
    parser.add_argument("--methods", default="kvzip,lore_kv,expected_attention,snapkv", help="preset names")
    parser.add_argument("--grid", type=Path, default=None, help="a grid file: its methods instead of --methods")
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--profile", action="store_true", help="the operators of one compression of the first method")
    args = parser.parse_args()
    lengths = [args.length] if args.lengths is None else [int(x) for x in args.lengths.split(",")]
    if min(lengths) < 64 or args.repeats < 1:
        parser.error("--length/--lengths must be >= 64 and --repeats >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    random_weights = random_name(args.model) is not None
    if random_weights:
        model = random_model(args.model, layers=args.layers, width=args.width)
        tokenizer = load("smollm2-135m-instruct")[1]
    else:
        model, tokenizer = load(args.model)
    configs = (
        methods(args.grid, args.budget) if args.grid else {m: preset(m, args.budget) for m in args.methods.split(",")}
    )
    if random_weights:
        configs = with_random_surrogates(configs, model)
    shape = f" (layers {args.layers}, width divisor {args.width}, random weights)" if random_weights else ""
    print(f"{args.model}{shape}, B = {args.budget}, query-agnostic, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; medians of {args.repeats} runs after a warm-up")  # fmt: skip
    print("| method | n | prefill | sampling | scoring | selection | total (s) | × transformers' prefill |")
    print("|---|---|---|---|---|---|---|---|")
    for length in lengths:
        if random_weights:
            context = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
        else:
            sample = make_sample("niah_single", tokenizer, length=length, seed=0)
            context, _ = sample.context_and_question_ids(tokenizer)
        for name, config in configs.items():
            time_method(name, Pipeline.from_config(config), model, tokenizer, context, args.repeats)
    if args.profile:
        first = Pipeline.from_config(next(iter(configs.values())))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            first.compress(model, context, query_aware=False, tokenizer=tokenizer)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=40))


def time_method(name: str, pipeline: Pipeline, model, tokenizer, context: torch.Tensor, repeats: int) -> None:
    """Print one row: ``pipeline``'s phases on ``context`` (1, n), medians of ``repeats`` runs
    interleaved with transformers' prefill of the same context, and their ratio."""

    def compress() -> dict[str, float]:
        return pipeline.compress(model, context, query_aware=False, tokenizer=tokenizer).stats.seconds

    compress()
    reference_prefill_seconds(model, context)
    runs, prefills = [], []
    for _ in range(repeats):  # interleaved, so that both see the same load
        runs.append(compress())
        prefills.append(reference_prefill_seconds(model, context))
    phases = {phase: statistics.median(run[phase] for run in runs) for phase in runs[0]}
    total = statistics.median(sum(run.values()) for run in runs)
    prefill = statistics.median(prefills)
    cells = " | ".join(f"{phases.get(p, 0.0):.3f}" for p in ("prefill", "sampling", "scoring", "selection"))
    n = context.shape[1]
    print(f"| {name} | {n} | {cells} | {total:.3f} | {total / prefill:.2f} (prefill {prefill:.3f} s) |", flush=True)


def methods(path: Path, budget: int) -> dict[str, PipelineConfig]:
    """Each method of the grid file at ``path`` but the full cache, at kept-token budget ``budget``."""
    grid = GridConfig.from_file(path)
    return {m.name: m.build(budget, path.parent) for m in grid.methods if not m.is_full}


def with_random_surrogates(configs: dict[str, PipelineConfig], model) -> dict[str, PipelineConfig]:
    """``configs`` with every ``surrogate`` scorer reading a random linear map fitted for ``model``
    (a random-weight architecture has no fitted file; the map's cost does not depend on its values)."""
    if not any(config.scorer.name == "surrogate" for config in configs.values()):
        return configs
    text = model.config.get_text_config()
    torch.manual_seed(0)
    net = SurrogateMap(sorted(evictable_layers(model)), text.hidden_size, text.num_key_value_heads)
    path = Path(tempfile.mkdtemp(prefix="lorekv-cost-")) / "random.safetensors"
    save_surrogate(Surrogate(net, {}, [], FitReport(0, ())), path, model)
    return {
        name: config.override({"scorer.file": str(path)}) if config.scorer.name == "surrogate" else config
        for name, config in configs.items()
    }


if __name__ == "__main__":
    main()
