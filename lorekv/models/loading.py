"""Load a causal LM and its tokenizer: bundled GGUF models, local directories, or hub ids.

A bundled GGUF is dequantised once (~25 s for SmolLM2, ~60 s for Gemma 3) and the result is
cached as safetensors under ``$LOREKV_CACHE`` (default ``~/.cache/lorekv``), so later loads
take about a second. The cache is written to a temporary directory and renamed into place,
so an interrupted first load leaves nothing half-written behind.

A tokenizer read from a GGUF and saved with ``save_pretrained`` has been seen to reload as the
wrong class under another transformers version (spaces turned into ``<|endoftext|>``, a wrong
eos). The cache therefore records what the GGUF tokenizer produced for a probe text and
checks the cached tokenizer against it on every load; on a mismatch it falls back to the GGUF.

The weights file's SHA-256 is written with the cache and checked on every load (about a second
for SmolLM2): a truncated, deleted or overwritten cache is rebuilt from the GGUF with a
one-line notice instead of loading NaNs or failing with a safetensors traceback. Temporary
directories left by an interrupted first load are removed on the next one.

Processes that load one bundled model at once (the shards of an evaluation grid started together
on a fresh machine) take turns through an exclusive lock beside the cache: the first builds it,
the others wait and read it, instead of each rebuilding it under the others' feet.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from lorekv.extras import require
from lorekv.models.bundled import BUNDLED, BundledModel

PROBE_TEXT = "Hello world!  Two spaces,\ttabs, digits 12345 and émigré — the end."
PROBE_CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
_MARKER = "lorekv-cache.json"
_WEIGHTS = "model.safetensors"
log = logging.getLogger("lorekv")


def cache_root() -> Path:
    return Path(os.environ.get("LOREKV_CACHE", Path.home() / ".cache" / "lorekv"))


def _fingerprint(tokenizer: PreTrainedTokenizerBase) -> dict:
    chat = None
    if getattr(tokenizer, "chat_template", None):
        chat = tokenizer.apply_chat_template(PROBE_CHAT, tokenize=False, add_generation_prompt=True)
    return {
        "probe_ids": tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"],
        "eos_token": tokenizer.eos_token,
        "chat": chat,
    }


def _gguf_key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path.name}:{stat.st_size}".encode()).hexdigest()[:16]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _require_gguf() -> None:
    """Reading a GGUF needs gguf (the tokenizer and weights) and accelerate (the weights)."""
    require("gguf", extra="gguf", what="GGUF loading")
    require("accelerate", extra="gguf", what="GGUF loading")


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    _require_gguf()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model, tokenizer


def _write_cache(target: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, key: str) -> None:
    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        save_model(model, str(tmp / _WEIGHTS))
        tokenizer.save_pretrained(tmp)
        meta = {"gguf": key, "tokenizer": _fingerprint(tokenizer), "weights_sha256": _file_sha256(tmp / _WEIGHTS)}
        (tmp / _MARKER).write_text(json.dumps(meta))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _cache_problem(target: Path, key: str) -> str | None:
    """Why the cache at ``target`` cannot be used (None: it is complete and intact)."""
    marker = target / _MARKER
    if not marker.exists():
        return "no cache" if not target.exists() else "incomplete cache (no marker)"
    try:
        meta = json.loads(marker.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "unreadable cache marker"
    if meta.get("gguf") != key:
        return "cache of another GGUF"
    weights = target / _WEIGHTS
    if not weights.exists():
        return "cached weights missing"
    if "weights_sha256" not in meta:
        return "cache written without a checksum (by an older lorekv)"
    if meta["weights_sha256"] != _file_sha256(weights):
        return "cached weights corrupted (checksum mismatch)"
    return None


def _read_cache(
    target: Path, key: str, dtype: torch.dtype
) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase | None]:
    problem = _cache_problem(target, key)
    if problem is not None:
        if problem != "no cache":
            log.warning("lorekv: %s at %s; rebuilding it from the GGUF", problem, target)
        return None, None
    meta = json.loads((target / _MARKER).read_text())
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(target)
    if _fingerprint(tokenizer) != meta["tokenizer"]:
        tokenizer = None
    return model, tokenizer


def _remove_stale_temporaries(target: Path) -> None:
    """Temporary cache directories a killed first load left beside ``target``."""
    for stale in target.parent.glob(f".{target.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _building(target: Path) -> Iterator[None]:
    """Hold the exclusive lock on ``target``'s cache while it is checked, built and read."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_bundled(
    bundled: BundledModel, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if importlib.util.find_spec(bundled.package) is None:
        raise ModuleNotFoundError(
            f"the bundled model {bundled.name!r} needs the package {bundled.package!r}; "
            f"install it with: {bundled.install}"
        )
    root = cache_root()
    target = root / bundled.name
    with _building(target):
        gguf = bundled.locate(root / "gguf")  # Gemma 3's is assembled from its parts on first use
        key = _gguf_key(gguf)
        _remove_stale_temporaries(target)
        model, tokenizer = _read_cache(target, key, dtype)
        if model is None:
            dequantised, tokenizer = _load_gguf(gguf, torch.float32)
            _write_cache(target, dequantised, tokenizer, key)
            model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    if tokenizer is None:
        _require_gguf()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model.eval(), tokenizer


def load(
    name_or_path: str, dtype: torch.dtype = torch.float32, *, device_map: str | dict | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM in eval mode and its tokenizer.

    Args:
        name_or_path: a bundled name (``smollm2-135m-instruct``, ``gemma3-270m``), a local
            transformers directory, a local ``.gguf`` file, or a hub id (where a hub is reachable).
            Bundled models and ``.gguf`` files need the ``lorekv[gguf]`` extra.
        dtype: the weights' dtype.
        device_map: accelerate's placement (e.g. ``"auto"`` on a GPU machine) for a local
            directory or hub id (needs the ``lorekv[accelerate]`` extra); the bundled models and
            GGUF files load on the CPU (move them with ``model.to(device)``).
    """
    if name_or_path in BUNDLED or name_or_path.endswith(".gguf"):
        if device_map is not None:
            raise ValueError(f"device_map applies to transformers directories and hub ids, not {name_or_path!r}")
    if name_or_path in BUNDLED:
        return load_bundled(BUNDLED[name_or_path], dtype)
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".gguf":
        model, tokenizer = _load_gguf(path, dtype)
        return model.eval(), tokenizer
    if not path.exists() and "/" not in name_or_path:
        raise ValueError(
            f"unknown model {name_or_path!r}: not a bundled name ({', '.join(BUNDLED)}), "
            "a local directory, a .gguf file, or a hub id (owner/name)"
        )
    if device_map is not None:
        require("accelerate", extra="accelerate", what="device_map placement")
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, device_map=device_map)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return model.eval(), tokenizer
