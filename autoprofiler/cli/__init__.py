"""Command line: ``autoprofiler eval|profile|route|optimize|compact ...``.

Each subcommand is a small function ``_cmd_<name>(args) -> int`` (the exit code). Exit codes:
0 success (for ``eval``: the candidate is correct), 1 the candidate was evaluated and is not correct,
2 bad input (a task or tree that does not load, a bad option), 3 an environment problem (no ncu, no GPU,
counters not permitted).

One file per subcommand (``eval_cmd``, ``profile_cmd``, ``route_cmd``, ``optimize_cmd``,
``compact_cmd``), each with its ``_add_<name>`` (the parser) and ``_cmd_<name>``; ``tree_setup`` holds
what route and optimize share, ``common`` the exit codes and helpers of every subcommand; this module
builds the parser and runs it.
"""

from __future__ import annotations

import argparse
import logging

from autoprofiler.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_INCORRECT,
    EXIT_OK,
    _Stop,
)
from autoprofiler.cli.compact_cmd import _add_compact
from autoprofiler.cli.eval_cmd import _add_eval
from autoprofiler.cli.optimize_cmd import (
    INPUT_FAILURES,
    _add_optimize,
    _format_row,
    _format_summary,
    _optimize_exit,
    _shard,
    _summary,
    _write_table,
)
from autoprofiler.cli.profile_cmd import _add_profile
from autoprofiler.cli.route_cmd import _add_route, _route_summary

__all__ = [  # the public names, and the helpers the tests import from here
    "EXIT_BAD_INPUT",
    "EXIT_ENVIRONMENT",
    "EXIT_INCORRECT",
    "EXIT_OK",
    "INPUT_FAILURES",
    "_Stop",
    "_format_row",
    "_format_summary",
    "_optimize_exit",
    "_route_summary",
    "_shard",
    "_summary",
    "_write_table",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoprofiler", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_eval, _add_profile, _add_route, _add_optimize, _add_compact):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)
