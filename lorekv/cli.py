"""The ``lorekv`` command line: the demo, generation from a config, the needle benchmark."""

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Future-aware KV-cache eviction.")

ModelOpt = Annotated[str, typer.Option(help="Bundled name, local directory, .gguf file or hub id.")]
BudgetOpt = Annotated[int, typer.Option(help="Kept tokens per KV head on average (B).")]


def _fail(error: Exception) -> None:
    typer.echo(f"error: {error}", err=True)
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


def _load(model: str):
    from lorekv.models import load

    typer.echo(f"Loading {model} (the first run dequantises the GGUF, about 30 s; later runs read a cache) ...")
    start = time.perf_counter()
    loaded = load(model)
    typer.echo(f"Loaded in {time.perf_counter() - start:.1f} s.")
    return loaded


def _eos(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<end_of_turn>", "<|endoftext|>"):
        found = tokenizer.convert_tokens_to_ids(token)
        if isinstance(found, int) and found != tokenizer.unk_token_id:
            ids.add(found)
    return sorted(i for i in ids if i is not None)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _methods(budget: int) -> dict[str, Any]:
    from lorekv.presets import preset

    return {
        "full cache": None,
        "LORE-KV": preset("lore_kv", budget),
        "prompt window (SnapKV)": preset("snapkv", budget),
    }


def _run_method(model, tokenizer, config, ids: torch.Tensor, max_new_tokens: int):
    from lorekv.decoding import generate_full
    from lorekv.pipeline import Pipeline

    eos = _eos(tokenizer)
    start = time.perf_counter()
    if config is None:
        result = generate_full(model, ids, max_new_tokens, eos_token_id=eos)
    else:
        result = Pipeline.from_config(config).generate(model, ids, max_new_tokens, eos_token_id=eos)
    return result, time.perf_counter() - start


@app.command()
@_guarded
def demo(
    model: ModelOpt = "smollm2-135m-instruct",
    budget: BudgetOpt = 64,
    tokens: Annotated[int, typer.Option(help="Haystack length in tokens.")] = 1500,
    depth: Annotated[float, typer.Option(help="Needle depth in [0, 1].")] = 0.5,
    seed: int = 0,
    max_new_tokens: int = 16,
) -> None:
    """Answer one needle-in-a-haystack question with the full cache, LORE-KV and the prompt-window control."""
    from lorekv.needle import make_task, prompt_ids

    methods = _methods(budget)
    net, tokenizer = _load(model)
    task = make_task(tokenizer, tokens, depth, seed)
    ids = prompt_ids(tokenizer, task)
    typer.echo(f"Prompt: {ids.shape[1]} tokens, needle at depth {depth:.2f}; expected answer {task.answer}.")
    typer.echo(f"Budget: {budget} tokens per KV head.\n")
    for name, config in methods.items():
        typer.echo(f"[{name}] running ...")
        result, seconds = _run_method(net, tokenizer, config, ids, max_new_tokens)
        answer = tokenizer.decode(result.token_ids, skip_special_tokens=True).strip()
        verdict = "correct" if task.is_correct(answer) else "wrong"
        typer.echo(f"  answer: {task.answer_prefix} {answer!r} -> {verdict}")
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
    question_file: Annotated[
        Path | None, typer.Option(help="Query-agnostic use: compress the prompt, then ask this.")
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    max_new_tokens: int = 64,
    chat: Annotated[bool, typer.Option(help="Wrap the text in the model's chat template.")] = True,
) -> None:
    """Compress a prompt with a pipeline and decode an answer; prints the answer and the stats as JSON."""
    from lorekv.decoding import decode
    from lorekv.pipeline import Pipeline, PipelineConfig
    from lorekv.presets import preset as make_preset

    if (config is None) == (preset is None):
        raise ValueError("give exactly one of --config or --preset")
    if preset is not None:
        if budget is None:
            raise ValueError("--preset needs --budget")
        pipeline_config = make_preset(preset, budget)
    else:
        pipeline_config = PipelineConfig.from_file(config)
    pipeline = Pipeline.from_config(pipeline_config)
    prompt = prompt_file.read_text()
    question = question_file.read_text() if question_file else None
    if not prompt.strip():
        raise ValueError(f"prompt_file {prompt_file} is empty")
    net, tokenizer = _load(model)
    context_ids, question_ids = _encode(tokenizer, prompt, question, chat)
    eos = _eos(tokenizer)
    if question_ids is None:
        result = pipeline.generate(net, context_ids, max_new_tokens, eos_token_id=eos)
    else:
        compressed = pipeline.compress(net, context_ids, query_aware=False)
        result = decode(net, compressed, question_ids, max_new_tokens, eos_token_id=eos)
    typer.echo(tokenizer.decode(result.token_ids, skip_special_tokens=True))
    typer.echo(json.dumps({"stats": result.stats.to_dict(), "decode_seconds": result.decode_seconds}, indent=2))


def _encode(tokenizer, prompt: str, question: str | None, chat: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    marker = "\u0000SPLIT\u0000"
    user = prompt if question is None else f"{prompt}{marker}{question}"
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
    else:
        text = user
    if question is None:
        return torch.tensor([tokenizer(text, add_special_tokens=not chat)["input_ids"]]), None
    head, tail = text.split(marker)
    ids = tokenizer(head, add_special_tokens=not chat)["input_ids"]
    return torch.tensor([ids]), torch.tensor([tokenizer(tail, add_special_tokens=False)["input_ids"]])


@app.command()
@_guarded
def needle(
    out: Annotated[Path, typer.Option(help="Results JSONL; rerunning resumes it.")] = Path("results/needle.jsonl"),
    trials: int = 12,
    budget: BudgetOpt = 64,
    tokens: int = 1250,
    methods: Annotated[str, typer.Option(help="Comma-separated: full and/or preset names.")] = "full,lore_kv,snapkv",
    config: Annotated[
        list[Path] | None,
        typer.Option(help="Pipeline YAML/JSON files run as extra methods named by file stem, at --budget."),
    ] = None,
    model: ModelOpt = "smollm2-135m-instruct",
    max_new_tokens: int = 16,
) -> None:
    """Needle-in-a-haystack accuracy of several methods at one budget (resumable)."""
    from lorekv.needle import make_task, prompt_ids
    from lorekv.pipeline import PipelineConfig
    from lorekv.presets import PRESETS, preset
    from lorekv.results import ResultsFile

    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m != "full" and m not in PRESETS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; choose from full, {', '.join(sorted(PRESETS))}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    configs = {m: None if m == "full" else preset(m, budget) for m in names}
    for path in config or []:
        loaded = PipelineConfig.from_file(path).model_dump()
        loaded["policy"]["budget"] = budget
        configs[path.stem] = PipelineConfig.model_validate(loaded)
    names = list(configs)
    results = ResultsFile(out)
    net, tokenizer = _load(model)
    for trial in range(trials):
        depth = (trial % 6 + 0.5) / 6
        task = make_task(tokenizer, tokens, depth, seed=trial)
        ids = prompt_ids(tokenizer, task)
        for name, config in configs.items():
            key = f"{model}|{name}|B={budget}|n={tokens}|seed={trial}"
            if key in results.done():
                continue
            result, seconds = _run_method(net, tokenizer, config, ids, max_new_tokens)
            answer = tokenizer.decode(result.token_ids, skip_special_tokens=True)
            results.add({
                "id": key, "model": model, "method": name, "budget": budget, "haystack": tokens,
                "tokens": int(ids.shape[1]), "seed": trial,
                "depth": depth, "answer": answer, "correct": task.is_correct(answer), "seconds": seconds,
                "stats": None if result.stats is None else result.stats.to_dict(),
            })  # fmt: skip
            typer.echo(
                f"trial {trial:>3} {name:<14} {'ok ' if task.is_correct(answer) else 'BAD'} {answer.strip()[:40]!r}"
            )
    typer.echo("")
    for name in names:
        rows = [
            r for r in results.records
            if (r["model"], r["method"], r["budget"], r["haystack"]) == (model, name, budget, tokens)
        ]  # fmt: skip
        if rows:
            ok = sum(r["correct"] for r in rows)
            typer.echo(
                f"{name:<14} {ok}/{len(rows)} correct   "
                f"median total {statistics.median(r['seconds'] for r in rows):.2f} s"
            )


@app.command()
def components() -> None:
    """List every registered component by family."""
    import lorekv.pipeline  # noqa: F401  (registers everything)
    from lorekv.aggregators.base import AGGREGATORS
    from lorekv.policies.base import POLICIES
    from lorekv.samplers.base import SAMPLERS
    from lorekv.scorers.base import SCORERS

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
        for key, fn in PRESETS.items():
            typer.echo(f"{key:<14} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return
    typer.echo(preset(name, budget).to_yaml(), nl=False)


def main() -> None:  # pragma: no cover
    sys.exit(app())
