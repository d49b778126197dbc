"""Tasks: reference PyTorch programs in KernelBench form.

A task file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``. Loading a
task never executes it: the source is parsed (``ast``) and checked for those three names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def content_hash(source: str) -> str:
    """The content hash used as cache key everywhere: sha256 of the UTF-8 source, first 16 hex digits."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One reference program.

    Attributes:
        id: stable and unique within a suite, e.g. ``"suite/l1/matmul_square"``.
        source: the KernelBench-form Python source.
        hash: ``content_hash(source)``.
        level: tier: 1 single op, 2 fused chain of ops, 3 small model.
        tags: free-form labels (``"matmul"``, ``"conv"``, ``"reduction"``, ...).
        origin: where it came from: a path, or ``"file.parquet#row=12"``.
    """

    id: str
    source: str
    hash: str
    level: int
    tags: tuple[str, ...] = ()
    origin: str = ""

    @classmethod
    def from_source(cls, id: str, source: str, level: int = 1, tags=(), origin: str = "") -> Task:
        return cls(id=id, source=source, hash=content_hash(source), level=int(level), tags=tuple(tags), origin=origin)
