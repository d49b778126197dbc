"""``autoprofiler compact RECORDING...``: rewrite each run of a recording's tables as one Parquet part.

A recording that grows over many sessions holds thousands of small parts; compacting keeps every row
and the write order (``tables.compact_runs``), so everything read from it stays the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

from autoprofiler.cli.common import EXIT_BAD_INPUT, EXIT_OK


def _add_compact(sub) -> None:
    p = sub.add_parser(
        "compact",
        help="rewrite each run of a recording's tables as one part (every row kept)",
        description="Rewrite each run=<id> partition of RECORDING's profiles/, rewards/ and candidates/ "
        "as one Parquet part, keeping every row and the write order. "
        "Example: autoprofiler compact datasets/recorded/h100",
    )
    p.add_argument("recordings", nargs="+", help="recording folders (each holding rewards/ and profiles/)")
    p.set_defaults(func=_cmd_compact)


def _cmd_compact(args) -> int:
    from autoprofiler.tables import RECORDING_TABLES, compact_runs

    folders = [Path(r) for r in args.recordings]
    tables = ", ".join(f"{table}/" for table in RECORDING_TABLES)
    for folder in folders:  # every path checked before any is rewritten
        if not any((folder / table).is_dir() for table in RECORDING_TABLES):
            print(f"error: {folder} is not a recording: it has none of {tables}", file=sys.stderr)
            return EXIT_BAD_INPUT
    for folder in folders:
        for table, name in RECORDING_TABLES.items():
            if not (folder / table).is_dir():
                continue
            done = compact_runs(folder / table, name)
            print(
                f"{folder / table}: {done.parts_before} -> {done.parts_after} parts, "
                f"{done.bytes_before / 2**20:.1f} -> {done.bytes_after / 2**20:.1f} MiB"
            )
            if done.copies_dropped:
                print(f"  dropped {done.copies_dropped} copies of rows (a compaction stopped half-way)")
            for reason in done.skipped:
                print(f"  left as it was: {reason}")
    return EXIT_OK
