"""Provenance: where and with what a row was measured (code, GPU, driver, profiler, torch).

Every reward row and every recorded profile carries one; a worker detects its own once, at start-up.

    >>> p = Provenance(device="cpu", torch_version="2.13.0", git_sha="abc123", git_dirty=False)
    >>> p.as_row()["git_dirty"]
    False
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Provenance", "detect", "git_state", "physical_gpu", "visible_gpu"]

_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Provenance:
    """Columns every row carries. Empty strings mean "not known" (e.g. no driver on a CPU).

    Attributes:
        device: hardware name ("NVIDIA H200", "cpu").
        driver: GPU driver version.
        ncu_version: the profiler tool ("ncu 2025.3.1.0", "torch 2.13.0" for the torch source).
        profile_source: "ncu" | "torch" | "" (no profiler).
        torch_version: torch in the worker that evaluated.
        git_sha, git_dirty: the code that ran (dirty: tracked files differ from the commit).
        run_id: the run that wrote the row.
        worker: which worker (host and pid) produced it.
    """

    device: str = ""
    driver: str = ""
    ncu_version: str = ""
    profile_source: str = ""
    torch_version: str = ""
    git_sha: str = ""
    git_dirty: bool | None = None
    run_id: str = ""
    worker: str = ""

    def as_row(self) -> dict[str, object]:
        """The reward-table columns this provenance fills."""
        return dataclasses.asdict(self)

    def replace(self, **changes) -> Provenance:
        return dataclasses.replace(self, **changes)


def visible_gpu(device: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The host's GPU that ``device`` ("cuda", "cuda:N") is in this process, as ``nvidia-smi --id``
    takes it: the ``CUDA_VISIBLE_DEVICES`` entry the device's index picks (a host index such as "3",
    or a UUID or MIG id), the index itself when the variable is unset; ``None`` for the CPU.

    Ray gives each ``GpuWorker`` actor its own ``CUDA_VISIBLE_DEVICES``: every actor's "cuda" is its
    process's GPU 0, and a different GPU of the host. ``nvidia-smi`` ignores the variable.

    >>> visible_gpu("cuda:1", {"CUDA_VISIBLE_DEVICES": "2,5"}), visible_gpu("cuda:1", {})
    ('5', '1')
    """
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    n = int(index or 0)
    environ = os.environ if environ is None else environ
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[n] if n < len(visible) else str(n)


def physical_gpu(device: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``visible_gpu`` as a name safe in a file name: "gpu3", or the UUID or MIG id with only letters,
    digits and dashes; one name per GPU of the host, whichever process asks. ``None`` for the CPU.

    >>> physical_gpu("cuda", {}), physical_gpu("cuda", {"CUDA_VISIBLE_DEVICES": "MIG-GPU-8f/1/0"})
    ('gpu0', 'MIG-GPU-8f_1_0')
    """
    gpu = visible_gpu(device, environ)
    if gpu is None:
        return None
    return "gpu" + gpu if gpu.isdigit() else re.sub(r"[^A-Za-z0-9-]", "_", gpu)


@functools.cache
def git_state() -> tuple[str, bool | None]:
    """(short sha, dirty) of the checkout this package is imported from, or, when the sender of a copy
    of the tree set them, ``AUTOPROFILER_GIT_SHA`` and ``AUTOPROFILER_GIT_DIRTY`` (``0``/``1``): they
    win over any ``.git`` in the copy, which may be stale (a GPU machine's copy can hold an older
    ``.git`` beside newer files). ("", None) when neither."""
    sent = _sent_git_state()
    if sent is not None:
        return sent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=_PACKAGE_DIR)

    try:
        sha = git("rev-parse", "--short=12", "HEAD")
        if sha.returncode != 0:
            return "", None
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return sha.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return "", None


def _sent_git_state() -> tuple[str, bool | None] | None:
    sha = os.environ.get("AUTOPROFILER_GIT_SHA", "").strip()
    if not sha:
        return None
    dirty = os.environ.get("AUTOPROFILER_GIT_DIRTY", "").strip()
    return sha[:12], {"0": False, "1": True}.get(dirty)


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def detect(
    device: str = "",
    driver: str = "",
    tool: str = "",
    profile_source: str = "",
    run_id: str = "",
    worker: str = "",
) -> Provenance:
    """A provenance with the code state and torch version detected here, and the given fields."""
    sha, dirty = git_state()
    return Provenance(
        device=device,
        driver=driver,
        ncu_version=tool,
        profile_source=profile_source,
        torch_version=_torch_version(),
        git_sha=sha,
        git_dirty=dirty,
        run_id=run_id,
        worker=worker,
    )
