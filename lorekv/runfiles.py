"""What every results file needs, evaluation grids and cost benchmarks alike: where it came
from (provenance: lorekv's version and commit, package versions, the machine) and how it
reaches disk (atomic writes: a reader sees the old file or the new one, never half of one)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from lorekv.tensorfiles import atomic_replace

PACKAGES = ("torch", "transformers", "numpy", "pydantic", "accelerate", "lorekv")
"""The packages whose versions a run records."""


def package_version(package: str) -> str | None:
    """The installed version of ``package``, None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """The version of each of :data:`PACKAGES`."""
    return {p: package_version(p) for p in PACKAGES}


def git_commit() -> str | None:
    """The commit of the lorekv checkout in use, ``+dirty`` when tracked files differ from it;
    None outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """The system, CPU model, core count, Python version and (when present) the first GPU."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    found = {"system": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
    return found


def load_average() -> list[float] | None:
    """The system's 1/5/15-minute load averages (other work on a shared machine skews every time)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` atomically: a temporary sibling, fsync, rename, fsync of the folder.

    The new file gets the permissions of the process's umask, like a file opened for writing.
    """

    def write(temporary: str) -> None:
        with open(temporary, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_replace(path, write)
