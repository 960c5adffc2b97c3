"""``lorekv gpu-check``: correctness on the device, then the cost of an 8B-class model, in one JSON file.

On a machine with a CUDA GPU it checks, in float32 and bfloat16 with stated tolerances, that
lorekv's own functions agree on the device with plain references written here: cascade attention
with a softmax over the concatenated keys, the scorers with brute force, compressed decoding with
the full cache whose evicted entries are hidden (:mod:`lorekv.hf.reference`), and the bundled
SmolLM2 answers the demo prompt with the same tokens in float32 as on the CPU. Then it times the
random-weight ``random:llama-3.1-8b`` in bfloat16 with :func:`~lorekv.cost.run_bench` at n = 8K,
32K and longer lengths while the time budget lasts. On a CPU-only machine the same code runs at
reduced sizes (so CI keeps it working) and the results say that the GPU figures were not taken.
"""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from lorekv.cost.config import BenchConfig
from lorekv.cost.run import run_bench

Log = Callable[[str], None]
NOT_TAKEN = "GPU figures not taken: no CUDA device; the CPU ran the same code at reduced sizes"
TOLERANCES = {"float32": {"cascade": 1e-5, "scores": 1e-4, "decode": 1e-4}, "bfloat16": {}}
TOLERANCES["bfloat16"] = {"cascade": 2e-2, "scores": 3e-2, "decode": 5e-2}


@dataclass(frozen=True)
class Sizes:
    """What one run measures: the cost model's shrink settings and lengths, its repeats, the time budget."""

    layers: int | None
    width: int | None
    lengths: tuple[int, ...]
    repeats: int
    decode_tokens: int
    budget_s: float
    demo: bool = True


GPU_SIZES = Sizes(
    layers=None, width=None, lengths=(8192, 32768, 65536, 98304), repeats=2, decode_tokens=16, budget_s=330
)
CPU_SIZES = Sizes(layers=1, width=8, lengths=(256, 512), repeats=1, decode_tokens=4, budget_s=120)


@dataclass
class Check:
    """One correctness check: its name, dtype, the largest error seen and the tolerance it must stay within."""

    name: str
    dtype: str
    error: float
    tolerance: float
    detail: str = ""
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = bool(self.error <= self.tolerance)


def placement() -> str:
    """Where the GPU branch puts its tensors ("cuda"; a test stands in "cpu")."""
    return "cuda"


