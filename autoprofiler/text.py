"""Cutting messages for one line of output: an error's first line, a value clipped to a width.

Errors from sandboxes, Ray and the LLM SDK are often many lines (a traceback, a dumped response);
a CLI error, a log line or an HTTP reason shows only the first line, and never an unbounded one.
"""

from __future__ import annotations

from typing import Any


def clip(value: Any, limit: int) -> str:
    """``str(value)``, cut to at most ``limit`` characters with a trailing ``...`` when cut."""
    text = str(value)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def first_line(text: Any, limit: int | None = 300, empty: str = "") -> str:
    """The first non-blank line of ``text``, cut at a word boundary past ``limit`` (never inside a
    hash or a path when a space comes before it; ``None``: whole); ``empty`` when there is no text."""
    stripped = "" if text is None else str(text).strip()
    if not stripped:
        return empty
    line = stripped.splitlines()[0].rstrip()
    if limit is None or len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit)
    return line[: cut if cut > 0 else limit] + " ..."
