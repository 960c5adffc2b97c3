"""The benchmark's results on screen (a table in sections) and on disk (JSON, written atomically)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lorekv.runfiles import atomic_write_text

THROUGHPUTS = ("prompts_per_second", "prompt_tokens_per_second", "generated_tokens_per_second")

SECTIONS = (
    "Machine",
    "Compression",
    "Sampling and scoring by M",
    "Scorers alone",
    "First-call overhead",
    "Memory",
    "Growth",
    "Decoding",
    "Batch throughput",
)


def default_out(model: str, device: str) -> Path:
    """``results/bench/<model>-<device>.json`` (the model's last path part, the device's type)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model.rstrip("/")).name or model)
    return Path("results") / "bench" / f"{name}-{device.split(':')[0]}.json"


def write_results(results: dict[str, Any], path: str | Path) -> Path:
    """Write ``results`` as JSON to ``path`` atomically (a folder in the way is an error naming it)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"out: {path} is a directory, expected a .json file path")
    atomic_write_text(path, json.dumps(results, indent=1, allow_nan=False) + "\n")
    return path


def read_results(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("type") != "lorekv-bench":
        raise ValueError(f"{path}: not a lorekv bench results file")
    return data


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) < 1.0:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def exponent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, align: str = ">") -> str:
    """A titled fixed-width table: the first column left-aligned, the others aligned by ``align``
    (``">"`` right, ``"<"`` left)."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [f"{str(c):{align}{w}}" for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    if not any(header):  # a key-value table: no header, no rule
        return "\n".join([f"== {title} ==", *(line(row) for row in rows)])
    rule = "-" * max(len(line(r)) for r in [header, *rows])
    return "\n".join([f"== {title} ==", line(header), rule, *(line(row) for row in rows)])


def _median(entry: dict[str, Any] | None) -> float | None:
    return None if entry is None else entry["median"]


