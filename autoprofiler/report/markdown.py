"""The report's text pieces: a polars frame as a Markdown table, counted nouns, file-name slugs and the
distinct values of a column joined into one string."""

from __future__ import annotations

import math
from typing import Any

import polars as pl


def markdown_table(frame: pl.DataFrame, formats: dict[str, str] | None = None) -> str:
    """``frame`` as a Markdown table: floats with 3 decimals (or ``formats[column]``), nulls empty.

    >>> print(markdown_table(pl.DataFrame({"a": ["x"], "b": [1.23456]})), end="")
    | a | b |
    |---|---|
    | x | 1.235 |
    """
    formats = formats or {}

    def fmt(column: str, v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return format(v, formats.get(column, ".3f")) if math.isfinite(v) else "n/a"
        return str(v)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    lines += [
        "| " + " | ".join(fmt(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
        for row in frame.rows()
    ]
    return "\n".join(lines) + "\n"


def _n(count: int, noun: str) -> str:
    """``3 tasks``, ``1 task``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _joined(column: str, null: str = "?") -> pl.Expr:
    """The distinct values of ``column``, sorted, as one comma-separated string."""
    return pl.col(column).unique().sort().cast(pl.String).fill_null(null).str.join(", ")
