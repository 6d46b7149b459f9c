"""What both export readers share: the reader interface and the column helpers.

The SQLite file and the parquetdir folder readers decode text, null-fill absent optional columns
and turn unreadable data into one line the same way, here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Protocol

import polars as pl

from ..errors import MissingColumns, TraceReadError
from .specs import TableSpec


class TableSource(Protocol):
    """One open export, read through the declared table specs, whatever its container."""

    path: Path
    #: the export's table names
    table_names: set[str]

    def close(self) -> None:
        """Release the file handles."""

    def columns(self, table: str) -> dict[str, str]:
        """Column name → stored type of ``table``."""
        ...

    def resolve_table(self, spec: TableSpec) -> str | None:
        """The name ``spec``'s table has in this export, or None when it is absent."""
        ...

    def read(self, spec: TableSpec) -> pl.DataFrame | None:
        """The declared columns of ``spec``; None when the table is absent."""
        ...

    def rowid_span(self, spec: TableSpec) -> tuple[int, int] | None:
        """``(first, last + 1)`` row key of ``spec``'s table, for slicing; None: read whole."""
        ...

    def batches(
        self, spec: TableSpec, rows: int, *, rowids: tuple[int, int] | None = None
    ) -> Iterator[pl.DataFrame]:
        """The declared columns of ``spec`` in frames of about ``rows`` rows, in stored order."""
        ...


def resolve_table(spec: TableSpec, table_names: Collection[str]) -> str | None:
    """The first of ``spec``'s names (its own, then ``alt_names``) among ``table_names``."""
    return next((c for c in (spec.name, *spec.alt_names) if c in table_names), None)


def source_column(spec: TableSpec, col: str, present: Collection[str]) -> str | None:
    """The stored name of declared column ``col`` (itself or an alias), None when absent."""
    return next((c for c in (col, *spec.aliases.get(col, ())) if c in present), None)


def plan_columns(
    spec: TableSpec, table: str, present: Collection[str], path: Path
) -> tuple[dict[str, str], list[str]]:
    """Declared column → stored column of ``spec`` in ``table``, and the optional ones it lacks.

    Required columns come first, then optional ones; a required one missing is
    :class:`MissingColumns`.
    """
    chosen: dict[str, str] = {}
    missing_required: list[str] = []
    absent_optional: list[str] = []
    for col in (*spec.required, *spec.optional):
        source = source_column(spec, col, present)
        if source is None:
            (missing_required if col in spec.required else absent_optional).append(col)
        else:
            chosen[col] = source
    if missing_required:
        raise MissingColumns(str(path), table, missing_required)
    return chosen, absent_optional


def with_absent(
    frame: pl.DataFrame, absent_optional: list[str], text: Collection[str] = ()
) -> pl.DataFrame:
    """``frame`` with the optional columns an export lacks added as typed nulls.

    Later stages then see one layout; the frames that matter record which were absent in
    ``RawTrace.warnings``.
    """
    if absent_optional:
        frame = frame.with_columns(
            pl.lit(None, dtype=pl.String if c in text else pl.Int64).alias(c)
            for c in absent_optional
        )
    return frame


def decode_text_columns(frame: pl.DataFrame, columns: Collection[str]) -> pl.DataFrame:
    """Decode BLOB-read text ``columns`` as UTF-8: invalid bytes become U+FFFD, NULs are dropped.

    The fast path is one validating cast; only a column that holds invalid UTF-8 is decoded
    value by value (files from other machines: binary device info, truncated strings).
    """
    fixed = []
    for name in columns:
        column = frame[name]
        if column.dtype == pl.String:
            decoded = column
        elif column.dtype == pl.Binary:
            try:
                decoded = column.cast(pl.String)
            except pl.exceptions.ComputeError:  # invalid UTF-8 somewhere in the column
                decoded = pl.Series(
                    name,
                    [None if v is None else v.decode("utf-8", "replace") for v in column],
                    dtype=pl.String,
                )
        else:  # all-null columns come back untyped; numbers stored in a TEXT column
            decoded = column.cast(pl.String)
        fixed.append(decoded.str.replace_all("\x00", "", literal=True))
    return frame.with_columns(fixed) if fixed else frame


_FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)


def read_error(path: Path, exc: BaseException, kind: str = "SQLite") -> BaseException:
    """The :class:`TraceReadError` for a driver/Arrow/Polars failure while reading ``path``.

    Rust-side panics (``pyo3_runtime.PanicException``) derive from BaseException, not
    Exception; they mean unreadable data too. Interrupts and exits pass through unchanged.
    """
    if isinstance(exc, (*_FATAL, TraceReadError)):
        return exc
    return TraceReadError(str(path), _short(exc), kind)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for prefix in ("INVALID_ARGUMENT: ", "IO: ", "[SQLite] "):
        text = text.replace(prefix, "")
    return text
