"""Small helpers on Polars frames shared by several stages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeAlias

import polars as pl

if TYPE_CHECKING:
    from polars.datatypes import DataType, DataTypeClass

#: What a frame schema maps a column name to: a Polars type class (``pl.Int64``) or instance.
PolarsDataType: TypeAlias = "DataTypeClass | DataType"


def concat_or_empty(
    frames: list[pl.DataFrame], schema: Mapping[str, PolarsDataType]
) -> pl.DataFrame:
    """The non-empty ``frames`` stacked, or an empty frame of ``schema`` when there are none."""
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=schema)


def int_value(value: object) -> int:
    """A numeric Polars scalar (``Series.max()`` and the like, typed loosely) as ``int``."""
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return int(value)


def previous_and_next(
    left: pl.DataFrame,
    right: pl.DataFrame,
    *,
    left_on: str,
    right_on: str,
    before: dict[str, str],
    after: dict[str, str],
    by: str = "device",
) -> pl.DataFrame:
    """Each ``left`` row with the last ``right`` row at or before it and the first at or after it.

    ``right``'s columns are renamed by ``before`` and ``after`` (which must rename ``right_on``);
    both frames must be sorted on their key (globally, hence within each ``by`` group).
    """
    prev = left.join_asof(
        right.rename(before),
        left_on=left_on,
        right_on=before[right_on],
        by=by,
        strategy="backward",
        check_sortedness=False,
    )
    return prev.join_asof(
        right.rename(after),
        left_on=left_on,
        right_on=after[right_on],
        by=by,
        strategy="forward",
        check_sortedness=False,
    )
