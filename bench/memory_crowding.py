"""Why evaluations ran out of device memory beside others, from a recording's logs.

A recording logs every cell the evaluator failed whole ("  the evaluator failed: ..."); a failure by
CUDA's allocator quotes its own account: what it tried to allocate, what the device had free, the
process's cap ("... GiB allowed") and use, and every process on the device. This sorts each into:

- **device full**: the allocation was larger than what the device had free, so the process was within
  its cap (the plans of all processes together overcommitted the device);
- **over its share**: the device had room, the process's cap did not;
- **unknown**: the allocator's text is not in the line.

It also counts, per log, how the evaluation passes went: the cells of each first pass and how many of
them the evaluator failed, how many failed again when evaluated together, and the first passes' cells
per second. That is what a change of the memory rules trades: fewer retries against fewer evaluations at
once. And from the "memory:" lines of evaluations that finished, what candidates reserved at most against
their plan, by action: the data to size the headroom from.

    python bench/memory_crowding.py datasets/recorded/h100/logs/recorder_2026-12-07f_call*.log \\
        --out bench/results/memory_crowding_h100.md
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}
_SIZE = r"([\d.]+) (GiB|MiB|KiB|B)"


@dataclass(frozen=True)
class Failure:
    process: str  # "candidate" | "reference" | "other"
    action: str
    verdict: str  # "device full" | "over its share" | "unknown"
    tried: float | None  # GiB
    free: float | None
    allowed: float | None
    in_use: float | None  # this process, CUDA context included
    processes: int  # processes on the device, this one included
    small: int  # of them, holding 0.5-0.8 GiB: about a CUDA context and nothing else
    device_used: float  # GiB, the processes' use together
    # the candidate's share below its plan + headroom (the line's "(its plan ..., headroom ...)");
    # None where the line does not say (logged before the evaluator wrote the plan into it)
    squeezed: bool | None = None


def _gib(match: re.Match | None, group: int = 1) -> float | None:
    return None if match is None else float(match.group(group)) * _UNITS[match.group(group + 1)] / 2**30


def _squeezed(cap: float, plan: float, head: float) -> bool:
    """Whether a cap (GiB, as logged) was below the plan plus headroom it was meant to be: the log
    rounds each to 3 significant digits, so a cap within 1% of the sum is not squeezed."""
    return cap < 0.99 * (plan + head)


def parse_line(line: str) -> Failure | None:
    """The failure one log line describes, ``None`` for any other line."""
    if "the evaluator failed:" not in line:
        return None
    action = re.search(r"action '(\w+)'", line)
    if "candidate's process ran out of memory" in line:
        process = "candidate"
    elif "reference process ran out of memory" in line:
        process = "reference"
    else:
        process = "other"
    tried = _gib(re.search(r"Tried to allocate " + _SIZE, line))
    free = _gib(re.search(r"of which " + _SIZE + " is free", line))
    allowed = _gib(re.search(_SIZE + " allowed", line))
    in_use = _gib(re.search(r"this process has " + _SIZE + " memory in use", line))
    listed = re.findall(r"Process \d+ has " + _SIZE + " memory", line)
    others = [float(v) * _UNITS[u] / 2**30 for v, u in listed]
    if tried is not None and free is not None and tried > free:
        verdict = "device full"
    elif tried is not None and free is not None:
        verdict = "over its share"
    else:
        verdict = "unknown"
    share = re.search(r"at its share of ([\d.e+-]+) GiB", line)
    plan = re.search(r"\(its plan ([\d.e+-]+) GiB, headroom ([\d.e+-]+) GiB\)", line)
    squeezed = None
    if share and plan:
        squeezed = _squeezed(float(share.group(1)), float(plan.group(1)), float(plan.group(2)))
    return Failure(
        process=process,
        action=action.group(1) if action else "?",
        verdict=verdict,
        tried=tried,
        free=free,
        allowed=allowed,
        in_use=in_use,
        processes=len(others) + (in_use is not None),
        small=sum(0.5 <= g <= 0.8 for g in others),
        device_used=sum(others) + (in_use or 0.0),
        squeezed=squeezed,
    )


@dataclass
class Passes:
    """How one log's evaluation passes went."""

    log: str
    first_cells: int = 0  # cells evaluated for the first time
    first_seconds: float = 0.0  # the first passes' time, from their progress lines
    failed_first: int = 0  # of them, failed by the evaluator (evaluated again together)
    failed_again: int = 0  # failed again together (evaluated again one at a time)


_DONE = re.compile(r"recording: cells (\d+)/\1 \(100%\).*?(?:(\d+) min )?(\d+) s elapsed")
_AGAIN = re.compile(r"evaluating (\d+) cells again (together|one at a time)")


def passes(log: Path) -> Passes:
    """Count one recorder log's first passes and retries (the progress and "again" lines)."""
    out = Passes(log.name)
    retry = ""  # the retry pass a finished pass belongs to, "" for a first pass
    for line in log.open(errors="replace"):
        if "the evaluator failed:" in line:
            continue
        if again := _AGAIN.search(line):
            n, how = int(again.group(1)), again.group(2)
            if how == "together":
                out.failed_first += n
            else:
                out.failed_again += n
            retry = how
        elif done := _DONE.search(line):
            if not retry:
                out.first_cells += int(done.group(1))
                out.first_seconds += 60 * int(done.group(2) or 0) + int(done.group(3))
        elif "recorded tasks" in line or "not all recorded" in line:
            retry = ""
    return out


