"""Command line: ``autoprofiler eval|profile|route|optimize ...``.

Each subcommand is a small function ``_cmd_<name>(args) -> int`` (the exit code). Exit codes:
0 success (for ``eval``: the candidate is correct), 1 the candidate was evaluated and is not correct,
2 bad input (a task or tree that does not load, a bad option), 3 an environment problem (no ncu, no GPU,
counters not permitted).
"""

from __future__ import annotations

import argparse
import logging
import sys

EXIT_OK, EXIT_INCORRECT, EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 0, 1, 2, 3


# --- eval --------------------------------------------------------------------------------------------
def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a candidate ModelNew against a task's Model")
    p.set_defaults(func=_cmd_eval)


def _cmd_eval(args) -> int:
    raise NotImplementedError


# --- profile -----------------------------------------------------------------------------------------
def _add_profile(sub) -> None:
    p = sub.add_parser("profile", help="profile a task with metric groups and print a table")
    p.set_defaults(func=_cmd_profile)


def _cmd_profile(args) -> int:
    raise NotImplementedError


# --- route / optimize --------------------------------------------------------------------------------
def _add_route(sub) -> None:
    p = sub.add_parser("route", help="route a task through a profiling tree")
    p.set_defaults(func=_cmd_route)


def _cmd_route(args) -> int:
    raise NotImplementedError


def _add_optimize(sub) -> None:
    p = sub.add_parser("optimize", help="profile by a tree, rewrite once, evaluate")
    p.set_defaults(func=_cmd_optimize)


def _cmd_optimize(args) -> int:
    raise NotImplementedError


# -----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoprofiler", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_eval, _add_profile, _add_route, _add_optimize):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