def render(results: dict[str, Any]) -> str:
    """Every section of ``results`` as text tables (see :data:`SECTIONS`)."""
    lengths = results["lengths"]
    keys = list(lengths)
    header = ["", *(f"n={lengths[k]['n']}" for k in keys)]
    settings = results["settings"]
    parts = [_machine(results)]

    def row(label: str, get: Any, fmt: Any) -> list[str]:
        return [label, *(fmt(get(lengths[k])) for k in keys)]

    phases = ("prefill", "sampling", "scoring", "selection")
    m = settings["num_futures"]
    parts.append(
        table(
            f"Compression (median of {settings['repeats']} runs; B={settings['budget']}, LORE-KV M={m}, "
            f"T={settings['tokens']})",
            header,
            [
                row("transformers prefill (SDPA)", lambda x: x["prefill"]["transformers"]["median"], seconds),
                row("lorekv prefill", lambda x: x["prefill"]["lorekv"]["median"], seconds),
                row("SnapKV compression", lambda x: x["compression"]["snapkv"]["median"], seconds),
                row("LORE-KV compression", lambda x: x["compression"]["lore_kv"]["median"], seconds),
                *(
                    row(f"  {p}", lambda x, p=p: x["compression"]["lore_kv"]["phase_medians"].get(p), seconds)
                    for p in phases
                ),
                row(
                    "LORE-KV / transformers prefill", lambda x: x["ratios"]["lore_kv_over_transformers_prefill"], ratio
                ),
                row("LORE-KV / SnapKV", lambda x: x["ratios"]["lore_kv_over_snapkv"], ratio),
                row(
                    "lorekv / transformers prefill",
                    lambda x: x["ratios"]["lorekv_prefill_over_transformers_prefill"],
                    ratio,
                ),
            ],
        )
    )
    futures = list(lengths[keys[0]]["futures"]) if keys else []
    parts.append(
        table(
            "Sampling and scoring by M (one prefill per n; median)",
            header,
            [
                *(
                    row(f"sampling M={f}", lambda x, f=f: x["futures"][f]["sampling"]["median"], seconds)
                    for f in futures
                ),
                *(row(f"scoring M={f}", lambda x, f=f: x["futures"][f]["scoring"]["median"], seconds) for f in futures),
                row(
                    f"T={settings['tokens']} batch-1 decode steps (transformers, full cache)",
                    lambda x: x["decode_steps"]["median"],
                    seconds,
                ),
                row("LORE-KV sampling / decode steps", lambda x: x["ratios"]["sampling_over_decode_steps"], ratio),
            ],
        )
    )
    scorer_names = list(lengths[keys[0]]["scorers"]) if keys else []
    scorer_rows = [
        row(f"{name} ({kind})", lambda x, name=name, kind=kind: _median(x["scorers"][name][kind]), seconds)
        for name in scorer_names
        for kind in ("eager", "compiled")
    ]
    for kind in ("eager", "compiled"):
        key = f"projected_loo_over_attention_mass_{kind}"
        if keys and key in lengths[keys[0]]["ratios"]:
            scorer_rows.append(
                row(f"projected LOO / attention mass ({kind})", lambda x, key=key: x["ratios"][key], ratio)
            )
    parts.append(
        table(f"Scorers alone on the same M={m} futures (median; compile {_compile(results)})", header, scorer_rows)
    )
    overhead = results.get("first_call_overhead", {})
    parts.append(
        table(
            "First-call overhead (first call minus median; compilation at the first n, a new shape after)",
            header,
            [[label, *(seconds(per.get(k)) for k in keys)] for label, per in overhead.items()],
        )
    )
    parts.append(
        table(
            "Memory (peak above the loaded model; KV bytes of the cache)",
            header,
            [
                row("transformers prefill", lambda x: x["memory"]["transformers_prefill"], mib),
                row("lorekv prefill", lambda x: x["memory"]["prefill"], mib),
                row("SnapKV compression", lambda x: x["memory"]["snapkv"], mib),
                row("LORE-KV compression", lambda x: x["memory"]["lore_kv"], mib),
                row("full KV (before eviction)", lambda x: x["memory"]["kv_bytes_before"], mib),
                row("KV after eviction (allocated)", lambda x: x["memory"]["kv_bytes_after"], mib),
                row("KV after eviction (kept)", lambda x: x["memory"]["kv_bytes_kept"], mib),
                row(
                    "(LORE-KV - prefill) / full KV",
                    lambda x: x["memory"]["lore_kv_over_prefill_per_kv"],
                    lambda v: f"{v:.2f}",
                ),
                row("after the prefill: sampling", lambda x: x["memory"]["after_prefill"]["sampling"], mib),
                row("after the prefill: scoring", lambda x: x["memory"]["after_prefill"]["scoring"], mib),
                row("after the prefill: selection", lambda x: x["memory"]["after_prefill"]["selection"], mib),
                row(
                    "after the prefill: peak / full KV",
                    lambda x: x["memory"]["after_prefill_per_kv"],
                    lambda v: f"{v:.3f}",
                ),
            ],
        )
    )
    growth = results["growth"]
    growth_rows = [[f"{label} vs n", exponent(k)] for label, k in growth["n"].items()]
    growth_rows += [
        [f"{part} vs M at n={lengths_n(results, n)}", exponent(per[part])]
        for n, per in growth["M"].items()
        for part in per
    ]
    parts.append(table("Growth (fitted exponent k of time ~ c * size^k)", ["", "k"], growth_rows))
    k = settings["decode_tokens"]
    decode_rows = [
        row(
            label,
            lambda x, key=key: x["decode"][key]["tokens_per_second"],
            lambda v: "-" if v is None else f"{v:.1f} tok/s",
        )
        for label, key in (
            ("transformers generate (full cache)", "generate"),
            ("transformers generate (after LORE-KV)", "generate_compressed"),
            ("lorekv decode (full cache)", "lorekv_full"),
            ("lorekv decode (after LORE-KV)", "lorekv_compressed"),
        )
    ]
    decode_rows.append(
        row(
            "generate after LORE-KV / on the full cache (time per token)",
            lambda x: x["ratios"]["compressed_generate_over_generate"],
            ratio,
        )
    )
    decode_rows.append(
        row("lorekv full / generate (time per token)", lambda x: x["ratios"]["lorekv_decode_over_generate"], ratio)
    )
    decode_rows.append(
        row(
            "lorekv compressed / generate (time per token)",
            lambda x: x["ratios"]["compressed_decode_over_generate"],
            ratio,
        )
    )
    parts.append(table(f"Decoding ((t_{k} - t_1) / {k - 1} per token; median)", header, decode_rows))
    if results.get("batch"):
        parts.append(_batch(results))
    return "\n\n".join(parts) + "\n"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _batch(results: dict[str, Any]) -> str:
    """Per n and b: seconds of a batch's compression and decoding, prompts/s, prompt tokens/s
    (compression), generated tokens/s (decoding), and each throughput over b = 1's."""
    settings = results["settings"]
    header = ["", "prompt tok", "compress", "decode"]
    header += [part for label in ("prompts/s", "prompt tok/s", "gen tok/s") for part in (label, "/ b=1")]
    rows = []
    for key, per_b in results["batch"].items():
        for entry in per_b.values():
            medians = entry["phase_medians"]
            row = [f"n={key} b={entry['b']}", str(sum(entry["prompt_lengths"]))]
            row += [seconds(medians.get("compression")), seconds(medians.get("decoding"))]
            row += [cell for name in THROUGHPUTS for cell in (_rate(entry[name]), ratio(entry["over_b1"][name]))]
            rows.append(row)
    title = (
        f"Batch throughput (LORE-KV M={settings['num_futures']}, B={settings['budget']}, then "
        f"K={settings['decode_tokens']} tokens per row; rows n, 15n/16, ... left-padded; median of "
        f"{settings['repeats']} runs)"
    )
    return table(title, header, rows)


