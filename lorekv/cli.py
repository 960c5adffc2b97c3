"""The ``lorekv`` command line: the demo, generation from a config, evaluation grids, reports, the cost
benchmark, surrogate fits."""

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Future-aware KV-cache eviction.")

ModelOpt = Annotated[str, typer.Option(help="Bundled name, local directory, .gguf file or hub id.")]
BudgetOpt = Annotated[int, typer.Option(help="Kept tokens per KV head on average (B).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a pipeline field, e.g. --set policy.budget=64 (repeatable; values parsed as YAML).",
    ),
]


def _fail(error: Exception) -> None:
    from pydantic import ValidationError

    from lorekv.validation import describe

    message = describe(error) if isinstance(error, ValidationError) else str(error)
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(2)


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Report bad input as one line on stderr (exit code 2) instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, ModuleNotFoundError, FileNotFoundError) as error:
            _fail(error)

    return wrapper


def _read_text(path: Path, option: str) -> str:
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a directory, expected a text file")
    if not path.exists():
        raise ValueError(f"{option} {path}: no such file")
    text = path.read_text()
    if not text.strip():
        raise ValueError(f"{option} {path}: the file is empty")
    return text


def _check_generation(max_new_tokens: int) -> None:
    from lorekv.validation import check_int_at_least

    check_int_at_least("max_new_tokens", max_new_tokens, 1)


def _load(model: str):
    from lorekv.models import load

    typer.echo(f"Loading {model} (the first run dequantises the GGUF, about 30 s; later runs read a cache) ...")
    start = time.perf_counter()
    loaded = load(model)
    typer.echo(f"Loaded in {time.perf_counter() - start:.1f} s.")
    return loaded