def device_facts(device: str) -> dict[str, Any]:
    """The device's name and memory, torch's and CUDA's versions."""
    facts: dict[str, Any] = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        facts["name"] = torch.cuda.get_device_name(index)
        facts["memory_bytes"] = int(torch.cuda.get_device_properties(index).total_memory)
    else:
        from lorekv.runfiles import machine

        facts["name"] = machine()["cpu"]
    return facts


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, max |want|): absolute near zero, relative for large values."""
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / max(1.0, float(want.abs().max())))


def check_cascade(device: str, dtype: torch.dtype, seed: int = 0) -> float:
    """Cascade attention over an evicted (padded) prefix shared by 3 branches, against a float64 softmax
    over the concatenated [prefix, own] keys with the visibility rule written out."""
    from lorekv.hf.attention import shared_prefix_attention
    from lorekv.hf.cache import PADDING

    gen = torch.Generator().manual_seed(seed)
    b, g, group, d, k, own, q = 3, 2, 2, 64, 96, 5, 3
    h = g * group
    keep = torch.rand(1, g, k, generator=gen) < 0.6
    prefix_pos = torch.where(keep, torch.arange(k).view(1, 1, k), torch.full((1, g, k), PADDING))
    pk, pv = torch.randn(1, g, k, d, generator=gen), torch.randn(1, g, k, d, generator=gen)
    key_pos = torch.arange(k, k + own + q).view(1, 1, -1).expand(b, g, -1).contiguous()
    keys, values = torch.randn(b, g, own + q, d, generator=gen), torch.randn(b, g, own + q, d, generator=gen)
    query = torch.randn(b, h, q, d, generator=gen)
    query_pos = torch.arange(k + own, k + own + q)
    scale = d**-0.5
    inputs = [t.to(dtype) for t in (query, keys, values, pk, pv)]
    query, keys, values, pk, pv = inputs
    on = [t.to(device) for t in inputs]
    got, _, _ = shared_prefix_attention(
        on[0], on[1], on[2], key_pos.to(device), query_pos.to(device), on[3], on[4], prefix_pos.to(device), True,
        None, scale,
    )  # fmt: skip
    all_keys = torch.cat([pk.expand(b, -1, -1, -1), keys], dim=2).double().repeat_interleave(group, dim=1)
    all_values = torch.cat([pv.expand(b, -1, -1, -1), values], dim=2).double().repeat_interleave(group, dim=1)
    positions = torch.cat([prefix_pos.expand(b, -1, -1), key_pos], dim=2).repeat_interleave(group, dim=1)
    seen = (positions[:, :, None, :] != PADDING) & (positions[:, :, None, :] <= query_pos.view(1, 1, q, 1))
    logits = (query.double() @ all_keys.transpose(-1, -2)) * scale
    want = torch.softmax(logits.masked_fill(~seen, -torch.inf), dim=-1) @ all_values
    return _relative(got, want)


def check_scores(device: str, dtype: torch.dtype, seed: int = 0) -> tuple[float, str]:
    """Attention mass and LOO on a random layer capture against float64 brute force: the softmax weights
    of the prompt keys, and ||o - o_{-j}|| with key j deleted and the softmax recomputed."""
    from lorekv.scorers import SCORERS
    from lorekv.trajectories import LayerCapture

    gen = torch.Generator().manual_seed(seed)
    m, g, h, t, n, d = 2, 2, 4, 4, 24, 32

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    parts = {
        "queries": normal(m, h, t, d), "prompt_keys": normal(g, n, d), "prompt_values": normal(g, n, d),
        "response_keys": normal(m, g, t, d), "response_values": normal(m, g, t, d), "o_proj": normal(16, h * d),
    }  # fmt: skip
    positions = torch.arange(n, n + t)
    layer = LayerCapture(
        0, query_positions=positions.to(device), scaling=d**-0.5, **{k: v.to(device) for k, v in parts.items()}
    )
    keys = torch.cat([parts["prompt_keys"].expand(m, -1, -1, -1), parts["response_keys"]], 2).double()
    values = torch.cat([parts["prompt_values"].expand(m, -1, -1, -1), parts["response_values"]], 2).double()
    keys, values = keys.repeat_interleave(h // g, 1), values.repeat_interleave(h // g, 1)
    key_pos = torch.cat([torch.arange(n), positions])
    seen = key_pos.view(1, -1) <= positions.view(-1, 1)  # (T, S); each future's own keys alike

    def attention(drop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        visible = seen.clone()
        if drop is not None:
            visible[:, drop] = False
        logits = (parts["queries"].double() @ keys.transpose(-1, -2)) * d**-0.5
        weights = torch.softmax(logits.masked_fill(~visible, -torch.inf), dim=-1)
        return weights, weights @ values

    weights, outputs = attention()
    loo = torch.stack([(outputs - attention(j)[1]).norm(dim=-1) for j in range(n)], dim=-1)
    mass = SCORERS.build({"name": "attention_mass"}).query_scores(layer)
    got_loo = SCORERS.build({"name": "loo"}).query_scores(layer)
    errors = {"attention_mass": _relative(mass, weights[..., :n]), "loo": _relative(got_loo, loo)}
    return max(errors.values()), ", ".join(f"{k} {v:.1e}" for k, v in errors.items())


def check_decode(model: Any, device: str) -> float:
    """LORE-KV compression (ragged per-head budget) then 4 greedy decoded tokens; each step's logits against
    the full cache with the evicted entries hidden (:func:`lorekv.hf.reference.masked_full_logits`)."""
    from lorekv.hf import decode
    from lorekv.hf.reference import keep_masks, masked_full_logits
    from lorekv.pipeline import Pipeline

    ids = torch.randint(0, model.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(1)).to(device)
    n = ids.shape[1]
    sampler = {"name": "temperature", "num_futures": 2, "num_tokens": 3}
    pipeline = Pipeline(sampler, "projected_loo", "mean", {"name": "per_head", "budget": 12, "alpha": 0.0})
    compressed = pipeline.compress(model, ids)
    seen: list[torch.Tensor] = []

    def rule(logits: torch.Tensor) -> torch.Tensor:
        seen.append(logits[0].float().clone())
        return logits.argmax(dim=-1)

    result = decode(model, compressed, max_new_tokens=4, rule=rule)
    fed = [ids[:, n - 1 :]] + [result.token_ids[i].view(1, 1).to(device) for i in range(3)]
    want = masked_full_logits(model, ids[:, : n - 1], keep_masks(compressed), fed)
    return max(_relative(a, b) for a, b in zip(seen, want, strict=True))


def demo_answers(device: str) -> dict[str, list[int]]:
    """The bundled SmolLM2 in float32 on ``device`` answering ``make demo``'s prompt (niah_single, 1500
    tokens, seed 0): the greedy tokens of the full cache and of LORE-KV at budget 64."""
    from lorekv.eval.tasks import make_sample, parse_task
    from lorekv.hf import generate_full
    from lorekv.models import end_of_turn_ids, load
    from lorekv.pipeline import Pipeline
    from lorekv.presets import preset

    model, tokenizer = load("smollm2-135m-instruct")
    model = model.to(device=device, dtype=torch.float32)
    sample = make_sample(parse_task("niah_single"), tokenizer, 1500, seed=0)
    ids = sample.prompt_ids(tokenizer).to(device)
    eos = end_of_turn_ids(tokenizer)
    full = generate_full(model, ids, sample.max_new_tokens, eos_token_id=eos)
    lore = Pipeline.from_config(preset("lore_kv", 64)).generate(
        model, ids, sample.max_new_tokens, eos_token_id=eos, tokenizer=tokenizer
    )
    return {"full cache": full.token_ids.tolist(), "LORE-KV": lore.token_ids.tolist()}


def check_demo(device: str) -> Check:
    """The demo's answers on ``device`` against the CPU's, as the count of differing tokens (tolerance 0)."""
    got = demo_answers(device)
    want = got if device == "cpu" else demo_answers("cpu")
    differing = sum(
        sum(a != b for a, b in zip(got[k], want[k], strict=False)) + abs(len(got[k]) - len(want[k])) for k in got
    )
    where = "this CPU run is the reference" if device == "cpu" else "against the CPU"
    return Check("smollm2 demo tokens", "float32", float(differing), 0.0, f"{where}; tokens {got}")


def correctness(device: str, sizes: Sizes, say: Log) -> list[Check]:
    """Every correctness check on ``device`` in float32 and bfloat16 (the demo in float32 only)."""
    from lorekv.models.architectures import random_model

    checks: list[Check] = []
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        tol = TOLERANCES[name]
        say(f"checks ({name}): cascade attention, scores, compressed decode")
        checks.append(Check("cascade = softmax attention", name, check_cascade(device, dtype), tol["cascade"]))
        error, detail = check_scores(device, dtype)
        checks.append(Check("scores = brute force", name, error, tol["scores"], detail))
        model = random_model("random:llama-3.1-8b", layers=2, width=8, dtype=dtype, device=device)
        checks.append(Check("compressed decode = masked full", name, check_decode(model, device), tol["decode"]))
        del model
    if sizes.demo:
        say("check: smollm2 demo prompt (float32)")
        checks.append(check_demo(device))
    return checks


FIRST_GROWTH = 1.5
"""The exponent k of time ~ n^k assumed from one measured length: between linear (the futures and
scores) and quadratic (the prefill's attention)."""


def estimate_seconds(measured: list[tuple[int, float]], n: int) -> float:
    """The bench's seconds at length ``n`` from the measured (length, seconds), model loading left out:
    the last one scaled by (n / n_last)^k, k fitted on the last two lengths (kept within [1, 2]) or
    :data:`FIRST_GROWTH` from one."""
    (n1, t1), k = measured[-1], FIRST_GROWTH
    if len(measured) > 1:
        n0, t0 = measured[-2]
        k = min(2.0, max(1.0, math.log(t1 / t0) / math.log(n1 / n0)))
    return t1 * (n / n1) ** k


def cost(device: str, sizes: Sizes, say: Log) -> dict[str, Any]:
    """The bench at each length while the time budget lasts: a length is skipped when its estimated time
    (:func:`estimate_seconds`) would overrun it."""
    from lorekv.cost.run import load_model

    models: dict[str, Any] = {}
    loading = [0.0]

    def loader(config: BenchConfig) -> Any:
        if "model" not in models:
            began = time.perf_counter()
            models["model"] = load_model(config)
            loading[0] = time.perf_counter() - began
        return models["model"]

    out: dict[str, Any] = {"model": "random:llama-3.1-8b", "lengths": {}, "skipped": []}
    start, measured = time.perf_counter(), []
    for n in sizes.lengths:
        spent = time.perf_counter() - start
        if measured and spent + estimate_seconds(measured, n) > sizes.budget_s:
            out["skipped"].append(n)
            continue
        config = BenchConfig(
            model="random:llama-3.1-8b", layers=sizes.layers, width=sizes.width, lengths=(n,), futures=(4,),
            repeats=sizes.repeats, decode_tokens=sizes.decode_tokens, scorers=("projected_loo",), device=device,
            dtype="bfloat16" if device != "cpu" else "float32", compile=False, batch_sizes=(1,),
        )  # fmt: skip
        say(f"cost: n={n}")
        began = time.perf_counter()
        loaded = loading[0]
        results = run_bench(config, loader=loader, log=say)
        seconds = time.perf_counter() - began - (loading[0] - loaded)
        measured.append((n, seconds))
        out["load_seconds"] = loading[0]
        out["dtype"], out["weights"] = (
            results["dtype"] if "dtype" in results else config.resolved_dtype,
            results.get("weights"),
        )
        out["lengths"][str(n)] = {"seconds": seconds, **_figures(results["lengths"][next(iter(results["lengths"]))])}
    if out["skipped"]:
        out["note"] = f"lengths {out['skipped']} skipped: the {sizes.budget_s:.0f} s time budget would be spent"
    return out


def _figures(length: dict[str, Any]) -> dict[str, Any]:
    """The figures the check reports from one bench length: medians, phases, peaks, decode tokens/s."""
    compression = length["compression"]
    return {
        "n": length["n"],
        "transformers_prefill_s": length["prefill"]["transformers"]["median"],
        "snapkv_s": compression["snapkv"]["median"],
        "lore_kv_s": compression["lore_kv"]["median"],
        "lore_kv_phases_s": compression["lore_kv"].get("phase_medians", {}),
        "snapkv_phases_s": compression["snapkv"].get("phase_medians", {}),
        "peak_bytes": {k: length["memory"][k] for k in ("transformers_prefill", "snapkv", "lore_kv")},
        "decode_tokens_per_s": {
            "full": length["decode"]["generate"]["tokens_per_second"],
            "compressed": length["decode"]["generate_compressed"]["tokens_per_second"],
        },
    }


def run_gpu_check(
    device: str | None = None, *, sizes: Sizes | None = None, demo: bool = True, log: Log | None = None
) -> dict[str, Any]:
    """Run the checks and the cost on ``device`` (None: the GPU when there is one, else the CPU); ``demo=False``
    leaves out the SmolLM2 demo check (a machine without the bundled model), and the results say so."""
    say = log or (lambda _: None)
    gpu = torch.cuda.is_available() if device is None else device.startswith("cuda")
    device = device or ("cuda" if gpu else "cpu")
    facts = device_facts(device)
    place = placement() if gpu else "cpu"
    sizes = sizes or (GPU_SIZES if gpu else CPU_SIZES)
    sizes = sizes if demo else replace(sizes, demo=False)
    wall = time.perf_counter()
    checks = correctness(place, sizes, say)
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": facts,
        "gpu": gpu,
        "sizes": asdict(sizes),
        "checks": [asdict(c) for c in checks],
        "passed": all(c.passed for c in checks),
        "cost": cost(place, sizes, say),
    }
    if not gpu:
        results["note"] = NOT_TAKEN
    results["seconds"] = time.perf_counter() - wall
    return results


