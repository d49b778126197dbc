"""Comparing the candidate's outputs with the reference's, in the reference process (``_reference.py``).

Structure first, from the metadata alone (count, shapes, dtypes, devices), before any data is read;
then values: integers exactly, floating point by ``allclose`` (atol/rtol by dtype) and the relative
error norm ``|out-ref|/|ref|`` (which catches near-zero outputs that pass ``allclose``). An output of
more than ``COMPARE_CHUNK`` elements is compared chunk by chunk (flat slices), so the float64
temporaries of the comparison stay bounded whatever the task's size; the checks and their messages are
the same (the norm is accumulated over chunks). Loaded by path beside ``_harness.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import _autoprofiler_harness as harness
from _autoprofiler_harness import Failure

COMPARE_CHUNK = harness.role_module("memory").COMPARE_CHUNK


class Comparer:
    def __init__(self, tools: harness.Tools, config: dict):
        self.tools = tools
        self.torch = tools.torch
        self.cfg = config

    def check_structure(self, reference: list, metas: list, what: str) -> None:
        """Count, shapes, dtypes and devices from the metadata alone (before any data is read)."""
        if len(metas) != len(reference):
            raise Failure("wrong_shape", f"{what}: {len(metas)} outputs, expected {len(reference)}")
        for i, (r, meta) in enumerate(zip(reference, metas, strict=True)):
            name = f"{what}: output {i}" if len(reference) > 1 else what
            if not isinstance(r, self.tools.Tensor):
                continue
            if not isinstance(meta, dict) or meta.get("kind") != "tensor":
                kind = meta.get("type") if isinstance(meta, dict) else None
                got = kind or type(meta.get("value") if isinstance(meta, dict) else meta).__name__
                raise Failure(
                    "wrong_shape", f"{name}: got {got}, expected a tensor of shape {tuple(r.shape)}"
                )
            shape = tuple(meta.get("shape") or ())
            if shape != tuple(r.shape):
                raise Failure("wrong_shape", f"{name}: shape {shape}, expected {tuple(r.shape)}")
            if f"torch.{meta.get('dtype')}" != str(r.dtype):
                raise Failure("wrong_output", f"{name}: dtype torch.{meta.get('dtype')}, expected {r.dtype}")
            if meta.get("device") != r.device.type:
                raise Failure("wrong_output", f"{name}: on device {meta.get('device')}, expected {r.device}")

    def compare(self, reference: list, new: list, what: str) -> None:
        """Raise ``Failure`` when the candidate's outputs do not match the reference's."""
        tools = self.tools
        if len(new) != len(reference):
            raise Failure("wrong_shape", f"{what}: {len(new)} outputs, expected {len(reference)}")
        for i, (r, n) in enumerate(zip(reference, new, strict=True)):
            name = f"{what}: output {i}" if len(reference) > 1 else what
            if isinstance(r, tools.Tensor):
                if r.numel() > COMPARE_CHUNK:
                    self.compare_chunked(r, n, name)
                else:
                    self.compare_tensor(r, n, name)
            elif isinstance(r, float) and isinstance(n, (int, float)):
                if not math.isclose(r, n, rel_tol=1e-4, abs_tol=1e-4):
                    raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")
            elif r != n and repr(r) != repr(n):
                raise Failure("wrong_output", f"{name}: {n!r}, expected {r!r}")

    # -- one tensor at once ------------------------------------------------------------------------
    def quick_match(self, r, n, atol: float, rel_tol: float) -> bool:
        """True when ``n`` certainly passes ``compare_tensor``, found in a few passes: everything finite
        (a finite sum), max ``|n - r|`` within ``atol`` (so within ``allclose``'s tolerance) and the
        relative error norm within ``rel_tol``. Anything else takes the full check and its message."""
        torch = self.torch
        if r.numel() == 0:
            return False
        wide = torch.float64 if r.dtype == torch.float64 else torch.float32
        rw, nw = r.to(wide), n.to(wide)
        if not (math.isfinite(float(rw.sum())) and math.isfinite(float(nw.sum()))):
            return False
        diff = (nw - rw).abs_()
        if float(diff.amax()) > atol:
            return False
        ref_norm = float(torch.linalg.vector_norm(rw))
        return ref_norm == 0.0 or float(torch.linalg.vector_norm(diff)) / ref_norm <= rel_tol

    def compare_tensor(self, r, n, name: str) -> None:
        torch = self.torch
        if not r.is_floating_point() and not r.is_complex():
            if not torch.equal(n, r):
                raise Failure("wrong_output", f"{name}: integer/bool values differ from the reference")
            return
        atol, rtol, rel_tol = tolerances(torch, r.dtype, self.cfg)
        if r.is_floating_point() and self.quick_match(r, n, atol, rel_tol):
            return
        rd, nd = r.to(torch.float64), n.to(torch.float64)
        r_fin, n_fin = torch.isfinite(rd), torch.isfinite(nd)
        bad = r_fin & ~n_fin
        if bool(bad.any()):
            raise Failure(
                "wrong_output", f"{name}: {int(bad.sum())} NaN/Inf values where the reference is finite"
            )
        if not bool(torch.allclose(nd, rd, rtol=rtol, atol=atol, equal_nan=True)):
            raise not_close(name, atol, rtol, Violations.of(torch, rd, nd, atol, rtol, 0), rd.numel())
        both = r_fin & n_fin
        ref_norm = float(torch.linalg.vector_norm(rd[both]))
        if ref_norm > 0.0:
            err = float(torch.linalg.vector_norm(nd[both] - rd[both])) / ref_norm
            if err > rel_tol:
                raise rel_norm_failure(name, err, rel_tol, ref_norm)

    # -- chunk by chunk ----------------------------------------------------------------------------
    def chunks(self, r, n):
        """Flat slices of ``r`` and ``n`` of ``COMPARE_CHUNK`` elements: ``(offset, r_chunk, n_chunk)``."""
        rf, nf = r.reshape(-1), n.reshape(-1)
        for start in range(0, rf.numel(), COMPARE_CHUNK):
            yield start, rf[start : start + COMPARE_CHUNK], nf[start : start + COMPARE_CHUNK]

    def compare_chunked(self, r, n, name: str) -> None:
        """``compare_tensor`` for a large output: the same checks, in order, over flat chunks."""
        torch = self.torch
        if not r.is_floating_point() and not r.is_complex():
            if not all(torch.equal(nc, rc) for _, rc, nc in self.chunks(r, n)):
                raise Failure("wrong_output", f"{name}: integer/bool values differ from the reference")
            return
        atol, rtol, rel_tol = tolerances(torch, r.dtype, self.cfg)
        if r.is_floating_point() and self.quick_match_chunked(r, n, atol, rel_tol):
            return
        bad_count, close, found = 0, True, Violations()
        ref_sq, err_sq = 0.0, 0.0
        for start, rc, nc in self.chunks(r, n):
            rd, nd = rc.to(torch.float64), nc.to(torch.float64)
            r_fin, n_fin = torch.isfinite(rd), torch.isfinite(nd)
            bad_count += int((r_fin & ~n_fin).sum())
            both = r_fin & n_fin
            if not bool(torch.allclose(nd, rd, rtol=rtol, atol=atol, equal_nan=True)):
                close = False
                found = found.merge(Violations.of(torch, rd, nd, atol, rtol, start))
            ref_sq += float(torch.linalg.vector_norm(rd[both])) ** 2
            err_sq += float(torch.linalg.vector_norm(nd[both] - rd[both])) ** 2
        if bad_count:
            raise Failure("wrong_output", f"{name}: {bad_count} NaN/Inf values where the reference is finite")
        if not close:
            raise not_close(name, atol, rtol, found, r.numel())
        ref_norm = math.sqrt(ref_sq)
        if ref_norm > 0.0:
            err = math.sqrt(err_sq) / ref_norm
            if err > rel_tol:
                raise rel_norm_failure(name, err, rel_tol, ref_norm)

    def quick_match_chunked(self, r, n, atol: float, rel_tol: float) -> bool:
        torch = self.torch
        wide = torch.float64 if r.dtype == torch.float64 else torch.float32
        ref_sq, diff_sq = 0.0, 0.0
        for _, rc, nc in self.chunks(r, n):
            rw, nw = rc.to(wide), nc.to(wide)
            if not (math.isfinite(float(rw.sum())) and math.isfinite(float(nw.sum()))):
                return False
            diff = (nw - rw).abs_()
            if float(diff.amax()) > atol:
                return False
            ref_sq += float(torch.linalg.vector_norm(rw, dtype=torch.float64)) ** 2
            diff_sq += float(torch.linalg.vector_norm(diff, dtype=torch.float64)) ** 2
        return ref_sq == 0.0 or math.sqrt(diff_sq / ref_sq) <= rel_tol


@dataclass(frozen=True)
class Violations:
    """The values outside ``allclose``'s tolerance (``|out - ref| > atol + rtol * |ref|``, finite on both
    sides): how many, and the worst one, the value furthest beyond what it is allowed. The largest
    difference is often not one of them: a large reference value allows a large difference."""

    count: int = 0
    index: int = -1  # flat index of the worst
    got: float = 0.0
    want: float = 0.0
    excess: float = -math.inf  # |got - want| - allowed, of the worst

    @classmethod
    def of(cls, torch, rd, nd, atol: float, rtol: float, offset: int) -> Violations:
        """The violations in float64 tensors ``rd`` (reference) and ``nd``; flat indices from ``offset``."""
        both = torch.isfinite(rd) & torch.isfinite(nd)
        excess = torch.where(both, (nd - rd).abs() - (atol + rtol * rd.abs()), torch.full_like(rd, -math.inf))
        flat = excess.reshape(-1)
        k = int(torch.argmax(flat))
        return cls(
            count=int((flat > 0).sum()),
            index=offset + k,
            got=float(nd.reshape(-1)[k]),
            want=float(rd.reshape(-1)[k]),
            excess=float(flat[k]),
        )

    def merge(self, other: Violations) -> Violations:
        worst = self if self.excess >= other.excess else other
        return replace(worst, count=self.count + other.count)


def not_close(name: str, atol: float, rtol: float, found: Violations, numel: int) -> Failure:
    if not found.count:  # every finite value is close: the difference is where the reference is NaN/Inf
        return Failure("wrong_output", f"{name}: values differ where the reference is NaN or Inf")
    diff = abs(found.got - found.want)
    return Failure(
        "wrong_output",
        f"{name}: not allclose (atol={atol:g}, rtol={rtol:g}): {found.count} of {numel} values outside the "
        f"tolerance, the worst at flat index {found.index} (got {found.got:.6g}, expected {found.want:.6g}: "
        f"diff {diff:.3g}, allowed {diff - found.excess:.3g})",
    )


def rel_norm_failure(name: str, err: float, rel_tol: float, ref_norm: float) -> Failure:
    return Failure(
        "wrong_output",
        f"{name}: relative error norm |out-ref|/|ref| = {err:.3g} > {rel_tol:g} although "
        f"allclose passed (outputs near zero, |ref| = {ref_norm:.3g}: KernelBench issue 165)",
    )


def tolerances(torch, dtype, config: dict) -> tuple[float, float, float]:
    low = dtype in (torch.float16, torch.bfloat16)
    default = 1e-2 if low else 1e-4
    atol = config.get("atol")
    rtol = config.get("rtol")
    atol = default if atol is None else float(atol)
    rtol = default if rtol is None else float(rtol)
    rel = config.get("rel_norm_tol")
    rel = 10.0 * max(atol, rtol) if rel is None else float(rel)
    return atol, rtol, rel