def _overrides(items: list[str] | None) -> dict[str, Any]:
    """``["policy.budget=64", ...]`` -> ``{"policy.budget": 64, ...}`` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items or []:
        path, sep, value = item.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"--set {item!r}: expected <part>.<field>=<value>, e.g. policy.budget=64")
        out[path.strip()] = yaml.safe_load(value)
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


@app.command()
@_guarded
def demo(
    model: ModelOpt = "smollm2-135m-instruct",
    budget: BudgetOpt = 64,
    length: Annotated[int, typer.Option(help="Prompt length in tokens (the sample fills 90-100% of it).")] = 1500,
    task: Annotated[str, typer.Option(help="Task family of `lorekv eval` (see docs/reference/evaluation.md).")] = (
        "niah_single"
    ),
    seed: int = 0,
    max_new_tokens: Annotated[int | None, typer.Option(help="Answer length (default: the task's).")] = None,
) -> None:
    """Answer one long-context question with the full cache, LORE-KV and the prompt-window control."""
    import time

    from lorekv.eval.tasks import check_length, make_sample, parse_task
    from lorekv.hf import check_context, generate_full
    from lorekv.models import end_of_turn_ids
    from lorekv.pipeline import Pipeline
    from lorekv.presets import preset

    config = parse_task(task)
    check_length(length, config)
    if max_new_tokens is not None:
        _check_generation(max_new_tokens)
    methods = {
        "full cache": None,
        "LORE-KV": Pipeline.from_config(preset("lore_kv", budget)),
        "prompt window (SnapKV)": Pipeline.from_config(preset("snapkv", budget)),
    }
    net, tokenizer = _load(model)
    sample = make_sample(config, tokenizer, length, seed=seed)
    ids = sample.prompt_ids(tokenizer)
    answer_tokens = sample.max_new_tokens if max_new_tokens is None else max_new_tokens
    check_context(net, ids.shape[1], answer_tokens, "answer")
    for pipeline in methods.values():  # every method's checks before any model work
        if pipeline is not None:
            pipeline.check_input(net, ids, query_aware=True, extra=answer_tokens, tokenizer=tokenizer)
    eos = end_of_turn_ids(tokenizer)
    typer.echo(f"Task {sample.task}: {ids.shape[1]} prompt tokens; expected answer {', '.join(sample.answers)}.")
    typer.echo(f"Budget: {budget} tokens per KV head.\n")
    for name, pipeline in methods.items():
        typer.echo(f"[{name}] running ...")
        start = time.perf_counter()
        if pipeline is None:
            result = generate_full(net, ids, answer_tokens, eos_token_id=eos)
        else:
            result = pipeline.generate(net, ids, answer_tokens, eos_token_id=eos, tokenizer=tokenizer)
        seconds = time.perf_counter() - start
        answer = result.text(tokenizer).strip()
        score = sample.score(answer)
        verdict = "correct" if score == 1 else ("wrong" if score == 0 else f"score {score:.2f}")
        typer.echo(f"  answer: {sample.answer_prefix} {answer!r} -> {verdict}")
        if result.stats is None:
            typer.echo(f"  kept: 100%   total {seconds:.2f} s")
        else:
            s = result.stats
            phases = "  ".join(f"{k} {v:.2f} s" for k, v in s.seconds.items())
            typer.echo(
                f"  kept: {s.kept_fraction:.1%} of {s.candidate_tokens} candidates   "
                f"KV bytes: {_mib(s.bytes_before)} -> {_mib(s.bytes_after)} allocated ({_mib(s.bytes_kept)} kept)"
            )
            typer.echo(f"  time: {phases}  decode {result.decode_seconds:.2f} s  total {seconds:.2f} s")
        typer.echo("")


@app.command()
@_guarded
def generate(
    prompt_file: Annotated[Path, typer.Option(help="Text file with the prompt (the context, with --question-file).")],
    config: Annotated[Path | None, typer.Option(help="Pipeline YAML/JSON file.")] = None,
    preset: Annotated[
        str | None, typer.Option(help="A preset name instead of --config (see `lorekv presets`).")
    ] = None,
    budget: Annotated[int | None, typer.Option(help="Budget for --preset.")] = None,
    set_: SetOpt = None,
    question_file: Annotated[
        Path | None, typer.Option(help="Query-agnostic use: compress the prompt, then ask this.")
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    max_new_tokens: int = 64,
    chat: Annotated[bool, typer.Option(help="Wrap the text in the model's chat template.")] = True,
) -> None:
    """Compress a prompt with a pipeline and decode an answer; prints the answer and the stats as JSON."""
    from lorekv.hf import decode
    from lorekv.models import SPLIT, chat_text, encode, encode_split, end_of_turn_ids
    from lorekv.pipeline import Pipeline, PipelineConfig
    from lorekv.presets import preset as make_preset

    if (config is None) == (preset is None):
        raise ValueError("give exactly one of --config or --preset")
    if preset is not None:
        if budget is None:
            raise ValueError("--preset needs --budget")
        pipeline_config = make_preset(preset, budget)
    else:
        if budget is not None:
            raise ValueError(f"--budget applies to --preset only; for --config use --set policy.budget={budget}")
        pipeline_config = PipelineConfig.from_file(config)
    pipeline = Pipeline.from_config(pipeline_config.override(_overrides(set_)))
    _check_generation(max_new_tokens)
    prompt = _read_text(prompt_file, "--prompt-file")
    question = _read_text(question_file, "--question-file") if question_file else None
    net, tokenizer = _load(model)
    eos = end_of_turn_ids(tokenizer)
    text = chat_text(tokenizer, prompt if question is None else prompt + SPLIT + question, chat=chat)
    if question is None:
        ids = encode(tokenizer, text, add_special_tokens=not chat)
        result = pipeline.generate(net, ids, max_new_tokens, eos_token_id=eos, tokenizer=tokenizer)
    else:
        context_ids, question_ids = encode_split(tokenizer, text, add_special_tokens=not chat)
        compressed = pipeline.compress(net, context_ids, query_aware=False, tokenizer=tokenizer)
        result = decode(net, compressed, question_ids, max_new_tokens, eos_token_id=eos)
    typer.echo(result.text(tokenizer))
    typer.echo(json.dumps({"stats": result.stats.to_dict(), "decode_seconds": result.decode_seconds}, indent=2))


@app.command(name="eval")
@_guarded
def eval_(
    targets: Annotated[
        list[str], typer.Argument(help="GRID.yaml to run it; or `merge SHARD.jsonl...` to join shard files.")
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="Results JSONL (default results/<grid>.jsonl; merged file for `merge`). Rerunning resumes."),
    ] = None,
    shard: Annotated[
        str | None, typer.Option(help="Run shard i/N (0 <= i < N); default RANK/WORLD_SIZE when set, else all.")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: torch's own choice).")] = None,
    allow_missing: Annotated[bool, typer.Option(help="merge: accept shards that have not finished.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar with an ETA.")] = True,
) -> None:
    """Run an evaluation grid (resumable, shardable), or merge its shards."""
    if targets[0] == "merge":
        from lorekv.eval.harness import merge

        if out is None:
            raise ValueError("out: merge needs --out, the merged results file")
        count, missing = merge(out, targets[1:], allow_missing=allow_missing)
        typer.echo(
            f"{out}: {count} rows from {len(targets) - 1} shards"
            + (f", {len(missing)} cells missing" if missing else "")
        )
        return
    if len(targets) != 1:
        raise ValueError(f"expected one grid file (or `merge SHARD...`), got {targets}")
    from lorekv.eval.grid import GridConfig
    from lorekv.eval.harness import parse_shard, run_grid

    grid_path = Path(targets[0])
    grid = GridConfig.from_file(grid_path)
    parts = parse_shard(shard)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    target = out or Path("results") / f"{grid_path.stem}.jsonl"
    path = run_grid(grid, target, shard=parts, base=grid_path.parent, progress=progress)
    typer.echo(f"{path}: done")


@app.command()
@_guarded
def report(
    results: Annotated[list[Path], typer.Argument(help="Results JSONL files (a merged grid, or several).")],
    out: Annotated[Path, typer.Option(help="Folder for report.md (leaderboard.md) and figures/.")] = Path("report"),
    leaderboard: Annotated[
        bool,
        typer.Option(help="Write the leaderboard instead: every method against the best at each budget, per setting."),
    ] = False,
    reference: Annotated[
        str | None, typer.Option(help="Method the paired differences are taken against (default: first method).")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Method the ablation groups vary (default: lore_kv when present).")
    ] = None,
    figures: Annotated[bool, typer.Option(help="Draw the matplotlib figures.")] = True,
    task: Annotated[
        list[str] | None, typer.Option(help="Report only this task label (repeatable), e.g. niah_single.")
    ] = None,
) -> None:
    """Write the Markdown report (tables with 95% intervals, paired differences) and figures, or the leaderboard."""
    from lorekv.eval.harness import read_results

    if leaderboard and (reference is not None or baseline is not None):
        given = "reference" if reference is not None else "baseline"
        raise ValueError(f"{given}: the leaderboard compares every method with the best at each budget; drop --{given}")
    rows, headers = read_results(results)
    if not rows:
        raise ValueError(f"results: no rows in {', '.join(map(str, results))}")
    if task:
        present = {r["task"] for r in rows}
        unknown = [t for t in task if t not in present]
        if unknown:
            raise ValueError(f"task: no rows for {unknown}; tasks present: {', '.join(sorted(present))}")
        rows = [r for r in rows if r["task"] in task]
    if leaderboard:
        from lorekv.eval.leaderboard import leaderboard_command, write_leaderboard

        source = leaderboard_command(results, out, tasks=task or ())
        path = write_leaderboard(rows, headers, out, figures=figures, source=source)
    else:
        from lorekv.eval.report import write_report

        path = write_report(rows, headers, out, reference=reference, baseline=baseline, figures=figures)
    typer.echo(str(path))


@app.command()
def components() -> None:
    """List every registered component by family."""
    from lorekv.aggregators import AGGREGATORS
    from lorekv.policies import POLICIES
    from lorekv.samplers import SAMPLERS
    from lorekv.scorers import SCORERS

    for registry in (SAMPLERS, SCORERS, AGGREGATORS, POLICIES):
        typer.echo(f"{registry.family:<10} {', '.join(registry.names())}")


@app.command()
@_guarded
def presets(
    name: Annotated[str | None, typer.Argument(help="Print this preset's config as YAML.")] = None,
    budget: BudgetOpt = 64,
) -> None:
    """List the presets, or print one as a pipeline YAML file."""
    from lorekv.presets import PRESETS, preset

    if name is None:
        width = max(map(len, PRESETS))
        for key, fn in PRESETS.items():
            typer.echo(f"{key:<{width}}  {(fn.__doc__ or '').strip().splitlines()[0]}")
        return
    typer.echo(preset(name, budget).to_yaml(), nl=False)


@app.command()
@_guarded
def bench(
    model: Annotated[
        str,
        typer.Option(
            help="Bundled name, local directory, .gguf file or hub id; or random:<architecture>, a published "
            "architecture with random weights (random:llama-3.2-1b, random:llama-3.1-8b, random:qwen2.5-7b, "
            "random:qwen3-8b, random:mistral-7b, random:gemma-3-4b, random:gemma-3-12b): it measures cost at "
            "that size, not accuracy."
        ),
    ] = "smollm2-135m-instruct",
    layers: Annotated[
        int | None, typer.Option(help="random: models only: keep the first k layers of the published pattern.")
    ] = None,
    width: Annotated[
        int | None,
        typer.Option(help="random: models only: divide hidden size, MLP and head counts by this (head size kept)."),
    ] = None,
    lengths: Annotated[str, typer.Option(help="Prompt lengths n in tokens, comma-separated.")] = "512,1024,2048,4096",
    futures: Annotated[str, typer.Option(help="The M of the sampling/scoring sweep, comma-separated.")] = "1,2,4,8",
    num_futures: Annotated[int, typer.Option(help="M of the LORE-KV compression and the scorers' futures.")] = 4,
    tokens: Annotated[int, typer.Option(help="T, tokens per future.")] = 8,
    budget: BudgetOpt = 128,
    repeats: Annotated[int, typer.Option(help="Timed runs per measurement after one warm-up (medians).")] = 5,
    decode_tokens: Annotated[int, typer.Option(help="K, tokens per decode measurement (>= 2).")] = 32,
    scorers: Annotated[
        str, typer.Option(help="Scorers timed alone, comma-separated.")
    ] = "attention_mass,loo,projected_loo",
    threads: Annotated[int | None, typer.Option(help="torch threads (default: every core).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:<i>.")] = "cpu",
    dtype: Annotated[
        str | None, typer.Option(help="float32, bfloat16 or float16 (default: float32 on cpu, bfloat16 on cuda).")
    ] = None,
    compile: Annotated[bool, typer.Option("--compile/--no-compile", help="Also time the compiled scorers.")] = True,
    batch_sizes: Annotated[
        str, typer.Option(help="Batch sizes b of the batch throughput, comma-separated; must include 1.")
    ] = "1,2,4,8",
    out: Annotated[Path | None, typer.Option(help="JSON file (default: results/bench/<model>-<device>.json).")] = None,
) -> None:
    """Time compression against transformers' prefill and SnapKV; phases, scorers, memory, growth, decoding,
    batch throughput.

    With --model random:<architecture> (and --layers, --width for a quick run) the model is a published
    architecture built with random weights and fed random token ids: the cost at a real size, no accuracy."""
    from lorekv.cost import (
        BenchConfig,
        default_out,
        known_context,
        parse_ints,
        parse_names,
        render,
        run_bench,
        write_results,
    )

    config = BenchConfig(
        model=model, layers=layers, width=width, lengths=parse_ints("lengths", lengths),
        futures=parse_ints("futures", futures),
        num_futures=num_futures, tokens=tokens, budget=budget, repeats=repeats, decode_tokens=decode_tokens,
        scorers=parse_names("scorers", scorers), threads=threads, device=device, dtype=dtype, compile=compile,
        batch_sizes=parse_ints("batch_sizes", batch_sizes),
    )  # fmt: skip
    config.check_context(known_context(model))
    out = out or default_out(config.label, device)
    if out.is_dir():
        raise ValueError(f"out: {out} is a directory, expected a .json file path")
    results = run_bench(config, log=lambda line: typer.echo(line, err=True))
    typer.echo(render(results), nl=False)
    typer.echo(f"\nWrote {write_results(results, out)}")


@app.command()
@_guarded
def distill(
    config: Annotated[
        Path | None, typer.Argument(help="A distill YAML (lorekv/surrogates/*.yaml are the shipped fits').")
    ] = None,
    out: Annotated[Path, typer.Option(help="The surrogate file to write (.safetensors).")] = Path(
        "surrogate.safetensors"
    ),
    teacher: Annotated[
        str | None, typer.Option(help="Teacher: a preset's name or a pipeline YAML (default: the config's, lore_kv).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Bundled name, local directory or .gguf file.")] = None,
    kind: Annotated[str | None, typer.Option(help="linear (ridge) or mlp.")] = None,
    set_: SetOpt = None,
) -> None:
    """Fit a surrogate scorer: run a teacher pipeline over calibration contexts, fit a per-layer map from each
    token's hidden state to the log of its teacher score, write it with its provenance and held-out figures.

    Resumable: finished contexts are kept in <out>.parts/ and read back by a rerun with the same settings."""
    from lorekv.distill.run import DistillConfig
    from lorekv.distill.run import distill as run_distill
    from lorekv.hf import prepare

    fields = {} if config is None else DistillConfig.from_file(config).model_dump()
    chosen = {"teacher": teacher, "model": model, "kind": kind}
    fields.update({key: value for key, value in chosen.items() if value is not None})
    for path, value in _overrides(set_).items():
        target = fields
        *parents, last = path.split(".")
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value
    settings = DistillConfig.model_validate(fields)
    settings.teacher_config()  # a bad teacher is refused before the model loads
    loaded, tokenizer = _load(settings.model)
    prepare(loaded)
    run_distill(settings, out, loaded, tokenizer, log=lambda line: typer.echo(line, err=True))


@app.command(name="gpu-check")
@_guarded
def gpu_check(
    out: Annotated[Path | None, typer.Option(help="JSON file (default: results/gpu-check-<device>.json).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when there is one).")] = None,
    demo: Annotated[
        bool, typer.Option(help="Check the bundled SmolLM2's demo answers (--no-demo where it is not installed).")
    ] = True,
) -> None:
    """Correctness on the device (float32 and bfloat16) and the cost of an 8B-class random-weight model.

    Without a CUDA device it runs the same code on the CPU at reduced sizes and says the GPU figures were not
    taken. Exit code 1 when a correctness check fails."""
    from lorekv.cost.gpu_check import render_check, run_gpu_check, write_check

    if device is not None and device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    results = run_gpu_check(device, demo=demo, log=lambda line: typer.echo(line, err=True))
    target = out or Path("results") / f"gpu-check-{results['device']['device'].replace(':', '')}.json"
    typer.echo(render_check(results), nl=False)
    typer.echo(f"Wrote {write_check(results, target)}")
    if not results["passed"]:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    sys.exit(app())