def render_check(results: dict[str, Any]) -> str:
    """The short table: one line per check, one per length, and the note when the GPU figures were not taken."""
    facts = results["device"]
    lines = [f"gpu-check on {facts['name']} ({facts['device']}, torch {facts['torch']}, CUDA {facts['cuda']})"]
    for c in results["checks"]:
        verdict = "PASS" if c["passed"] else "FAIL"
        lines.append(f"  {verdict}  {c['name']:<34} {c['dtype']:<9} error {c['error']:.2e} <= {c['tolerance']:.0e}")
    lines.append("  n        prefill    snapkv     lore_kv    peak lore_kv  decode full/compressed tok/s")
    for entry in results["cost"]["lengths"].values():
        rates = entry["decode_tokens_per_s"]
        rate = "/".join("-" if r is None else f"{r:.1f}" for r in (rates["full"], rates["compressed"]))
        lines.append(
            f"  {entry['n']:<8} {entry['transformers_prefill_s']:<10.3f} {entry['snapkv_s']:<10.3f} "
            f"{entry['lore_kv_s']:<10.3f} {entry['peak_bytes']['lore_kv'] / 2**20:>9.1f} MiB  {rate}"
        )
    if not results["sizes"]["demo"]:
        lines.append("  smollm2 demo check not run")
    for note in (results["cost"].get("note"), results.get("note")):
        if note:
            lines.append(f"  {note}")
    return "\n".join(lines) + "\n"


def write_check(results: dict[str, Any], path: str | Path) -> Path:
    """Write the results as JSON (folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))
    return path
