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