def lengths_n(results: dict[str, Any], key: str) -> int:
    return results["lengths"][key]["n"]


def _machine(results: dict[str, Any]) -> str:
    machine, packages, settings = results["machine"], results["packages"], results["settings"]
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    software = f"torch {packages.get('torch')}, transformers {packages.get('transformers')}"
    rows = [
        ["model", f"{settings['model']} ({results['dtype']}, {results['device']})"],
        *_weights(results),
        ["machine", f"{machine.get('cpu')}, {machine.get('cores')} cores{gpu}; {machine.get('system')}"],
        ["threads", str(results["threads"])],
        ["software", f"{software}, python {machine.get('python')}"],
        ["commit", str(results.get("commit"))],
        ["settings", f"repeats {settings['repeats']} (+1 warm-up), T={settings['tokens']}, B={settings['budget']}, "
                     f"M={settings['num_futures']}, K={settings['decode_tokens']}, compile {_compile(results)}"],
        ["wall time", _duration(results.get("wall_seconds"))],
        ["load average", _load(results.get("load_average"))],
    ]  # fmt: skip
    return table("Machine", ["", ""], rows, align="<")


def _weights(results: dict[str, Any]) -> list[list[str]]:
    """The rows that say what the weights are: random weights say what they measure and what not."""
    weights = results.get("weights")
    rows = [["prompts", results["prompts"]]] if results.get("prompts") else []
    if not weights:
        return rows
    count = f"{weights['parameters'] / 1e9:.2f} B parameters"
    if weights.get("weights") != "random":
        return [["weights", f"pretrained, {count}"], *rows]
    shrink = f"{weights['layers']} of {weights['published_layers']} layers"
    shrink += f" ({weights['full_attention_layers']} full attention), width 1/{weights['width']}"
    return [
        ["weights", f"RANDOM: {weights['architecture']} as published by {weights['source']}; {shrink}; {count}"],
        ["measures", weights["measures"]],
        ["cannot measure", weights["cannot_measure"]],
        *rows,
    ]


def _duration(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s ({value / 60:.1f} min)"


def _load(load: dict[str, Any] | None) -> str:
    """The 1-minute load average at start and end, against the cores (a busy machine skews every time)."""
    if not load or load.get("start") is None or load.get("end") is None:
        return "-"
    return f"{load['start'][0]:.2f} at start, {load['end'][0]:.2f} at end (1-minute)"


def _compile(results: dict[str, Any]) -> str:
    return "on" if results["compile"] else "off"
