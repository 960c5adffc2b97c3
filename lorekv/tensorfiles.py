"""Files replaced atomically, and a safetensors file with lorekv's metadata: written atomically,
checksummed, and refused with an error that says why (missing, damaged, another kind of file)
before anything is built from it.

A compressed cache (:mod:`lorekv.hf.storage`) and a fitted surrogate scorer
(:mod:`lorekv.distill`) are such files: tensors, plus one JSON object under the metadata key
``"lorekv"`` holding the file's ``format`` (name and version), what the reader needs and a
SHA-256 of every tensor (``sha256``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file


def atomic_replace(path: Path, write: Callable[[str], None]) -> Path:
    """Replace ``path`` atomically by what ``write(temporary)`` writes to a temporary sibling
    (renamed over it, then the folder fsynced); an interrupted write leaves the old file or none,
    never half of one. The new file gets the permissions of the process's umask. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)
    return path


def fsync_directory(path: Path) -> None:
    """Flush a folder's entries to disk (a new or renamed file survives a power loss)."""
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A SHA-256 of every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for key in sorted(tensors):
        tensor = tensors[key].contiguous().cpu()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def write_tensor_file(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
    """Write ``tensors`` (moved to the CPU) and ``meta`` (with their checksum added as ``sha256``)
    to ``path``, replacing it atomically; returns the path."""
    tensors = {key: value.detach().contiguous().cpu() for key, value in tensors.items()}
    text = json.dumps({**meta, "sha256": tensors_digest(tensors)})
    return atomic_replace(Path(path), lambda temporary: save_file(tensors, temporary, metadata={"lorekv": text}))


def read_tensor_file(
    path: str | Path, fmt: str, required: set[str], what: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and metadata of a file of format ``fmt`` whose metadata holds ``required``.

    Raises:
        ValueError: naming ``path`` and ``what`` it should be: no such file; another format or
            version; unreadable (damaged, or another kind of file); its tensors do not match the
            checksum written with them.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such {what} file")
    try:
        with safe_open(path, framework="pt") as handle:
            meta = json.loads((handle.metadata() or {})["lorekv"])
        if meta.get("format") != fmt:
            raise ValueError(f"{path}: format {meta.get('format')!r}, this lorekv reads {fmt!r} ({what})")
        missing = {*required, "sha256"} - set(meta)
        if missing:
            raise KeyError(f"metadata without {sorted(missing)}")
        tensors = load_file(path)
    except (SafetensorError, OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable lorekv {what} (damaged, or another kind of file): {error}") from None
    if tensors_digest(tensors) != meta["sha256"]:
        raise ValueError(f"{path}: damaged: its tensors do not match the checksum written with them")
    return tensors, meta


__all__ = ["read_tensor_file", "tensors_digest", "write_tensor_file"]