def passes_table(rows: list[Passes]) -> str:
    lines = [
        "| log | first-pass cells | failed by the evaluator | failed again together | first-pass cell/s |",
        "|---|---|---|---|---|",
    ]
    total = Passes("all")
    for r in [*rows, total]:
        if r is not total:
            total.first_cells += r.first_cells
            total.first_seconds += r.first_seconds
            total.failed_first += r.failed_first
            total.failed_again += r.failed_again
        rate = f"{r.first_cells / r.first_seconds:.2f}" if r.first_seconds else ""
        share = f" ({r.failed_first / r.first_cells:.0%})" if r.first_cells else ""
        lines.append(f"| {r.log} | {r.first_cells} | {r.failed_first}{share} | {r.failed_again} | {rate} |")
    return "\n".join(lines)


_PEAK = re.compile(
    r"memory: \S+ action '(\w+)': the candidate reserved ([\d.e+-]+) GiB at most; planned ([\d.e+-]+) GiB, "
    r"headroom ([\d.e+-]+) GiB, cap (?:([\d.e+-]+) GiB|none), (beside others|alone)"
)


def peaks_table(logs: list[Path]) -> str:
    """What candidates reserved at most against their plan, by action, from the recording's "memory:"
    lines (evaluations that finished; beside others a candidate never exceeds its cap, so there the
    ratios are bounded by it, alone they are not), and how many had a cap squeezed below plan plus
    headroom: beside others, the budget's leftover (before a layout had to leave the whole headroom);
    alone, a budget that small itself."""
    by: dict[tuple[str, str], list[tuple[float, float, float, float | None]]] = {}
    for log in logs:
        for line in log.open(errors="replace"):
            if m := _PEAK.search(line):
                peak, plan, head = float(m.group(2)), float(m.group(3)), float(m.group(4))
                cap = float(m.group(5)) if m.group(5) else None
                by.setdefault((m.group(1), m.group(6)), []).append((peak, plan, head, cap))
    if not by:
        return 'no "memory:" lines (recorded before the candidates reported their peak)'
    lines = [
        "| action | where | cells | peak / plan, median | max | peak over plan + headroom "
        "| cap below plan + headroom |",
        "|---|---|---|---|---|---|---|",
    ]
    for (action, where), rows in sorted(by.items()):
        ratios = sorted(peak / plan for peak, plan, _, _ in rows if plan > 0)
        over = sum(peak > plan + head for peak, plan, head, _ in rows)
        squeezed = sum(cap is not None and _squeezed(cap, plan, head) for _, plan, head, cap in rows)
        median = f"{statistics.median(ratios):.2f}" if ratios else ""
        top = f"{ratios[-1]:.2f}" if ratios else ""
        lines.append(f"| {action} | {where} | {len(rows)} | {median} | {top} | {over} | {squeezed} |")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def table(failures: list[Failure]) -> str:
    lines = [
        "| process | action | verdict | tried GiB | free GiB | cap GiB | in use GiB | processes "
        "| ~context only | device used GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in failures:
        lines.append(
            f"| {f.process} | {f.action} | {f.verdict} | {_fmt(f.tried)} | {_fmt(f.free)} "
            f"| {_fmt(f.allowed)} | {_fmt(f.in_use)} | {f.processes} | {f.small} | {f.device_used:.1f} |"
        )
    return "\n".join(lines)


def summary(failures: list[Failure]) -> str:
    by = Counter((f.process, f.verdict) for f in failures)
    over = Counter(f.action for f in failures if f.verdict == "over its share")
    full = Counter(f.action for f in failures if f.verdict == "device full")
    return "\n".join(
        [
            f"failures: {len(failures)}; " + ", ".join(f"{p} {v}: {n}" for (p, v), n in sorted(by.items())),
            "over its share, by action: " + ", ".join(f"{a} {n}" for a, n in over.most_common()),
            "device full, by action: " + ", ".join(f"{a} {n}" for a, n in full.most_common()),
            "candidate's share below its plan + headroom: "
            + ", ".join(
                f"{label} {sum(f.squeezed is value for f in failures if f.process == 'candidate')}"
                for label, value in (("yes", True), ("no", False), ("not logged", None))
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", type=Path, help="recorder logs (record_generated.log of each call)")
    p.add_argument("--out", type=Path, default=None, help="also write the table and summary as Markdown")
    args = p.parse_args(argv)
    missing = [str(path) for path in args.logs if not path.is_file()]
    if missing:
        print(f"error: not a file: {', '.join(missing)}", file=sys.stderr)
        return 2
    failures = [f for path in args.logs for line in path.open(errors="replace") if (f := parse_line(line))]
    text = (
        summary(failures)
        + "\n\n"
        + passes_table([passes(path) for path in args.logs])
        + "\n\n"
        + peaks_table(args.logs)
        + "\n\n"
        + table(failures)
    )
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
