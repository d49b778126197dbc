"""Correct the git provenance of one recording run's rows, where what the rows say is known to be wrong.

A GPU machine's copy of the tree may hold a stale ``.git``; before ``provenance.git_state`` let the
sender's ``AUTOPROFILER_GIT_SHA`` win, rows recorded there were stamped with that stale sha and
``git_dirty=true``. Given the tree that was really sent (the commit named where the call is written
down), this rewrites ``git_sha`` and ``git_dirty`` of the rows of ``--run-id`` in every table folder
named (``run=<id>/part-*.parquet``), keeping everything else, and prints how many rows changed.

    python bench/restamp_provenance.py datasets/recorded/h200/profiles datasets/recorded/h200/rewards \\
        --run-id 20261203T145108-e256c9 --git-sha 6ab93f0effaa --git-dirty 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def restamp(part: Path, run_id: str, sha: str, dirty: bool) -> int:
    """Rewrite ``part``'s rows of ``run_id``; returns how many there were."""
    table = pq.read_table(part)
    mine = pc.fill_null(pc.equal(table["run_id"], run_id), False)
    n = pc.sum(mine.cast(pa.int64())).as_py() or 0
    if not n:
        return 0
    for name, value in (("git_sha", sha), ("git_dirty", dirty)):
        column = table[name]
        new = pc.if_else(mine, pa.scalar(value, column.type), column)
        table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), new)
    pq.write_table(table, part)
    return n


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="+", help="table folders (profiles, rewards)")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--git-sha", required=True)
    parser.add_argument("--git-dirty", choices=("0", "1"), required=True)
    args = parser.parse_args(argv)
    for folder in args.tables:
        parts = sorted(Path(folder).rglob("*.parquet"))
        if not parts:
            print(f"error: no parquet parts under {folder}", file=sys.stderr)
            return 2
        n = sum(restamp(p, args.run_id, args.git_sha, args.git_dirty == "1") for p in parts)
        print(f"{folder}: {n} row(s) of run {args.run_id}: git_sha={args.git_sha} git_dirty={args.git_dirty}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
