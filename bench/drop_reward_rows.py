"""Drop the reward rows of a recording that an evaluator fault decided, so a resumed recording makes
them again (rows are keyed: a missing key is evaluated, a present one is skipped).

A row goes when its error contains ``--error-contains`` (and, with ``--action`` or ``--error-kind``,
it is that action's row or of that kind). Every part file of the table is rewritten without them; a
part left empty is removed. Prints what went, per run and action. ``--dry-run`` only prints.

    python bench/drop_reward_rows.py datasets/recorded/h200/rewards \\
        --error-contains "child process" --action torch_compile
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", help="a reward table folder (run=<id>/part-*.parquet)")
    parser.add_argument("--error-contains", required=True)
    parser.add_argument("--action", default=None)
    parser.add_argument("--error-kind", default=None, help="only rows of this error_kind (e.g. crashed)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    parts = sorted(Path(args.table).rglob("*.parquet"))
    if not parts:
        print(f"error: no parquet parts under {args.table}", file=sys.stderr)
        return 2
    dropped: Counter = Counter()
    kept = 0
    for part in parts:
        table = pq.read_table(part)
        match = pc.fill_null(pc.match_substring(table["error"], args.error_contains), False)
        if args.action is not None:
            match = pc.and_(match, pc.fill_null(pc.equal(table["action"], args.action), False))
        if args.error_kind is not None:
            match = pc.and_(match, pc.fill_null(pc.equal(table["error_kind"], args.error_kind), False))
        gone = table.filter(match)
        for run, action in zip(gone["run_id"].to_pylist(), gone["action"].to_pylist(), strict=True):
            dropped[(run, action)] += 1
        rest = table.filter(pc.invert(match))
        kept += rest.num_rows
        if gone.num_rows and not args.dry_run:
            if rest.num_rows:
                pq.write_table(rest, part)
            else:
                part.unlink()
    for (run, action), n in sorted(dropped.items()):
        print(f"{run}  {action}: {n} row(s) {'would go' if args.dry_run else 'dropped'}")
    print(f"{sum(dropped.values())} dropped, {kept} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
